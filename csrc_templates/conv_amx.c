#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepack: the weights made into A tiles once (params=) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel loops */
#define {{NAME}}_CHUNKS {{CHUNKS}} /* the plan's region_chunks: equal ranges of the tiles' loop on the pool */
#define {{NAME}}_KCB {{KCB}} /* the plan's kcb: K blocks of 32 per slice (A tiles in L1) */
#define {{NAME}}_G {{G}} /* the plan's group: items of a channel block that share a slice's A tiles */
#define {{NAME}}_FOLD {{FOLD}} /* the plan's fold: the kernel's columns folded into the copy's channels */
/* {{NAME}}: conv2d on AMX-BF16 tiles read straight from the input (eqfuse.backend.kinds.contraction.conv_amx),
 * {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{C}}x{{KH}}x{{KW}}, stride {{SH}}x{{SW}}, padding {{PH}}x{{PW}}
 * -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out), the epilogue fused into the store.
 *
 * The GEMM of the conv, out[o][pixel] = sum over (tap, c) of w[o][c][tap] x[c][pixel + tap], with
 * no column matrix and no packed panels: a B tile (16 K-pairs x 16 pixels, 64 bytes a row) is
 * loaded by tileloadd from a copy of the input in which those 16 rows are 16 pairs of channels
 * and the 16 pixels of a row are consecutive for every tap.
 * - The copy xq[K2][QH][QW][PHASE] of K-pairs (two channels' bf16 in one 32-bit word, the even
 *   channel low), one phase plane per (row, column) phase of the stride, QH x QW of them (stride 1:
 *   one). Phase (qh, qw) holds padded pixel (r SH + qh, q SW + qw) at r WQ + q, the images one
 *   after the other (IMG = HQ x WQ pairs each), zero outside the image and past the last image.
 *   Output pixel (oh, ow) of image n is flat pixel f = n IMG + oh WQ + ow, and its tap (kh, kw)
 *   reads phase (kh % SH, kw % SW) at f + (kh / SH) WQ + kw / SW: one offset per tap, so 16
 *   consecutive flat pixels are 16 consecutive pairs. The flat pixels with ow >= OW (or oh >= OH)
 *   are computed and dropped: (HQ x WQ) / (OH x OW) - 1 of the work, bounded by the plan.
 * - FOLD (few input channels): the copy's channels are the (kernel column kw, input channel c)
 *   pairs, kc = kw C + c, each holding pixel (r SH + qh, q SW + kw) at r WQ + q with WQ = OW: the
 *   columns of the window are in K, a tap is a kernel row (NT = KH offsets, one column phase),
 *   and a K block of 32 holds all of a row's KW x C products where C x KW <= 32 (a stem's 7 x 3).
 * - The weights as A tiles, [O / 16][NKB][16][32] bf16, K in blocks of 32 copy channels of one
 *   tap (tap-major: NKB = NT KCP / 32); channels past KC and rows past O zero. Made once when
 *   bound by params= ({{NAME}}_prepack), else at each call.
 * The register tile: 2 x 2 C tiles, 32 output channels x 32 flat pixels (tiles 0-3), A tiles 4-5,
 * B tiles 6-7, over the NKB blocks; then the tile through the epilogue into NCHW, the flat pixels
 * that are output pixels only. The threads share the (channel block, pixel block) items, channel
 * blocks outermost: a range of items reads one block's weights, from L1, while the copy's pairs
 * stream. */
#if !defined(EQF_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_BF16__))
#error "the plan chose the AMX-BF16 path (tdpbf16ps) but the compiler does not target AMX-TILE and AMX-BF16"
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#define {{NAME}}_DIMS                                                                              \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, \
           OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, FOLD = {{NAME}}_FOLD,          \
           QH = KH < SH ? KH : SH, QW = FOLD ? 1 : (KW < SW ? KW : SW) /* the phases some tap reads */, \
           HQ = OH + (KH - 1) / SH, WQ = FOLD ? OW : OW + (KW - 1) / SW /* a phase's rows, columns */,   \
           KC = FOLD ? KW * C : C /* the copy's channels */, NT = FOLD ? KH : KH * KW /* taps */,       \
           KCP = {{KCP}} /* KC padded to whole K blocks of 32 */, K2 = KCP / 2, CB = KCP / 32,           \
           NKB = NT * CB, NOB = (O + 31) / 32, IMG = HQ * WQ, F = N * IMG, NPB = (F + 31) / 32,          \
           REACH = (KH - 1) / SH * WQ + (FOLD ? 0 : (KW - 1) / SW) /* the farthest tap's offset */,      \
           PHASE = (NPB * 32 + REACH + 15) / 16 * 16 /* a phase plane's pairs: the last block's reads */ }

long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_DIMS;
    return (long)NOB * 32 * NKB * 32 / 2; /* (bf16: halves) */
}

/* OIHW weights -> A tiles [2 NOB][NKB][16][32], block kb = tap x CB + block of copy channels, rounded to bf16 */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wf)
{
    {{NAME}}_DIMS;
    uint16_t* restrict wp = (uint16_t*)wf;
    for (long o16 = 0; o16 < 2 * NOB; o16++)
        for (long kb = 0; kb < NKB; kb++) {
            const long tap = kb / CB, cb = kb % CB;
            for (long r = 0; r < 16; r++)
                for (long e = 0; e < 32; e++) {
                    const long o = o16 * 16 + r, kc = cb * 32 + e;
                    const long kh = FOLD ? tap : tap / KW, kw = FOLD ? kc / C : tap % KW, c = FOLD ? kc % C : kc;
                    wp[((o16 * NKB + kb) * 16 + r) * 32 + e] =
                        eqf_bf16(o < O && kc < KC ? wt[((o * C + c) * KH + kh) * KW + kw] : 0.0f);
                }
        }
}

typedef struct {
    {{PARAM_FIELDS}}
    uint32_t* xq;        /* the copy of K-pairs */
    const uint16_t* wq;  /* the A tiles */
} {{NAME}}_job;

/* the lanes l of 16 from q whose q + l lies in [a, b) */
static inline uint32_t {{NAME}}_lanes(long q, long a, long b)
{
    const long lo = a - q > 0 ? a - q : 0, hi = b - q < 16 ? b - q : 16;
    return hi <= lo ? 0u : ((1u << hi) - 1u) & ~((1u << lo) - 1u);
}

#if defined(__AVX512BF16__) && defined(__BMI2__)
/* the floats s[l SW] of the lanes l in m (SW 1 or 2), the others zero: no read outside them */
static inline __m512 {{NAME}}_row16(const float* restrict s, uint32_t m)
{
    {{NAME}}_DIMS;
    if (SW == 1)
        return _mm512_maskz_loadu_ps((__mmask16)m, s);
    const uint32_t even = _pdep_u32(m, 0x55555555u); /* lane l's float at 2 l */
    const __m512 a = _mm512_maskz_loadu_ps((__mmask16)even, s), b = _mm512_maskz_loadu_ps((__mmask16)(even >> 16), s + 16);
    return _mm512_permutex2var_ps(a, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), b);
}
#endif

/* Rows (k2, qh, qw, n, r) of the copy: WQ pairs each, the K-pair of copy channels 2 k2 and
 * 2 k2 + 1 at padded row r SH + qh, column q SW + qw (FOLD: q SW + the channel's kw); zero where
 * that lies outside the image; the last row of a phase plane zeroes its tail too. */
static void {{NAME}}_copy_rows(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    const float* restrict x = {{X}};
    uint32_t* restrict xq = jb->xq;
    for (long row = lo; row < hi; row++) {
        const long r = row % HQ, n = row / HQ % N, pl = row / HQ / N;
        const long qw = pl % QW, qh = pl / QW % QH, k2 = pl / QW / QH;
        uint32_t* restrict phase = xq + k2 * (long)QH * QW * PHASE + (qh * QW + qw) * (long)PHASE;
        uint32_t* restrict dst = phase + n * (long)IMG + r * WQ;
        const long ih = r * SH + qh - PH;
        /* each half h: its input row (s[h], read at q SW + col[h]) and the columns q it reads inside the image */
        const float* s[2] = {x, x};
        long col[2] = {0, 0}, qa[2] = {0, 0}, qb[2] = {0, 0};
        for (int h = 0; h < 2; h++) {
            const long kc = 2 * k2 + h;
            if (kc >= KC || ih < 0 || ih >= H)
                continue;
            const long c = FOLD ? kc % C : kc;
            col[h] = (FOLD ? kc / C : qw) - PW;
            s[h] = x + ((n * C + c) * H + ih) * (long)W;
            qa[h] = col[h] >= 0 ? 0 : (SW - 1 - col[h]) / SW;
            const long b = W - 1 - col[h] < 0 ? 0 : (W - 1 - col[h]) / SW + 1;
            qb[h] = b < WQ ? b : WQ;
        }
        long q = 0;
#if defined(__AVX512BF16__) && defined(__BMI2__)
        if (SW <= 2) { /* 16 pairs a step: both halves rounded by one vcvtne2ps2bf16, interleaved */
            const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                   23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            for (; q < WQ; q += 16) {
                const uint32_t m0 = {{NAME}}_lanes(q, qa[0], qb[0]), m1 = {{NAME}}_lanes(q, qa[1], qb[1]);
                const __m512 v0 = {{NAME}}_row16(s[0] + q * SW + col[0], m0), v1 = {{NAME}}_row16(s[1] + q * SW + col[1], m1);
                const __m512i v = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
                _mm512_mask_storeu_epi32((void*)(dst + q), (__mmask16)(WQ - q < 16 ? (1u << (WQ - q)) - 1u : 0xffffu), v);
            }
        }
#endif
        for (; q < WQ; q++) {
            const uint32_t v0 = q >= qa[0] && q < qb[0] ? eqf_bf16(s[0][q * SW + col[0]]) : 0;
            const uint32_t v1 = q >= qa[1] && q < qb[1] ? eqf_bf16(s[1][q * SW + col[1]]) : 0;
            dst[q] = v0 | v1 << 16;
        }
        if (n == N - 1 && r == HQ - 1) /* past the last image: the blocks' reads beyond F are zeros */
            memset(phase + F, 0, sizeof(uint32_t) * (PHASE - F));
    }
}

/* A run of a pixel block's flat pixels along one output row: tile columns [q, q + cnt), image n,
 * output pixels j0 .. j0 + cnt - 1 of its planes */
typedef struct {
    long q, n, j0, cnt;
} {{NAME}}_run;

/* The runs of pixel block pb (the flat pixels past OW or OH dropped): how many */
static int {{NAME}}_runs(long pb, {{NAME}}_run* restrict runs)
{
    {{NAME}}_DIMS;
    int nr = 0;
    const long fe = (pb + 1) * 32 < F ? (pb + 1) * 32 : F;
    for (long f = pb * 32; f < fe;) {
        const long n = f / IMG, oh = f % IMG / WQ, ow = f % WQ;
        const long len = WQ - ow < fe - f ? WQ - ow : fe - f;
        if (oh < OH && ow < OW)
            runs[nr++] = ({{NAME}}_run){f - pb * 32, n, oh * OW + ow, OW - ow < len ? OW - ow : len};
        f += len;
    }
    return nr;
}

/* The pending epilogue's rows from prow up to R (a statement in _tiles) */
#define {{NAME}}_STORE(R)                                                                          \
    for (const long r_end = (R); prow < r_end; prow++)                                              \
        for (int u = 0; u < nruns; u++) {                                                          \
            const long b = runs[u].n, i = pob * 32 + prow, j0 = runs[u].j0;                        \
            const float* restrict src = prev + prow * 32 + runs[u].q;                              \
            float* restrict dst = out + (b * O + i) * (long)OH * OW + j0;                          \
            _Pragma("omp simd") for (long e = 0; e < runs[u].cnt; e++) {                           \
                const long j = j0 + e;                                                             \
                const float acc = src[e];                                                          \
                dst[e] = {{EPILOGUE}};                                                             \
                (void)j;                                                                           \
            }                                                                                      \
            (void)b;                                                                               \
        }

/* Items (channel block ob, pixel block pb), ob outermost: 32 output channels x 32 flat pixels
 * each, in groups of up to G items of one channel block. K goes in slices of KCB blocks (the
 * slice's A tiles, 32 x KCB x 32 bf16, stay in L1 while the group's pixel blocks use them), each
 * item's C tiles kept between slices in part[]. After its last slice an item's tiles go into one
 * of two buffers, and its epilogue runs during the next items' products, a share of its rows
 * after each K block (the vector units store while the tile unit multiplies); the range's last
 * item's at the end. */
static void {{NAME}}_tiles(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    enum { KCB = {{NAME}}_KCB, G = {{NAME}}_G };
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const uint32_t* restrict xq = jb->xq;
    const uint16_t* restrict wq = jb->wq;
    const long plane = (long)QH * QW * PHASE; /* a K-pair's pairs: the B tiles' row stride */
    long off[NT]; /* each tap's offset from its output pixel (FOLD: a kernel row's) */
    for (long t = 0; t < NT; t++) {
        const long kh = FOLD ? t : t / KW, kw = FOLD ? 0 : t % KW;
        off[t] = (kh % SH * QW + kw % SW) * (long)PHASE + kh / SH * WQ + kw / SW;
    }
    float tiles[2][32 * 32] __attribute__((aligned(64)));
    float part[G][32 * 32] __attribute__((aligned(64)));
    {{NAME}}_run runs[32 / WQ + 3];
    int nruns = 0, done = 0;               /* the pending epilogue: its runs, */
    long prow = 32, pob = 0, prows = 0;     /* its next row, channel block and rows */
    const float* restrict prev = tiles[0];
    const long per = (32 + KCB - 1) / KCB; /* pending rows stored per K block */
    eqf_amx_begin(); /* (in each range: the tile configuration is a thread's) */
    for (long g0 = lo; g0 < hi;) {
        const long ob = g0 / NPB, pb0 = g0 % NPB;
        long ng = hi - g0 < G ? hi - g0 : G; /* the group: up to G items, all of channel block ob */
        ng = ng < NPB - pb0 ? ng : NPB - pb0;
        const uint16_t* restrict a0 = wq + 2 * ob * (long)NKB * 512, *restrict a1 = a0 + (long)NKB * 512;
        for (long k0 = 0; k0 < NKB; k0 += KCB) {
            const long k1 = k0 + KCB < NKB ? k0 + KCB : NKB;
            for (long q = 0; q < ng; q++) {
                const uint32_t* restrict b = xq + (pb0 + q) * 32;
                EQF_AMX_FENCE(); /* (the copy, the weights and part[] are in memory before the tile loads) */
                if (k0 == 0) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                } else {
                    _tile_loadd(0, part[q], 128);
                    _tile_loadd(1, part[q] + 16, 128);
                    _tile_loadd(2, part[q] + 16 * 32, 128);
                    _tile_loadd(3, part[q] + 16 * 32 + 16, 128);
                }
                for (long kb = k0; kb < k1; kb++) { /* block kb: the tap's channels cb x 32 .. cb x 32 + 31 */
                    const uint32_t* restrict bk = b + off[kb / CB] + kb % CB * 16 * plane;
                    _tile_loadd(4, a0 + kb * 512, 64);
                    _tile_loadd(5, a1 + kb * 512, 64);
                    _tile_loadd(6, bk, 4 * plane);
                    _tile_loadd(7, bk + 16, 4 * plane);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                    {{NAME}}_STORE(prow + per < prows ? prow + per : prows);
                }
                float* restrict c = k1 < NKB ? part[q] : tiles[done & 1];
                _tile_stored(0, c, 128);
                _tile_stored(1, c + 16, 128);
                _tile_stored(2, c + 16 * 32, 128);
                _tile_stored(3, c + 16 * 32 + 16, 128);
                EQF_AMX_FENCE();
                if (k1 == NKB) { /* the item is done: its epilogue pending, the last one's finished first */
                    {{NAME}}_STORE(prows);
                    prev = c;
                    nruns = {{NAME}}_runs(pb0 + q, runs);
                    pob = ob, prow = 0, prows = O - ob * 32 < 32 ? O - ob * 32 : 32;
                    done++;
                }
            }
        }
        g0 += ng;
    }
    {{NAME}}_STORE(prows);
    _tile_release();
}

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_DIMS;
    if (!eqf_amx_ready()) { /* the tile state refused (common_amx.h): no tile instruction runs */
        eqf_fail_note(EQF_NO_AMX);
        return;
    }
    uint32_t* xq = (uint32_t*)eqf_scratch(EQF_SCRATCH_CONV_COL, (long)K2 * QH * QW * PHASE);
#if {{NAME}}_PREPACKED
    const uint16_t* wq = (const uint16_t*){{WEIGHTS}}; /* the A tiles {{NAME}}_prepack made once */
#else
    uint16_t* wq = (uint16_t*)eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
#endif
    if (!xq || !wq) {
        eqf_nomem_note();
        return;
    }
#if !{{NAME}}_PREPACKED
    {{NAME}}_prepack({{WEIGHTS}}, (float*)wq); /* (weights not bound by params=: made at each call) */
#endif
    /* two parallel loops on the claim-based pool (common_pool.h), one after the other: the copy
     * (by row), the tiles */
    {{NAME}}_job job = { {{PARAM_INIT}}, xq, wq };
    eqf_region((long)K2 * QH * QW * N * HQ, {{NAME}}_copy_rows, &job, {{NAME}}_PARALLEL);
    eqf_region_n((long)NOB * NPB, {{NAME}}_tiles, &job, {{NAME}}_PARALLEL, {{NAME}}_CHUNKS);
}

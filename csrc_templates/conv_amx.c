#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepack: the weights made into B tiles once (params=) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel loops */
#define {{NAME}}_CHUNKS {{CHUNKS}} /* the plan's region_chunks: equal ranges of the tiles' loop on the pool */
#define {{NAME}}_KCB {{KCB}} /* the plan's kcb: K blocks of 32 per slice (the weights' B tiles in L1) */
#define {{NAME}}_G {{G}} /* the plan's group: items of a channel block that share a slice's B tiles */
#define {{NAME}}_FOLD {{FOLD}} /* the plan's fold: the kernel's columns folded into the copy's channels */
#define {{NAME}}_OVERLAP {{OVERLAP}} /* the plan's overlap: folded, the A tiles' rows overlapping in the image's copy */
#define {{NAME}}_IN_COPY {{IN_COPY}} /* the plan's in_copy: the input is the copy, written by its producer */
/* the plan's sibling (a 1x1 conv reading another conv's copy): the phase plane of that copy holding
 * its pixels, that copy's rows and columns per image, its planes' pixels */
#define {{NAME}}_SIBLING {{SIBLING}}
#define {{NAME}}_S enum { SPLANE = {{SPLANE}}, SHQ = {{SHQ}}, SWQ = {{SWQ}}, SPHASE = {{SPHASE}} }
#define {{NAME}}_OUT_COPY {{OUT_COPY}} /* the plan's out_copy: the output is the next conv's copy, in bf16 */
#define {{NAME}}_OUT_POOL {{OUT_POOL}} /* the plan's out_pool: the output is the max pool of the conv's */
#define {{NAME}}_IN_BLOCKED {{IN_BLOCKED}} /* the plan's in_blocked: the input in blocks of VL channels */
#define {{NAME}}_OUT_BLOCKED {{OUT_BLOCKED}} /* the plan's out_blocked: the output (the pool's) in blocks of VL channels */
#define {{NAME}}_STAGED {{STAGED}} /* the plan's staged: the NCHW output written in blocks first, then reordered */
/* the items' results stored a pixel's channels at a time (in blocks: the output's, or the staged copy's) */
#define {{NAME}}_PIXEL_STORE (({{NAME}}_OUT_BLOCKED || {{NAME}}_STAGED) && !{{NAME}}_OUT_POOL)
#define {{NAME}}_EPI_BLOCKED {{EPI_BLOCKED}} /* the plan's blocked_args: epilogue operands read in blocks, at blk */
#define {{NAME}}_VL {{VL}} /* the blocked layout's channels per block, [N][C / VL][H][W][VL] (contraction/blocked.py) */
/* the items' order: groups of G pixel blocks outermost (a thread's range is a range of pixels, all
 * channels: the next kernel, whose threads split pixels the same way, finds them in its own
 * core's caches); for the pool, each range of pool rows (_tiles_pool) a channel block at a time,
 * its items in pixel order */
#define {{NAME}}_PIXEL_MAJOR (!{{NAME}}_OUT_POOL)
/* {{NAME}}: conv2d on AMX-BF16 tiles read straight from the input (eqfuse.backend.kinds.contraction.conv_amx),
 * {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{C}}x{{KH}}x{{KW}}, stride {{SH}}x{{SW}}, padding {{PH}}x{{PW}}
 * -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out), the epilogue fused into the store.
 *
 * The GEMM of the conv, out[pixel][o] = sum over (tap, c) of x[pixel + tap][c] w[c][tap][o], with
 * no column matrix and no packed panels: an A tile (16 pixels x 32 channels, 64 bytes a row) is
 * loaded by tileloadd from a copy of the input in which a pixel's channels are one row and the
 * pixels of an output row are consecutive rows for every tap.
 * - The copy xq[QH][QW][PHASE][KCP] of bf16 (pixel-major, channels innermost: NHWC), one phase
 *   plane per (row, column) phase of the stride, QH x QW of them (stride 1: one). Phase (qh, qw)
 *   holds padded pixel (r SH + qh, q SW + qw) at r WQ + q, the images one after the other (IMG =
 *   HQ x WQ pixels each), zero outside the image, past the last image and in the channels past KC.
 *   Output pixel (oh, ow) of image n is flat pixel f = n IMG + oh WQ + ow, and its tap (kh, kw)
 *   reads phase (kh % SH, kw % SW) at f + (kh / SH) WQ + kw / SW: one offset per tap, so 16
 *   consecutive flat pixels are 16 consecutive rows, each a whole cache line of its 32 channels
 *   (a tap moves the tile by whole rows: the lines a tap reads, the next column's tap reads
 *   again). The flat pixels with ow >= OW (or oh >= OH) are computed and dropped: (HQ x WQ) /
 *   (OH x OW) - 1 of the work, bounded by the plan.
 * - FOLD (few input channels): the copy's channels are the (kernel column kw, input channel c)
 *   pairs, kc = kw C + c, each holding pixel (r SH + qh, q SW + kw) at r WQ + q with WQ = OW: the
 *   columns of the window are in K, a tap is a kernel row (NT = KH offsets, one column phase),
 *   and a K block of 32 holds all of a row's KW x C products where C x KW <= 32 (a stem's 7 x 3).
 * - The weights as B tiles, [O / 16][NKB][16][16][2] bf16 (16 K-pairs x 16 output channels, the
 *   even channel of a pair first), K in blocks of 32 copy channels of one tap (tap-major: NKB =
 *   NT KCP / 32); channels past KC and outputs past O zero. Made once when bound by params=
 *   ({{NAME}}_prepack), else at each call.
 * - IN_COPY: the producer of the input, a conv on this kernel (its OUT_COPY), wrote it as this
 *   copy, in bf16 (what the copy would have rounded it to), into the input's buffer: no copy here.
 * - OUT_COPY: the output goes into the copy of the next conv on this kernel (whose input it is,
 *   and which alone reads it), in bf16: the Y constants are that conv's geometry; each output
 *   pixel's 32 channels of a channel block are one 64-byte row there, and the rows of that copy
 *   no output pixel fills (its zero padding, the phase planes' tails) are zeroed first.
 * - OUT_POOL: the output is a max pool (PKH x PKW, stride PSH x PSW, padding PPH x PPW) of the
 *   conv's, POH x POW: each thread takes a range of pool rows and the conv's rows their windows
 *   read (the rows at a range's edge computed by both ranges), a channel block at a time, its
 *   items in pixel order; the items' C tiles go into a band of the conv's results (pixel-major,
 *   the thread's scratch), and each row of the output, once whole there, goes through the
 *   epilogue and, a pool column at a time, into the max of every pool pixel of the range whose
 *   window holds it, in a pixel-major buffer of the range's pool pixels (the thread's scratch),
 *   written to the output (NCHW or blocks) after the block's last item. The conv's output is
 *   never stored whole.
 * The register tile: 2 x 2 C tiles, 32 flat pixels x 32 output channels (tiles 0-3), A tiles 4-5,
 * B tiles 6-7, over the NKB blocks; then the tile, transposed to channel-major, through the
 * epilogue into NCHW, the flat pixels that are output pixels only. The threads share the (channel
 * block, pixel block) items in groups of G pixel blocks of one channel block, which read a K
 * slice of that block's weights from L1 while the copy's rows stream; the groups in pixel order,
 * each group's channel blocks one after the other (PIXEL_MAJOR; OUT_POOL: channel blocks
 * outermost). */
#if {{NAME}}_EPI_BLOCKED && !({{NAME}}_OUT_COPY || {{NAME}}_OUT_POOL || {{NAME}}_PIXEL_STORE)
#error "the plan reads epilogue operands in blocks into an NCHW store (conv_amx.py stages such an output)"
#endif
#if {{NAME}}_IN_BLOCKED && {{NAME}}_FOLD
#error "the plan reads a folded copy from blocks (contraction/blocked.py never asks for it)"
#endif
#if !defined(EQF_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_BF16__))
#error "the plan chose the AMX-BF16 path (tdpbf16ps) but the compiler does not target AMX-TILE and AMX-BF16"
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
/* r[0..15], 16 rows of 16 32-bit elements, transposed in place: r[i] lane j <- r[j] lane i (32-bit
 * interleaves, then 64-bit, then a 4 x 4 transpose of the 128-bit lanes): the pixel-major tiles
 * and the channel-major rows around them (the copy's rounding, the NCHW epilogue) */
static inline void {{NAME}}_tr16(__m512i r[16])
{
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) { /* u[g + j], lane k: rows g .. g + 3 at column 4 k + j */
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int j = 0; j < 4; j++) {
        const __m512i v0 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x44), v1 = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xEE);
        const __m512i v2 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + j], u[12 + j], 0xEE);
        r[j] = _mm512_shuffle_i32x4(v0, v2, 0x88);
        r[4 + j] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
        r[8 + j] = _mm512_shuffle_i32x4(v1, v3, 0x88);
        r[12 + j] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
    }
}
#endif

#if {{NAME}}_OUT_COPY /* the next conv's copy: its stride, padding, phases, flat rows and columns, pixels per phase plane, channels */
#define {{NAME}}_Y                                                                                 \
    enum { YSH = {{YSH}}, YSW = {{YSW}}, YPH = {{YPH}}, YPW = {{YPW}}, YQH = {{YQH}}, YQW = {{YQW}}, YHQ = {{YHQ}}, \
           YWQ = {{YWQ}}, YPHASE = {{YPHASE}}, YKCP = {{YKCP}}, YIMG = YHQ * YWQ, YF = N * YIMG }
#endif
#if {{NAME}}_OUT_POOL
/* the max pool's window, stride, padding and output rows and columns; the band's pixels (_tiles):
 * a row and two pixel blocks, and 32 pixel blocks between the moves of its partial row to its
 * start (8, 32 and 96 blocks ran alike: `python benchmarks/bench_models.py --precision bf16
 * --model resnet_stages`, the stem by eqfuse.runtime.profile; benchmarks/RESULTS.md, 2026-12-04) */
#define {{NAME}}_P                                                                                 \
    enum { PKH = {{PKH}}, PKW = {{PKW}}, PSH = {{PSH}}, PSW = {{PSW}}, PPH = {{PPH}}, PPW = {{PPW}}, POH = {{POH}}, POW = {{POW}}, \
           BANDP = ((WQ + 31) / 32 + 2 + 32) * 32,                                                \
           /* each window holds a pixel of the conv's output (padding at most half the window, as   \
            * torch's max pool asks): a pool pixel's first row stores its maxima, no -inf first */ \
           FIRST = 2 * PPH <= PKH && 2 * PPW <= PKW }
#endif
#define {{NAME}}_DIMS                                                                              \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, \
           OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, FOLD = {{NAME}}_FOLD,          \
           OVERLAP = {{NAME}}_OVERLAP, C2 = C + C % 2 /* OVERLAP: the copy's channels */,             \
           QH = OVERLAP ? 1 : KH < SH ? KH : SH, QW = FOLD ? 1 : (KW < SW ? KW : SW) /* the phases some tap reads */, \
           HQ = OVERLAP ? OH : {{NAME}}_SIBLING ? {{SHQ}} : OH + (KH - 1) / SH, /* a phase's rows, columns   \
                (OVERLAP: whole tiles of 16 a row; SIBLING: the other conv's copy's) */                   \
           WQ = OVERLAP ? (OW + 15) / 16 * 16 : {{NAME}}_SIBLING ? {{SWQ}} : FOLD ? OW : OW + (KW - 1) / SW, \
           HP = (OH - 1) * SH + KH, WP = (WQ - 1) * SW + KW /* OVERLAP: the copy's padded rows, columns */, \
           KC = OVERLAP ? KW * C2 : FOLD ? KW * C : C /* the copy's channels (OVERLAP: an A row's K) */, NT = FOLD ? KH : KH * KW /* taps */,       \
           KCP = {{KCP}} /* KC padded to whole K blocks of 32 */, CB = KCP / 32,                        \
           NKB = NT * CB, NOB = (O + 31) / 32, IMG = HQ * WQ, F = N * IMG,                            \
           NPB = (F - (HQ - OH) * WQ + 31) / 32 /* the pixel blocks: the last image's rows past OH none's */, \
           REACH = (KH - 1) / SH * WQ + (FOLD ? 0 : (KW - 1) / SW) /* the farthest tap's offset */,      \
           PHASE = NPB * 32 + REACH /* a phase plane's pixels: the last block's reads */ }

#if {{NAME}}_OVERLAP /* tiles 4-5 (A): rows of KW x C2 bf16; 6-7 (B): KW x C2 / 2 K-pairs */
static const eqf_tilecfg {{NAME}}_CFG = {
    .palette_id = 1,
    .colsb = {64, 64, 64, 64, {{KW}} * ({{C}} + {{C}} % 2) * 2, {{KW}} * ({{C}} + {{C}} % 2) * 2, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, {{KW}} * ({{C}} + {{C}} % 2) / 2, {{KW}} * ({{C}} + {{C}} % 2) / 2}};
#endif

long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_DIMS;
    return (long)NOB * 32 * NKB * 32 / 2; /* (bf16: halves) */
}

/* OIHW weights -> B tiles [2 NOB][NKB][16][16][2], block kb = tap x CB + block of copy channels,
 * row k2 the K-pair of copy channels 2 k2 and 2 k2 + 1, rounded to bf16 (OVERLAP: K index
 * kw C2 + c, a kernel row's pixels' channels as the A tile's row holds them) */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wf)
{
    {{NAME}}_DIMS;
    uint16_t* restrict wp = (uint16_t*)wf;
    for (long o16 = 0; o16 < 2 * NOB; o16++)
        for (long kb = 0; kb < NKB; kb++) {
            const long tap = kb / CB, cb = kb % CB;
            for (long k2 = 0; k2 < 16; k2++)
                for (long e = 0; e < 32; e++) {
                    const long o = o16 * 16 + e / 2, kc = cb * 32 + 2 * k2 + e % 2, cc = OVERLAP ? C2 : C;
                    const long kh = FOLD ? tap : tap / KW, kw = FOLD ? kc / cc : tap % KW, c = FOLD ? kc % cc : kc;
                    wp[((o16 * NKB + kb) * 16 + k2) * 32 + e] =
                        eqf_bf16(o < O && kc < KC && c < C && kw < KW ? wt[((o * C + c) * KH + kh) * KW + kw] : 0.0f);
                }
        }
}

typedef struct {
    {{PARAM_FIELDS}}
    uint16_t* xq;        /* the copy, pixel-major */
    const uint16_t* wq;  /* the weights' B tiles */
    float* acc;          /* OUT_POOL: a channel block's pool pixels, pixel-major (the range's thread's) */
    float* band;         /* OUT_POOL: the conv's results of the rows not yet pooled, pixel-major (the thread's) */
    float* stg;          /* STAGED: the output in blocks of VL channels, before its reorder into NCHW */
    long pa, pb;         /* OUT_POOL: the range's pool rows of its image, whose maxima `acc` holds */
    long row0, row1;     /* OUT_POOL: the flat rows of the conv's output those read */
    int failed;          /* OUT_POOL: a thread's scratch buffer could not be allocated */
} {{NAME}}_job;

#if !{{NAME}}_IN_COPY
/* the lanes l of 16 from q whose q + l lies in [a, b) */
static inline uint32_t {{NAME}}_lanes(long q, long a, long b)
{
    const long lo = a - q > 0 ? a - q : 0, hi = b - q < 16 ? b - q : 16;
    return hi <= lo ? 0u : ((1u << hi) - 1u) & ~((1u << lo) - 1u);
}

#if {{NAME}}_OVERLAP
/* OVERLAP: rows (n, hp) of the copy of the zero-padded image, [N][HP][WP][C2] bf16 (a pixel's
 * channels, then zeros to C2): padded pixel (hp, wp) is input pixel (hp - PH, wp - PW). An A tile
 * of output pixels ow .. ow + 15 of row oh, at tap (kernel row) kh, is the 16 rows of KW x C2
 * values from pixel (oh SH + kh, ow SW), SW x C2 values apart: its rows overlap here, and the
 * copy is the image's size. 16 pixels at a time: each channel's 16 floats one masked load, the
 * channels interleaved into the pixels' rows by one permute. */
static void {{NAME}}_copy_image(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    const float* restrict x = {{X}};
    uint16_t* restrict xq = jb->xq;
    for (long row = lo; row < hi; row++) {
        const long n = row / HP, ih = row % HP - PH;
        uint16_t* restrict dst = xq + row * (long)WP * C2;
        if (ih < 0 || ih >= H) {
            memset(dst, 0, sizeof(uint16_t) * WP * C2);
            continue;
        }
        const float* restrict src = x + (n * C * (long)H + ih) * W - PW; /* (column wp of channel c: src[c H W + wp]) */
        long q = 0;
#if defined(__AVX512BF16__)
        if (C2 == 2 || C2 == 4) {
            uint16_t idx[64] __attribute__((aligned(64)));
            for (int e = 0; e < 64; e++) /* e = pixel p C2 + channel c: c's half of the conversions, pixel p */
                idx[e] = (uint16_t)(C2 == 4 ? (e % 4 / 2) * 32 + (e % 2) * 16 + e / 4 : (e % 2) * 16 + e / 2);
            const __m512i i0 = _mm512_load_si512((const void*)idx), ihi = _mm512_load_si512((const void*)(idx + 32));
            for (; q < WP; q += 16) {
                const __mmask16 m = (__mmask16){{NAME}}_lanes(q, PW, PW + W);
                __m512 v[4];
                for (int c = 0; c < 4; c++)
                    v[c] = c < C ? _mm512_maskz_loadu_ps(m, src + c * (long)H * W + q) : _mm512_setzero_ps();
                const __m512i a = (__m512i)_mm512_cvtne2ps_pbh(v[1], v[0]), b = (__m512i)_mm512_cvtne2ps_pbh(v[3], v[2]);
                const long np = WP - q < 16 ? WP - q : 16; /* (the row's last pixels: their values only) */
                const __m512i lo32 = C2 == 4 ? _mm512_permutex2var_epi16(a, i0, b) : _mm512_permutexvar_epi16(i0, a);
                _mm512_mask_storeu_epi16(dst + q * C2, (__mmask32)(np * C2 >= 32 ? 0xffffffffu : (1u << (np * C2)) - 1u), lo32);
                if (C2 == 4 && np > 8)
                    _mm512_mask_storeu_epi16(dst + q * C2 + 32, (__mmask32)(np * C2 - 32 >= 32 ? 0xffffffffu : (1u << (np * C2 - 32)) - 1u),
                                             _mm512_permutex2var_epi16(a, ihi, b));
            }
        }
#endif
        for (; q < WP; q++)
            for (long c = 0; c < C2; c++)
                dst[q * C2 + c] = c < C && q >= PW && q < PW + W ? eqf_bf16(src[c * (long)H * W + q]) : 0;
    }
}
#endif

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

#if defined(__AVX512BF16__)
/* FOLD with KW <= 8 and C <= 4 (one K block): a copy row, pixel by pixel. Pixel q's copy
 * channels kc = kw C + c are input columns q SW - PW + kw of the C rows at x (channel c's row at
 * x + c H W; `in`: the row lies in the image, else zeros): each channel's KW columns one masked
 * load into 8 lanes of two vectors (channel c at lane 8 c), the 32 channels picked from them
 * by two permutes, rounded by one vcvtne2ps2bf16, one 64-byte row. */
static inline void {{NAME}}_fold_row(const float* restrict x, int in, uint16_t* restrict dst)
{
    {{NAME}}_DIMS;
    if (!in) {
        memset(dst, 0, sizeof(uint16_t) * KCP * WQ);
        return;
    }
    int idx[32] __attribute__((aligned(64)));
    for (int kc = 0; kc < 32; kc++)
        idx[kc] = kc < KC ? kc % C * 8 + kc / C : 0;
    const __m512i lo16 = _mm512_load_si512((const void*)idx), hi16 = _mm512_load_si512((const void*)(idx + 16));
    const __mmask16 hmask = (__mmask16)(KC - 16 >= 16 ? 0xffffu : KC > 16 ? (1u << (KC - 16)) - 1u : 0u);
    const __mmask16 lmask = (__mmask16)(KC >= 16 ? 0xffffu : (1u << KC) - 1u);
    for (long q = 0; q < WQ; q++) {
        const long s0 = q * SW - PW, a = s0 < 0 ? -s0 : 0, b = W - s0 < KW ? W - s0 : KW;
        const uint32_t m = b <= a ? 0u : ((1u << b) - 1u) & ~((1u << a) - 1u); /* the columns inside the image */
        __m512 v[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int c = 0; c < C; c++) /* (lanes 8 (c % 2) .. of v[c / 2]: the pointer moved back to match) */
            v[c / 2] = _mm512_mask_loadu_ps(v[c / 2], (__mmask16)(m << (c % 2 * 8)), x + c * (long)H * W + s0 - c % 2 * 8);
        const __m512 l = _mm512_maskz_permutex2var_ps(lmask, v[0], lo16, v[1]);
        const __m512 h = _mm512_maskz_permutex2var_ps(hmask, v[0], hi16, v[1]);
        _mm512_storeu_si512((void*)(dst + q * KCP), (__m512i)_mm512_cvtne2ps_pbh(h, l));
    }
}
#endif

#if !{{NAME}}_OVERLAP
/* Rows (n, r, qh, qw) of the copy: WQ pixels of KCP bf16 each, pixel q's copy channel kc the
 * input at padded row r SH + qh, column q SW + qw (FOLD: q SW + the channel's kw); zero where that
 * lies outside the image or kc >= KC; the last row of a phase plane zeroes the plane's tail too.
 * 32 channels at a time: 16 K-pairs of 16 pixels, rounded, then transposed to 16 pixel rows. */
static void {{NAME}}_copy_rows(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    const float* restrict x = {{X}};
    uint16_t* restrict xq = jb->xq;
    for (long row = lo; row < hi; row++) {
        /* (row-major, every phase plane's row r together: a thread's range of rows is the pixels
         * its range of the tiles reads, from its own core's caches) */
        const long pl = row % (QH * QW), r = row / (QH * QW) % HQ, n = row / (QH * QW) / HQ, qw = pl % QW, qh = pl / QW;
        uint16_t* restrict phase = xq + pl * (long)PHASE * KCP;
        uint16_t* restrict dst = phase + (n * (long)IMG + r * WQ) * KCP;
        const long ih = r * SH + qh - PH;
#if {{NAME}}_IN_BLOCKED /* the input in blocks of VL channels: a pixel's channels VL at a time, no transposition */
        for (long q = 0; q < WQ; q++) {
            enum { VL = {{NAME}}_VL };
            const long iw = q * SW + qw - PW;
            uint16_t* restrict d = dst + q * KCP;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) {
                memset(d, 0, sizeof(uint16_t) * KCP);
                continue;
            }
            const float* restrict s0 = x + ((n * (C / VL) * (long)H + ih) * W + iw) * VL; /* (block cb: + cb H W VL) */
            for (long k0 = 0; k0 < KCP; k0 += 32) {
#if defined(__AVX512BF16__)
                if (VL == 16) { /* (two blocks, one vcvtne2ps2bf16, one 64-byte row) */
                    const __m512 lo16 = k0 < C ? _mm512_loadu_ps(s0 + k0 / 16 * (long)H * W * 16) : _mm512_setzero_ps();
                    const __m512 hi16 = k0 + 16 < C ? _mm512_loadu_ps(s0 + (k0 / 16 + 1) * (long)H * W * 16) : _mm512_setzero_ps();
                    _mm512_storeu_si512((void*)(d + k0), (__m512i)_mm512_cvtne2ps_pbh(hi16, lo16));
                    continue;
                }
#endif
                for (long e = k0; e < k0 + 32; e++)
                    d[e] = e < C ? eqf_bf16(s0[e / VL * (long)H * W * VL + e % VL]) : 0;
            }
        }
        goto next;
#endif
#if defined(__AVX512BF16__)
        if (FOLD && KW <= 8 && C <= 4 && KCP == 32) { /* (a stem's few channels: a pixel at a time) */
            {{NAME}}_fold_row(ih >= 0 && ih < H ? x + (n * C * (long)H + ih) * W : x, ih >= 0 && ih < H, dst);
            goto next;
        }
#endif
#if defined(__AVX512BF16__) && defined(__BMI2__)
        if (!FOLD && SW <= 2) { /* every channel's row read at the same columns: one mask a step, the rows H W apart */
            if (ih < 0 || ih >= H) {
                memset(dst, 0, sizeof(uint16_t) * KCP * WQ);
                goto next;
            }
            const long col = qw - PW, qa = col >= 0 ? 0 : (SW - 1 - col) / SW;
            const long qb = W - 1 - col < 0 ? 0 : (W - 1 - col) / SW + 1 < WQ ? (W - 1 - col) / SW + 1 : WQ;
            const float* restrict s0 = x + (n * C * (long)H + ih) * W + col;
            const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                   23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            for (long k0 = 0; k0 < KCP; k0 += 32)
                for (long q = 0; q < WQ; q += 16) {
                    const uint32_t m = {{NAME}}_lanes(q, qa, qb);
                    __m512i v[16]; /* v[l]: the K-pair l of the block at the 16 pixels */
                    for (int l = 0; l < 16; l++) {
                        const long kc = k0 + 2 * l;
                        const __m512 v0 = kc < KC ? {{NAME}}_row16(s0 + kc * (long)H * W + q * SW, m) : _mm512_setzero_ps();
                        const __m512 v1 = kc + 1 < KC ? {{NAME}}_row16(s0 + (kc + 1) * (long)H * W + q * SW, m) : _mm512_setzero_ps();
                        v[l] = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
                    }
                    {{NAME}}_tr16(v); /* v[p]: the pixel p's 16 K-pairs */
                    const long np = WQ - q < 16 ? WQ - q : 16;
                    for (long p = 0; p < np; p++)
                        _mm512_storeu_si512((void*)(dst + (q + p) * KCP + k0), v[p]);
                }
            goto next;
        }
#endif
        for (long k0 = 0; k0 < KCP; k0 += 32) {
            /* each channel e of the block: its input row (s[e], read at q SW + col[e]) and the columns q it reads inside the image */
            const float* s[32];
            long col[32], qa[32], qb[32];
            for (int e = 0; e < 32; e++) {
                const long kc = k0 + e;
                s[e] = x, col[e] = qa[e] = qb[e] = 0;
                if (kc >= KC || ih < 0 || ih >= H)
                    continue;
                const long c = FOLD ? kc % C : kc;
                col[e] = (FOLD ? kc / C : qw) - PW;
                s[e] = x + ((n * C + c) * H + ih) * (long)W;
                qa[e] = col[e] >= 0 ? 0 : (SW - 1 - col[e]) / SW;
                const long b = W - 1 - col[e] < 0 ? 0 : (W - 1 - col[e]) / SW + 1;
                qb[e] = b < WQ ? b : WQ;
            }
            long q = 0;
#if defined(__AVX512BF16__) && defined(__BMI2__)
            if (SW <= 2) { /* 16 pixels a step: each K-pair's two channels rounded by one vcvtne2ps2bf16, interleaved */
                const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                       23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                for (; q < WQ; q += 16) {
                    __m512i v[16]; /* v[l]: the K-pair l of the block at the 16 pixels */
                    for (int l = 0; l < 16; l++) {
                        const int e = 2 * l;
                        const uint32_t m0 = {{NAME}}_lanes(q, qa[e], qb[e]), m1 = {{NAME}}_lanes(q, qa[e + 1], qb[e + 1]);
                        const __m512 v0 = {{NAME}}_row16(s[e] + q * SW + col[e], m0);
                        const __m512 v1 = {{NAME}}_row16(s[e + 1] + q * SW + col[e + 1], m1);
                        v[l] = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
                    }
                    {{NAME}}_tr16(v); /* v[p]: the pixel p's 16 K-pairs */
                    const long np = WQ - q < 16 ? WQ - q : 16;
                    for (long p = 0; p < np; p++)
                        _mm512_storeu_si512((void*)(dst + (q + p) * KCP + k0), v[p]);
                }
            }
#endif
            for (; q < WQ; q++)
                for (int e = 0; e < 32; e++)
                    dst[q * KCP + k0 + e] = q >= qa[e] && q < qb[e] ? eqf_bf16(s[e][q * SW + col[e]]) : 0;
        }
#if defined(__AVX512BF16__) || {{NAME}}_IN_BLOCKED
    next:
#endif
        if (n == N - 1 && r == HQ - 1) /* past the last image: the blocks' reads beyond F are zeros */
            memset(phase + (long)F * KCP, 0, sizeof(uint16_t) * KCP * (PHASE - F));
    }
}
#endif
#endif

/* The epilogue along one pixel's 32 channels of channel block OB, DST[o] from SRC[o] (the pixel's
 * image b and output pixel j in scope): a whole block in two 16-lane vectors, the last one's
 * channels below O only (the others not written; their operands not read). With operands in
 * blocks (EPI_BLOCKED) a loop per VL channels, each one block's: blk, the element's offset in
 * the blocked layout, runs on with the lanes. */
#if {{NAME}}_EPI_BLOCKED
#define {{NAME}}_EPI_PIXEL(DST, SRC, OB)                                                           \
    do {                                                                                           \
        enum { VL = {{NAME}}_VL };                                                                 \
        for (long h_ = 0; h_ < 32 && (OB) * 32 + h_ < O; h_ += VL) {                               \
            const long blk0 = ((b * (O / VL) + ((OB) * 32 + h_) / VL) * (long)OH * OW + j) * VL - h_; \
            _Pragma("omp simd simdlen(16)") for (long o = h_; o < h_ + VL; o++) {                  \
                const long i = (OB) * 32 + o, blk = blk0 + o;                                      \
                const float acc = (SRC)[o];                                                        \
                (DST)[o] = {{EPILOGUE}};                                                           \
                (void)i, (void)blk;                                                                \
            }                                                                                      \
        }                                                                                          \
    } while (0)
#else
#define {{NAME}}_EPI_PIXEL(DST, SRC, OB)                                                           \
    do {                                                                                           \
        if ((OB) * 32 + 32 <= O)                                                                   \
            _Pragma("omp simd simdlen(16)") for (long o = 0; o < 32; o++) {                        \
                const long i = (OB) * 32 + o;                                                      \
                const float acc = (SRC)[o];                                                        \
                (DST)[o] = {{EPILOGUE}};                                                           \
                (void)i;                                                                           \
            }                                                                                      \
        else                                                                                       \
            _Pragma("omp simd") for (long o = 0; o < O - (OB) * 32; o++) {                         \
                const long i = (OB) * 32 + o;                                                      \
                const float acc = (SRC)[o];                                                        \
                (DST)[o] = {{EPILOGUE}};                                                           \
                (void)i;                                                                           \
            }                                                                                      \
    } while (0)
#endif

#if {{NAME}}_OUT_COPY
/* The rows of the next conv's copy no output pixel fills (`_Y`): zero */
static void {{NAME}}_yzero(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_Y;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    uint16_t* restrict y = (uint16_t*)out;
    for (long row = lo; row < hi; row++) {
        const long r = row % YHQ, n = row / YHQ % N, pl = row / YHQ / N, qw = pl % YQW, qh = pl / YQW;
        uint16_t* restrict phase = y + pl * (long)YPHASE * YKCP;
        uint16_t* restrict d = phase + (n * (long)YIMG + r * YWQ) * YKCP;
        const long oh = r * YSH + qh - YPH; /* the output row this copy row holds */
        if (oh < 0 || oh >= OH)
            memset(d, 0, sizeof(uint16_t) * YKCP * YWQ);
        else
            for (long q = 0; q < YWQ; q++) {
                const long ow = q * YSW + qw - YPW;
                if (ow < 0 || ow >= OW)
                    memset(d + q * YKCP, 0, sizeof(uint16_t) * YKCP);
            }
        if (n == N - 1 && r == YHQ - 1)
            memset(phase + (long)YF * YKCP, 0, sizeof(uint16_t) * YKCP * (YPHASE - YF));
    }
}

/* Where each flat pixel of pixel block pb goes in the next conv's copy (y[p]: its row, NULL for
 * a pixel dropped or one that conv never reads), its image (bs[p]) and output pixel (js[p]) */
static void {{NAME}}_ylanes(long pb, uint16_t* y0, uint16_t** y, long* bs, long* js)
{
    {{NAME}}_DIMS;
    {{NAME}}_Y;
    for (int p = 0; p < 32; p++) {
        const long f = pb * 32 + p, n = f / IMG, oh = f % IMG / WQ, ow = f % WQ;
        const long a = oh + YPH, c = ow + YPW;
        y[p] = NULL, bs[p] = n, js[p] = oh * OW + ow;
        if (f < F && oh < OH && ow < OW && a % YSH < YQH && c % YSW < YQW && a / YSH < YHQ && c / YSW < YWQ)
            y[p] = y0 + ((a % YSH * YQW + c % YSW) * (long)YPHASE + n * YIMG + a / YSH * YWQ + c / YSW) * YKCP;
    }
}

/* the 32 floats of t (16 at a time, as the epilogue's loop wrote them) rounded to bf16, one 64-byte row */
static inline void {{NAME}}_put_bf16(uint16_t* restrict d, const float* restrict t)
{
#if defined(__AVX512BF16__)
    _mm512_storeu_si512((void*)d, (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(t + 16), _mm512_load_ps(t)));
#else
    for (int e = 0; e < 32; e++)
        d[e] = eqf_bf16(t[e]);
#endif
}

/* The pending epilogue's pixels from prow up to R (a statement in _tiles): each pixel's 32
 * channels through the epilogue (the channels past O zero), a row of the next conv's copy */
#define {{NAME}}_STORE(R)                                                                          \
    for (const long r_end = (R); prow < r_end; prow++) {                                           \
        uint16_t* restrict yd = ydst[prow];                                                        \
        if (!yd)                                                                                   \
            continue;                                                                              \
        const long b = ybs[prow], j = yjs[prow];                                                   \
        {{NAME}}_EPI_PIXEL(lane, prev + prow * 32, pob);                                           \
        for (long o = O - pob * 32; o < 32; o++) /* (the last block's channels past O: zero) */    \
            lane[o] = 0.0f;                                                                        \
        {{NAME}}_put_bf16(yd + pob * 32, lane);                                                    \
        (void)b, (void)j;                                                                          \
    }
#elif {{NAME}}_OUT_POOL
/* A run of cnt conv output pixels of row oh from column ow0 (v: their 32 channels each, after
 * the epilogue) into the pool: for each pool column whose window meets the run, the max over the
 * run's pixels in the window, then that into the max of each pool pixel of the column whose
 * window holds row oh (acc: the image's pool rows pa .. pb - 1, 32 channels a pixel; the rows
 * outside them are another range's). NaN is kept as the max pool keeps it:
 * a = (v > a || v != v) ? v : a, a NaN once in `a` stays. */
static inline void {{NAME}}_pool_run(float* restrict acc, long pa, long pb, const float* restrict v, long oh, long ow0, long cnt)
{
    {{NAME}}_DIMS;
    {{NAME}}_P;
    const long hl = oh + PPH - PKH + 1, wl = ow0 + PPW - PKW + 1; /* (the first window that holds it: ceil(hl / PSH)) */
    const long ph0 = hl <= pa * PSH ? pa : (hl + PSH - 1) / PSH, pw0 = wl <= 0 ? 0 : (wl + PSW - 1) / PSW;
    const long ph1 = (oh + PPH) / PSH < pb - 1 ? (oh + PPH) / PSH : pb - 1;
    const long pw1 = (ow0 + cnt - 1 + PPW) / PSW < POW - 1 ? (ow0 + cnt - 1 + PPW) / PSW : POW - 1;
    for (long pw = pw0; pw <= pw1; pw++) {
        const long c0 = pw * PSW - PPW > ow0 ? pw * PSW - PPW : ow0;
        const long c1 = pw * PSW - PPW + PKW - 1 < ow0 + cnt - 1 ? pw * PSW - PPW + PKW - 1 : ow0 + cnt - 1;
#if defined(__AVX512F__) /* (two vectors of 16 channels: the compiler's own loops took 8 lanes) */
        for (int h = 0; h < 32; h += 16) {
            __m512 m = _mm512_loadu_ps(v + (c0 - ow0) * 32 + h);
            for (long c = c0 + 1; c <= c1; c++) {
                const __m512 r = _mm512_loadu_ps(v + (c - ow0) * 32 + h);
                m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(r, m, _CMP_GT_OQ) | _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q), r);
            }
            const __mmask16 mnan = _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
            for (long ph = ph0; ph <= ph1; ph++) {
                float* restrict a = acc + ((ph - pa) * POW + pw) * 32 + h;
                const __m512 av = _mm512_loadu_ps(a);
                _mm512_storeu_ps(a, _mm512_mask_mov_ps(av, _mm512_cmp_ps_mask(m, av, _CMP_GT_OQ) | mnan, m));
            }
        }
#else
        float m[32];
        for (long o = 0; o < 32; o++)
            m[o] = v[(c0 - ow0) * 32 + o];
        for (long c = c0 + 1; c <= c1; c++)
            for (long o = 0; o < 32; o++) {
                const float r = v[(c - ow0) * 32 + o];
                m[o] = ((r > m[o]) | (r != r)) ? r : m[o];
            }
        for (long ph = ph0; ph <= ph1; ph++) {
            float* restrict a = acc + ((ph - pa) * POW + pw) * 32;
            for (long o = 0; o < 32; o++)
                a[o] = ((m[o] > a[o]) | (m[o] != m[o])) ? m[o] : a[o];
        }
#endif
    }
}

/* Conv row oh (v: its OW pixels' 32 channels, after the epilogue) into the pool: for each pool
 * column the max over the columns of its window, into the max of each pool pixel of the column
 * whose window holds row oh (acc: the image's pool rows pa .. pb - 1). Two values' max is vmaxps's (the
 * first where it is larger, else the second: pool_run's order, the same results), which drops a
 * NaN: a row with a NaN or an infinity (`odd`) goes through pool_run instead, which keeps NaN as
 * the max pool keeps it. */
static void {{NAME}}_pool_row(const float* restrict v, float* restrict acc, long pa, long pb, long oh, int odd)
{
    {{NAME}}_DIMS;
    {{NAME}}_P;
    const long hl = oh + PPH - PKH + 1; /* (the first window that holds it: ceil(hl / PSH)) */
    const long ph0 = hl <= pa * PSH ? pa : (hl + PSH - 1) / PSH, ph1 = (oh + PPH) / PSH < pb - 1 ? (oh + PPH) / PSH : pb - 1;
#define {{NAME}}_FIRST_ROW(ph) (FIRST && ((ph) * PSH - PPH > 0 ? (ph) * PSH - PPH : 0) == oh) /* (row oh the window's first) */
#if defined(__AVX512F__)
    if (!odd) {
        for (long pw = 0; pw < POW; pw++) {
            const long s0 = pw * PSW - PPW, c0 = s0 > 0 ? s0 : 0, c1 = s0 + PKW < OW ? s0 + PKW : OW;
            for (int h = 0; h < 32 && c0 < c1; h += 16) {
                __m512 m = _mm512_loadu_ps(v + c0 * 32 + h);
                for (long c = c0 + 1; c < c1; c++)
                    m = _mm512_max_ps(_mm512_loadu_ps(v + c * 32 + h), m);
                for (long ph = ph0; ph <= ph1; ph++) {
                    float* restrict a = acc + ((ph - pa) * POW + pw) * 32 + h;
                    _mm512_storeu_ps(a, {{NAME}}_FIRST_ROW(ph) ? m : _mm512_max_ps(m, _mm512_loadu_ps(a)));
                }
            }
        }
        return;
    }
#endif
    for (long ph = ph0; ph <= ph1; ph++) /* (pool_run takes the maxima so far: -inf where this row is the first) */
        if ({{NAME}}_FIRST_ROW(ph))
            for (long e = 0; e < POW * 32; e++)
                acc[(ph - pa) * POW * 32 + e] = -INFINITY;
#undef {{NAME}}_FIRST_ROW
    (void)odd;
    {{NAME}}_pool_run(acc, pa, pb, v, oh, 0, OW);
}

/* a NaN or an infinity among the 32 floats at t */
static inline int {{NAME}}_odd(const float* restrict t)
{
#if defined(__AVX512DQ__)
    return (_mm512_fpclass_ps_mask(_mm512_loadu_ps(t), 0x99) | _mm512_fpclass_ps_mask(_mm512_loadu_ps(t + 16), 0x99)) != 0;
#else
    int odd = 0;
    for (int o = 0; o < 32; o++)
        odd |= !isfinite(t[o]);
    return odd;
#endif
}

/* The rows of the conv's output complete once the flat pixels below FEND are in the band (a
 * statement in _tiles): each into the pool ({{NAME}}_pool_row), the rows past OH dropped; then,
 * where the next item would not fit, the band's pixels not yet pooled (part of a row) moved to
 * its start. */
#define {{NAME}}_POOL_ROWS(FEND, OB)                                                               \
    do {                                                                                           \
        const long fend = (FEND) < F ? (FEND) : F;                                                 \
        for (; (prw + 1) * WQ <= fend && prw < jb->row1; prw++) {                                  \
            const long b = prw / HQ, oh = prw % HQ; /* (b: an epilogue's operands' image) */     \
            (void)b;                                                                               \
            float* restrict v = band + (prw * WQ - bf0) * 32;                                      \
            int odd = 0;                                                                           \
            for (long ow = 0; ow < OW && oh < OH; ow++) {                                          \
                const long j = oh * OW + ow;                                                       \
                {{NAME}}_EPI_PIXEL(v + ow * 32, v + ow * 32, (OB)); /* (in place; past O never read) */ \
                odd |= {{NAME}}_odd(v + ow * 32);                                                  \
                (void)j;                                                                           \
            }                                                                                      \
            if (oh < OH)                                                                           \
                {{NAME}}_pool_row(v, jb->acc, jb->pa, jb->pb, oh, odd);                           \
        }                                                                                          \
        if ((FEND) + 32 - bf0 > BANDP) {                                                           \
            memmove(band, band + (prw * WQ - bf0) * 32, sizeof(float) * 32 * (size_t)((FEND) - prw * WQ)); \
            bf0 = prw * WQ;                                                                        \
        }                                                                                          \
    } while (0)
#define {{NAME}}_STORE(R) /* (none pending: each item's tile goes into the pool when it is done) */
#elif {{NAME}}_PIXEL_STORE
/* The image (bs[p]) and output pixel (js[p]; -1: dropped) of each flat pixel of pixel block pb */
static void {{NAME}}_pixels(long pb, long* bs, long* js)
{
    {{NAME}}_DIMS;
    for (int p = 0; p < 32; p++) {
        const long f = pb * 32 + p, n = f / IMG, oh = f % IMG / WQ, ow = f % WQ;
        bs[p] = n, js[p] = f < F && oh < OH && ow < OW ? oh * OW + ow : -1;
    }
}

/* The pending item's pixels from prow up to R (a statement in _tiles): each pixel's 32 channels
 * through the epilogue, then VL at a time into their block's plane ([N][O / VL][OH][OW][VL]) */
#define {{NAME}}_STORE(R)                                                                          \
    for (const long r_end = (R); prow < r_end; prow++) {                                           \
        const long b = pbs[prow], j = pjs[prow];                                                   \
        if (j < 0)                                                                                 \
            continue;                                                                              \
        {{NAME}}_EPI_PIXEL(lane, prev + prow * 32, pob);                                           \
        for (long h = 0; h < 32 && pob * 32 + h < O; h += {{NAME}}_VL)                             \
            memcpy(bout + ((b * (O / {{NAME}}_VL) + (pob * 32 + h) / {{NAME}}_VL) * (long)OH * OW + j) * {{NAME}}_VL, \
                   lane + h, sizeof(float) * {{NAME}}_VL);                                         \
    }
#else
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

/* dst[0 .. cnt) = t[0 .. cnt), cnt <= 32 (8 lanes a store: the width the epilogue's loop wrote t in,
 * so that each load is forwarded from one store) */
static inline void {{NAME}}_put(float* restrict dst, const float* restrict t, long cnt)
{
#if defined(__AVX512F__) && defined(__AVX512VL__)
    for (int k = 0; k < 32 && k < cnt; k += 8)
        _mm256_mask_storeu_ps(dst + k, (__mmask8)(cnt - k >= 8 ? 0xffu : (1u << (cnt - k)) - 1u), _mm256_loadu_ps(t + k));
#else
    memcpy(dst, t, sizeof(float) * (size_t)cnt);
#endif
}

/* c[32 pixels][32 channels] -> t[32 channels][32 pixels] */
static inline void {{NAME}}_transpose(const float* restrict c, float* restrict t)
{
#if defined(__AVX512F__)
    for (int pi = 0; pi < 32; pi += 16)
        for (int oi = 0; oi < 32; oi += 16) {
            __m512i r[16];
            for (int p = 0; p < 16; p++)
                r[p] = _mm512_load_si512((const void*)(c + (pi + p) * 32 + oi));
            {{NAME}}_tr16(r);
            for (int o = 0; o < 16; o++)
                _mm512_store_si512((void*)(t + (oi + o) * 32 + pi), r[o]);
        }
#else
    for (int p = 0; p < 32; p++)
        for (int o = 0; o < 32; o++)
            t[o * 32 + p] = c[p * 32 + o];
#endif
}

/* The pending epilogue's rows (NCHW) from prow up to R (a statement in _tiles). A run that ends 32 or
 * more pixels before its plane does: the epilogue of 32 lanes from j0 (whole vectors; an operand
 * read per pixel is read inside its plane, the lanes past the run dropped), then the run's lanes
 * stored ({{NAME}}_put); the others lane by lane. */
#define {{NAME}}_STORE(R)                                                                          \
    for (const long r_end = (R); prow < r_end; prow++)                                              \
        for (int u = 0; u < nruns; u++) {                                                          \
            const long b = runs[u].n, i = pob * 32 + prow, j0 = runs[u].j0, cnt = runs[u].cnt;     \
            const float* restrict src = prev + prow * 32 + runs[u].q;                              \
            float* restrict dst = out + (b * O + i) * (long)OH * OW + j0;                          \
            if (j0 + 32 <= (long)OH * OW) {                                                        \
                _Pragma("omp simd") for (long e = 0; e < 32; e++) {                                \
                    const long j = j0 + e;                                                         \
                    const float acc = src[e];                                                      \
                    lane[e] = {{EPILOGUE}};                                                   \
                    (void)j;                                                                       \
                }                                                                                  \
                {{NAME}}_put(dst, lane, cnt);                                                      \
            } else                                                                                 \
                _Pragma("omp simd") for (long e = 0; e < cnt; e++) {                               \
                    const long j = j0 + e;                                                         \
                    const float acc = src[e];                                                      \
                    dst[e] = {{EPILOGUE}};                                                    \
                    (void)j;                                                                       \
                }                                                                                  \
            (void)b;                                                                               \
        }

#endif

/* Items (channel block ob, pixel block pb) in PIXEL_MAJOR's order: 32 flat pixels x 32 output
 * channels each, in groups of up to G items of one channel block. K goes in slices of KCB blocks (the
 * slice's B tiles, KCB x 32 x 32 bf16, stay in L1 while the group's pixel blocks use them), each
 * item's C tiles kept between slices in part[]. After its last slice an item's tiles go,
 * transposed, into one of two buffers, and its epilogue runs during the next items' products, a
 * share of its rows after each K block (the vector units store while the tile unit multiplies);
 * the range's last item's at the end. */
static void {{NAME}}_tiles(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    enum { KCB = {{NAME}}_KCB, G = {{NAME}}_G };
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const uint16_t* restrict xq = jb->xq;
    const uint16_t* restrict wq = jb->wq;
    long off[NT]; /* each tap's offset from its output pixel's row of the copy, in bf16 (FOLD: a kernel row's) */
    for (long t = 0; t < NT; t++) {
        const long kh = FOLD ? t : t / KW, kw = FOLD ? 0 : t % KW;
        off[t] = OVERLAP ? t * (long)WP * C2 : ((kh % SH * QW + kw % SW) * (long)PHASE + kh / SH * WQ + kw / SW) * KCP;
    }
    float stage[32 * 32] __attribute__((aligned(64))); /* an item's C tiles, pixel-major */
    float tiles[2][32 * 32 + 32] __attribute__((aligned(64))); /* (+ 32: a run's 32 lanes read past the last row) */
    float lane[32] __attribute__((aligned(64)));                 /* a run's epilogue */
    float part[G][32 * 32] __attribute__((aligned(64)));
#if {{NAME}}_OUT_COPY
    uint16_t* ydst[32]; /* the pending item's pixels' rows in the next conv's copy */
    long ybs[32], yjs[32];
#elif {{NAME}}_PIXEL_STORE
    long pbs[32], pjs[32]; /* the pending item's pixels' images and output pixels */
    float* restrict bout = {{NAME}}_STAGED ? jb->stg : out; /* (the blocks: the output's, or the staged copy's) */
#elif {{NAME}}_OUT_POOL
    {{NAME}}_P;
    float* restrict band = jb->band;
    long bf0 = lo % NPB * 32, prw = jb->row0; /* the band's first flat pixel, the next flat row to pool */
#else
    {{NAME}}_run runs[32 / WQ + 3];
    int nruns = 0;                         /* the pending epilogue: its runs, */
#endif
    int done = 0;
    long prow = 32, pob = 0, prows = 0;     /* its next row, channel block and rows */
    const float* restrict prev = tiles[0];
    const long per = (32 + KCB - 1) / KCB; /* pending rows stored per K block */
#if {{NAME}}_OVERLAP /* (A tiles of KW x C2 values a row, B tiles of KW x C2 / 2 K-pairs) */
    _tile_loadconfig(&{{NAME}}_CFG);
#else
    eqf_amx_begin(); /* (in each range: the tile configuration is a thread's) */
#endif
    for (long g0 = lo; g0 < hi;) {
#if {{NAME}}_PIXEL_MAJOR /* item g: group g / (NOB G) of G pixel blocks, channel block g / G % NOB, block g % G of the group */
        const long ob = g0 / G % NOB, pb0 = g0 / (NOB * G) * G + g0 % G;
        const long step = hi - g0 < G - g0 % G ? hi - g0 : G - g0 % G;
#else /* item g: channel block g / NPB, pixel block g % NPB */
        const long ob = g0 / NPB, pb0 = g0 % NPB;
        const long step = hi - g0 < G ? (hi - g0 < NPB - pb0 ? hi - g0 : NPB - pb0) : (G < NPB - pb0 ? G : NPB - pb0);
#endif
        /* the group: the step's items, all of channel block ob, whose pixel blocks are below NPB */
        const long ng = step < NPB - pb0 ? step : NPB - pb0 > 0 ? NPB - pb0 : 0;
        const uint16_t* restrict b0 = wq + 2 * ob * (long)NKB * 512, *restrict b1 = b0 + (long)NKB * 512;
        for (long k0 = 0; k0 < NKB; k0 += KCB) {
            const long k1 = k0 + KCB < NKB ? k0 + KCB : NKB;
            for (long q = 0; q < ng; q++) {
#if {{NAME}}_OVERLAP /* the block's two tiles of 16 pixels, each in one output row; a tap moves them WP pixels */
                const long f0 = (pb0 + q) * 32, f1 = f0 + 16 < F ? f0 + 16 : f0; /* (past F: the first again, dropped) */
                const uint16_t* restrict a = xq + ((f0 / IMG * HP + f0 % IMG / WQ * SH) * (long)WP + f0 % WQ * SW) * C2;
                const uint16_t* restrict a5 = xq + ((f1 / IMG * HP + f1 % IMG / WQ * SH) * (long)WP + f1 % WQ * SW) * C2;
                enum { ASTRIDE = SW * C2 * 2 /* bytes between a tile's rows */ };
#else
                const uint16_t* restrict a = xq + (pb0 + q) * 32 * (long)KCP, *restrict a5 = a + 16 * KCP;
                enum { ASTRIDE = 2 * KCP };
#endif
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
                    const long ak = off[kb / CB] + kb % CB * 32;
                    _tile_loadd(4, a + ak, ASTRIDE);
                    _tile_loadd(5, a5 + ak, ASTRIDE);
                    _tile_loadd(6, b0 + kb * 512, 64);
                    _tile_loadd(7, b1 + kb * 512, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                    {{NAME}}_STORE(prow + per < prows ? prow + per : prows);
                }
#if {{NAME}}_OUT_POOL
                float* restrict c = k1 < NKB ? part[q] : band + ((pb0 + q) * 32 - bf0) * 32;
#else
                float* restrict c = k1 < NKB ? part[q] : {{NAME}}_OUT_COPY || {{NAME}}_PIXEL_STORE ? tiles[done & 1] : stage;
#endif
                _tile_stored(0, c, 128);
                _tile_stored(1, c + 16, 128);
                _tile_stored(2, c + 16 * 32, 128);
                _tile_stored(3, c + 16 * 32 + 16, 128);
                EQF_AMX_FENCE();
                if (k1 == NKB) { /* the item is done: its epilogue pending, the last one's finished first */
                    {{NAME}}_STORE(prows);
#if {{NAME}}_OUT_COPY /* (the tiles went into the buffer pixel-major: a pixel's channels, a row of the copy) */
                    {{NAME}}_ylanes(pb0 + q, (uint16_t*)out, ydst, ybs, yjs);
                    prows = 32;
#elif {{NAME}}_PIXEL_STORE /* (pixel-major as well: a pixel's channels, VL of them a store) */
                    {{NAME}}_pixels(pb0 + q, pbs, pjs);
                    prows = 32;
#elif {{NAME}}_OUT_POOL
                    {{NAME}}_POOL_ROWS((pb0 + q + 1) * 32, ob);
                    prows = 0;
#else
                    {{NAME}}_transpose(stage, tiles[done & 1]);
                    nruns = {{NAME}}_runs(pb0 + q, runs);
                    prows = O - ob * 32 < 32 ? O - ob * 32 : 32;
#endif
                    prev = tiles[done & 1];
                    pob = ob, prow = 0;
                    done++;
                }
            }
        }
        g0 += step;
    }
    {{NAME}}_STORE(prows);
    (void)per, (void)prev, (void)lane, (void)stage, (void)prow, (void)pob, (void)prows; /* (OUT_POOL: no pending epilogue) */
    _tile_release();
}

#if {{NAME}}_OUT_POOL
/* Pool rows [lo, hi) of the max pool's output (t = n POH + ph), every channel block: per image, the
 * conv's rows those rows' windows read (the rows at a range's edges computed by both ranges:
 * the maxima are a range's own), then per channel block its items over those rows (_tiles) and
 * the range's maxima into the output. A thread's range is a range of pixels, as its range of the
 * copy's rows (each thread's tiles read the copy from its own core's caches). */
static void {{NAME}}_tiles_pool(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_P;
    {{NAME}}_job* jb = job;
    {{NAME}}_job jp = *jb;
    {{PARAM_UNPACK}}
    const long P = (long)POH * POW;
    jp.band = eqf_scratch(EQF_SCRATCH_GEMM_A, (long)BANDP * 32);
    for (long t = lo; t < hi;) {
        const long n = t / POH, pa = t % POH, pb = hi - n * POH < POH ? hi - n * POH : POH;
        const long ra = pa * PSH - PPH > 0 ? pa * PSH - PPH : 0; /* (the conv rows of pool rows [pa, pb)) */
        const long rb = (pb - 1) * PSH - PPH + PKH < OH ? (pb - 1) * PSH - PPH + PKH : OH;
        float* restrict acc = eqf_scratch(EQF_SCRATCH_CONV_TILE, (pb - pa) * POW * 32);
        if (!acc || !jp.band) {
            __atomic_store_n(&jb->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        jp.acc = acc, jp.pa = pa, jp.pb = pb, jp.row0 = n * HQ + ra, jp.row1 = n * HQ + rb;
        const long p0 = pa * POW, np = (pb - pa) * POW; /* (the range's pool pixels) */
        for (long ob = 0; ob < NOB; ob++) {
            for (long e = 0; e < (FIRST ? 0 : np * 32); e++)
                acc[e] = -INFINITY;
            {{NAME}}_tiles(&jp, ob * NPB + jp.row0 * WQ / 32, ob * NPB + (jp.row1 * WQ + 31) / 32);
            const long nc = O - ob * 32 < 32 ? O - ob * 32 : 32;
#if {{NAME}}_OUT_BLOCKED /* (each pool pixel's channels VL at a time into their block's plane) */
            for (long px = 0; px < np; px++) /* (each pixel's channels read once, in order) */
                for (long h = 0; h < nc; h += {{NAME}}_VL)
                    memcpy(out + ((n * (O / {{NAME}}_VL) + (ob * 32 + h) / {{NAME}}_VL) * P + p0 + px) * {{NAME}}_VL,
                           acc + px * 32 + h, sizeof(float) * {{NAME}}_VL);
            continue;
#endif
            float* restrict on = out + (n * O + ob * 32) * P + p0;
            long px = 0;
#if defined(__AVX512F__)
            for (; px + 16 <= np; px += 16) /* 16 pool pixels x 16 channels at a time */
                for (int ch = 0; ch < 32 && ch < nc; ch += 16) {
                    __m512i r[16];
                    for (int p = 0; p < 16; p++)
                        r[p] = _mm512_loadu_si512((const void*)(acc + (px + p) * 32 + ch));
                    {{NAME}}_tr16(r);
                    for (int c = 0; c < 16 && ch + c < nc; c++)
                        _mm512_storeu_si512((void*)(on + (ch + c) * P + px), r[c]);
                }
#endif
            for (; px < np; px++)
                for (long c = 0; c < nc; c++)
                    on[c * P + px] = acc[px * 32 + c];
        }
        t = n * POH + pb;
    }
}
#endif

#if {{NAME}}_STAGED
/* Rows (n, channel block cb of VL, oh) of the staged output, [N][O / VL][OH][OW][VL], into NCHW:
 * 16 pixels x 16 channels at a time, transposed in registers */
static void {{NAME}}_unstage(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    enum { VL = {{NAME}}_VL };
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    for (long row = lo; row < hi; row++) {
        const long oh = row % OH, cb = row / OH % (O / VL), n = row / OH / (O / VL);
        const float* restrict s = jb->stg + row * (long)OW * VL;
        float* restrict d = out + ((n * O + cb * VL) * (long)OH + oh) * OW; /* (channel l of the block: + l OH OW) */
        long ow = 0;
#if defined(__AVX512F__)
        if (VL == 16)
            for (; ow < OW; ow += 16) {
                const long np = OW - ow < 16 ? OW - ow : 16;
                __m512i r[16];
                for (int p = 0; p < 16; p++)
                    r[p] = p < np ? _mm512_loadu_si512((const void*)(s + (ow + p) * 16)) : _mm512_setzero_si512();
                {{NAME}}_tr16(r);
                for (int l = 0; l < 16; l++)
                    _mm512_mask_storeu_epi32(d + l * (long)OH * OW + ow, (__mmask16)((1u << np) - 1u), r[l]);
            }
#endif
        for (; ow < OW; ow++)
            for (long l = 0; l < VL; l++)
                d[l * (long)OH * OW + ow] = s[ow * VL + l];
    }
}
#endif

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_DIMS;
    if (!eqf_amx_ready()) { /* the tile state refused (common_amx.h): no tile instruction runs */
        eqf_fail_note(EQF_NO_AMX);
        return;
    }
#if {{NAME}}_IN_COPY
    uint16_t* xq = (uint16_t*){{X}}; /* (the copy its producer wrote) */
#if {{NAME}}_SIBLING /* (the plane of another conv's copy that holds this one's pixels) */
    {{NAME}}_S;
    xq += (long)SPLANE * SPHASE * KCP;
#endif
#else
    uint16_t* xq = (uint16_t*)eqf_scratch(EQF_SCRATCH_CONV_COL, ((OVERLAP ? (long)N * HP * WP * C2 : (long)QH * QW * PHASE * KCP) + 1) / 2);
#endif
#if {{NAME}}_PREPACKED
    const uint16_t* wq = (const uint16_t*){{WEIGHTS}}; /* the B tiles {{NAME}}_prepack made once */
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
#if {{NAME}}_STAGED
    float* stg = eqf_scratch(EQF_SCRATCH_GEMM_A, (long)N * O * OH * OW);
    if (!stg) {
        eqf_nomem_note();
        return;
    }
#else
    float* stg = NULL;
#endif
    {{NAME}}_job job = { {{PARAM_INIT}}, xq, wq, NULL, NULL, stg, 0, 0, 0, 0, 0 };
#if !{{NAME}}_IN_COPY
#if {{NAME}}_OVERLAP
    eqf_region((long)N * HP, {{NAME}}_copy_image, &job, {{NAME}}_PARALLEL);
#else
    eqf_region((long)QH * QW * N * HQ, {{NAME}}_copy_rows, &job, {{NAME}}_PARALLEL);
#endif
#endif
#if {{NAME}}_OUT_COPY
    {
        {{NAME}}_Y;
        eqf_region((long)YQH * YQW * N * YHQ, {{NAME}}_yzero, &job, {{NAME}}_PARALLEL);
    }
#endif
#if {{NAME}}_OUT_POOL
    { /* ranges of pool rows, one a thread (no two threads write one pool pixel; each range computes
       * its edge rows of the conv again: more ranges than threads ran no faster on two threads,
       * `python benchmarks/bench_models.py --precision bf16 --model resnet_stages`; benchmarks/RESULTS.md,
       * 2026-12-04) */
        {{NAME}}_P;
        eqf_region_n((long)N * POH, {{NAME}}_tiles_pool, &job, {{NAME}}_PARALLEL, eqf_region_request > 1 ? eqf_region_request : 1);
    }
    if (job.failed)
        eqf_nomem_note();
#else
    eqf_region_n({{NAME}}_PIXEL_MAJOR ? (long)(NPB + {{NAME}}_G - 1) / {{NAME}}_G * NOB * {{NAME}}_G : (long)NOB * NPB,
                 {{NAME}}_tiles, &job, {{NAME}}_PARALLEL, {{NAME}}_CHUNKS);
#endif
#if {{NAME}}_STAGED
    eqf_region((long)N * (O / {{NAME}}_VL) * OH, {{NAME}}_unstage, &job, {{NAME}}_PARALLEL);
#endif
}

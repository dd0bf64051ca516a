#define {{NAME}}_CB {{CB}} /* the plan's cb: input channels per block of the padded copy */
#define {{NAME}}_VL {{VL}} /* the plan's vl: floats per vector */
#define {{NAME}}_V {{V}} /* the plan's v: vectors per output-channel block */
#define {{NAME}}_OBW {{OBW}} /* the plan's obw: output channels per block, V x VL */
#define {{NAME}}_RW {{RW}} /* the plan's rw: output pixels per register tile */
#define {{NAME}}_ROWS {{ROWS}} /* the plan's rows: a tile's pixels in one output row */
#define {{NAME}}_IN_BLOCKED {{IN_BLOCKED}} /* the plan's in_blocked: the input in blocks of VL channels */
#define {{NAME}}_OUT_BLOCKED {{OUT_BLOCKED}} /* the plan's out_blocked: the output in blocks of VL channels */
#define {{NAME}}_INPLACE {{INPLACE}} /* the plan's in_place: the blocked input read where it is */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b: the weights blocked once (params=) */
#define {{NAME}}_EPI_BLOCKED {{EPI_BLOCKED}} /* the plan's epi_blocked: the epilogue reads operands in blocks */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_CHUNKS {{CHUNKS}} /* the plan's region_chunks: equal ranges of the tiles' loop on the pool */
#define {{NAME}}_BF16 {{BF16}} /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16 */
/* {{NAME}}: direct conv2d, {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{C}}x{{KH}}x{{KW}}, stride {{SH}}x{{SW}},
 * padding {{PH}}x{{PW}} -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out), the epilogue fused into the store.
 *
 * Layouts inside the kernel (eqfuse.backend.conv_direct):
 * - the input, zero padded, in channel blocks of CB: xp[N][NCB][HP][WP][CB] (CB = {{CB}}), made at
 *   each call (scratch); every tap then reads a pixel's CB channels from one cache line and the
 *   register tile needs no bounds checks;
 * - the weights in output-channel blocks of OBW = V x VL ({{V}} x {{VL}}):
 *   w[NOB][NCB][KH][KW][CB][OBW], zero padded; made once by {{NAME}}_prepack when bound by
 *   params= (PREPACKED {{PREPACKED}}), else at each call.
 * The register tile: RW = {{RW}} output pixels (consecutive in n, oh, ow order, so a tile may span
 * rows and images: a 2x2 map of two images is one tile of 8) x OBW output channels, RW x V vector
 * accumulators; per input channel one weight vector load per V and one broadcast per pixel.
 * Threads share the (channel block, pixel tile) pairs, channel blocks outermost (each thread
 * then streams its own share of the weights).
 * Between two direct convs (IN_BLOCKED {{IN_BLOCKED}}, OUT_BLOCKED {{OUT_BLOCKED}}) the tensor is kept in
 * blocks of VL channels, [N][C / VL][H][W][VL]: the producer stores the tile's vectors as they
 * are, the consumer copies rows of blocks into its padded copy. An epilogue operand of the
 * output's shape may be in blocks too (a residual, eqfuse.backend.conv_blocked): it is read at
 * `blk`, the output element's offset in that layout.
 * BF16 ({{BF16}}; precision="bf16", docs/precision.md): the padded copy and the weights hold bf16
 * (the copy rounds the input as it makes it; the prepack rounds the weights once), and the
 * weights are K-pairs, w[NOB][NCB][KH][KWC / 2][OBW][2]: the (kw, ci) steps of a kernel row two at
 * a time, both in one 32-bit lane (an odd row's last step alone); the register tile accumulates
 * in f32 and the epilogue is f32. 2 = vdpbf16ps (AVX512_BF16); 1 = the fallback: the pairs widened to f32 by a shift and
 * a mask, two FMAs (the same bf16 operands). Never INPLACE (the input is converted by the copy). */
#define {{NAME}}_REORDER {{REORDER}} /* the plan's reorder: NCHW stored in blocks, then reordered */
#define {{NAME}}_DIMS                                                                              \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}},   \
           OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, CB = {{CB}},                  \
           NCB = (C + CB - 1) / CB, HP = (OH - 1) * SH + KH, WP = (OW - 1) * SW + KW, VL = {{VL}},        \
           V = {{V}}, OBW = {{OBW}} /* V x VL */, NOB = (O + OBW - 1) / OBW, RW = {{RW}}, P = OH * OW,                   \
           NP = N * P, ROWS = {{ROWS}}, TR = (OW + RW - 1) / RW, NT = ROWS ? N * OH * TR : (NP + RW - 1) / RW,  \
           KWC = {{BF16}} ? (KW * CB + 1) / 2 * 2 : KW * CB /* a kernel row's weight rows (bf16: whole pairs) */ }
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */
#if {{BF16}}
#if {{BF16}} == 2 && !(defined(__AVX512BF16__) && {{VL}} == 16)
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif
#if {{BF16}} == 2
#include <immintrin.h>
#endif
typedef uint32_t {{NAME}}_vp __attribute__((vector_size({{VL}} * 4), aligned(4))); /* VL bf16 K-pairs */
typedef uint16_t {{NAME}}_xt; /* an element of the padded copy and of the blocked weights */
#define {{NAME}}_CVT(x) eqf_bf16(x)
#else
typedef float {{NAME}}_xt;
#define {{NAME}}_CVT(x) (x)
#endif

long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_DIMS;
    return (long)NOB * NCB * KH * KWC * OBW / ({{BF16}} ? 2 : 1); /* (bf16: halves) */
}

/* OIHW weights -> w[NOB][NCB][KH][KW][CB][OBW], zero padded in both channel counts. */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wf)
{
    {{NAME}}_DIMS;
    {{NAME}}_xt* restrict wp = ({{NAME}}_xt*)wf;
#if {{BF16}}
    if (KW * CB % 2) /* (an odd kernel row: its last pair's high halves are zero) */
        for (long row = 0; row < (long)NOB * NCB * KH; row++)
            for (long oo = 0; oo < OBW; oo++)
                wp[(row * KWC + KWC - 2) * OBW + 2 * oo + 1] = 0;
#endif
    for (long ob = 0; ob < NOB; ob++)
        for (long cb = 0; cb < NCB; cb++)
            for (long kh = 0; kh < KH; kh++)
                for (long kw = 0; kw < KW; kw++)
                    for (long ci = 0; ci < CB; ci++) {
                        const long c = cb * CB + ci;
#if {{BF16}} /* step t = kw x CB + ci of the kernel row: pair t / 2, half t % 2 of each channel's lane */
                        const long t = kw * CB + ci;
                        {{NAME}}_xt* restrict dst = wp + ((((ob * NCB + cb) * KH + kh) * KWC + t / 2 * 2) * OBW) + t % 2;
                        for (long oo = 0; oo < OBW; oo++) {
                            const long o = ob * OBW + oo;
                            dst[2 * oo] = eqf_bf16((o < O && c < C) ? wt[((o * C + c) * KH + kh) * KW + kw] : 0.0f);
                        }
#else
                        float* restrict dst = wp + ((((ob * NCB + cb) * KH + kh) * KW + kw) * CB + ci) * OBW;
                        for (long oo = 0; oo < OBW; oo++) {
                            const long o = ob * OBW + oo;
                            dst[oo] = (o < O && c < C) ? wt[((o * C + c) * KH + kh) * KW + kw] : 0.0f;
                        }
#endif
                    }
}

/* One row (n, cb, hp) of the padded, channel-blocked input: the CB input rows read side by
 * side, each pixel's CB channels written together. */
static inline void {{NAME}}_pad_row(const float* restrict x, {{NAME}}_xt* restrict xp, long row)
{
    {{NAME}}_DIMS;
    const long hp = row % HP, cb = row / HP % NCB, n = row / HP / NCB, ih = hp - PH;
    const long cn = C - cb * CB < CB ? C - cb * CB : CB; /* channels of this block (a last one may be short) */
    const long iw1 = W < WP - PW ? W : WP - PW;         /* input columns read (a stride may skip the last) */
    {{NAME}}_xt* restrict dst = xp + row * WP * CB;
    if (ih < 0 || ih >= H || iw1 <= 0) {
        memset(dst, 0, sizeof({{NAME}}_xt) * WP * CB);
        return;
    }
    memset(dst, 0, sizeof({{NAME}}_xt) * PW * CB);
    if (WP > PW + iw1)
        memset(dst + (PW + iw1) * CB, 0, sizeof({{NAME}}_xt) * (WP - PW - iw1) * CB);
    {{NAME}}_xt* restrict d = dst + PW * CB;
#if {{IN_BLOCKED}}
    /* the input in blocks of CB channels already ([N][C / CB][H][W][CB], made by the conv that
     * produced it): a row of the block is the padded row's interior */
    (void)cn;
#if {{BF16}}
    {
        const float* restrict s = x + ((n * NCB + cb) * H + ih) * (long)W * CB;
        long q = 0;
#if {{BF16}} == 2 /* (a pixel's CB = VL = 16 channels: one vcvtneps2bf16) */
        for (; q < iw1 * CB; q += 16)
            _mm256_storeu_si256((__m256i*)(d + q), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + q)));
#endif
        for (; q < iw1 * CB; q++)
            d[q] = eqf_bf16(s[q]);
    }
#else
    memcpy(d, x + ((n * NCB + cb) * H + ih) * (long)W * CB, sizeof(float) * iw1 * CB);
#endif
    return;
#endif
    const float* restrict src = x + ((n * C + cb * CB) * H + ih) * W;
    if (cn == CB) {
        for (long iw = 0; iw < iw1; iw++)
#pragma GCC unroll 16
            for (long ci = 0; ci < CB; ci++)
                d[iw * CB + ci] = {{NAME}}_CVT(src[ci * (long)H * W + iw]);
    } else {
        for (long iw = 0; iw < iw1; iw++)
            for (long ci = 0; ci < CB; ci++)
                d[iw * CB + ci] = {{NAME}}_CVT(ci < cn ? src[ci * (long)H * W + iw] : 0.0f);
    }
}

/* tile[RW][OBW] = the RW pixels at xoff (offsets into xp) . one channel block's weights w. */
/* (no predictive commoning, no partial redundancy elimination: along a row, pixel r + 1 at tap kw
 * is pixel r at kw + 1 (at step t + SW x CB of the unrolled loop), and gcc would carry those values
 * between steps in registers the accumulators need, spilling them: with PRE, a 3x3 stride-2 conv
 * of 16 -> 32 channels at 16 x 16 spent most of its time on spills: benchmarks/bench_conv.py
 * --set resnet18, row "l2 16->32 3x3/2 @16") */
__attribute__((optimize("no-predictive-commoning", "no-tree-pre")))
/* The input: kernel row kh (kh0 <= kh < kh1: the rows inside the image) of channel block cb at
 * xb + cb x bs + (kh - kh0) x rs, plus xoff[r] for pixel r (ROWS: xoff[0] + r x SW x CB). */
static inline void {{NAME}}_tile(const {{NAME}}_xt* restrict xb, long bs, long rs, int kh0, int kh1,
                                 const long* restrict xoff, const {{NAME}}_xt* restrict w, float* restrict tile)
{
    {{NAME}}_DIMS;
    {{NAME}}_vf acc[RW][V];
#pragma GCC unroll 32
    for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            acc[r][v] = ({{NAME}}_vf){0};
    /* For one input-channel block and kernel row, the (kw, ci) pairs of a pixel are KW x CB
     * consecutive floats of the padded copy, and their weights KW x CB consecutive OBW-vectors:
     * one loop over both (a 7x7 stem of 3 channels: 21 steps per kernel row, not 7 of 3). */
    for (int cb = 0; cb < NCB; cb++)
        for (int kh = kh0; kh < kh1; kh++) {
            const {{NAME}}_xt* restrict xk = xb + cb * bs + (kh - kh0) * rs;
            if (ROWS && (kh + 1 < kh1 || cb + 1 < NCB)) {
                /* the next kernel row's window into L1 while this one computes: a tile's input is
                 * short runs of lines that the hardware prefetcher misses (resnet_stages:
                 * benchmarks/bench_models.py --model resnet_stages) */
                const {{NAME}}_xt* nx = (kh + 1 < kh1 ? xk + rs : xb + (cb + 1) * bs) + xoff[0];
                for (int q = 0; q < ((RW - 1) * SW + KW) * CB; q += 64 / (int)sizeof({{NAME}}_xt))
                    __builtin_prefetch(nx + q);
            }
            const {{NAME}}_xt* restrict wk = w + ((long)cb * KH + kh) * KWC * OBW;
            /* ROWS: the tile's pixels are one output row's, SW x CB floats apart (constant
             * displacements from one pointer); else each its own pointer */
            const {{NAME}}_xt* px[RW];
#pragma GCC unroll 32
            for (int r = 0; r < RW; r++)
                px[r] = xk + (ROWS ? xoff[0] + r * SW * CB : xoff[r]);
/* (16 steps unrolled. Unrolled whole, 48 steps, a 3x3 conv at 64 channels and 56 x 56 was
 * slightly faster (the loop's exit branch mispredicted once per kernel row and channel block), but
 * gcc took several times as long to compile one such conv, and those convs run as Winograd now
 * (conv_winograd.c); the stem and the stride-2 convs left here measured within the noise) */
#if {{BF16}}
            /* KW x CB / 2 K-pairs: V vectors of VL pairs, one broadcast pair per pixel */
#pragma GCC unroll 16
            for (int t2 = 0; t2 < KW * CB / 2; t2++) {
                {{NAME}}_vp wv[V];
#pragma GCC unroll 8
                for (int v = 0; v < V; v++) {
                    wv[v] = *(const {{NAME}}_vp*)(wk + (t2 * OBW + v * VL) * 2);
#if defined(__x86_64__) && (defined(__AVX512F__) || ({{VL}} <= 8 && defined(__AVX__)) || {{VL}} <= 4)
                    __asm__("" : "+v"(wv[v])); /* in a register (as below) */
#endif
                }
#pragma GCC unroll 32
                for (int r = 0; r < RW; r++) {
                    uint32_t a;
                    memcpy(&a, px[r] + 2 * t2, 4);
#pragma GCC unroll 8
                    for (int v = 0; v < V; v++)
                        acc[r][v] = EQF_DP_BF16({{BF16}}, {{VL}}, acc[r][v], a, wv[v]);
                }
            }
            if (KW * CB % 2) { /* an odd kernel row (a stem's 3 channels x 7): its last step alone, the
                                * bf16 operands widened (exact) and one FMA, not a pair whose other
                                * half would multiply the next pixel's value by a zero weight */
                {{NAME}}_vf wl[V];
#pragma GCC unroll 8
                for (int v = 0; v < V; v++)
                    wl[v] = ({{NAME}}_vf)(*(const {{NAME}}_vp*)(wk + ((KWC / 2 - 1) * OBW + v * VL) * 2) << 16);
#pragma GCC unroll 32
                for (int r = 0; r < RW; r++) {
                    const float a = eqf_bf16_f32(px[r][KW * CB - 1]);
#pragma GCC unroll 8
                    for (int v = 0; v < V; v++)
                        acc[r][v] += a * wl[v];
                }
            }
#else
#pragma GCC unroll 16
            for (int t = 0; t < KW * CB; t++) {
                {{NAME}}_vf wv[V];
#pragma GCC unroll 8
                for (int v = 0; v < V; v++) {
                    wv[v] = *(const {{NAME}}_vfu*)(wk + t * OBW + v * VL);
#if defined(__x86_64__) && (defined(__AVX512F__) || ({{VL}} <= 8 && defined(__AVX__)) || {{VL}} <= 4) /* (a vector register holds it) */
                    /* in a register: gcc would otherwise fold the load into each of the RW
                     * FMAs that read it (RW x V loads instead of V) */
                    __asm__("" : "+v"(wv[v]));
#endif
                }
#pragma GCC unroll 32
                for (int r = 0; r < RW; r++) {
                    const float a = px[r][t];
#pragma GCC unroll 8
                    for (int v = 0; v < V; v++)
                        acc[r][v] += a * wv[v];
                }
            }
#endif
        }
#pragma GCC unroll 32
    for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            *({{NAME}}_vfu*)(tile + r * OBW + v * VL) = acc[r][v];
}

/* INPLACE {{INPLACE}}: the input in blocks already ([N][NCB][H][W][CB]) is read where it is, tile
 * by tile along output rows; the kernel rows outside the image are skipped. A tile column whose
 * window crosses the image's left or right edge (the EL first and the TR - ER last, a short tile
 * at a row's end among them) reads an edge strip instead: its window's columns of every input row,
 * zero outside the image, s[NE][N][NCB][H][WL][CB], made once per call and shared by the
 * output-channel blocks and the threads (a copy of the window per tile was slower on a 3x3 conv
 * at 28 x 28, where half the tiles are at an edge: benchmarks/bench_conv.py --set resnet56). */
enum { {{NAME}}_WL = ({{RW}} - 1) * {{SW}} + {{KW}} /* a ROWS tile's window width */, {{NAME}}_EL = {{EDGE_L}},
       {{NAME}}_ER = {{EDGE_R}}, {{NAME}}_NE = {{EDGE_L}} + ({{OW}} + {{RW}} - 1) / {{RW}} - {{EDGE_R}} };
static inline void {{NAME}}_strip_row(const float* restrict x, float* restrict s, long row)
{
    {{NAME}}_DIMS;
    enum { WL = {{NAME}}_WL, EL = {{NAME}}_EL, ER = {{NAME}}_ER };
    const long ih = row % H, cb = row / H % NCB, n = row / H / NCB % N, e = row / ((long)N * NCB * H);
    const long tr = e < EL ? e : ER + e - EL, iw0 = tr * RW * SW - PW;
    const long c0 = iw0 < 0 ? -iw0 : 0, c1 = W - iw0 < WL ? W - iw0 : WL; /* window columns inside */
    {{NAME}}_vf* restrict d = ({{NAME}}_vf*)(s + row * WL * CB);
    const float* restrict src = x + ((n * NCB + cb) * H + ih) * (long)W * CB;
    /* (a pixel's CB = VL channels: one vector; inline rather than libc calls) */
    for (long c = 0; c < WL; c++)
        d[c] = c >= c0 && c < c1 ? *(const {{NAME}}_vfu*)(src + (iw0 + c) * CB) : ({{NAME}}_vf){0};
}

{{REORDER_FN}}

/* The call's job, read by the ranges of its parallel loops (common_pool.h, eqf_region): the
 * kernel's arguments and its buffers. */
typedef struct {
    {{PARAM_FIELDS}}
    {{NAME}}_xt* xp;
    float* es;
    float* ys;
    const {{NAME}}_xt* w;
} {{NAME}}_job;

/* rows [lo, hi) of the input's copy: edge strips (INPLACE) or the padded, blocked input */
static void {{NAME}}_copy_rows(void* job, long lo, long hi)
{
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    for (long row = lo; row < hi; row++)
#if {{INPLACE}}
        {{NAME}}_strip_row({{X}}, jb->es, row);
#else
        {{NAME}}_pad_row({{X}}, jb->xp, row);
#endif
}

/* tiles [lo, hi) of the NOB x NT (output-channel block, pixel tile) */
static void {{NAME}}_tiles(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const {{NAME}}_xt* restrict xp = jb->xp;
    const float* restrict es = jb->es;
    float* restrict ys = jb->ys;
    const {{NAME}}_xt* restrict w = jb->w;
    (void)xp;
    (void)es;
    (void)ys;
    for (long it = lo; it < hi; it++) {
        const long ob = it / NT, t = it % NT;
        long xoff[RW], pb[RW], pj[RW];
        const {{NAME}}_xt* xb = xp;
        long bs = (long)HP * WP * CB, rs = (long)WP * CB;
        int rw, kh0 = 0, kh1 = KH;
        if (ROWS) { /* tile t: image n, output row oh, columns ow0.. (a short last tile computes
                     * past the row end, reading the padded copy's slack, and stores rw) */
            const long n = t / (OH * TR), oh = t / TR % OH, ow0 = t % TR * RW;
            rw = OW - ow0 < RW ? (int)(OW - ow0) : RW;
            for (int r = 0; r < RW; r++) {
                pb[r] = n;
                pj[r] = oh * OW + ow0 + r;
            }
#if {{INPLACE}}
            const long ih0 = oh * SH - PH, iw0 = ow0 * SW - PW;
            kh0 = ih0 < 0 ? (int)-ih0 : 0;
            kh1 = H - ih0 < KH ? (int)(H - ih0) : KH;
            xoff[0] = 0;
            if (kh1 <= kh0) { /* (no kernel row inside the image: the tile is 0) */
                xb = {{X}};
            } else if (t % TR >= {{NAME}}_EL && t % TR < {{NAME}}_ER) { /* the window inside: in place */
                xb = {{X}} + ((n * NCB * H) + ih0 + kh0) * (long)W * CB + iw0 * CB;
                bs = (long)H * W * CB;
                rs = (long)W * CB;
            } else { /* an edge strip: tile column tr = t % TR */
                const long tr = t % TR, se = tr < {{NAME}}_EL ? tr : {{NAME}}_EL + tr - {{NAME}}_ER;
                xb = es + (((se * N + n) * NCB * H) + ih0 + kh0) * (long){{NAME}}_WL * CB;
                bs = (long)H * {{NAME}}_WL * CB;
                rs = (long){{NAME}}_WL * CB;
            }
#else
            xoff[0] = ((n * NCB * HP) + oh * SH) * (long)WP * CB + ow0 * SW * CB;
#endif
        } else { /* tile t: the RW pixels from t x RW in (n, oh, ow) order */
            const long q0 = t * RW;
            rw = NP - q0 < RW ? (int)(NP - q0) : RW;
            for (int r = 0; r < RW; r++) {
                const long q = q0 + (r < rw ? r : rw - 1); /* a short tile repeats its last pixel */
                const long n = q / P, j = q % P, oh = j / OW, ow = j % OW;
                xoff[r] = ((n * NCB * HP) + oh * SH) * (long)WP * CB + ow * SW * CB;
                pb[r] = n;
                pj[r] = j;
            }
        }
        float tile[RW * OBW] __attribute__((aligned(64)));
        {{NAME}}_tile(xb, bs, rs, kh0, kh1, xoff, w + ob * ((long)NCB * KH * KWC * OBW), tile);
        const long o0 = ob * OBW, oc = O - o0 < OBW ? O - o0 : OBW;
#if {{OUT_BLOCKED}} || {{EPI_BLOCKED}} || {{NAME}}_REORDER
        /* the epilogue along each pixel's channels, VL at a time, where an operand in blocks of
         * VL channels is read contiguously (at blk): a vector store per VL channels when the
         * output is in blocks too ([N][O / VL][OH][OW][VL]: the next kernels read it so, see
         * eqfuse.backend.conv_blocked), else into the tile, which the NCHW store below takes */
        for (int r = 0; r < rw; r++) {
            const long b = pb[r], j = pj[r];
            (void)b; (void)j;
            for (long v0 = 0; v0 < oc; v0 += VL) {
                const long blk0 = ((b * (O / VL) + (o0 + v0) / VL) * (long)P + j) * VL;
#if {{NAME}}_REORDER
                float* restrict dst = ys + blk0;
                const float* restrict src = tile + r * OBW + v0;
#elif {{OUT_BLOCKED}}
                float* restrict dst = out + blk0;
                const float* restrict src = tile + r * OBW + v0;
#else
                float* dst = tile + r * OBW + v0;
                const float* src = dst;
#endif
#pragma omp simd
                for (long l = 0; l < VL; l++) {
                    const long i = o0 + v0 + l, blk = blk0 + l;
                    const float acc = src[l];
                    (void)i; (void)blk;
                    dst[l] = {{EPILOGUE}};
                }
            }
        }
#endif
#if !{{OUT_BLOCKED}} && !{{NAME}}_REORDER
        /* NCHW keeps a channel's pixels together: the tile transposed (channels x pixels),
         * then the epilogue along each channel's pixels (unless applied above), where a
         * residual or any tensor of the output's shape is read contiguously, as the result
         * is stored */
        float tt[OBW * RW] __attribute__((aligned(64)));
        for (int r = 0; r < RW; r++)
            for (int oo = 0; oo < OBW; oo++)
                tt[oo * RW + r] = tile[r * OBW + oo];
        if (pb[0] == pb[rw - 1]) { /* one image: the pixels are consecutive in each channel */
            const long b = pb[0], j0 = pj[0];
            (void)b;
            for (long oo = 0; oo < oc; oo++) {
                const long i = o0 + oo;
                float* restrict orow = out + (b * O + i) * (long)P + j0;
                const float* restrict trow = tt + oo * RW;
                (void)i;
#pragma omp simd
                for (int r = 0; r < rw; r++) {
                    const long j = j0 + r;
                    const float acc = trow[r];
                    (void)j;
                    orow[r] = {{EPILOGUE_NCHW}};
                }
            }
        } else {
            for (int r = 0; r < rw; r++) {
                const long b = pb[r], j = pj[r];
                (void)b; (void)j;
                for (long oo = 0; oo < oc; oo++) {
                    const long i = o0 + oo;
                    const float acc = tt[oo * RW + r];
                    (void)i;
                    out[(b * O + i) * (long)P + j] = {{EPILOGUE_NCHW}};
                }
            }
        }
#endif
    }
}

#if {{NAME}}_REORDER
/* rows [lo, hi) of the output in blocks, reordered into NCHW */
static void {{NAME}}_reorder_rows(void* job, long lo, long hi)
{
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    for (long q = lo; q < hi; q++)
        {{NAME}}_reorder_row(jb->ys, out, q);
}
#endif

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_DIMS;
#if {{INPLACE}}
    {{NAME}}_xt* xp = NULL;
    float* es = eqf_scratch(EQF_SCRATCH_CONV_COL, (long){{NAME}}_NE * N * NCB * H * {{NAME}}_WL * CB + 1);
    if (!es) {
        eqf_nomem_note();
        return;
    }
#else
    float* es = NULL;
    /* (+ slack: a ROWS tile past a row's end reads up to RW x SW pixels further) */
    {{NAME}}_xt* xp = ({{NAME}}_xt*)eqf_scratch(EQF_SCRATCH_CONV_COL, (long)N * NCB * HP * WP * CB + (long)RW * SW * CB);
    if (!xp) {
        eqf_nomem_note();
        return;
    }
    memset(xp + (long)N * NCB * HP * WP * CB, 0, sizeof({{NAME}}_xt) * RW * SW * CB);
#endif
    float* ys = NULL;
#if {{NAME}}_REORDER
    ys = eqf_scratch(EQF_SCRATCH_GEMM_A, (long)N * O * P); /* the output in blocks, then NCHW */
    if (!ys) {
        eqf_nomem_note();
        return;
    }
#endif
#if {{PREPACKED}}
    const {{NAME}}_xt* w = (const {{NAME}}_xt*){{WEIGHTS}}; /* the blocks {{NAME}}_prepack made once */
#else
    {{NAME}}_xt* w = ({{NAME}}_xt*)eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
#endif
    if (!w) {
        eqf_nomem_note();
        return;
    }
#if !{{PREPACKED}}
    {{NAME}}_prepack({{WEIGHTS}}, (float*)w); /* (weights not bound by params=: blocked at each call) */
#endif
    /* Three parallel loops on the claim-based pool, one after another: the input's copy (by
     * row), the tiles, the reorder into NCHW (by row). A range that no worker has claimed is run
     * by the caller, so no loop waits for a thread that has no core. */
    {{NAME}}_job job = { {{PARAM_INIT}}, xp, es, ys, w };
#if {{INPLACE}}
    eqf_region((long){{NAME}}_NE * N * NCB * H, {{NAME}}_copy_rows, &job, {{PARALLEL}});
#else
    eqf_region((long)N * NCB * HP, {{NAME}}_copy_rows, &job, {{PARALLEL}});
#endif
    eqf_region_n((long)NOB * NT, {{NAME}}_tiles, &job, {{PARALLEL}}, {{NAME}}_CHUNKS);
#if {{NAME}}_REORDER
    eqf_region((long)N * (O / VL) * OH, {{NAME}}_reorder_rows, &job, {{PARALLEL}});
#endif
}

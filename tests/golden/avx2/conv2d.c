#define eqf_kinds_k8_conv2d_VL 8 /* the plan's vl: floats per vector */
#define eqf_kinds_k8_conv2d_RO 6 /* the plan's ro: output channels per tile */
#define eqf_kinds_k8_conv2d_RPH 1 /* the plan's rph: output rows per tile */
#define eqf_kinds_k8_conv2d_RPW 2 /* the plan's rpw: pixel vectors per row of a tile */
#define eqf_kinds_k8_conv2d_PREPACKED 0 /* the plan's prepacked_b: the weights blocked once (params=) */
#define eqf_kinds_k8_conv2d_PARALLEL 0 /* the plan's parallel: the `if` of the parallel region */
#define eqf_kinds_k8_conv2d_CHUNKS 64 /* the plan's region_chunks: equal ranges of the tiles' loop on the pool */
#define eqf_kinds_k8_conv2d_OINNER 0 /* the plan's o_inner: the channel tiles innermost, pixel tiles outer */
#define eqf_kinds_k8_conv2d_ALIGN 0 /* the plan's row_align: each column phase of the padded copy whole vectors */
/* eqf_kinds_k8_conv2d: direct conv2d with output pixels in the vector lanes, 2x3x11x13 *
 * 5x3x3x3, stride 1x1, padding 1x1 -> 2x5x11x13 (NCHW in
 * and out), the epilogue fused into the store. For few output channels (eqfuse.backend.conv_direct):
 * channel vectors would need a broadcast of an input value per FMA; here a vector holds VL
 * output pixels of one row, and per input channel and tap the tile loads RPH x RPW pixel
 * vectors and broadcasts RO weights for RO x RPH x RPW FMAs.
 * The input is copied zero padded, each row split into its SW column phases
 * (xq[N][C][HP][SW][WQ], element wp of a padded row at [wp % SW][wp / SW]), so that the input of
 * VL output pixels at any tap is VL consecutive floats. The weights are [NTO][C][KH][KW][RO]
 * (prepacked once when bound by params=): a tile's RO broadcasts per step are consecutive, and its
 * whole share one stream. OINNER (0): the tiles run with the channel tiles innermost,
 * so a pixel tile's input window stays in L1 while every channel tile reads it (the weights
 * stream from L2 instead); else the channel tiles outermost (a tile's weights stay in L1, the
 * input streams). */
#define eqf_kinds_k8_conv2d_DIMS                                                                              \
    enum { N = 2, C = 3, H = 11, W = 13, O = 5, KH = 3, KW = 3, OH = 11,   \
           OW = 13, SH = 1, SW = 1, PH = 1, PW = 1, VL = 8, RO = 6,        \
           RPH = 1, RPW = 2, TW = RPW * VL, NTW = (OW + TW - 1) / TW, NTH = (OH + RPH - 1) / RPH, \
           NTO = (O + RO - 1) / RO, OPAD = NTO * RO, HP = (NTH * RPH - 1) * SH + KH,                     \
           WQ = 0 ? (NTW * TW + (KW - 1) / SW + 1 + VL - 1) / VL * VL : NTW * TW + (KW - 1) / SW + 1, P = OH * OW }
typedef float eqf_kinds_k8_conv2d_vf __attribute__((vector_size(8 * 4)));
typedef float eqf_kinds_k8_conv2d_vfu __attribute__((vector_size(8 * 4), aligned(4))); /* an unaligned access */

long eqf_kinds_k8_conv2d_prepack_floats(void)
{
    eqf_kinds_k8_conv2d_DIMS;
    return (long)C * KH * KW * OPAD;
}

/* OIHW weights -> w[NTO][C][KH][KW][RO], zero padded. */
void eqf_kinds_k8_conv2d_prepack(const float* restrict wt, float* restrict wp)
{
    eqf_kinds_k8_conv2d_DIMS;
    for (long to = 0; to < NTO; to++)
        for (long c = 0; c < C; c++)
            for (long k = 0; k < KH * KW; k++)
                for (long r = 0; r < RO; r++) {
                    const long o = to * RO + r;
                    wp[((to * C + c) * KH * KW + k) * RO + r] = o < O ? wt[(o * C + c) * KH * KW + k] : 0.0f;
                }
}

/* One padded row (n, c, hp), split into its SW column phases. ALIGN (0): each phase is a
 * whole number of vectors (WQ), so that every phase starts on a vector's boundary: a tap's pixel
 * vectors at kw / SW = 0 are aligned loads, the others cross one line boundary less often than
 * from a row start anywhere (Whisper's conv1, 80 rows of 3011 floats otherwise: 1-3% less time,
 * `benchmarks/bench_conv.py --set whisper --cpu-time`). Short 2-D rows do not take it: there the
 * padding adds up to a third to the copy (the 7x7 stem of `benchmarks/bench_conv.py --set
 * resnet18`'s shapes on the direct path, 36 -> 48 floats a phase: 3% more CPU time). */
static inline void eqf_kinds_k8_conv2d_pad_row(const float* restrict x, float* restrict xq, long row)
{
    eqf_kinds_k8_conv2d_DIMS;
    const long hp = row % HP, nc = row / HP, ih = hp - PH;
    float* restrict dst = xq + row * SW * WQ;
    const float* restrict src = x + (nc * H + (ih < 0 ? 0 : ih)) * W;
    const int inside = ih >= 0 && ih < H;
    for (long ph = 0; ph < SW; ph++)
        for (long q = 0; q < WQ; q++) {
            const long iw = q * SW + ph - PW;
            dst[ph * WQ + q] = inside && iw >= 0 && iw < W ? src[iw] : 0.0f;
        }
}

/* tile[RO][RPH][TW] for output channels o0.., rows oh0.., columns ow0.. of image n */
__attribute__((optimize("no-predictive-commoning")))
static inline void eqf_kinds_k8_conv2d_tile(const float* restrict xq, const float* restrict w, long n, long o0, long oh0,
                                 long ow0, float* restrict tile)
{
    eqf_kinds_k8_conv2d_DIMS;
    eqf_kinds_k8_conv2d_vf acc[RO][RPH * RPW];
#pragma GCC unroll 32
    for (int r = 0; r < RO; r++)
#pragma GCC unroll 8
        for (int p = 0; p < RPH * RPW; p++)
            acc[r][p] = (eqf_kinds_k8_conv2d_vf){0};
    for (long c = 0; c < C; c++)
        for (long kh = 0; kh < KH; kh++) {
            const float* restrict xr = xq + ((n * C + c) * HP + oh0 * SH + kh) * (long)SW * WQ + ow0;
            const float* restrict wr = w + ((o0 / RO * C + c) * KH + kh) * KW * (long)RO;
#pragma GCC unroll 16
            for (int kw = 0; kw < KW; kw++) {
                eqf_kinds_k8_conv2d_vf xv[RPH * RPW];
#pragma GCC unroll 8
                for (int p = 0; p < RPH * RPW; p++) {
                    xv[p] = *(const eqf_kinds_k8_conv2d_vfu*)(xr + (p / RPW) * SH * SW * WQ + (kw % SW) * WQ + kw / SW
                                                   + (p % RPW) * VL);
#if defined(__x86_64__) && (defined(__AVX512F__) || (8 <= 8 && defined(__AVX__)) || 8 <= 4) /* (a vector register holds it) */
                    __asm__("" : "+v"(xv[p])); /* (in a register, not reloaded by each FMA) */
#endif
                }
#pragma GCC unroll 32
                for (int r = 0; r < RO; r++) {
                    const float a = wr[kw * RO + r];
#pragma GCC unroll 8
                    for (int p = 0; p < RPH * RPW; p++)
                        acc[r][p] += a * xv[p];
                }
            }
        }
#pragma GCC unroll 32
    for (int r = 0; r < RO; r++)
#pragma GCC unroll 8
        for (int p = 0; p < RPH * RPW; p++)
            *(eqf_kinds_k8_conv2d_vfu*)(tile + (r * RPH + p / RPW) * TW + (p % RPW) * VL) = acc[r][p];
}

/* The call's job, read by the ranges of its parallel loops (common_pool.h, eqf_region): the
 * kernel's arguments and its buffers. */
typedef struct {
    const float* restrict in0; const float* restrict in1; float* restrict out;
    float* xq;
    const float* w;
} eqf_kinds_k8_conv2d_job;

/* rows [lo, hi) of the padded input copy */
static void eqf_kinds_k8_conv2d_pad_rows(void* job, long lo, long hi)
{
    const eqf_kinds_k8_conv2d_job* jb = job;
    const float* restrict in0 = jb->in0; (void)in0; const float* restrict in1 = jb->in1; (void)in1; float* restrict out = jb->out; (void)out;
    for (long row = lo; row < hi; row++)
        eqf_kinds_k8_conv2d_pad_row(in0, jb->xq, row);
}

/* tiles [lo, hi) of the NTO x N x NTH x NTW */
static void eqf_kinds_k8_conv2d_tiles(void* job, long lo, long hi)
{
    eqf_kinds_k8_conv2d_DIMS;
    const eqf_kinds_k8_conv2d_job* jb = job;
    const float* restrict in0 = jb->in0; (void)in0; const float* restrict in1 = jb->in1; (void)in1; float* restrict out = jb->out; (void)out;

    const float* restrict xq = jb->xq;
    const float* restrict w = jb->w;
    for (long it = lo; it < hi; it++) {
        const long to = 0 ? it % NTO : it / (N * NTH * NTW), t = 0 ? it / NTO : it % (N * NTH * NTW);
        const long b = t / (NTH * NTW), oh0 = t / NTW % NTH * RPH, ow0 = t % NTW * TW, o0 = to * RO;
        float tile[RO * RPH * TW] __attribute__((aligned(64)));
        if (it + 1 < hi) {
            /* the next tile's output lines, prefetched for writing while this tile computes: its
             * stores then find them in cache (Whisper's conv1, a 4.6 MB output: 2% less time with
             * its GELU, `benchmarks/bench_conv.py --set whisper`) */
            const long it1 = it + 1;
            const long to1 = 0 ? it1 % NTO : it1 / (N * NTH * NTW), t1 = 0 ? it1 / NTO : it1 % (N * NTH * NTW);
            const long b1 = t1 / (NTH * NTW), oh1 = t1 / NTW % NTH * RPH, ow1 = t1 % NTW * TW, o1 = to1 * RO;
            for (long r = 0; r < RO && o1 + r < O; r++)
                for (long h = 0; h < RPH && oh1 + h < OH; h++)
                    for (long q = 0; q < TW && ow1 + q < OW; q += 64 / (long)sizeof(float))
                        __builtin_prefetch(out + (b1 * O + o1 + r) * (long)P + (oh1 + h) * OW + ow1 + q, 1);
        }
        eqf_kinds_k8_conv2d_tile(xq, w, b, o0, oh0, ow0, tile);
        const long cw = OW - ow0 < TW ? OW - ow0 : TW;
        (void)b;
        for (long r = 0; r < RO && o0 + r < O; r++)
            for (long h = 0; h < RPH && oh0 + h < OH; h++) {
                const long i = o0 + r, j0 = (oh0 + h) * OW + ow0;
                const float* restrict trow = tile + (r * RPH + h) * TW;
                float* restrict orow = out + (b * O + i) * (long)P + j0;
                (void)i;
#pragma omp simd
                for (long q = 0; q < cw; q++) {
                    const long j = j0 + q;
                    const float acc = trow[q];
                    (void)j;
                    orow[q] = ({ const float eqf_v3 = eqf_relu(acc); eqf_v3; });
                }
            }
    }
}

void eqf_kinds_k8_conv2d(const float* restrict in0, const float* restrict in1, float* restrict out)
{
    eqf_kinds_k8_conv2d_DIMS;
    float* xq = eqf_scratch(EQF_SCRATCH_CONV_COL, (long)N * C * HP * SW * WQ);
#if 0
    const float* w = in1; /* the blocks eqf_kinds_k8_conv2d_prepack made once */
#else
    float* w = eqf_scratch(EQF_SCRATCH_GEMM_B, eqf_kinds_k8_conv2d_prepack_floats());
#endif
    if (!xq || !w) {
        eqf_nomem_note();
        return;
    }
#if !0
    eqf_kinds_k8_conv2d_prepack(in1, w); /* (weights not bound by params=: blocked at each call) */
#endif
    /* Two parallel loops on the claim-based pool, one after the other: the input's padded copy
     * (by row), the tiles. A range that no worker has claimed is run by the caller, so no loop
     * waits for a thread that has no core. */
    eqf_kinds_k8_conv2d_job job = { in0, in1, out, xq, w };
    eqf_region((long)N * C * HP, eqf_kinds_k8_conv2d_pad_rows, &job, 0);
    eqf_region_n((long)NTO * N * NTH * NTW, eqf_kinds_k8_conv2d_tiles, &job, 0, eqf_kinds_k8_conv2d_CHUNKS);
}

#define {{NAME}}_VL {{VL}} /* the plan's vl: floats per vector */
#define {{NAME}}_RO {{RO}} /* the plan's ro: output channels per tile */
#define {{NAME}}_RPH {{RPH}} /* the plan's rph: output rows per tile */
#define {{NAME}}_RPW {{RPW}} /* the plan's rpw: pixel vectors per row of a tile */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b: the weights blocked once (params=) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_CHUNKS {{CHUNKS}} /* the plan's region_chunks: equal ranges of the tiles' loop on the pool */
#define {{NAME}}_OINNER {{OINNER}} /* the plan's o_inner: the channel tiles innermost, pixel tiles outer */
#define {{NAME}}_ALIGN {{ALIGN}} /* the plan's row_align: each column phase of the padded copy whole vectors */
/* {{NAME}}: direct conv2d with output pixels in the vector lanes, {{N}}x{{C}}x{{H}}x{{W}} *
 * {{O}}x{{C}}x{{KH}}x{{KW}}, stride {{SH}}x{{SW}}, padding {{PH}}x{{PW}} -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in
 * and out), the epilogue fused into the store. For few output channels (eqfuse.backend.conv_direct):
 * channel vectors would need a broadcast of an input value per FMA; here a vector holds VL
 * output pixels of one row, and per input channel and tap the tile loads RPH x RPW pixel
 * vectors and broadcasts RO weights for RO x RPH x RPW FMAs.
 * The input is copied zero padded, each row split into its SW column phases
 * (xq[N][C][HP][SW][WQ], element wp of a padded row at [wp % SW][wp / SW]), so that the input of
 * VL output pixels at any tap is VL consecutive floats. The weights are [NTO][C][KH][KW][RO]
 * (prepacked once when bound by params=): a tile's RO broadcasts per step are consecutive, and its
 * whole share one stream. OINNER ({{OINNER}}): the tiles run with the channel tiles innermost,
 * so a pixel tile's input window stays in L1 while every channel tile reads it (the weights
 * stream from L2 instead); else the channel tiles outermost (a tile's weights stay in L1, the
 * input streams). */
#define {{NAME}}_DIMS                                                                              \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}},   \
           OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, VL = {{VL}}, RO = {{RO}},        \
           RPH = {{RPH}}, RPW = {{RPW}}, TW = RPW * VL, NTW = (OW + TW - 1) / TW, NTH = (OH + RPH - 1) / RPH, \
           NTO = (O + RO - 1) / RO, OPAD = NTO * RO, HP = (NTH * RPH - 1) * SH + KH,                     \
           WQ = {{ALIGN}} ? (NTW * TW + (KW - 1) / SW + 1 + VL - 1) / VL * VL : NTW * TW + (KW - 1) / SW + 1, P = OH * OW }
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */

long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_DIMS;
    return (long)C * KH * KW * OPAD;
}

/* OIHW weights -> w[NTO][C][KH][KW][RO], zero padded. */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wp)
{
    {{NAME}}_DIMS;
    for (long to = 0; to < NTO; to++)
        for (long c = 0; c < C; c++)
            for (long k = 0; k < KH * KW; k++)
                for (long r = 0; r < RO; r++) {
                    const long o = to * RO + r;
                    wp[((to * C + c) * KH * KW + k) * RO + r] = o < O ? wt[(o * C + c) * KH * KW + k] : 0.0f;
                }
}

/* One padded row (n, c, hp), split into its SW column phases. ALIGN ({{ALIGN}}): each phase is a
 * whole number of vectors (WQ), so that every phase starts on a vector's boundary: a tap's pixel
 * vectors at kw / SW = 0 are aligned loads, the others cross one line boundary less often than
 * from a row start anywhere (Whisper's conv1, 80 rows of 3011 floats otherwise: 1-3% less time,
 * `benchmarks/bench_conv.py --set whisper --cpu-time`). Short 2-D rows do not take it: there the
 * padding adds up to a third to the copy (the 7x7 stem of `benchmarks/bench_conv.py --set
 * resnet18`'s shapes on the direct path, 36 -> 48 floats a phase: 3% more CPU time). */
static inline void {{NAME}}_pad_row(const float* restrict x, float* restrict xq, long row)
{
    {{NAME}}_DIMS;
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
static inline void {{NAME}}_tile(const float* restrict xq, const float* restrict w, long n, long o0, long oh0,
                                 long ow0, float* restrict tile)
{
    {{NAME}}_DIMS;
    {{NAME}}_vf acc[RO][RPH * RPW];
#pragma GCC unroll 32
    for (int r = 0; r < RO; r++)
#pragma GCC unroll 8
        for (int p = 0; p < RPH * RPW; p++)
            acc[r][p] = ({{NAME}}_vf){0};
    for (long c = 0; c < C; c++)
        for (long kh = 0; kh < KH; kh++) {
            const float* restrict xr = xq + ((n * C + c) * HP + oh0 * SH + kh) * (long)SW * WQ + ow0;
            const float* restrict wr = w + ((o0 / RO * C + c) * KH + kh) * KW * (long)RO;
#pragma GCC unroll 16
            for (int kw = 0; kw < KW; kw++) {
                {{NAME}}_vf xv[RPH * RPW];
#pragma GCC unroll 8
                for (int p = 0; p < RPH * RPW; p++) {
                    xv[p] = *(const {{NAME}}_vfu*)(xr + (p / RPW) * SH * SW * WQ + (kw % SW) * WQ + kw / SW
                                                   + (p % RPW) * VL);
#if defined(__x86_64__) && (defined(__AVX512F__) || ({{VL}} <= 8 && defined(__AVX__)) || {{VL}} <= 4) /* (a vector register holds it) */
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
            *({{NAME}}_vfu*)(tile + (r * RPH + p / RPW) * TW + (p % RPW) * VL) = acc[r][p];
}

/* The call's job, read by the ranges of its parallel loops (common_pool.h, eqf_region): the
 * kernel's arguments and its buffers. */
typedef struct {
    {{PARAM_FIELDS}}
    float* xq;
    const float* w;
} {{NAME}}_job;

/* rows [lo, hi) of the padded input copy */
static void {{NAME}}_pad_rows(void* job, long lo, long hi)
{
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    for (long row = lo; row < hi; row++)
        {{NAME}}_pad_row({{X}}, jb->xq, row);
}

/* tiles [lo, hi) of the NTO x N x NTH x NTW */
static void {{NAME}}_tiles(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const float* restrict xq = jb->xq;
    const float* restrict w = jb->w;
    for (long it = lo; it < hi; it++) {
        const long to = {{OINNER}} ? it % NTO : it / (N * NTH * NTW), t = {{OINNER}} ? it / NTO : it % (N * NTH * NTW);
        const long b = t / (NTH * NTW), oh0 = t / NTW % NTH * RPH, ow0 = t % NTW * TW, o0 = to * RO;
        float tile[RO * RPH * TW] __attribute__((aligned(64)));
        if (it + 1 < hi) {
            /* the next tile's output lines, prefetched for writing while this tile computes: its
             * stores then find them in cache (Whisper's conv1, a 4.6 MB output: 2% less time with
             * its GELU, `benchmarks/bench_conv.py --set whisper`) */
            const long it1 = it + 1;
            const long to1 = {{OINNER}} ? it1 % NTO : it1 / (N * NTH * NTW), t1 = {{OINNER}} ? it1 / NTO : it1 % (N * NTH * NTW);
            const long b1 = t1 / (NTH * NTW), oh1 = t1 / NTW % NTH * RPH, ow1 = t1 % NTW * TW, o1 = to1 * RO;
            for (long r = 0; r < RO && o1 + r < O; r++)
                for (long h = 0; h < RPH && oh1 + h < OH; h++)
                    for (long q = 0; q < TW && ow1 + q < OW; q += 64 / (long)sizeof(float))
                        __builtin_prefetch(out + (b1 * O + o1 + r) * (long)P + (oh1 + h) * OW + ow1 + q, 1);
        }
        {{NAME}}_tile(xq, w, b, o0, oh0, ow0, tile);
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
                    orow[q] = {{EPILOGUE}};
                }
            }
    }
}

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_DIMS;
    float* xq = eqf_scratch(EQF_SCRATCH_CONV_COL, (long)N * C * HP * SW * WQ);
#if {{PREPACKED}}
    const float* w = {{WEIGHTS}}; /* the blocks {{NAME}}_prepack made once */
#else
    float* w = eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
#endif
    if (!xq || !w) {
        eqf_nomem_note();
        return;
    }
#if !{{PREPACKED}}
    {{NAME}}_prepack({{WEIGHTS}}, w); /* (weights not bound by params=: blocked at each call) */
#endif
    /* Two parallel loops on the claim-based pool, one after the other: the input's padded copy
     * (by row), the tiles. A range that no worker has claimed is run by the caller, so no loop
     * waits for a thread that has no core. */
    {{NAME}}_job job = { {{PARAM_INIT}}, xq, w };
    eqf_region((long)N * C * HP, {{NAME}}_pad_rows, &job, {{PARALLEL}});
    eqf_region_n((long)NTO * N * NTH * NTW, {{NAME}}_tiles, &job, {{PARALLEL}}, {{NAME}}_CHUNKS);
}

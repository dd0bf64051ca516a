#define {{NAME}}_VL {{VL}} /* the plan's vl: floats per vector */
#define {{NAME}}_V {{V}} /* the plan's v: vectors per output-channel block */
#define {{NAME}}_OBW {{OBW}} /* the plan's obw: output channels per block, V x VL */
#define {{NAME}}_RW {{RW}} /* the plan's rw: tiles per register tile */
#define {{NAME}}_TB {{TB}} /* the plan's tb: tiles per block */
#define {{NAME}}_IN_BLOCKED {{IN_BLOCKED}} /* the plan's in_blocked: the input in blocks of VL channels */
#define {{NAME}}_OUT_BLOCKED {{OUT_BLOCKED}} /* the plan's out_blocked: the output in blocks of VL channels */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b: the weights transformed once (params=) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_BF16 {{BF16}} /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16 */
/* {{NAME}}: conv2d 3x3, stride 1, padding {{PH}}x{{PW}}, by Winograd F(2x2, 3x3):
 * {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{C}}x3x3 -> {{N}}x{{O}}x{{OH}}x{{OW}}, the epilogue fused into the store.
 *
 * Each 2x2 block of output pixels (a "tile") is Y = A^T [sum over c of (G g G^T) . (B^T d B)] A,
 * d being the tile's 4x4 input window of channel c and g the 3x3 filter: 16 products per input
 * channel and output channel where the direct conv makes 36 (2.25x fewer multiply-adds). With
 * the transforms as matrices, per block of TB tiles (eqfuse.backend.conv_winograd):
 * 1. input transform: Vb[TB][16][C], the 16 values B^T d B of each tile and channel (adds only;
 *    VL channels per vector, read from the input in blocks of VL channels [N][C / VL][H][W][VL]);
 * 2. 16 GEMMs: Mb[.][xi] (TB x O) = Vb[.][xi] (TB x C) . U[xi] (C x O), U = G g G^T made once
 *    ({{NAME}}_prepack, U[16][O / OBW][C][OBW]) when the weights are bound by params=
 *    (PREPACKED {{PREPACKED}}); register tiles of RW tiles x OBW = V x VL output channels;
 * 3. output transform: the 2x2 pixels A^T m A of each tile and output channel vector, through the
 *    epilogue, stored in blocks of VL channels (OUT_BLOCKED {{OUT_BLOCKED}}: the next conv reads
 *    them so), or NCHW (REORDER {{REORDER}}: in blocks first, then reordered; else pixel by pixel).
 * Vb and Mb are each thread's own (scratch), sized for L2; the threads of the claim-based pool
 * (common_pool.h) claim the blocks of TB tiles one at a time.
 * A tile's 16 rows of Vb (of Mb) are together, and tiles RA = 16 x C + 16 (RM) floats apart: the
 * GEMM reads RW tiles' rows at once, and at 16 x C floats apart (4 KiB for 64 channels) they
 * would all fall in one set of the L1 (a 64-channel conv at 56 x 56 took 1.5x as long: its row
 * "64 3x3 @56" of benchmarks/bench_conv.py --set resnet56). Kept
 * by tile, not by xi ([16][TB][C]), the transforms' 16 loads and stores go to one region, not 16
 * (by xi, the transforms took about twice their share of that conv's time).
 * Rounding: B and A hold 0 and +-1, G +-1/2: F(2x2, 3x3) adds about one rounding of the sums'
 * magnitude per transform, the error of a direct conv's order of summation (checked against
 * numpy in tests/test_contraction/conv.py).
 * BF16 ({{BF16}}; precision="bf16", docs/precision.md): the 16 GEMMs multiply bf16 K-pairs (two
 * consecutive input channels in one 32-bit lane) and accumulate in f32; U is held as
 * U[16][NOB][C / 2][OBW][2] bf16, rounded once by the prepack, and the input transform rounds Vb
 * to bf16 as it stores it (same offsets, in halves). The transforms and the epilogue stay f32.
 * 2 = vdpbf16ps (AVX512_BF16); 1 = the fallback: the pairs widened to f32 by a shift and a mask,
 * two FMAs (the same bf16 operands). */
#define {{NAME}}_REORDER {{REORDER}} /* the plan's reorder: NCHW stored in blocks, then reordered */
#include <omp.h>
#if {{BF16}} == 2
#include <immintrin.h>
#endif
#define {{NAME}}_DIMS                                                                                     \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, OH = {{OH}}, OW = {{OW}}, PH = {{PH}},        \
           PW = {{PW}}, VL = {{VL}}, V = {{V}}, OBW = {{OBW}}, RW = {{RW}}, TB = {{TB}}, NCB = C / VL,            \
           NOB = O / OBW, RA = 16 * C + 16, RM = 16 * O + 16, TH = (OH + 1) / 2, TW = (OW + 1) / 2, T = N * TH * TW, P = OH * OW }
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */
#if {{BF16}}
#if {{BF16}} == 2 && !(defined(__AVX512BF16__) && {{VL}} == 16)
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif
typedef uint32_t {{NAME}}_vp __attribute__((vector_size({{VL}} * 4), aligned(4))); /* VL bf16 K-pairs */
typedef uint16_t {{NAME}}_vt; /* an element of U and Vb */
/* dst[VL] = x rounded to bf16 (as vcvtne2ps2bf16: eqf_bf16) */
static inline void {{NAME}}_to_bf16({{NAME}}_vf x, uint16_t* restrict dst)
{
#if {{BF16}} == 2
    _mm256_storeu_si256((__m256i*)dst, (__m256i)_mm512_cvtneps_pbh((__m512)x));
#else
    for (int l = 0; l < {{VL}}; l++)
        dst[l] = eqf_bf16(x[l]);
#endif
}
#else
typedef float {{NAME}}_vt;
#endif

long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_DIMS;
    return {{BF16}} ? 8L * C * O : 16L * C * O; /* (bf16: halves, C even) */
}

/* OIHW weights -> U[16][NOB][C][OBW], U = G g G^T for each output and input channel, with
 * G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1] (in double, rounded once). */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wf)
{
    {{NAME}}_vt* restrict wp = ({{NAME}}_vt*)wf;
    {{NAME}}_DIMS;
    for (long o = 0; o < O; o++)
        for (long c = 0; c < C; c++) {
            const float* g = wt + (o * C + c) * 9;
            double t[4][3], u[4][4];
            for (int j = 0; j < 3; j++) {
                t[0][j] = g[j];
                t[1][j] = 0.5 * ((double)g[j] + g[3 + j] + g[6 + j]);
                t[2][j] = 0.5 * ((double)g[j] - g[3 + j] + g[6 + j]);
                t[3][j] = g[6 + j];
            }
            for (int i = 0; i < 4; i++) {
                u[i][0] = t[i][0];
                u[i][1] = 0.5 * (t[i][0] + t[i][1] + t[i][2]);
                u[i][2] = 0.5 * (t[i][0] - t[i][1] + t[i][2]);
                u[i][3] = t[i][2];
            }
            for (int xi = 0; xi < 16; xi++)
#if {{BF16}} /* [16][NOB][C / 2][OBW][2]: the K-pair (c, c + 1) of an output channel in one 32-bit lane */
                wp[(((xi * (long)NOB + o / OBW) * C + c / 2 * 2) * OBW + o % OBW * 2) + c % 2] =
                    eqf_bf16((float)u[xi / 4][xi % 4]);
#else
                wp[((xi * (long)NOB + o / OBW) * C + c) * OBW + o % OBW] = (float)u[xi / 4][xi % 4];
#endif
        }
}

/* Step 1 for one tile: Vb[r][xi][c] for its window at (ih0, iw0) of image n, every channel
 * block; B^T d B = rows (d0 - d2, d1 + d2, d2 - d1, d1 - d3), then the same along columns.
 * A window inside the image is read with plain loads; one across its edge, pixel by pixel
 * (zero outside). */
static inline void {{NAME}}_in(const float* restrict x, {{NAME}}_vt* restrict vb, long r, long n, long ih0, long iw0)
{
    {{NAME}}_DIMS;
    typedef {{NAME}}_vf vf;
    const int inside = ih0 >= 0 && iw0 >= 0 && ih0 + 4 <= H && iw0 + 4 <= W;
    for (long cb = 0; cb < NCB; cb++) {
        const float* restrict src = x + (n * NCB + cb) * (long)H * W * VL;
        vf d[4][4], t[4][4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const long ih = ih0 + i, iw = iw0 + j;
                d[i][j] = inside || (ih >= 0 && ih < H && iw >= 0 && iw < W)
                              ? *(const {{NAME}}_vfu*)(src + (ih * W + iw) * VL) : (vf){0};
            }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            t[0][j] = d[0][j] - d[2][j];
            t[1][j] = d[1][j] + d[2][j];
            t[2][j] = d[2][j] - d[1][j];
            t[3][j] = d[1][j] - d[3][j];
        }
        {{NAME}}_vt* restrict dst = vb + r * RA + cb * VL;
#if {{BF16}}
#define {{NAME}}_ST(p, v) {{NAME}}_to_bf16((v), (p))
#else
#define {{NAME}}_ST(p, v) (*(vf*)(p) = (v))
#endif
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            {{NAME}}_ST(dst + (4 * i + 0) * C, t[i][0] - t[i][2]);
            {{NAME}}_ST(dst + (4 * i + 1) * C, t[i][1] + t[i][2]);
            {{NAME}}_ST(dst + (4 * i + 2) * C, t[i][2] - t[i][1]);
            {{NAME}}_ST(dst + (4 * i + 3) * C, t[i][1] - t[i][3]);
        }
#undef {{NAME}}_ST
    }
}

/* Step 2's register tile: m[RW][OBW] (rows RM apart) = a[RW][C] (rows RA apart) . u[C][OBW]. */
__attribute__((optimize("no-predictive-commoning")))
static inline void {{NAME}}_gemm(const {{NAME}}_vt* restrict a, const {{NAME}}_vt* restrict u, float* restrict m)
{
    {{NAME}}_DIMS;
    {{NAME}}_vf acc[RW][V];
#pragma GCC unroll 32
    for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            acc[r][v] = ({{NAME}}_vf){0};
#if {{BF16}}
    /* C / 2 K-pairs: V vectors of VL pairs of U, one broadcast pair of each row of a */
#pragma GCC unroll 16
    for (int c2 = 0; c2 < C / 2; c2++) {
        {{NAME}}_vp wv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            wv[v] = *(const {{NAME}}_vp*)(u + (c2 * OBW + v * VL) * 2);
#if defined(__x86_64__) && (defined(__AVX512F__) || ({{VL}} <= 8 && defined(__AVX__)) || {{VL}} <= 4)
            __asm__("" : "+v"(wv[v])); /* in a register, not folded into each instruction */
#endif
        }
#pragma GCC unroll 32
        for (int r = 0; r < RW; r++) {
            uint32_t s;
            memcpy(&s, a + r * RA + 2 * c2, 4);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] = EQF_DP_BF16({{BF16}}, {{VL}}, acc[r][v], s, wv[v]);
        }
    }
#else
#pragma GCC unroll 16
    for (int c = 0; c < C; c++) {
        {{NAME}}_vf wv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++) {
            wv[v] = *(const {{NAME}}_vf*)(u + c * OBW + v * VL);
#if defined(__x86_64__) && (defined(__AVX512F__) || ({{VL}} <= 8 && defined(__AVX__)) || {{VL}} <= 4)
            __asm__("" : "+v"(wv[v])); /* in a register, not folded into each FMA (see conv_direct.c) */
#endif
        }
#pragma GCC unroll 32
        for (int r = 0; r < RW; r++) {
            const float s = a[r * RA + c];
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                acc[r][v] += s * wv[v];
        }
    }
#endif
#pragma GCC unroll 32
    for (int r = 0; r < RW; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            *({{NAME}}_vf*)(m + r * (long)RM + v * VL) = acc[r][v];
}

{{REORDER_FN}}

/* The call's job, read by the chunks of its parallel loops (common_pool.h, eqf_region): the
 * kernel's arguments and its buffers. */
typedef struct {
    {{PARAM_FIELDS}}
    const float* xb;
    const {{NAME}}_vt* w;
    float* ys;
    int nomem;
} {{NAME}}_job;

#if !{{IN_BLOCKED}}
/* rows [lo, hi) of the input's copy into blocks: NCHW rows to xb[n][cb][h][w][VL] */
static void {{NAME}}_block_rows(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    for (long row = lo; row < hi; row++) {
        const long h = row % H, cb = row / H % NCB, n = row / H / NCB;
        const float* restrict src = {{X}} + ((n * C + cb * VL) * H + h) * (long)W;
        float* restrict dst = (float*)jb->xb + row * (long)W * VL;
        for (long iw = 0; iw < W; iw++)
#pragma GCC unroll 16
            for (long l = 0; l < VL; l++)
                dst[iw * VL + l] = src[l * (long)H * W + iw];
    }
}
#endif

/* block k of TB tiles (from k x TB), with the thread's own Vb and Mb */
static void {{NAME}}_tile_block(void* job, long k)
{
    {{NAME}}_DIMS;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const float* restrict xb = jb->xb;
    const {{NAME}}_vt* restrict w = jb->w;
    float* restrict ys = jb->ys;
    (void)ys;
    /* (Vb's TB x RA elements, then Mb: in bf16 the first half of Vb's floats is used) */
    float* restrict vbf = eqf_scratch(EQF_SCRATCH_ATTN_ROW, (long)TB * (RA + RM));
    {{NAME}}_vt* restrict vb = ({{NAME}}_vt*)vbf;
    if (!vb) { /* the block is skipped, the caller learns it */
        __atomic_store_n(&jb->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    const long t0 = k * TB, tz = T - t0 < TB ? T : t0 + TB;
    float* restrict mb = vbf + (long)TB * RA;
    const long nr = tz - t0 < TB ? tz - t0 : TB, nrw = (nr + RW - 1) / RW * RW;
    for (long r = 0; r < nrw; r++) {
        if (r >= nr) { /* (rows of the last register tile past the run: zeros, not stored) */
            memset(vb + r * RA, 0, sizeof({{NAME}}_vt) * 16 * C);
            continue;
        }
        const long t = t0 + r, n = t / (TH * TW), ty = t / TW % TH, tx = t % TW;
        {{NAME}}_in(xb, vb, r, n, 2 * ty - PH, 2 * tx - PW);
    }
    for (int xi = 0; xi < 16; xi++)
        for (long ob = 0; ob < NOB; ob++)
            for (long r0 = 0; r0 < nrw; r0 += RW)
                {{NAME}}_gemm(vb + r0 * RA + xi * C, w + (xi * (long)NOB + ob) * C * OBW,
                              mb + r0 * RM + xi * O + ob * OBW);
    /* step 3: A^T m A, A^T = [1 1 1 0; 0 1 -1 -1]; then the epilogue per pixel */
    for (long r = 0; r < nr; r++) {
        const long t = t0 + r, n = t / (TH * TW), oh0 = t / TW % TH * 2, ow0 = t % TW * 2;
        for (long o0 = 0; o0 < O; o0 += VL) {
            {{NAME}}_vf mm[16], s[2][4];
#pragma GCC unroll 16
            for (int xi = 0; xi < 16; xi++)
                mm[xi] = *(const {{NAME}}_vf*)(mb + r * RM + xi * O + o0);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                s[0][j] = mm[j] + mm[4 + j] + mm[8 + j];
                s[1][j] = mm[4 + j] - mm[8 + j] - mm[12 + j];
            }
            float y[4][VL] __attribute__((aligned(64)));
#pragma GCC unroll 2
            for (int i = 0; i < 2; i++) {
                *({{NAME}}_vf*)y[2 * i] = s[i][0] + s[i][1] + s[i][2];
                *({{NAME}}_vf*)y[2 * i + 1] = s[i][1] - s[i][2] - s[i][3];
            }
            for (int q = 0; q < 4; q++) {
                const long oh = oh0 + q / 2, ow = ow0 + q % 2;
                if (oh >= OH || ow >= OW)
                    continue;
                const long b = n, j = oh * OW + ow, blk0 = ((b * (O / VL) + o0 / VL) * (long)P + j) * VL;
                (void)b;
                (void)j;
#if {{OUT_BLOCKED}} || {{NAME}}_REORDER
#if {{OUT_BLOCKED}}
                float* restrict dst = out + blk0;
#else
                float* restrict dst = ys + blk0;
#endif
#pragma omp simd
                for (long l = 0; l < VL; l++) {
                    const long i = o0 + l, blk = blk0 + l;
                    const float acc = y[q][l];
                    (void)i;
                    (void)blk;
                    dst[l] = {{EPILOGUE}};
                }
#else
                for (long l = 0; l < VL; l++) {
                    const long i = o0 + l, blk = blk0 + l;
                    const float acc = y[q][l];
                    (void)blk;
                    out[(b * O + i) * (long)P + j] = {{EPILOGUE}};
                }
#endif
            }
        }
    }
}

/* blocks [lo, hi) */
static void {{NAME}}_tiles(void* job, long lo, long hi)
{
    for (long k = lo; k < hi; k++)
        {{NAME}}_tile_block(job, k);
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
#if {{IN_BLOCKED}}
    const float* xb = {{X}};
#else
    float* xb = eqf_scratch(EQF_SCRATCH_CONV_COL, (long)N * C * H * W); /* the input in blocks */
    if (!xb) {
        eqf_nomem_note();
        return;
    }
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
    const {{NAME}}_vt* w = (const {{NAME}}_vt*){{WEIGHTS}}; /* U, made once by {{NAME}}_prepack */
#else
    {{NAME}}_vt* w = ({{NAME}}_vt*)eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
    if (!w) {
        eqf_nomem_note();
        return;
    }
    {{NAME}}_prepack({{WEIGHTS}}, (float*)w); /* (weights not bound by params=: transformed at each call) */
#endif
    /* Three parallel loops on the claim-based pool, one after another: the input into blocks (by
     * row), the tiles (by block of TB), the reorder into NCHW (by row). A chunk claimed by no
     * worker is run by the caller, so no loop waits for a thread that has no core. */
    {{NAME}}_job job = { {{PARAM_INIT}}, xb, w, ys, 0 };
#if !{{IN_BLOCKED}}
    eqf_region((long)N * NCB * H, {{NAME}}_block_rows, &job, {{PARALLEL}});
#endif
    eqf_region((T + TB - 1) / TB, {{NAME}}_tiles, &job, {{PARALLEL}});
#if {{NAME}}_REORDER
    eqf_region((long)N * (O / VL) * OH, {{NAME}}_reorder_rows, &job, {{PARALLEL}});
#endif
    if (job.nomem)
        eqf_nomem_note();
}

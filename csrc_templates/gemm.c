#define {{NAME}}_PREPACKED_B {{PREPACKED_B}} /* the plan's prepacked_b: B's panels packed once (params=) */
#define {{NAME}}_SPLIT {{SPLIT}} /* the plan's split: 0 auto, 1 rows, 2 columns (emit_gemm.SPLITS) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_POOL {{POOL}} /* the plan's pool: the column panels shared on the claim-based pool, no OpenMP region */
#define {{NAME}}_BF16 {{BF16}} /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16, 3 AMX-BF16 */
#define {{NAME}}_A_TRANSPOSED {{A_TRANSPOSED}} /* the plan's a_transposed: A given as K x M */
#define {{NAME}}_B_TRANSPOSED {{B_TRANSPOSED}} /* the plan's b_transposed: B given as N x K */
#define {{NAME}}_IMPLICIT {{IMPLICIT}} /* the plan's implicit: B is a conv's image, packed by im2col_b.c's gathers */
/* {{NAME}}: C[b] = epilogue(A[b] @ B[b]) for b < {{BATCH}}; M={{M}} N={{N}} K={{K}}, row-major,
 * B {{B_LAYOUT}}, A {{A_LAYOUT}}.
 *
 * BLIS-style, loop order pc (KC slices of K) > chunk (MC rows of A) > jc (NC columns of B,
 * packed into a KC x NC panel that stays in L2) > ir (MR rows of A x KC, stay in L1) > jr
 * (NR-column micro-panel of B) > register-blocked MR x NR micro-kernel. With DIRECT_A
 * ({{DIRECT_A}}; A not given transposed, eqfuse.backend.kinds.contraction.plan_gemm.direct_a) the micro-kernel
 * broadcasts A's elements from its rows in place; otherwise each chunk of A is packed once per
 * K slice into MR-row panels. Sizes are compile-time constants: the backend knows every shape,
 * and constant trip counts let gcc unroll the micro-kernel. The last M % MR rows run through a
 * kernel of that many rows (EDGE_MR); a partial last NR panel is computed in full on a
 * zero-padded panel and stored in part. With DIRECT_B ({{DIRECT_B}}; few rows, B not transposed, see eqfuse.backend.kinds.contraction.plan_gemm.direct) the
 * micro-kernel reads the full NR-column panels of B in place (row stride {{LDB}}) and only a
 * partial last panel is packed. With PREPACKED_B ({{PREPACKED_B}}; B bound by params=) the B argument
 * is not B but its panels, packed once by {{NAME}}_prepack: for each KC slice of K, the NR-column
 * panels of all of N, so every thread reads the panels it needs and nothing is packed per call.
 *
 * BF16 ({{BF16}}; precision="bf16", the plan's path): 0 = f32. 2 = AVX512_BF16: B's panels hold
 * K-pairs of bf16 ([kc/2][NR][2], vdpbf16ps's operand), A is packed per K slice as K-pairs of bf16
 * (one 32-bit lane per row and pair, rounded by vcvtne2ps2bf16), and the micro-kernel multiplies
 * with vdpbf16ps, accumulating in f32. 1 = the fallback for CPUs without it: B's panels hold bf16
 * ([kc][NR]), widened to f32 by a shift in the micro-kernel; A is packed as f32 values rounded to
 * bf16; f32 FMA. Either way A and B are rounded alike (eqf_bf16, common.h) and a K slice's depth
 * in the panels is even (a zero pads an odd one); the epilogue is f32. B is never read in place
 * (DIRECT_B) nor A (DIRECT_A): both are converted while packed. 3 = AMX-BF16 (MR = NR = 32): B's
 * panels are the K-pairs of path 2, A is packed per K slice as rows of bf16, and the micro-kernel
 * multiplies 2 x 2 C tiles of 16 x 16 f32 by tdpbf16ps (common_amx.h: the tile configuration, the
 * operating system's permission, and an emulation for CPUs without AMX); a K slice's depth in both
 * panels is padded by zeros to whole blocks of 32, one row of an A tile.
 *
 * The epilogue: a KC slice that is not the last one adds its partial sums into C; the last one
 * leaves the finished MR x NR tile in a buffer in L1, from where it reaches C through
 * `{{EPILOGUE}}` (in terms of acc, i, j, b, M, N, K and the extra parameters): the only store
 * of the final value, so the epilogue runs exactly once per element.
 *
 * Threads: when there are at least as many batches as threads, each thread computes whole
 * batches (no synchronisation at all); otherwise the threads split each batch, either by rows
 * (each an equal share of the MR tiles; the threads pack each B panel together, two barriers per
 * panel) or, when M is small against N, by columns (each its own NR panels, its own packed B
 * and A, no synchronisation); {{NAME}}_split has the rule. */
#include <stdlib.h>
#include <omp.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define {{NAME}}_M {{M}}L
#define {{NAME}}_N {{N}}L
#define {{NAME}}_K {{K}}L
#define {{NAME}}_MR {{MR}}
#define {{NAME}}_NR {{NR}}
#define {{NAME}}_MC {{MC}}L
#define {{NAME}}_NC {{NC}}L
#define {{NAME}}_KC {{KC}}L
#define {{NAME}}_DIRECT_A {{DIRECT_A}} /* the plan's direct_a: A read in place */
#define {{NAME}}_DIRECT_B {{DIRECT_B}} /* the plan's direct_b: B read in place */
/* ROWMAP: the rows are a dim taken at run time behind a batch (eqfuse.backend.runtime_dim): the
 * GEMM's row i is row AROW(i) of A and C, each batch's first `live` rows one after another */
#define {{NAME}}_ROWMAP {{ROWMAP}}
#define {{NAME}}_AROW(i) {{AROW}}
#define {{NAME}}_EDGE_MR ({{NAME}}_M % {{NAME}}_MR) /* rows of the last, partial MR tile (0: none) */
#define {{NAME}}_EDGE ({{NAME}}_EDGE_MR ? {{NAME}}_EDGE_MR : {{NAME}}_MR)
#define {{NAME}}_NPAD (({{NAME}}_N + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR) /* N in whole panels */
#if {{BF16}}
typedef uint16_t {{NAME}}_bt; /* an element of B's panels: bf16 bits */
#if {{BF16}} == 3
#define {{NAME}}_KEVEN(kc) (((kc) + 31) & ~31L) /* a K slice's depth in the panels: whole 32-element blocks */
#else
#define {{NAME}}_KEVEN(kc) (((kc) + 1) & ~1L) /* a K slice's depth in the panels: whole K-pairs */
#endif
#define {{NAME}}_AROUND(x) eqf_bf16_round(x) /* A packed as f32 values rounded to bf16 (the fallback) */
#else
typedef float {{NAME}}_bt;
#define {{NAME}}_KEVEN(kc) (kc)
#define {{NAME}}_AROUND(x) (x)
#endif
#if {{BF16}} == 2 && !defined(__AVX512BF16__)
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif
#if {{BF16}} == 3 && !defined(EQF_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_BF16__))
#error "the plan chose the AMX-BF16 path (tdpbf16ps) but the compiler does not target AMX-TILE and AMX-BF16"
#endif
/* floats of scratch per row of a packed A block or column of a packed B panel: KC, or the padded
 * depth of path 3 in bf16 when that is more */
#define {{NAME}}_KFLOATS ({{NAME}}_KEVEN({{NAME}}_KC) / 2 > {{NAME}}_KC ? {{NAME}}_KEVEN({{NAME}}_KC) / 2 : {{NAME}}_KC)

/* A counting build (-DEQF_COUNT_UKERNEL) counts the micro-kernel calls, to check them against
 * the uop counts of `eqfuse lower --uops`; {{NAME}}_ukernel_calls() reads and resets the count. */
#ifdef EQF_COUNT_UKERNEL
static long {{NAME}}_calls;
long {{NAME}}_ukernel_calls(void) { return __atomic_exchange_n(&{{NAME}}_calls, 0, __ATOMIC_RELAXED); }
#define {{NAME}}_COUNT_CALL() __atomic_fetch_add(&{{NAME}}_calls, 1, __ATOMIC_RELAXED)
#else
#define {{NAME}}_COUNT_CALL() ((void)0)
#endif

/* tile[mr][NR] = A (mr rows x kc, element (r, k) at a[r * ars + k * aks]) . b_panel (kc x NR,
 * k-major, row stride ldb, zero padded). Always inlined with constant mr, ars and aks: each call
 * site is its own fully unrolled kernel, over packed A (ars 1, aks MR) or over A in place (ars
 * LDA, aks 1: DIRECT_A), with MR rows or, for the last M % MR rows, only those (EDGE_MR: no
 * zero rows of A through the FMAs). */
#if defined(__AVX512F__) && {{NR}} % 16 == 0
static inline __attribute__((always_inline)) void {{NAME}}_ukernel(
    const int mr, const long ars, const long aks, long kc, const float* restrict a,
    const {{NAME}}_bt* restrict b, long ldb, float* restrict tile)
{
    /* MR x NR/16 zmm accumulators; with the B row (NR/16 zmm) they must fit the 32 registers,
     * and the A element is broadcast straight from memory into each FMA. */
    enum { V = {{NAME}}_NR / 16 };
    __m512 c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            c[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (long k = 0; k < kc; k++) {
        __m512 bv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
#if {{BF16}}
            bv[v] = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(b + 16 * v))), 16));
#else
            bv[v] = _mm512_loadu_ps(b + 16 * v);
#endif
        /* the next A micro-panel rows come from L2: ask for them ahead of use */
        if (ars == 1) /* (packed A) */
            _mm_prefetch((const char*)(a + 8 * aks), _MM_HINT_T0);
#pragma GCC unroll 64
        for (int r = 0; r < mr; r++) {
            __m512 ar = _mm512_set1_ps(a[r * ars]);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                c[r][v] = _mm512_fmadd_ps(ar, bv[v], c[r][v]);
        }
        a += aks;
        b += ldb;
    }
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm512_store_ps(tile + r * {{NAME}}_NR + 16 * v, c[r][v]);
}
#elif defined(__AVX2__) && defined(__FMA__) && {{NR}} % 8 == 0
static inline __attribute__((always_inline)) void {{NAME}}_ukernel(
    const int mr, const long ars, const long aks, long kc, const float* restrict a,
    const {{NAME}}_bt* restrict b, long ldb, float* restrict tile)
{
    /* The BLIS/MLAS AVX2 shape: MR x NR/8 ymm accumulators (6 x 2 = 12), the B row (2) and
     * one broadcast A element fill the 16 ymm registers; AVX2 has no broadcast operand in an
     * FMA, so each A element is one vbroadcastss. */
    enum { V = {{NAME}}_NR / 8 };
    __m256 c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            c[r][v] = _mm256_setzero_ps();
#pragma GCC unroll 4
    for (long k = 0; k < kc; k++) {
        __m256 bv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
#if {{BF16}}
            bv[v] = _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(b + 8 * v))), 16));
#else
            bv[v] = _mm256_loadu_ps(b + 8 * v);
#endif
        if (ars == 1) /* (packed A) */
            _mm_prefetch((const char*)(a + 8 * aks), _MM_HINT_T0);
#pragma GCC unroll 64
        for (int r = 0; r < mr; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + r * ars);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                c[r][v] = _mm256_fmadd_ps(ar, bv[v], c[r][v]);
        }
        a += aks;
        b += ldb;
    }
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm256_store_ps(tile + r * {{NAME}}_NR + 8 * v, c[r][v]);
}
#elif {{NR}} % 4 == 0
/* Portable micro-kernel, in GCC's generic vectors of 4 floats (SSE on x86-64-v2, NEON on ARM,
 * scalar code elsewhere): MR x NR/4 accumulators that live in registers, the tile fully
 * unrolled. Plain loops over a float array were left scalar and in memory by gcc
 * (benchmarks/bench_gemm.py --machine portable). */
typedef float {{NAME}}_v4 __attribute__((vector_size(16)));
typedef float {{NAME}}_v4u __attribute__((vector_size(16), aligned(4))); /* an unaligned load */
static inline __attribute__((always_inline)) void {{NAME}}_ukernel(
    const int mr, const long ars, const long aks, long kc, const float* restrict a,
    const {{NAME}}_bt* restrict b, long ldb, float* restrict tile)
{
    enum { V = {{NAME}}_NR / 4 };
    {{NAME}}_v4 c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            c[r][v] = ({{NAME}}_v4){0.0f, 0.0f, 0.0f, 0.0f};
#pragma GCC unroll 2
    for (long k = 0; k < kc; k++) {
        {{NAME}}_v4 bv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
#if {{BF16}}
            bv[v] = ({{NAME}}_v4){eqf_bf16_f32(b[4 * v]), eqf_bf16_f32(b[4 * v + 1]), eqf_bf16_f32(b[4 * v + 2]),
                                  eqf_bf16_f32(b[4 * v + 3])};
#else
            bv[v] = *(const {{NAME}}_v4u*)(b + 4 * v);
#endif
#pragma GCC unroll 64
        for (int r = 0; r < mr; r++) {
            const float ar = a[r * ars];
            const {{NAME}}_v4 av = {ar, ar, ar, ar};
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                c[r][v] += av * bv[v];
        }
        a += aks;
        b += ldb;
    }
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            *({{NAME}}_v4*)(tile + r * {{NAME}}_NR + 4 * v) = c[r][v];
}
#else
/* Any other NR (a blocking given by hand): plain loops, left to the auto-vectorizer. */
static inline __attribute__((always_inline)) void {{NAME}}_ukernel(
    const int mr, const long ars, const long aks, long kc, const float* restrict a,
    const {{NAME}}_bt* restrict b, long ldb, float* restrict tile)
{
    float c[{{NAME}}_MR][{{NAME}}_NR];
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < {{NAME}}_NR; j++)
            c[r][j] = 0.0f;
    for (long k = 0; k < kc; k++)
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < {{NAME}}_NR; j++)
#if {{BF16}}
                c[r][j] += a[r * ars + k * aks] * eqf_bf16_f32(b[k * ldb + j]);
#else
                c[r][j] += a[r * ars + k * aks] * b[k * ldb + j];
#endif
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < {{NAME}}_NR; j++)
            tile[r * {{NAME}}_NR + j] = c[r][j];
}
#endif

#if {{BF16}} == 2
/* tile[mr][NR] = A (mr rows x kc, packed as K-pairs: the pair p of row r is the 32-bit a[p * MR + r])
 * . b_panel (K-pairs of bf16, [kc/2][NR][2]), by vdpbf16ps: each 32-bit lane of a zmm of B holds
 * the pair (B[2p][j], B[2p+1][j]) of one column j, and the broadcast pair of A multiplies both
 * elements, summed into f32 lane j. Always inlined with a constant mr (MR, or EDGE_MR). */
static inline __attribute__((always_inline)) void {{NAME}}_ukernel_bf16(
    const int mr, long kc, const uint32_t* restrict a, const uint16_t* restrict b, float* restrict tile)
{
    enum { V = {{NAME}}_NR / 16 };
    __m512 c[{{NAME}}_MR][V];
    const long kp = (kc + 1) / 2;
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            c[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (long p = 0; p < kp; p++) {
        __m512i bv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            bv[v] = _mm512_loadu_si512((const void*)(b + 32 * v));
        _mm_prefetch((const char*)(a + 8 * {{NAME}}_MR), _MM_HINT_T0);
#pragma GCC unroll 64
        for (int r = 0; r < mr; r++) {
            const __m512i ar = _mm512_set1_epi32((int)a[r]);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)bv[v], (__m512bh)ar);
        }
        a += {{NAME}}_MR;
        b += 2 * {{NAME}}_NR;
    }
#pragma GCC unroll 64
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm512_store_ps(tile + r * {{NAME}}_NR + 16 * v, c[r][v]);
}
#endif

/* Row `row` (of A and C, before AROW) of a finished MR x NR tile, nr columns from jcr, into C: on
 * the last K slice through the epilogue, on others into the partial sums. Four loops rather than
 * one with conditions inside: the epilogue's loop must not read C when C does not hold a partial
 * sum yet (that read would miss in cache). */
static inline __attribute__((always_inline)) void {{NAME}}_store_row(const float* restrict trow, float* restrict C, long b,
                                                                    long row, long jcr, long nr, int first, int last{{EXTRA_PARAMS}})
{
    const long M = {{NAME}}_M, N = {{NAME}}_N, K = {{NAME}}_K;
    (void)M; (void)N; (void)K; (void)b;
    const long i = {{NAME}}_AROW(row);
    float* restrict crow = C + i * {{LDC}}L + jcr * {{CSC}}L;
    if (first && last) {
#pragma omp simd
        for (long jj = 0; jj < nr; jj++) {
            const long j = jcr + jj;
            const float acc = trow[jj];
            (void)j;
            crow[jj * {{CSC}}L] = {{EPILOGUE}};
        }
    } else if (last) {
#pragma omp simd
        for (long jj = 0; jj < nr; jj++) {
            const long j = jcr + jj;
            const float acc = crow[jj * {{CSC}}L] + trow[jj];
            (void)j;
            crow[jj * {{CSC}}L] = {{EPILOGUE}};
        }
    } else if (first) {
#pragma omp simd
        for (long jj = 0; jj < nr; jj++)
            crow[jj * {{CSC}}L] = trow[jj];
    } else {
#pragma omp simd
        for (long jj = 0; jj < nr; jj++)
            crow[jj * {{CSC}}L] += trow[jj];
    }
}

#if {{BF16}} == 3
/* tile[MR][NR] (MR = NR = 32) = A . B over a K slice of depth KEVEN(kc) (zero padded in both
 * panels), by tdpbf16ps. A's micro-panel holds MR rows of KEVEN(kc) bf16: an A tile is 16 rows x
 * 32 bf16 of it, at a row stride of KEVEN(kc) elements. B's micro-panel holds the K-pairs
 * [KEVEN(kc)/2][NR][2]: a B tile is 16 K-pairs x 16 columns (64 bytes a row), at a row stride of
 * NR pairs. Tiles: C 0-3 (rows 0-15 x columns 0-15, rows 0-15 x 16-31, rows 16-31 x 0-15, rows
 * 16-31 x 16-31), A 4-5 (rows 0-15, 16-31), B 6-7 (columns 0-15, 16-31). The rows past M of the
 * last tile are zero in the packed A, and the epilogue stores only the rows that exist. */
_Static_assert({{NAME}}_MR == 32 && {{NAME}}_NR == 32, "the AMX micro-kernel is 2 x 2 C tiles of 16 x 16");
static inline __attribute__((always_inline)) void {{NAME}}_ukernel_amx(long kc, const uint16_t* restrict a,
                                                                    const uint16_t* restrict b, float* restrict tile,
                                                                    const char* pf, long pf_lines,
                                                                    const float* restrict prev, long prow, long pmr, long pjcr,
                                                                    long pnr, float* restrict C, long batch, int first, int last{{EXTRA_PARAMS}})
{
    const long kb = {{NAME}}_KEVEN(kc);
    /* rows of the previous tile (prev, pmr rows from prow) stored per step: the vector units run
     * its epilogue while the tile unit multiplies this one (see _macro) */
    const long per = (pmr + kb / 32 - 1) / (kb / 32);
    EQF_AMX_FENCE(); /* (the packed panels are in memory before the first tile load) */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (long k = 0; k < kb; k += 32) {
        /* pf_lines lines of the next B panel into L2 per step (see _macro) */
        for (long l = 0; l < pf_lines; l++)
            _mm_prefetch(pf + (k / 32 * pf_lines + l) * 64, _MM_HINT_T1);
        for (long r = k / 32 * per; r < (k / 32 + 1) * per && r < pmr; r++)
            {{NAME}}_store_row(prev + r * {{NAME}}_NR, C, batch, prow + r, pjcr, pnr, first, last{{EXTRA_ARGS}});
        _tile_loadd(4, a + k, 2 * kb);
        _tile_loadd(5, a + 16 * kb + k, 2 * kb);
        _tile_loadd(6, b + k * {{NAME}}_NR, 4 * {{NAME}}_NR);
        _tile_loadd(7, b + k * {{NAME}}_NR + 32, 4 * {{NAME}}_NR);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, tile, 4 * {{NAME}}_NR);
    _tile_stored(1, tile + 16, 4 * {{NAME}}_NR);
    _tile_stored(2, tile + 16 * {{NAME}}_NR, 4 * {{NAME}}_NR);
    _tile_stored(3, tile + 16 * {{NAME}}_NR + 16, 4 * {{NAME}}_NR);
    EQF_AMX_FENCE();
}
#endif

/* B[pc:pc+kc, jc+jr0 : jc+jr1] -> NR-column micro-panels, k-major inside a panel, zero padded.
 * B_AT is the element (k, j) of B for the layout this kernel was built for; the loops run along
 * that layout's rows so that the reads are contiguous. */
#if {{BF16}} == 0
static void {{NAME}}_pack_b(const float* restrict B, long pc, long kc, long jc, long jr0, long jr1, long nc,
                            float* restrict bp)
{
    for (long jr = jr0; jr < jr1; jr += {{NAME}}_NR) {
        float* restrict dst = bp + jr * kc;
        const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
#if {{B_TRANSPOSED}}
        for (long j = 0; j < nr; j++)
            for (long k = 0; k < kc; k++)
                dst[k * {{NAME}}_NR + j] = {{B_AT}};
        for (long j = nr; j < {{NAME}}_NR; j++)
            for (long k = 0; k < kc; k++)
                dst[k * {{NAME}}_NR + j] = 0.0f;
#else
        if (nr == {{NAME}}_NR) {
            for (long k = 0; k < kc; k++)
#pragma omp simd
                for (long j = 0; j < {{NAME}}_NR; j++)
                    dst[k * {{NAME}}_NR + j] = {{B_AT}};
        } else {
            for (long k = 0; k < kc; k++) {
                for (long j = 0; j < nr; j++)
                    dst[k * {{NAME}}_NR + j] = {{B_AT}};
                for (long j = nr; j < {{NAME}}_NR; j++)
                    dst[k * {{NAME}}_NR + j] = 0.0f;
            }
        }
#endif
    }
}
#elif {{BF16}} == 1
/* bf16 panels, [KEVEN(kc)][NR] each (an odd kc's last row of zeros), rounded by eqf_bf16 */
static void {{NAME}}_pack_b(const float* restrict B, long pc, long kc, long jc, long jr0, long jr1, long nc,
                            uint16_t* restrict bp)
{
    const long kc2 = {{NAME}}_KEVEN(kc);
    for (long jr = jr0; jr < jr1; jr += {{NAME}}_NR) {
        uint16_t* restrict dst = bp + jr * kc2;
        const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
        for (long k = 0; k < kc2; k++) {
            for (long j = 0; j < {{NAME}}_NR; j++)
                dst[k * {{NAME}}_NR + j] = k < kc && j < nr ? eqf_bf16({{B_AT}}) : 0;
        }
    }
}
#elif {{IMPLICIT}}
/* The implicit im2col (a conv on AMX tiles: emit_gemm's `image`): B is the image's zero-padded
 * copy, and the K-pair panels below are packed from it (csrc_templates/im2col_b.c): per panel,
 * where each group of 16 columns' windows lie, once; then per pair of rows two loads of each group
 * (a load per output row the group spans at stride 1, a gather otherwise), interleaved and
 * rounded as below; the padding past kc and past the panel's columns zero. */
static void {{NAME}}_pack_b(const float* restrict B, long pc, long kc, long jc, long jr0, long jr1, long nc,
                            uint16_t* restrict bp)
{
    const long kc2 = {{NAME}}_KEVEN(kc);
    for (long jr = jr0; jr < jr1; jr += {{NAME}}_NR) {
        uint16_t* restrict dst = bp + jr * kc2;
        const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
#if defined(__AVX512BF16__)
        const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
        const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
        {{NAME}}_group g[{{NAME}}_NR / 16];
        for (long h = 0; h < {{NAME}}_NR / 16; h++)
            {{NAME}}_group_of(jc + jr + 16 * h, nr - 16 * h < 0 ? 0 : (nr - 16 * h < 16 ? nr - 16 * h : 16), &g[h]);
        for (long k0 = 0; k0 < kc2; k0 += 2)
            for (long h = 0; h < {{NAME}}_NR / 16; h++) {
                const __m512 r0 = k0 < kc ? {{NAME}}_cols(B, pc + k0, &g[h]) : _mm512_setzero_ps();
                const __m512 r1 = k0 + 1 < kc ? {{NAME}}_cols(B, pc + k0 + 1, &g[h]) : _mm512_setzero_ps();
                const __m512 x0 = _mm512_permutex2var_ps(r0, lo, r1), x1 = _mm512_permutex2var_ps(r0, hi, r1);
                _mm512_storeu_si512((void*)(dst + k0 * {{NAME}}_NR + 32 * h), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
            }
#else
        for (long k = 0; k < kc2; k++)
            for (long j = 0; j < {{NAME}}_NR; j++)
                dst[(k >> 1) * 2 * {{NAME}}_NR + 2 * j + (k & 1)] = k < kc && j < nr ? eqf_bf16({{NAME}}_col(B, pc + k, jc + jr + j)) : 0;
#endif
    }
}
#else
/* K-pair panels, [KEVEN(kc)/2][NR][2] each (paths 2 and 3: vdpbf16ps's operand, and 16 pairs of
 * it are a B tile): the pair of rows (2p, 2p + 1) of column j at dst[p * 2 NR + 2 j], the depth
 * past kc (an odd kc's last element; path 3: up to the 32-element block) zero. Full panels of a B
 * with rows in memory: two rows interleaved (vpermt2ps) and rounded by vcvtne2ps2bf16, 16 columns
 * at a time (without AVX512_BF16, only path 3's emulation: by eqf_bf16, which rounds alike). */
static void {{NAME}}_pack_b(const float* restrict B, long pc, long kc, long jc, long jr0, long jr1, long nc,
                            uint16_t* restrict bp)
{
    const long kc2 = {{NAME}}_KEVEN(kc);
    for (long jr = jr0; jr < jr1; jr += {{NAME}}_NR) {
        uint16_t* restrict dst = bp + jr * kc2;
        const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
        long k0 = 0;
#if !{{B_TRANSPOSED}} && defined(__AVX512BF16__)
        if (nr == {{NAME}}_NR) {
            const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
            const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
            for (; k0 + 2 <= kc; k0 += 2) {
                for (long j = 0; j < {{NAME}}_NR; j += 16) {
                    long k = k0;
                    const __m512 r0 = _mm512_loadu_ps(&{{B_AT}});
                    k = k0 + 1;
                    const __m512 r1 = _mm512_loadu_ps(&{{B_AT}});
                    const __m512 x0 = _mm512_permutex2var_ps(r0, lo, r1), x1 = _mm512_permutex2var_ps(r0, hi, r1);
                    _mm512_storeu_si512((void*)(dst + k0 * {{NAME}}_NR + 2 * j), (__m512i)_mm512_cvtne2ps_pbh(x1, x0));
                }
            }
        }
#endif
        for (long k = k0; k < kc2; k++)
            for (long j = 0; j < {{NAME}}_NR; j++)
                dst[(k >> 1) * 2 * {{NAME}}_NR + 2 * j + (k & 1)] = k < kc && j < nr ? eqf_bf16({{B_AT}}) : 0;
    }
}
#endif

#if {{BF16}} < 2
/* A[ic:ic+mc, pc:pc+kc] -> MR-row micro-panels, k-major inside a panel, zero padded. */
static void {{NAME}}_pack_a(const float* restrict A, long ic, long mc, long pc, long kc, float* restrict ap{{ROWMAP_PARAM}})
{
    for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
        float* restrict dst = ap + ir * kc;
        long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
#if {{A_TRANSPOSED}}
        /* A given transposed (K x M, row stride LDA): the MR rows of one k are contiguous */
        const float* restrict srct = A + pc * {{LDA}}L + ic + ir;
        for (long k = 0; k < kc; k++) {
            for (long r = 0; r < mr; r++)
                dst[k * {{NAME}}_MR + r] = {{NAME}}_AROUND(srct[k * {{LDA}}L + r]);
            for (long r = mr; r < {{NAME}}_MR; r++)
                dst[k * {{NAME}}_MR + r] = 0.0f;
        }
#elif {{ROWMAP}}
        /* each row where AROW puts it (the tile's rows may be in two batches) */
        for (long r = 0; r < {{NAME}}_MR; r++) {
            const float* restrict src = A + {{NAME}}_AROW(ic + ir + (r < mr ? r : 0)) * {{LDA}}L + pc;
            for (long k = 0; k < kc; k++)
                dst[k * {{NAME}}_MR + r] = r < mr ? {{NAME}}_AROUND(src[k]) : 0.0f;
        }
#else
        const float* restrict src = A + (ic + ir) * {{LDA}}L + pc;
        if (mr == {{NAME}}_MR) {
            for (long k = 0; k < kc; k++)
#pragma GCC unroll 64
                for (long r = 0; r < {{NAME}}_MR; r++)
                    dst[k * {{NAME}}_MR + r] = {{NAME}}_AROUND(src[r * {{LDA}}L + k]);
        } else {
            for (long k = 0; k < kc; k++) {
                for (long r = 0; r < mr; r++)
                    dst[k * {{NAME}}_MR + r] = {{NAME}}_AROUND(src[r * {{LDA}}L + k]);
                for (long r = mr; r < {{NAME}}_MR; r++)
                    dst[k * {{NAME}}_MR + r] = 0.0f;
            }
        }
#endif
    }
}
#endif

#if {{BF16}} == 2
/* A[ic:ic+mc, pc:pc+kc] -> MR-row micro-panels of K-pairs: the pair (A[i][2p], A[i][2p+1]) of row
 * ir + r at ap[ir * kp + p * MR + r] as one 32-bit lane (kp = ceil(kc / 2), an odd kc's last pair
 * completed by a zero, rows past mc zero). A with rows in memory: 32 elements of a row rounded by
 * one vcvtne2ps2bf16 into 16 pairs. A whole micro-panel (MR <= 16 rows) goes 16 K-pairs at a time
 * through registers: its MR vectors of 16 pairs, one per row, are the 16 x MR block of the panel
 * transposed, and the block's MR vectors are each merged from the rows' vectors by masked
 * vpermd (MR x MR of them). Storing each row's pairs one by one instead (a 32-bit store at every
 * MR-th lane) took a tenth of the time of BERT's second FFN GEMM (M 128, K 3072, N 768), whose A,
 * the activations, is packed on every call (`benchmarks/bench_gemm.py --precision bf16`). */
static void {{NAME}}_pack_a_pairs(const float* restrict A, long ic, long mc, long pc, long kc, uint32_t* restrict ap{{ROWMAP_PARAM}})
{
    const long kp = (kc + 1) / 2;
#if !{{A_TRANSPOSED}} && {{NAME}}_MR <= 16
    /* lane i of the block's vector j is pair (16 j + i) / MR of row (16 j + i) % MR */
    int32_t lane_pair[{{NAME}}_MR][16] __attribute__((aligned(64)));
    __mmask16 from_row[{{NAME}}_MR][{{NAME}}_MR] = { { 0 } };
    for (int j = 0; j < {{NAME}}_MR; j++)
        for (int i = 0; i < 16; i++) {
            lane_pair[j][i] = (16 * j + i) / {{NAME}}_MR;
            from_row[j][(16 * j + i) % {{NAME}}_MR] |= (__mmask16)(1u << i);
        }
#endif
    for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
        uint32_t* restrict dst = ap + ir * kp;
        const long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
#if !{{A_TRANSPOSED}} && {{NAME}}_MR <= 16
        if (mr == {{NAME}}_MR && kc >= 32) {
            const float* restrict src[{{NAME}}_MR];
            for (int r = 0; r < {{NAME}}_MR; r++)
                src[r] = A + {{NAME}}_AROW(ic + ir + r) * {{LDA}}L + pc;
            long p = 0;
            for (; 2 * p + 32 <= kc; p += 16) {
                __m512i row[{{NAME}}_MR];
#pragma GCC unroll 16
                for (int r = 0; r < {{NAME}}_MR; r++)
                    row[r] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src[r] + 2 * p + 16),
                                                          _mm512_loadu_ps(src[r] + 2 * p));
#pragma GCC unroll 16
                for (int j = 0; j < {{NAME}}_MR; j++) {
                    const __m512i idx = _mm512_load_si512((const void*)lane_pair[j]);
                    __m512i v = _mm512_setzero_si512();
#pragma GCC unroll 16
                    for (int r = 0; r < {{NAME}}_MR; r++)
                        v = _mm512_mask_permutexvar_epi32(v, from_row[j][r], idx, row[r]);
                    _mm512_storeu_si512((void*)(dst + p * {{NAME}}_MR + 16 * j), v);
                }
            }
            for (; p < kp; p++)
                for (int r = 0; r < {{NAME}}_MR; r++)
                    dst[p * {{NAME}}_MR + r] = eqf_bf16_pair(src[r][2 * p], 2 * p + 1 < kc ? src[r][2 * p + 1] : 0.0f);
            continue;
        }
#endif
        for (long r = 0; r < {{NAME}}_MR; r++) {
            if (r >= mr) {
                for (long p = 0; p < kp; p++)
                    dst[p * {{NAME}}_MR + r] = 0;
                continue;
            }
#if {{A_TRANSPOSED}}
            /* A given transposed (K x M, row stride LDA) */
            const float* restrict col = A + pc * {{LDA}}L + ic + ir + r;
            for (long p = 0; p < kp; p++)
                dst[p * {{NAME}}_MR + r] = eqf_bf16_pair(col[2 * p * {{LDA}}L],
                                                         2 * p + 1 < kc ? col[(2 * p + 1) * {{LDA}}L] : 0.0f);
#else
            const float* restrict src = A + {{NAME}}_AROW(ic + ir + r) * {{LDA}}L + pc;
            long p = 0;
            for (; 2 * p + 32 <= kc; p += 16) {
                uint32_t t[16] __attribute__((aligned(64)));
                _mm512_store_si512((void*)t, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 2 * p + 16),
                                                                           _mm512_loadu_ps(src + 2 * p)));
#pragma GCC unroll 16
                for (int q = 0; q < 16; q++)
                    dst[(p + q) * {{NAME}}_MR + r] = t[q];
            }
            for (; p < kp; p++)
                dst[p * {{NAME}}_MR + r] = eqf_bf16_pair(src[2 * p], 2 * p + 1 < kc ? src[2 * p + 1] : 0.0f);
#endif
        }
    }
}
#endif

#if {{BF16}} == 3
/* A[ic:ic+mc, pc:pc+kc] -> rows of bf16 for the A tiles: row r of the chunk at ap[r * KEVEN(kc)],
 * its K slice rounded to bf16 and zero padded to whole blocks of 32; the rows past mc, up to whole
 * MR-row micro-panels, zero. A with rows in memory: 32 elements rounded by one vcvtne2ps2bf16. */
static void {{NAME}}_pack_a_rows(const float* restrict A, long ic, long mc, long pc, long kc, uint16_t* restrict ap)
{
    const long kb = {{NAME}}_KEVEN(kc), rows = (mc + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR;
    for (long r = 0; r < rows; r++) {
        uint16_t* restrict dst = ap + r * kb;
        long k = 0;
        if (r < mc) {
#if {{A_TRANSPOSED}}
            /* A given transposed (K x M, row stride LDA) */
            const float* restrict col = A + pc * {{LDA}}L + ic + r;
            for (; k < kc; k++)
                dst[k] = eqf_bf16(col[k * {{LDA}}L]);
#else
            const float* restrict src = A + (ic + r) * {{LDA}}L + pc;
#if defined(__AVX512BF16__)
            for (; k + 32 <= kc; k += 32)
                _mm512_storeu_si512((void*)(dst + k), (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + k + 16),
                                                                                    _mm512_loadu_ps(src + k)));
#endif
            for (; k < kc; k++)
                dst[k] = eqf_bf16(src[k]);
#endif
        }
        for (; k < kb; k++)
            dst[k] = 0;
    }
}
#endif

/* C[ic:ic+mc, jc:jc+nc] (+)= packed A block . packed B panel; the epilogue on the last K slice.
 * ir outer (JR_OUTER 0): one MR x kc micro-panel of A stays in L1 while the B panel streams from
 * L2. AMX (JR_OUTER 1): jr outer, each B micro-panel serving every MR tile of the block in turn
 * while the next one is prefetched into L2, a share per call: a micro-panel of A (32 rows of all
 * of a deep K slice) does not stay in L1 beside B's anyway, and prepacked weights past the caches
 * then come from memory at the pace of the whole block's tiles, not in one pass over the block's
 * first MR rows that waits on memory (benchmarks/bench_models.py --precision bf16 --model bert-base). */
#define {{NAME}}_JR_OUTER ({{BF16}} == 3)
static void {{NAME}}_macro(const float* restrict A, const float* restrict ap, const {{NAME}}_bt* restrict bp,
                           const float* restrict B, float* restrict C,
                           long b, long ic, long mc, long jc, long nc, long pc, long kc{{EXTRA_PARAMS}})
{
    const long M = {{NAME}}_M, N = {{NAME}}_N, K = {{NAME}}_K;
    const int first = pc == 0, last = pc + kc >= K;
    /* AMX: two tile buffers, the tile just computed stored into C during the next one's products
     * (pmr rows pending from prow, pnr columns from pjcr; the last one after the loop) */
    float tiles[1 + {{NAME}}_JR_OUTER][{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
    long prow = 0, pmr = 0, pjcr = 0, pnr = 0;
    (void)M; (void)N; (void)b; (void)prow; (void)pmr; (void)pjcr; (void)pnr;
    const long nir = (mc + {{NAME}}_MR - 1) / {{NAME}}_MR, njr = (nc + {{NAME}}_NR - 1) / {{NAME}}_NR;
    for (long t = 0; t < nir * njr; t++) {
        const long ir = ({{NAME}}_JR_OUTER ? t % nir : t / njr) * {{NAME}}_MR;
        const long jr = ({{NAME}}_JR_OUTER ? t / nir : t % njr) * {{NAME}}_NR;
        const long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
        float* restrict tile = tiles[{{NAME}}_JR_OUTER ? t & 1 : 0];
        {
            const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
            /* Fetch the C tile (for writing) while the micro-kernel computes: otherwise each
             * store below waits for its line from memory, a cost per element of C that shows
             * when K is small. */
            for (long r = 0; r < mr; r++)
                for (long jj = 0; jj < nr; jj += 16)
                    __builtin_prefetch(C + {{NAME}}_AROW(ic + ir + r) * {{LDC}}L + (jc + jr + jj) * {{CSC}}L, 1, 3);
            {{NAME}}_COUNT_CALL();
            /* one inlined kernel per case, every stride a constant: MR rows or the edge's
             * EDGE_MR, B in place (DIRECT_B, full panels) or packed, A in place or packed */
#if {{NAME}}_DIRECT_B
#define {{NAME}}_CALL(MRX, AQ, ARS, AKS)                                                                 \
            do {                                                                                    \
                if (nr == {{NAME}}_NR)                                                              \
                    {{NAME}}_ukernel(MRX, ARS, AKS, kc, AQ, B + pc * {{LDB}}L + jc + jr, {{LDB}}L, tile); \
                else                                                                                \
                    {{NAME}}_ukernel(MRX, ARS, AKS, kc, AQ, bp + jr * kc, {{NAME}}_NR, tile);       \
            } while (0)
#else
#define {{NAME}}_CALL(MRX, AQ, ARS, AKS)                                                                 \
            {{NAME}}_ukernel(MRX, ARS, AKS, kc, AQ, bp + jr * {{NAME}}_KEVEN(kc), {{NAME}}_NR, tile)
#endif
#if {{BF16}} == 2
            /* K-pairs of A (packed per K slice) and of B: vdpbf16ps */
            {
                const long kp = (kc + 1) / 2;
                const uint32_t* restrict aq = (const uint32_t*)ap + ir * kp;
                const uint16_t* restrict bq = bp + jr * {{NAME}}_KEVEN(kc);
                /* (ROWMAP: a partial tile of any row count by the MR kernel, A's rows past it zero) */
                if ({{NAME}}_EDGE_MR == 0 || mr == {{NAME}}_MR || {{NAME}}_ROWMAP)
                    {{NAME}}_ukernel_bf16({{NAME}}_MR, kc, aq, bq, tile);
                else
                    {{NAME}}_ukernel_bf16({{NAME}}_EDGE, kc, aq, bq, tile);
            }
            (void)A;
#elif {{BF16}} == 3
            /* rows of bf16 A and K-pairs of B: tdpbf16ps on 2 x 2 C tiles (all MR rows: those past M are zero) */
            {
                /* the next micro-panel, 1 / nir of it per call: the block's next, or with PREPACKED_B
                 * the next block's first (the panels of a K slice are contiguous across N) */
                const long bytes = 2 * {{NAME}}_KEVEN(kc) * {{NAME}}_NR, steps = {{NAME}}_KEVEN(kc) / 32;
                const long share = (bytes / 64 + nir - 1) / nir, lines = jr + {{NAME}}_NR < nc || ({{PREPACKED_B}} && jc + nc < N) ? (share + steps - 1) / steps : 0;
                const char* pf = (const char*)(bp + (jr + {{NAME}}_NR) * {{NAME}}_KEVEN(kc)) + ir / {{NAME}}_MR * share * 64;
                {{NAME}}_ukernel_amx(kc, (const uint16_t*)ap + ir * {{NAME}}_KEVEN(kc), bp + jr * {{NAME}}_KEVEN(kc), tile, pf, lines,
                                     tiles[(t + 1) & 1], prow, pmr, pjcr, pnr, C, b, first, last{{EXTRA_ARGS}});
                prow = ic + ir, pmr = mr, pjcr = jc + jr, pnr = nr;
            }
            (void)A;
#elif {{NAME}}_DIRECT_A
            if ({{NAME}}_EDGE_MR == 0 || mr == {{NAME}}_MR)
                {{NAME}}_CALL({{NAME}}_MR, A + (ic + ir) * {{LDA}}L + pc, {{LDA}}L, 1);
{{EDGE_ROWS_DIRECT}}            else
                {{NAME}}_CALL({{NAME}}_EDGE, A + (ic + ir) * {{LDA}}L + pc, {{LDA}}L, 1);
            (void)ap;
#else
            if ({{NAME}}_EDGE_MR == 0 || mr == {{NAME}}_MR)
                {{NAME}}_CALL({{NAME}}_MR, ap + ir * kc, 1, {{NAME}}_MR);
{{EDGE_ROWS_PACKED}}            else
                {{NAME}}_CALL({{NAME}}_EDGE, ap + ir * kc, 1, {{NAME}}_MR);
            (void)A;
#endif
#undef {{NAME}}_CALL
            (void)B;
#if {{BF16}} != 3
            for (long r = 0; r < mr; r++)
                {{NAME}}_store_row(tile + r * {{NAME}}_NR, C, b, ic + ir + r, jc + jr, nr, first, last{{EXTRA_ARGS}});
#else
            if (t == nir * njr - 1) /* the last tile: nothing to overlap it with */
                for (long r = 0; r < mr; r++)
                    {{NAME}}_store_row(tile + r * {{NAME}}_NR, C, b, ic + ir + r, jc + jr, nr, first, last{{EXTRA_ARGS}});
#endif
        }
        /* whole rows in one NC block: the row epilogue on these MR rows while they are in L1
         * (jr outer: on the block's rows once all are done) */
        if (last && nc == N && ({{NAME}}_JR_OUTER ? t == nir * njr - 1 : jr + {{NAME}}_NR >= nc)) {
            const long eqf_r0 = {{NAME}}_JR_OUTER ? ic : ic + ir, eqf_r1 = {{NAME}}_JR_OUTER ? ic + mc : ic + ir + mr;
            {{ROW_EPILOGUE}}
        }
    }
}


/* Rows [m0, m1) x columns [n0, n1) of batch b: C = epilogue(A @ B), in row chunks of MC and
 * column panels of NCB. With `shared`, the nt threads of the enclosing parallel region call this
 * together (same b and columns, each its own rows) and pack each B panel together: every thread
 * must then take the same number of steps, hence `nchunks` (of MC rows) is given. */
static void {{NAME}}_block(const float* A, const float* B, float* C, long b, long m0, long m1, long nchunks, long MC,
                           long n0, long n1, long NCB, float* restrict ap, {{NAME}}_bt* restrict bp, int shared, int me,
                           int nt{{EXTRA_PARAMS}})
{
    const long K = {{NAME}}_K, KC = {{NAME}}_KC;
    for (long pc = 0; pc < K; pc += KC) {
        const long kc = K - pc < KC ? K - pc : KC;
        for (long chunk = 0; chunk < nchunks; chunk++) {
            /* A is packed once per (K slice, chunk of rows) and then serves every B panel */
            const long ic = m0 + chunk * MC;
            const long mc = ic >= m1 ? 0 : (m1 - ic < MC ? m1 - ic : MC);
#if {{BF16}} == 2
            {{NAME}}_pack_a_pairs(A, ic, mc, pc, kc, (uint32_t*)ap{{ROWMAP_ARG}});
#elif {{BF16}} == 3
            {{NAME}}_pack_a_rows(A, ic, mc, pc, kc, (uint16_t*)ap);
#else
            if (!{{NAME}}_DIRECT_A)
                {{NAME}}_pack_a(A, ic, mc, pc, kc, ap{{ROWMAP_ARG}});
#endif
            for (long jc = n0; jc < n1; jc += NCB) {
                const long nc = n1 - jc < NCB ? n1 - jc : NCB;
                const long npanels = (nc + {{NAME}}_NR - 1) / {{NAME}}_NR;
                /* with DIRECT_B only a partial last panel is packed, the others are read from B */
                const long q0 = {{NAME}}_DIRECT_B ? nc / {{NAME}}_NR : 0, q = npanels - q0;
#if {{PREPACKED_B}}
                /* the panels _prepack made once: nothing to pack, nothing to wait for */
                const {{NAME}}_bt* restrict panel = (const {{NAME}}_bt*)B + pc * {{NAME}}_NPAD
                                                    + jc * {{NAME}}_KEVEN(kc);
                (void)q; (void)shared; (void)me; (void)nt;
#else
                const {{NAME}}_bt* restrict panel = bp;
                if (shared) {
                    /* each thread packs its share of the panel once the last one is no longer read */
#pragma omp barrier
                    {{NAME}}_pack_b(B, pc, kc, jc, (q0 + q * me / nt) * {{NAME}}_NR,
                                    (q0 + q * (me + 1) / nt) * {{NAME}}_NR, nc, bp);
#pragma omp barrier
                } else {
                    {{NAME}}_pack_b(B, pc, kc, jc, q0 * {{NAME}}_NR, npanels * {{NAME}}_NR, nc, bp);
                }
#endif
                if (mc > 0)
                    {{NAME}}_macro(A, ap, panel, B, C, b, ic, mc, jc, nc, pc, kc{{EXTRA_ARGS}});
            }
            /* the row epilogue (a row op over whole rows of C) on the rows just finished, when
             * the macro kernel could not (rows wider than one NC block) */
            if (pc + kc >= K && mc > 0 && {{NAME}}_N > NCB) { /* rows split: [n0, n1) is all of N */
                const long eqf_r0 = ic, eqf_r1 = ic + mc;
                {{ROW_EPILOGUE}}
            }
        }
    }
}

/* How nt threads share one batch: 1 = each takes whole MR-row tiles and they pack every B panel
 * together (barriers); 2 = each takes whole NR-column panels, packs its own B panels and all of
 * A (no synchronisation). {{SPLIT}} fixes the choice (0: decide here, at run time).
 * The rule: columns when every thread gets a column panel (panels >= nt) and either M <= N / 2,
 * or M <= N and M <= 64 MR. With few rows B, the larger operand, dominates the traffic: split by
 * columns it is read and packed once in total and each thread reads only its own share, with no
 * barrier; split by rows each thread reads all of the packed B (half of it from the other core's
 * cache) once per row chunk, with two barriers per panel, which also stall both threads whenever
 * one is preempted. The price of the column split is A packed by every thread (M x K each): at
 * M = N it was ahead up to 384 rows (2 threads, 1.00-1.03x) and behind from 512 (0.94-0.98x,
 * 1024^3 0.94x), so larger M keeps the row split, as does M > N (300 x 512 x 128: 0.98x). */
static int {{NAME}}_split(int nt)
{
    const long M = {{NAME}}_M, N = {{NAME}}_N;
    const long panels = (N + {{NAME}}_NR - 1) / {{NAME}}_NR;
    if ({{SPLIT}}) return {{SPLIT}};
    return nt > 1 && panels >= nt && (2 * M <= N || (M <= N && M <= 64 * {{NAME}}_MR)) ? 2 : 1;
}

#if {{NAME}}_POOL
/* POOL (a few rows over prepacked B on AMX tiles, plan_gemm.amx_few_rows): the column panels as
 * ranges of the claim-based pool (common_pool.h, eqf_region_n), each range all M rows of its own
 * panels, its A packed once per range and its tiles configured per range: the caller never waits
 * for a thread that has no core (another runtime's spinning threads), where an OpenMP region of a
 * few tens of microseconds would. One batch, no row epilogue. */
#define {{NAME}}_POOL_CHUNKS 4 /* ranges of panels: 2 threads' 2 each, or 3 for the caller beside a late worker; more
                                   * pack A more often (bench_models.py --precision bf16 --model mlp; RESULTS.md) */
typedef struct {
    const float* A0;
    const float* B0;
    float* C0;
    {{EXTRA_FIELDS}}
    int nomem; /* a range could not get its scratch (atomic) */
} {{NAME}}_pjob;

static void {{NAME}}_panels(void* job, long lo, long hi)
{
    {{NAME}}_pjob* jb = job;
    {{EXTRA_UNPACK}}
    const long M = {{NAME}}_M, N = {{NAME}}_N, KF = {{NAME}}_KFLOATS, MC = {{NAME}}_MC, NC = {{NAME}}_NC;
    const long n0 = lo * {{NAME}}_NR, n1 = hi * {{NAME}}_NR < N ? hi * {{NAME}}_NR : N;
    const long nchunks = (M + MC - 1) / MC;
    const long mcb = ((M + nchunks - 1) / nchunks + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR;
    const long ncb = (NC + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR;
    float* ap = eqf_scratch(EQF_SCRATCH_GEMM_A, KF * mcb);
    if (!ap) {
        __atomic_store_n(&jb->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
#if {{BF16}} == 3
    eqf_amx_begin(); /* (per range: the tile configuration is a thread's) */
#endif
    {{NAME}}_block(jb->A0, jb->B0, jb->C0, 0, 0, M, nchunks, mcb, n0, n1, ncb, ap, NULL, 0, 0, 1{{EXTRA_ARGS}});
#if {{BF16}} == 3
    _tile_release();
#endif
}
#endif

void {{NAME}}(const float* A0, const float* B0, float* C0{{EXTRA_PARAMS}}{{LIVE_PARAM}})
{
    /* the rows computed: M, or the first rows of a dim taken at run time (eqfuse.backend.runtime_dim):
     * its length, whose last tile takes the micro-kernel of its own rows (EDGE_ROWS), or in bf16
     * its length in whole MR tiles (the rows past the length are scratch: they hold anything, and
     * the last tile is then one of MR rows or M's own) */
    const long M = {{ROWS_LIVE}}, N = {{NAME}}_N, BATCH = {{BATCH}};
    const long KF = {{NAME}}_KFLOATS, NC = {{NAME}}_NC, MC = {{NAME}}_MC; /* (KF: of the scratch, KFLOATS) */
    const long NCP = (NC + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR; /* NC padded to whole panels */
#if {{BF16}} == 3
    if (!eqf_amx_ready()) { /* the tile state refused (common_amx.h): no tile instruction runs */
        eqf_fail_note(EQF_NO_AMX);
        return;
    }
#endif
#if {{NAME}}_POOL
    {
        {{NAME}}_pjob job = {A0, B0, C0{{EXTRA_INIT}}, 0};
        eqf_region_n((N + {{NAME}}_NR - 1) / {{NAME}}_NR, {{NAME}}_panels, &job, {{PARALLEL}}, {{NAME}}_POOL_CHUNKS);
        if (job.nomem)
            eqf_nomem_note();
        (void)M; (void)BATCH; (void)KF; (void)NC; (void)MC; (void)NCP;
        return;
    }
#endif
    /* Enough batches: each thread computes whole batches, with no synchronisation at all.
     * Otherwise the threads split the rows or the columns of each batch (see _split). */
    /* PARALLEL ({{PARALLEL}}, the plan's rule): 0 runs the whole GEMM on the calling thread, with
     * no parallel region (small work: a fork and join would cost more than it saves, and far
     * more when another process holds the other cores) */
    const int nt_max = {{PARALLEL}} ? omp_get_max_threads() : 1;
    const int by_batch = BATCH >= nt_max && BATCH > 1;
    const int by_cols = !by_batch && {{NAME}}_split(nt_max) == 2;
    float* bp_shared = by_batch || by_cols || {{PREPACKED_B}} ? NULL : eqf_scratch(EQF_SCRATCH_GEMM_B, KF * NCP);
    int nomem = 0; /* a scratch buffer could not be allocated: no thread computes, the caller learns it */
#pragma omp parallel if ({{PARALLEL}})
    {
        const int nt = omp_get_num_threads(), me = omp_get_thread_num();
        long m0 = 0, m1 = M, rows = M, n0 = 0, n1 = N, ncb = NCP;
        if (by_cols) { /* whole NR panels per thread, in equal column chunks of at most NC */
            const long panels = (N + {{NAME}}_NR - 1) / {{NAME}}_NR;
            n0 = panels * me / nt * {{NAME}}_NR;
            n1 = panels * (me + 1) / nt * {{NAME}}_NR;
            n1 = n1 < N ? n1 : N;
            n0 = n0 < N ? n0 : N;
            const long cols = (panels + nt - 1) / nt * {{NAME}}_NR; /* the most columns any thread has */
            const long ncs = (cols + NCP - 1) / NCP;
            ncb = ((cols + ncs - 1) / ncs + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR;
        } else if (!by_batch) { /* whole MR tiles per thread */
            const long tiles = (M + {{NAME}}_MR - 1) / {{NAME}}_MR;
            m0 = tiles * me / nt * {{NAME}}_MR;
            m1 = tiles * (me + 1) / nt * {{NAME}}_MR;
            m1 = m1 < M ? m1 : M;
            m0 = m0 < M ? m0 : M;
            rows = (tiles + nt - 1) / nt * {{NAME}}_MR; /* the most rows any thread has */
        }
        /* equal chunks of at most MC rows: a thin last chunk would repack all of B for a few rows */
        const long nchunks = (rows + MC - 1) / MC;
        const long mcb = ((rows + nchunks - 1) / nchunks + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR;
        /* (bf16 K-pairs of A: ceil(KC / 2) x mcb 32-bit lanes, within KC x mcb floats; path 3's rows:
         * KEVEN(KC) x mcb halves, within KFLOATS x mcb) */
        float* ap = {{NAME}}_DIRECT_A ? NULL : eqf_scratch(EQF_SCRATCH_GEMM_A, KF * mcb);
        /* (bf16 panels: KEVEN(KC) x ncb halves, within KFLOATS x ncb floats) */
        {{NAME}}_bt* bp = ({{NAME}}_bt*)((by_batch || by_cols) && !{{PREPACKED_B}} ? eqf_scratch(EQF_SCRATCH_GEMM_B, KF * ncb)
                                                                                 : bp_shared);
        if ((!ap && !{{NAME}}_DIRECT_A) || (!bp && !{{PREPACKED_B}})) {
#pragma omp atomic write
            nomem = 1;
        }
        if (!by_batch && !by_cols) { /* the threads pack B together (barriers): all of them stop, or none */
#pragma omp barrier
        }
        int stop;
#pragma omp atomic read
        stop = nomem;
#if {{BF16}} == 3
        eqf_amx_begin(); /* (in each thread: the tile configuration is a thread's) */
#endif
        for (long b = by_batch ? me : 0; b < BATCH && !stop; b += by_batch ? nt : 1)
            {{NAME}}_block(A0 + b * {{A_BATCH_STRIDE}}L, B0 + b * {{B_BATCH_STRIDE}}L, C0 + b * {{C_BATCH_STRIDE}}L,
                           b, m0, m1, nchunks, mcb, n0, n1, ncb, ap, bp, !by_batch && !by_cols, me,
                           nt{{EXTRA_ARGS}});
#if {{BF16}} == 3
        _tile_release();
#endif
    }
    if (nomem)
        eqf_nomem_note();
}

#if {{PREPACKED_B}}
/* The panels the kernel reads in place of B: for each KC slice of K (the slice at pc starts at
 * pc * NPAD elements), the NR-column panels of all of N, k-major, zero padded. In bf16 (BF16) the
 * elements are halves (KC is even, so only the last slice can be odd, padded to KEVEN): the
 * size is given in floats, half as many. */
#if {{BF16}}
long {{NAME}}_prepack_floats(void) { return {{NAME}}_KEVEN({{NAME}}_K) * {{NAME}}_NPAD / 2; }
#else
long {{NAME}}_prepack_floats(void) { return {{NAME}}_K * {{NAME}}_NPAD; }
#endif

void {{NAME}}_prepack(const float* B, float* P)
{
    for (long pc = 0; pc < {{NAME}}_K; pc += {{NAME}}_KC) {
        const long kc = {{NAME}}_K - pc < {{NAME}}_KC ? {{NAME}}_K - pc : {{NAME}}_KC;
        {{NAME}}_pack_b(B, pc, kc, 0, 0, {{NAME}}_NPAD, {{NAME}}_N, ({{NAME}}_bt*)P + pc * {{NAME}}_NPAD);
    }
}
#endif

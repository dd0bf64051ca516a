/* {{NAME}}: C = epilogue(A @ B) for few rows, M={{M}} N={{N}} K={{K}}, A {{A_LAYOUT}}, B bound
 * (params=) and read as the panels {{NAME}}_prepack made once, from B {{B_LAYOUT}}.
 *
 * The memory-bound path (eqfuse.backend.kinds.contraction.plan_gemm.skinny): with few rows each element of B is
 * used M times only, so the time is that of streaming B once from memory (or L3). B is laid out
 * as NR-column panels over all of K, k-major, one after the other: the whole of B is then one
 * sequential stream. A is packed once per call, k-major in groups of MR rows (MR x K floats a
 * group, in L1 or L2), and each panel runs through the micro-kernel once per group with the
 * MR x NR accumulators in registers over all of K: no K slices, no partial sums in C. The
 * finished tile goes through `{{EPILOGUE}}` (acc, i, j, b, M, N, K, the extra parameters) into
 * C, the only store. The threads of the claim-based pool (common_pool.h) take the packing of A
 * in parts (PACK_PARTS parts of K per group, when the plan splits it), then the panels, one at a
 * time; a row epilogue then runs over whole rows, after the last panel. */
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
#define {{NAME}}_GROUPS {{GROUPS}} /* groups of MR rows: ceil(M / MR) */
#define {{NAME}}_PANELS (({{NAME}}_N + {{NAME}}_NR - 1) / {{NAME}}_NR)
#define {{NAME}}_NPAD ({{NAME}}_PANELS * {{NAME}}_NR)
#define {{NAME}}_PER_CHUNK {{PER_CHUNK}} /* panels per pool chunk */
/* Packing A: PACK_PARTS parts of K per group, each a pool chunk, on the pool's threads when
 * PACK_PARALLEL (plan_gemm.skinny_pack_parts) */
#define {{NAME}}_PACK_PARTS {{PACK_PARTS}}
#define {{NAME}}_PACK_PART (({{NAME}}_K + {{NAME}}_PACK_PARTS - 1) / {{NAME}}_PACK_PARTS)
#define {{NAME}}_PACK_PARALLEL {{PACK_PARALLEL}}
#define {{NAME}}_ROWS_PER_CHUNK (({{NAME}}_M + 3) / 4) /* rows per pool chunk of the row epilogue: four chunks */
/* software prefetch of B this many floats ahead of the FMAs (0: none), see plan_gemm.skinny_tiles */
#define {{NAME}}_PF {{PF}}

#ifdef EQF_COUNT_UKERNEL
static long {{NAME}}_calls;
long {{NAME}}_ukernel_calls(void) { return __atomic_exchange_n(&{{NAME}}_calls, 0, __ATOMIC_RELAXED); }
#define {{NAME}}_COUNT_CALL() __atomic_fetch_add(&{{NAME}}_calls, 1, __ATOMIC_RELAXED)
#else
#define {{NAME}}_COUNT_CALL() ((void)0)
#endif

/* tile[MR][NR] = a (K x MR, k-major) . b (K x NR, k-major), over all of K */
#if defined(__AVX512F__) && {{NR}} % 16 == 0
typedef __m512 {{NAME}}_vec;
#define {{NAME}}_W 16
#define {{NAME}}_ZERO() _mm512_setzero_ps()
#define {{NAME}}_LOAD(p) _mm512_loadu_ps(p)
#define {{NAME}}_FMA(x, p, c) _mm512_fmadd_ps(_mm512_set1_ps(x), p, c)
#define {{NAME}}_STORE(p, v) _mm512_store_ps(p, v)
#elif defined(__AVX2__) && defined(__FMA__) && {{NR}} % 8 == 0
typedef __m256 {{NAME}}_vec;
#define {{NAME}}_W 8
#define {{NAME}}_ZERO() _mm256_setzero_ps()
#define {{NAME}}_LOAD(p) _mm256_loadu_ps(p)
#define {{NAME}}_FMA(x, p, c) _mm256_fmadd_ps(_mm256_set1_ps(x), p, c)
#define {{NAME}}_STORE(p, v) _mm256_store_ps(p, v)
#else
/* GCC's generic vectors of 4 floats (SSE on x86-64-v2; NR is a multiple of 4, contraction/emit_gemm.py) */
#define {{NAME}}_W 4
typedef float {{NAME}}_vec __attribute__((vector_size(16)));
typedef float {{NAME}}_vecu __attribute__((vector_size(16), aligned(4)));
#define {{NAME}}_ZERO() (({{NAME}}_vec){0})
#define {{NAME}}_LOAD(p) (*(const {{NAME}}_vecu*)(p))
#define {{NAME}}_FMA(x, p, c) ((c) + (x) * (p))
#define {{NAME}}_STORE(p, v) (*({{NAME}}_vec*)(p) = (v))
#endif

static inline void {{NAME}}_ukernel(const float* restrict a, const float* restrict b, float* restrict tile)
{
    enum { V = {{NAME}}_NR / {{NAME}}_W };
    {{NAME}}_vec c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            c[r][v] = {{NAME}}_ZERO();
#pragma GCC unroll 4
    for (long k = 0; k < {{NAME}}_K; k++) {
        {{NAME}}_vec bv[V];
#if {{NAME}}_PF > 0
        /* the stream is sequential, but the hardware prefetcher alone does not keep enough
         * lines in flight for an FMA loop this short per line */
#pragma GCC unroll 16
        for (int v = 0; v < {{NAME}}_NR; v += 16)
            __builtin_prefetch(b + {{NAME}}_PF + v, 0, 3);
#endif
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            bv[v] = {{NAME}}_LOAD(b + {{NAME}}_W * v);
#pragma GCC unroll 64
        for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 16
            for (int v = 0; v < V; v++)
                c[r][v] = {{NAME}}_FMA(a[r], bv[v], c[r][v]);
        a += {{NAME}}_MR;
        b += {{NAME}}_NR;
    }
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            {{NAME}}_STORE(tile + r * {{NAME}}_NR + {{NAME}}_W * v, c[r][v]);
}

/* B (K x N, or N x K given transposed) -> the panels: panel p holds columns [p NR, p NR + NR)
 * for k = 0..K-1, k-major, zero padded; B_AT is the element (k, j). */
long {{NAME}}_prepack_floats(void) { return {{NAME}}_K * {{NAME}}_NPAD; }

void {{NAME}}_prepack(const float* B, float* P)
{
    for (long p = 0; p < {{NAME}}_PANELS; p++) {
        float* restrict dst = P + p * {{NAME}}_K * {{NAME}}_NR;
        const long j0 = p * {{NAME}}_NR;
        const long nr = {{NAME}}_N - j0 < {{NAME}}_NR ? {{NAME}}_N - j0 : {{NAME}}_NR;
        for (long k = 0; k < {{NAME}}_K; k++) {
            for (long j = 0; j < nr; j++)
                dst[k * {{NAME}}_NR + j] = {{B_AT}};
            for (long j = nr; j < {{NAME}}_NR; j++)
                dst[k * {{NAME}}_NR + j] = 0.0f;
        }
    }
}

/* A -> GROUPS groups of MR rows, each K x MR k-major, zero padded past row M: the part
 * [k0, k1) of group g */
static void {{NAME}}_pack_a(const float* restrict A, float* restrict ap, long g, long k0, long k1)
{
    for (long r = 0; r < {{NAME}}_MR; r++) {
        const long i = g * {{NAME}}_MR + r;
        float* restrict dst = ap + g * {{NAME}}_K * {{NAME}}_MR + r;
        if (i < {{NAME}}_M)
            for (long k = k0; k < k1; k++)
                dst[k * {{NAME}}_MR] = {{A_AT}};
        else
            for (long k = k0; k < k1; k++)
                dst[k * {{NAME}}_MR] = 0.0f;
    }
}

/* C[:, panels p0..p1) = epilogue(A @ B) */
static void {{NAME}}_panels(const float* restrict ap, const float* restrict P, float* restrict C, long p0,
                            long p1{{EXTRA_PARAMS}})
{
    const long M = {{NAME}}_M, N = {{NAME}}_N, K = {{NAME}}_K, b = 0;
    float tile[{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
    (void)M; (void)K; (void)b;
    for (long p = p0; p < p1; p++) {
        const long j0 = p * {{NAME}}_NR;
        const long nr = N - j0 < {{NAME}}_NR ? N - j0 : {{NAME}}_NR;
        for (long g = 0; g < {{NAME}}_GROUPS; g++) {
            const long i0 = g * {{NAME}}_MR;
            const long mr = M - i0 < {{NAME}}_MR ? M - i0 : {{NAME}}_MR;
            {{NAME}}_COUNT_CALL();
            {{NAME}}_ukernel(ap + g * K * {{NAME}}_MR, P + p * K * {{NAME}}_NR, tile);
            for (long r = 0; r < mr; r++) {
                const long i = i0 + r;
                float* restrict crow = C + i * {{LDC}}L + j0;
                const float* restrict trow = tile + r * {{NAME}}_NR;
#pragma omp simd
                for (long jj = 0; jj < nr; jj++) {
                    const long j = j0 + jj;
                    const float acc = trow[jj];
                    (void)j;
                    crow[jj] = {{EPILOGUE}};
                }
            }
        }
    }
}

typedef struct {
    const float* A;
    float* ap;
    const float* P;
    float* C;
    {{EXTRA_FIELDS}}
} {{NAME}}_job;

/* pool chunk c of packing A: part c % PACK_PARTS of group c / PACK_PARTS */
static void {{NAME}}_pack_chunk(void* job, long c)
{
    const {{NAME}}_job* jb = job;
    const long k0 = c % {{NAME}}_PACK_PARTS * {{NAME}}_PACK_PART;
    {{NAME}}_pack_a(jb->A, jb->ap, c / {{NAME}}_PACK_PARTS, k0,
                    k0 + {{NAME}}_PACK_PART < {{NAME}}_K ? k0 + {{NAME}}_PACK_PART : {{NAME}}_K);
}

/* pool chunk k: the panels of share k of PANELS */
static void {{NAME}}_chunk(void* job, long k)
{
    const {{NAME}}_job* jb = job;
    {{EXTRA_UNPACK}}
    {{NAME}}_panels(jb->ap, jb->P, jb->C, k * {{NAME}}_PER_CHUNK,
                    k * {{NAME}}_PER_CHUNK + {{NAME}}_PER_CHUNK < {{NAME}}_PANELS ? k * {{NAME}}_PER_CHUNK + {{NAME}}_PER_CHUNK
                                                                             : {{NAME}}_PANELS{{EXTRA_ARGS}});
}

#if {{ROW_EPILOGUE_ON}}
/* pool chunk k: the row epilogue of rows [k ROWS_PER_CHUNK, (k + 1) ROWS_PER_CHUNK) (it needs whole
 * rows: after every panel) */
static void {{NAME}}_row(void* job, long k)
{
    const {{NAME}}_job* jb = job;
    {{EXTRA_UNPACK}}
    float* restrict C = jb->C;
    const long b = 0, eqf_r0 = k * {{NAME}}_ROWS_PER_CHUNK,
               eqf_r1 = eqf_r0 + {{NAME}}_ROWS_PER_CHUNK < {{NAME}}_M ? eqf_r0 + {{NAME}}_ROWS_PER_CHUNK : {{NAME}}_M;
    (void)b;
    {{ROW_EPILOGUE}}
}
#endif

void {{NAME}}(const float* A, const float* P, float* C{{EXTRA_PARAMS}})
{
    float* ap = eqf_scratch(EQF_SCRATCH_GEMM_A, {{NAME}}_GROUPS * {{NAME}}_MR * {{NAME}}_K);
    if (!ap) {
        eqf_nomem_note();
        return;
    }
    /* PARALLEL ({{PARALLEL}}, the plan's rule): 0 runs on the calling thread. Otherwise the parts
     * of A (with PACK_PARALLEL), then the panels, are chunks of the claim-based pool (common.h):
     * A, read by every panel, is packed in full before the first panel */
    const int threads = {{PARALLEL}} ? eqf_pool_threads() : 1;
    {{NAME}}_job job = {A, ap, P, C{{EXTRA_INIT}}};
    eqf_parallel_for({{NAME}}_GROUPS * {{NAME}}_PACK_PARTS, {{NAME}}_pack_chunk, &job,
                     {{NAME}}_PACK_PARALLEL ? threads : 1);
    eqf_parallel_for(({{NAME}}_PANELS + {{NAME}}_PER_CHUNK - 1) / {{NAME}}_PER_CHUNK, {{NAME}}_chunk, &job, threads);
#if {{ROW_EPILOGUE_ON}}
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_ROWS_PER_CHUNK - 1) / {{NAME}}_ROWS_PER_CHUNK, {{NAME}}_row, &job, threads);
#endif
}

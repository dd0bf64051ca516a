#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the panels shared by the claim-based pool */
#define {{NAME}}_BF16 {{BF16}} /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16 */
#define {{NAME}}_A_TRANSPOSED {{A_TRANSPOSED}} /* the plan's a_transposed: A given as K x M */
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
 * time; a row epilogue then runs over whole rows, after the last panel.
 *
 * BF16 ({{BF16}}; precision="bf16", the plan's path): 0 = f32. 2 = AVX512_BF16: the panels hold
 * K-pairs of bf16 ([K2/2][NR][2], half the bytes to stream), A is packed as K-pairs of bf16
 * (a 32-bit lane per row and pair, rounded by vcvtne2ps2bf16), multiplied by vdpbf16ps into f32
 * accumulators. 1 = the fallback for CPUs without it: the panels hold bf16 ([K2][NR]), widened
 * to f32 before an f32 FMA; A is packed as f32 values rounded to bf16. With vectors of W floats
 * and NR a multiple of 2 W (N_PAIRS), each k's 2 W columns of a vector pair are stored as W
 * 32-bit lanes, lane i holding column i in its low half and column W + i in its high half: one
 * load, then a shift (the low halves) and a mask (the high halves, already in place) widen both
 * vectors, where widening each by itself takes a vpmovzxwd and a shift. An odd K is completed by
 * a zero (K2 = K rounded up to even). The epilogue is f32. */
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
#define {{NAME}}_PER_CHUNK 1 /* panels per pool chunk */
/* the plan's runs: each thread's panels one contiguous run, claimed in order, the rest taken
 * from the back of the others' runs (common_pool.h, eqf_runs_claim); 0: claimed in turn */
#define {{NAME}}_RUNS {{RUNS}}
/* Packing A: PACK_PARTS parts of K per group, each a pool chunk, on the pool's threads when
 * PACK_PARALLEL (plan_gemm.skinny_pack_parts) */
#define {{NAME}}_PACK_PARTS {{PACK_PARTS}} /* the plan's pack_parts (0: the calling thread packs A, in one part) */
#define {{NAME}}_PACK_NPARTS ({{NAME}}_PACK_PARTS > 0 ? {{NAME}}_PACK_PARTS : 1)
/* (even: a part of bf16 K-pairs starts on a pair) */
#define {{NAME}}_PACK_PART (((({{NAME}}_K + {{NAME}}_PACK_NPARTS - 1) / {{NAME}}_PACK_NPARTS) + 1) & ~1L)
#define {{NAME}}_PACK_PARALLEL ({{NAME}}_PACK_PARTS > 0)
#define {{NAME}}_ROWS_PER_CHUNK (({{NAME}}_M + 3) / 4) /* rows per pool chunk of the row epilogue: four chunks */
/* software prefetch of B this many floats ahead of the FMAs (0: none), see plan_gemm.skinny_tiles */
#define {{NAME}}_PF {{PF}}
#if {{BF16}}
typedef uint16_t {{NAME}}_bt; /* an element of the panels: bf16 bits */
#define {{NAME}}_K2 (({{NAME}}_K + 1) & ~1L) /* K in whole K-pairs */
#define {{NAME}}_AROUND(x) eqf_bf16_round(x)
#else
typedef float {{NAME}}_bt;
#define {{NAME}}_K2 {{NAME}}_K
#define {{NAME}}_AROUND(x) (x)
#endif
#if {{BF16}} == 2
/* A's group g: K2 / 2 pairs x MR 32-bit lanes, in the floats' place */
#define {{NAME}}_AGROUP ({{NAME}}_K2 / 2 * {{NAME}}_MR)
#else
#define {{NAME}}_AGROUP ({{NAME}}_K * {{NAME}}_MR)
#endif
#if {{BF16}} == 2 && !defined(__AVX512BF16__)
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif

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
#if {{BF16}}
#define {{NAME}}_LOAD(p) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p))), 16))
#define {{NAME}}_N_PAIRS ({{BF16}} == 1 && {{NR}} % 32 == 0)
#define {{NAME}}_LOAD_PAIR(p, lo, hi) do { const __m512i x_ = _mm512_loadu_si512((const void*)(p)); \
    (lo) = _mm512_castsi512_ps(_mm512_slli_epi32(x_, 16)); \
    (hi) = _mm512_castsi512_ps(_mm512_and_si512(x_, _mm512_set1_epi32((int)0xFFFF0000u))); } while (0)
#else
#define {{NAME}}_LOAD(p) _mm512_loadu_ps(p)
#endif
#define {{NAME}}_FMA(x, p, c) _mm512_fmadd_ps(_mm512_set1_ps(x), p, c)
#define {{NAME}}_STORE(p, v) _mm512_store_ps(p, v)
#elif defined(__AVX2__) && defined(__FMA__) && {{NR}} % 8 == 0
typedef __m256 {{NAME}}_vec;
#define {{NAME}}_W 8
#define {{NAME}}_ZERO() _mm256_setzero_ps()
#if {{BF16}}
#define {{NAME}}_LOAD(p) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p))), 16))
#define {{NAME}}_N_PAIRS ({{BF16}} == 1 && {{NR}} % 16 == 0)
#define {{NAME}}_LOAD_PAIR(p, lo, hi) do { const __m256i x_ = _mm256_loadu_si256((const __m256i*)(p)); \
    (lo) = _mm256_castsi256_ps(_mm256_slli_epi32(x_, 16)); \
    (hi) = _mm256_castsi256_ps(_mm256_and_si256(x_, _mm256_set1_epi32((int)0xFFFF0000u))); } while (0)
#else
#define {{NAME}}_LOAD(p) _mm256_loadu_ps(p)
#endif
#define {{NAME}}_FMA(x, p, c) _mm256_fmadd_ps(_mm256_set1_ps(x), p, c)
#define {{NAME}}_STORE(p, v) _mm256_store_ps(p, v)
#else
/* GCC's generic vectors of 4 floats (SSE on x86-64-v2; NR is a multiple of 4, contraction/emit_gemm.py) */
#define {{NAME}}_W 4
typedef float {{NAME}}_vec __attribute__((vector_size(16)));
typedef float {{NAME}}_vecu __attribute__((vector_size(16), aligned(4)));
#define {{NAME}}_ZERO() (({{NAME}}_vec){0})
#if {{BF16}}
#define {{NAME}}_LOAD(p) (({{NAME}}_vec){eqf_bf16_f32((p)[0]), eqf_bf16_f32((p)[1]), eqf_bf16_f32((p)[2]), eqf_bf16_f32((p)[3])})
#else
#define {{NAME}}_LOAD(p) (*(const {{NAME}}_vecu*)(p))
#endif
#define {{NAME}}_FMA(x, p, c) ((c) + (x) * (p))
#define {{NAME}}_STORE(p, v) (*({{NAME}}_vec*)(p) = (v))
#endif
#ifndef {{NAME}}_N_PAIRS
#define {{NAME}}_N_PAIRS 0
#endif

#if {{BF16}} == 2
/* vdpbf16ps over K-pairs: a holds pair p of row r at a[p * MR + r], b the panel's pairs */
static inline void {{NAME}}_ukernel(const float* restrict af, const {{NAME}}_bt* restrict b, float* restrict tile)
{
    enum { V = {{NAME}}_NR / 16 };
    const uint32_t* restrict a = (const uint32_t*)af;
    __m512 c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            c[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (long p = 0; p < {{NAME}}_K2 / 2; p++) {
        __m512i bv[V];
#if {{NAME}}_PF > 0
        /* (PF floats ahead: the same bytes, 2 PF halves) */
#pragma GCC unroll 16
        for (int v = 0; v < 2 * {{NAME}}_NR; v += 32)
            __builtin_prefetch(b + 2 * {{NAME}}_PF + v, 0, 3);
#endif
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            bv[v] = _mm512_loadu_si512((const void*)(b + 32 * v));
#pragma GCC unroll 64
        for (int r = 0; r < {{NAME}}_MR; r++) {
            const __m512i ar = _mm512_set1_epi32((int)a[r]);
#pragma GCC unroll 16
            for (int v = 0; v < V; v++)
                c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)bv[v], (__m512bh)ar);
        }
        a += {{NAME}}_MR;
        b += 2 * {{NAME}}_NR;
    }
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            _mm512_store_ps(tile + r * {{NAME}}_NR + 16 * v, c[r][v]);
}
#else
static inline void {{NAME}}_ukernel(const float* restrict a, const {{NAME}}_bt* restrict b, float* restrict tile)
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
         * lines in flight for an FMA loop this short per line (PF floats ahead: 4 PF bytes, one
         * prefetch per 64-byte line of the k-row, whose elements are floats or bf16 halves) */
#pragma GCC unroll 16
        for (int v = 0; v < {{NAME}}_NR; v += 64 / (int)sizeof({{NAME}}_bt))
            __builtin_prefetch(b + {{NAME}}_PF * 4 / (long)sizeof({{NAME}}_bt) + v, 0, 3);
#endif
#if {{NAME}}_N_PAIRS
#pragma GCC unroll 16
        for (int v = 0; v < V; v += 2)
            {{NAME}}_LOAD_PAIR(b + {{NAME}}_W * v, bv[v], bv[v + 1]);
#else
#pragma GCC unroll 16
        for (int v = 0; v < V; v++)
            bv[v] = {{NAME}}_LOAD(b + {{NAME}}_W * v);
#endif
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
#endif

/* B (K x N, or N x K given transposed) -> the panels: panel p holds columns [p NR, p NR + NR)
 * for k = 0..K-1, k-major, zero padded; B_AT is the element (k, j). In bf16 (BF16) the panels
 * are K2 deep and of halves (the size is given in floats, half as many): K-pairs
 * ([K2/2][NR][2]) for vdpbf16ps, else k-major rows. */
#if {{BF16}}
long {{NAME}}_prepack_floats(void) { return {{NAME}}_K2 * {{NAME}}_NPAD / 2; }
#else
long {{NAME}}_prepack_floats(void) { return {{NAME}}_K * {{NAME}}_NPAD; }
#endif

void {{NAME}}_prepack(const float* B, float* Pf)
{
    {{NAME}}_bt* P = ({{NAME}}_bt*)Pf;
    for (long p = 0; p < {{NAME}}_PANELS; p++) {
        {{NAME}}_bt* restrict dst = P + p * {{NAME}}_K2 * {{NAME}}_NR;
        const long j0 = p * {{NAME}}_NR;
        const long nr = {{NAME}}_N - j0 < {{NAME}}_NR ? {{NAME}}_N - j0 : {{NAME}}_NR;
#if {{BF16}} == 2
        for (long k = 0; k < {{NAME}}_K2; k++)
            for (long j = 0; j < {{NAME}}_NR; j++)
                dst[(k >> 1) * 2 * {{NAME}}_NR + 2 * j + (k & 1)] = k < {{NAME}}_K && j < nr ? eqf_bf16({{B_AT}}) : 0;
#elif {{BF16}} == 1
        for (long k = 0; k < {{NAME}}_K2; k++)
            for (long j = 0; j < {{NAME}}_NR; j++) {
                /* N_PAIRS: column j = 2 W g + h W + i of the k-row at half 2 W g + 2 i + h */
                const long at = {{NAME}}_N_PAIRS ? j / (2 * {{NAME}}_W) * 2 * {{NAME}}_W + 2 * (j % {{NAME}}_W)
                                                   + j / {{NAME}}_W % 2 : j;
                dst[k * {{NAME}}_NR + at] = k < {{NAME}}_K && j < nr ? eqf_bf16({{B_AT}}) : 0;
            }
#else
        for (long k = 0; k < {{NAME}}_K; k++) {
            for (long j = 0; j < nr; j++)
                dst[k * {{NAME}}_NR + j] = {{B_AT}};
            for (long j = nr; j < {{NAME}}_NR; j++)
                dst[k * {{NAME}}_NR + j] = 0.0f;
        }
#endif
    }
}

/* A -> GROUPS groups of MR rows, each K x MR k-major, zero padded past row M: the part
 * [k0, k1) of group g. With BF16 == 2 a group is K2/2 pairs x MR 32-bit lanes (the pair
 * (2p, 2p + 1) of row r at p * MR + r; k0 is even), rounded by vcvtne2ps2bf16 32 elements at a
 * time when A's rows are in memory; with BF16 == 1 the values are rounded to bf16. */
static void {{NAME}}_pack_a(const float* restrict A, float* restrict ap, long g, long k0, long k1)
{
#if {{BF16}} == 2
    const long p0 = k0 / 2, p1 = (k1 + 1) / 2; /* the pairs of [k0, k1) */
    for (long r = 0; r < {{NAME}}_MR; r++) {
        const long i = g * {{NAME}}_MR + r;
        uint32_t* restrict dst = (uint32_t*)ap + g * {{NAME}}_AGROUP + r;
        if (i >= {{NAME}}_M) {
            for (long p = p0; p < p1; p++)
                dst[p * {{NAME}}_MR] = 0;
            continue;
        }
        long p = p0;
#if !{{A_TRANSPOSED}}
        for (; 2 * p + 32 <= k1; p += 16) {
            const long k = 2 * p;
            uint32_t t[16] __attribute__((aligned(64)));
            _mm512_store_si512((void*)t, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(&{{A_AT}} + 16),
                                                                       _mm512_loadu_ps(&{{A_AT}})));
#pragma GCC unroll 16
            for (int q = 0; q < 16; q++)
                dst[(p + q) * {{NAME}}_MR] = t[q];
        }
#endif
        for (long k0 = 2 * p; k0 < k1; k0 += 2) { /* (the pairs left, one by one) */
            long k = k0;
            const float lo = {{A_AT}};
            k = k0 + 1;
            dst[(k0 >> 1) * {{NAME}}_MR] = eqf_bf16_pair(lo, k < {{NAME}}_K ? {{A_AT}} : 0.0f);
        }
    }
#else
    for (long r = 0; r < {{NAME}}_MR; r++) {
        const long i = g * {{NAME}}_MR + r;
        float* restrict dst = ap + g * {{NAME}}_AGROUP + r;
        if (i < {{NAME}}_M)
            for (long k = k0; k < k1; k++)
                dst[k * {{NAME}}_MR] = {{NAME}}_AROUND({{A_AT}});
        else
            for (long k = k0; k < k1; k++)
                dst[k * {{NAME}}_MR] = 0.0f;
    }
#endif
}

/* C[:, panels p0..p1) = epilogue(A @ B) */
static void {{NAME}}_panels(const float* restrict ap, const {{NAME}}_bt* restrict P, float* restrict C, long p0,
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
            {{NAME}}_ukernel(ap + g * {{NAME}}_AGROUP, P + p * {{NAME}}_K2 * {{NAME}}_NR, tile);
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
    const {{NAME}}_bt* P;
    float* C;
    eqf_runs_t* runs;
    {{EXTRA_FIELDS}}
} {{NAME}}_job;

/* pool chunk c of packing A: part c % PACK_PARTS of group c / PACK_PARTS */
static void {{NAME}}_pack_chunk(void* job, long c)
{
    const {{NAME}}_job* jb = job;
    const long k0 = c % {{NAME}}_PACK_NPARTS * {{NAME}}_PACK_PART;
    {{NAME}}_pack_a(jb->A, jb->ap, c / {{NAME}}_PACK_NPARTS, k0,
                    k0 + {{NAME}}_PACK_PART < {{NAME}}_K ? k0 + {{NAME}}_PACK_PART : {{NAME}}_K);
}

/* pool chunk k: the panels of share k of PANELS (with RUNS: the share this thread claims) */
static void {{NAME}}_chunk(void* job, long k)
{
    const {{NAME}}_job* jb = job;
#if {{NAME}}_RUNS
    k = eqf_runs_claim(jb->runs);
#endif
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
#if {{NAME}}_RUNS
    eqf_runs_t runs;
    eqf_runs_init(&runs, ({{NAME}}_PANELS + {{NAME}}_PER_CHUNK - 1) / {{NAME}}_PER_CHUNK, threads);
    {{NAME}}_job job = {A, ap, (const {{NAME}}_bt*)P, C, &runs{{EXTRA_INIT}}};
#else
    {{NAME}}_job job = {A, ap, (const {{NAME}}_bt*)P, C, NULL{{EXTRA_INIT}}};
#endif
    eqf_parallel_for({{NAME}}_GROUPS * {{NAME}}_PACK_NPARTS, {{NAME}}_pack_chunk, &job,
                     {{NAME}}_PACK_PARALLEL ? threads : 1);
    eqf_parallel_for(({{NAME}}_PANELS + {{NAME}}_PER_CHUNK - 1) / {{NAME}}_PER_CHUNK, {{NAME}}_chunk, &job, threads);
#if {{ROW_EPILOGUE_ON}}
    eqf_parallel_for(({{NAME}}_M + {{NAME}}_ROWS_PER_CHUNK - 1) / {{NAME}}_ROWS_PER_CHUNK, {{NAME}}_row, &job, threads);
#endif
}

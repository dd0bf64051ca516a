/* {{NAME}}: C[b] = epilogue(A[b] @ B[b]) for b < {{BATCH}}; M={{M}} N={{N}} K={{K}}, row-major,
 * B {{B_LAYOUT}}.
 *
 * BLIS-style, loop order pc (KC slices of K) > chunk (MC rows of A, packed once) > jc (NC
 * columns of B, packed into a KC x NC panel that stays in L2) > ir (MR-row micro-panel of A,
 * stays in L1) > jr (NR-column micro-panel of B) > register-blocked MR x NR micro-kernel. Sizes
 * are compile-time constants: the backend knows every shape, and constant trip counts let gcc
 * unroll the micro-kernel. Edge tiles are computed in full on zero-padded panels and stored in
 * part.
 *
 * The epilogue: a KC slice that is not the last one adds its partial sums into C; the last one
 * leaves the finished MR x NR tile in a buffer in L1, from where it reaches C through
 * `{{EPILOGUE}}` (in terms of acc, i, j, b, M, N, K and the extra parameters): the only store
 * of the final value, so the epilogue runs exactly once per element.
 *
 * Threads: when there are at least as many batches as threads, each thread computes whole
 * batches (no synchronisation at all); otherwise each thread takes an equal share of the rows
 * and the threads pack each B panel together (two barriers per panel). */
#include <stdlib.h>
#include <omp.h>
#if defined(__AVX512F__)
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

/* tile[MR][NR] = a_panel (kc x MR, k-major) . b_panel (kc x NR, k-major); both zero padded. */
#if defined(__AVX512F__) && {{NR}} % 16 == 0
static inline void {{NAME}}_ukernel(long kc, const float* restrict a, const float* restrict b,
                                    float* restrict tile)
{
    /* MR x NR/16 zmm accumulators; with the B row (NR/16 zmm) they must fit the 32 registers,
     * and the A element is broadcast straight from memory into each FMA. */
    enum { V = {{NAME}}_NR / 16 };
    __m512 c[{{NAME}}_MR][V];
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            c[r][v] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (long k = 0; k < kc; k++) {
        __m512 bv[V];
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            bv[v] = _mm512_load_ps(b + 16 * v);
        /* the next A micro-panel rows come from L2: ask for them ahead of use */
        _mm_prefetch((const char*)(a + 8 * {{NAME}}_MR), _MM_HINT_T0);
#pragma GCC unroll 64
        for (int r = 0; r < {{NAME}}_MR; r++) {
            __m512 ar = _mm512_set1_ps(a[r]);
#pragma GCC unroll 8
            for (int v = 0; v < V; v++)
                c[r][v] = _mm512_fmadd_ps(ar, bv[v], c[r][v]);
        }
        a += {{NAME}}_MR;
        b += {{NAME}}_NR;
    }
#pragma GCC unroll 64
    for (int r = 0; r < {{NAME}}_MR; r++)
#pragma GCC unroll 8
        for (int v = 0; v < V; v++)
            _mm512_store_ps(tile + r * {{NAME}}_NR + 16 * v, c[r][v]);
}
#else
/* Portable micro-kernel: plain loops over a register-sized tile, left to the auto-vectorizer. */
static inline void {{NAME}}_ukernel(long kc, const float* restrict a, const float* restrict b,
                                    float* restrict tile)
{
    float c[{{NAME}}_MR][{{NAME}}_NR];
    for (int r = 0; r < {{NAME}}_MR; r++)
        for (int j = 0; j < {{NAME}}_NR; j++)
            c[r][j] = 0.0f;
    for (long k = 0; k < kc; k++)
        for (int r = 0; r < {{NAME}}_MR; r++)
            for (int j = 0; j < {{NAME}}_NR; j++)
                c[r][j] += a[k * {{NAME}}_MR + r] * b[k * {{NAME}}_NR + j];
    for (int r = 0; r < {{NAME}}_MR; r++)
        for (int j = 0; j < {{NAME}}_NR; j++)
            tile[r * {{NAME}}_NR + j] = c[r][j];
}
#endif

/* B[pc:pc+kc, jc+jr0 : jc+jr1] -> NR-column micro-panels, k-major inside a panel, zero padded.
 * B_AT is the element (k, j) of B for the layout this kernel was built for; the loops run along
 * that layout's rows so that the reads are contiguous. */
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

/* A[ic:ic+mc, pc:pc+kc] -> MR-row micro-panels, k-major inside a panel, zero padded. */
static void {{NAME}}_pack_a(const float* restrict A, long ic, long mc, long pc, long kc, float* restrict ap)
{
    for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
        float* restrict dst = ap + ir * kc;
        long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
        const float* restrict src = A + (ic + ir) * {{LDA}}L + pc;
        if (mr == {{NAME}}_MR) {
            for (long k = 0; k < kc; k++)
#pragma GCC unroll 64
                for (long r = 0; r < {{NAME}}_MR; r++)
                    dst[k * {{NAME}}_MR + r] = src[r * {{LDA}}L + k];
        } else {
            for (long k = 0; k < kc; k++) {
                for (long r = 0; r < mr; r++)
                    dst[k * {{NAME}}_MR + r] = src[r * {{LDA}}L + k];
                for (long r = mr; r < {{NAME}}_MR; r++)
                    dst[k * {{NAME}}_MR + r] = 0.0f;
            }
        }
    }
}

/* C[ic:ic+mc, jc:jc+nc] (+)= packed A block . packed B panel; the epilogue on the last K slice.
 * ir outer: one MR x kc micro-panel of A stays in L1 while the B panel streams from L2. */
static void {{NAME}}_macro(const float* restrict ap, const float* restrict bp, float* restrict C, long b,
                           long ic, long mc, long jc, long nc, long pc, long kc{{EXTRA_PARAMS}})
{
    const long M = {{NAME}}_M, N = {{NAME}}_N, K = {{NAME}}_K;
    const int first = pc == 0, last = pc + kc >= K;
    float tile[{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
    (void)M; (void)N; (void)b;
    for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
        const long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
        for (long jr = 0; jr < nc; jr += {{NAME}}_NR) {
            const long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
            /* Fetch the C tile (for writing) while the micro-kernel computes: otherwise each
             * store below waits for its line from memory, a cost per element of C that shows
             * when K is small. */
            for (long r = 0; r < mr; r++)
                for (long jj = 0; jj < nr; jj += 16)
                    __builtin_prefetch(C + (ic + ir + r) * {{LDC}}L + jc + jr + jj, 1, 3);
            {{NAME}}_ukernel(kc, ap + ir * kc, bp + jr * kc, tile);
            for (long r = 0; r < mr; r++) {
                const long i = ic + ir + r;
                float* restrict crow = C + i * {{LDC}}L + jc + jr;
                const float* restrict trow = tile + r * {{NAME}}_NR;
                /* four loops rather than one with conditions inside: the epilogue's loop must not
                 * read C when C does not hold a partial sum yet (that read would miss in cache) */
                if (first && last) {
#pragma omp simd
                    for (long jj = 0; jj < nr; jj++) {
                        const long j = jc + jr + jj;
                        const float acc = trow[jj];
                        (void)j;
                        crow[jj] = {{EPILOGUE}};
                    }
                } else if (last) {
#pragma omp simd
                    for (long jj = 0; jj < nr; jj++) {
                        const long j = jc + jr + jj;
                        const float acc = crow[jj] + trow[jj];
                        (void)j;
                        crow[jj] = {{EPILOGUE}};
                    }
                } else if (first) {
#pragma omp simd
                    for (long jj = 0; jj < nr; jj++)
                        crow[jj] = trow[jj];
                } else {
#pragma omp simd
                    for (long jj = 0; jj < nr; jj++)
                        crow[jj] += trow[jj];
                }
            }
        }
        /* whole rows in one NC block: the row epilogue on these MR rows while they are in L1 */
        if (last && nc == N) {
            const long eqf_r0 = ic + ir, eqf_r1 = ic + ir + mr;
            {{ROW_EPILOGUE}}
        }
    }
}

/* Packing buffer `slot` of the calling thread, at least `floats` long, 64-byte aligned. Kept from
 * call to call: a fresh buffer of a few MB is a fresh mmap, and its page faults cost more than
 * packing a small problem. Shared by every GEMM of the module (kernels run one after another);
 * thread-local, so concurrent callers (cffi releases the GIL) never share one. Never freed: one
 * buffer per slot and thread, the size of the largest use. */
#ifndef EQF_GEMM_SCRATCH
#define EQF_GEMM_SCRATCH
static float* eqf_gemm_scratch(int slot, long floats)
{
    static _Thread_local float* buf[2];
    static _Thread_local long cap[2];
    if (cap[slot] < floats) {
        free(buf[slot]);
        cap[slot] = (floats + 15) / 16 * 16; /* aligned_alloc wants a multiple of the alignment */
        buf[slot] = aligned_alloc(64, sizeof(float) * (size_t)cap[slot]);
        if (!buf[slot]) abort(); /* nothing sensible to compute without it */
    }
    return buf[slot];
}
#endif

/* Rows [m0, m1) of batch b: C = epilogue(A @ B). With `shared`, the nt threads of the enclosing
 * parallel region call this together (same b, each its own rows) and pack each B panel
 * together: every thread must then take the same number of steps, hence `nchunks` (of MC rows)
 * is given. */
static void {{NAME}}_rows(const float* A, const float* B, float* C, long b, long m0, long m1, long nchunks, long MC,
                          float* restrict ap, float* restrict bp, int shared, int me, int nt{{EXTRA_PARAMS}})
{
    const long N = {{NAME}}_N, K = {{NAME}}_K, KC = {{NAME}}_KC, NC = {{NAME}}_NC;
    for (long pc = 0; pc < K; pc += KC) {
        const long kc = K - pc < KC ? K - pc : KC;
        for (long chunk = 0; chunk < nchunks; chunk++) {
            /* A is packed once per (K slice, chunk of rows) and then serves every B panel */
            const long ic = m0 + chunk * MC;
            const long mc = ic >= m1 ? 0 : (m1 - ic < MC ? m1 - ic : MC);
            {{NAME}}_pack_a(A, ic, mc, pc, kc, ap);
            for (long jc = 0; jc < N; jc += NC) {
                const long nc = N - jc < NC ? N - jc : NC;
                const long npanels = (nc + {{NAME}}_NR - 1) / {{NAME}}_NR;
                if (shared) {
                    /* each thread packs its share of the panel once the last one is no longer read */
#pragma omp barrier
                    {{NAME}}_pack_b(B, pc, kc, jc, npanels * me / nt * {{NAME}}_NR,
                                    npanels * (me + 1) / nt * {{NAME}}_NR, nc, bp);
#pragma omp barrier
                } else {
                    {{NAME}}_pack_b(B, pc, kc, jc, 0, npanels * {{NAME}}_NR, nc, bp);
                }
                if (mc > 0)
                    {{NAME}}_macro(ap, bp, C, b, ic, mc, jc, nc, pc, kc{{EXTRA_ARGS}});
            }
            /* the row epilogue (a row op over whole rows of C) on the rows just finished, when
             * the macro kernel could not (rows wider than one NC block) */
            if (pc + kc >= K && mc > 0 && N > NC) {
                const long eqf_r0 = ic, eqf_r1 = ic + mc;
                {{ROW_EPILOGUE}}
            }
        }
    }
}

void {{NAME}}(const float* A0, const float* B0, float* C0{{EXTRA_PARAMS}})
{
    const long M = {{NAME}}_M, BATCH = {{BATCH}};
    const long KC = {{NAME}}_KC, NC = {{NAME}}_NC, MC = {{NAME}}_MC;
    const long NCP = (NC + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR; /* NC padded to whole panels */
    /* Enough batches: each thread computes whole batches, with no synchronisation at all.
     * Otherwise the threads split the rows of each batch and share the packed B panels. */
    const int by_batch = BATCH >= omp_get_max_threads() && BATCH > 1;
    float* bp_shared = by_batch ? NULL : eqf_gemm_scratch(1, KC * NCP);
#pragma omp parallel
    {
        const int nt = omp_get_num_threads(), me = omp_get_thread_num();
        long m0 = 0, m1 = M, rows = M;
        if (!by_batch) { /* whole MR tiles per thread */
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
        float* ap = eqf_gemm_scratch(0, KC * ((mcb + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR));
        float* bp = by_batch ? eqf_gemm_scratch(1, KC * NCP) : bp_shared;
        for (long b = by_batch ? me : 0; b < BATCH; b += by_batch ? nt : 1)
            {{NAME}}_rows(A0 + b * {{A_BATCH_STRIDE}}L, B0 + b * {{B_BATCH_STRIDE}}L, C0 + b * {{C_BATCH_STRIDE}}L,
                          b, m0, m1, nchunks, mcb, ap, bp, !by_batch, me, nt{{EXTRA_ARGS}});
    }
}

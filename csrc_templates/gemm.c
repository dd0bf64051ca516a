/* {{NAME}}: C[b] = epilogue(A[b] @ B[b]) for b < {{BATCH}}; M={{M}} N={{N}} K={{K}}, row-major,
 * B {{B_LAYOUT}}. BLIS-style: B is packed into KC x NR panels shared by all threads, each thread
 * packs its own MC x KC block of A into MR-row panels, and a register-blocked MR x NR
 * micro-kernel (GCC vector extensions: AVX-512 on this machine) computes each tile. The
 * epilogue runs once per element, on the tile in L1, right before its single store to C. */

#define {{NAME}}_MR {{MR}}
#define {{NAME}}_NR {{NR}}
typedef float {{NAME}}_vec __attribute__((vector_size(64), aligned(64)));

static inline void {{NAME}}_ukernel(long kc, const float* restrict a, const float* restrict b,
                                    float* restrict tile)
{
    /* MR x NR accumulators live in registers: NR/16 vectors per row. */
    {{NAME}}_vec c[{{NAME}}_MR][{{NAME}}_NR / 16];
    for (int r = 0; r < {{NAME}}_MR; r++)
        for (int v = 0; v < {{NAME}}_NR / 16; v++)
            c[r][v] = ({{NAME}}_vec){0};
    for (long k = 0; k < kc; k++) {
        {{NAME}}_vec bv[{{NAME}}_NR / 16];
        for (int v = 0; v < {{NAME}}_NR / 16; v++)
            bv[v] = *(const {{NAME}}_vec*)(b + k * {{NAME}}_NR + 16 * v);
#pragma GCC unroll 16
        for (int r = 0; r < {{NAME}}_MR; r++) {
            float ar = a[k * {{NAME}}_MR + r];
            for (int v = 0; v < {{NAME}}_NR / 16; v++)
                c[r][v] += ar * bv[v];
        }
    }
    for (int r = 0; r < {{NAME}}_MR; r++)
        for (int v = 0; v < {{NAME}}_NR / 16; v++)
            *({{NAME}}_vec*)(tile + r * {{NAME}}_NR + 16 * v) = c[r][v];
}

/* B[pc:pc+kc, jc:jc+nc] -> NR-column panels, k-major inside a panel, zero padded. */
static void {{NAME}}_pack_b(const float* restrict B, long pc, long kc, long jc, long nc, float* restrict bp)
{
#pragma omp for schedule(static)
    for (long jr = 0; jr < nc; jr += {{NAME}}_NR) {
        float* dst = bp + jr * kc;
        long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
        for (long k = 0; k < kc; k++) {
            for (long j = 0; j < nr; j++)
                dst[k * {{NAME}}_NR + j] = {{B_AT}};
            for (long j = nr; j < {{NAME}}_NR; j++)
                dst[k * {{NAME}}_NR + j] = 0.0f;
        }
    }
}

/* A[ic:ic+mc, pc:pc+kc] -> MR-row panels, k-major inside a panel, zero padded. */
static void {{NAME}}_pack_a(const float* restrict A, long ic, long mc, long pc, long kc, float* restrict ap)
{
    for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
        float* dst = ap + ir * kc;
        long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
        for (long k = 0; k < kc; k++) {
            for (long r = 0; r < mr; r++)
                dst[k * {{NAME}}_MR + r] = A[(ic + ir + r) * {{LDA}} + pc + k];
            for (long r = mr; r < {{NAME}}_MR; r++)
                dst[k * {{NAME}}_MR + r] = 0.0f;
        }
    }
}

void {{NAME}}(const float* A0, const float* B0, float* C0{{EXTRA_PARAMS}})
{
    const long M = {{M}}, N = {{N}}, K = {{K}};
    const long KC = {{KC}}, NC = {{NC}};
    /* aligned_alloc wants a size that is a multiple of the alignment: round up to 16 floats */
    float* bp = aligned_alloc(64, sizeof(float) * ((KC * ((NC + {{NAME}}_NR - 1) / {{NAME}}_NR * {{NAME}}_NR) + 15) / 16 * 16));
#pragma omp parallel
    {
        /* One MC block per thread when M is small, so both cores get work. */
        int nt = omp_get_num_threads();
        long mc_max = (M + nt - 1) / nt;
        mc_max = (mc_max + {{NAME}}_MR - 1) / {{NAME}}_MR * {{NAME}}_MR;
        if (mc_max > {{MC}}) mc_max = {{MC}};
        float* ap = aligned_alloc(64, sizeof(float) * ((KC * mc_max + 15) / 16 * 16));
        float tile[{{NAME}}_MR * {{NAME}}_NR] __attribute__((aligned(64)));
        for (long b = 0; b < {{BATCH}}; b++) {
            const float* A = A0 + b * {{A_BATCH_STRIDE}};
            const float* B = B0 + b * {{B_BATCH_STRIDE}};
            float* C = C0 + b * {{C_BATCH_STRIDE}};
            for (long jc = 0; jc < N; jc += NC) {
                long nc = N - jc < NC ? N - jc : NC;
                for (long pc = 0; pc < K; pc += KC) {
                    long kc = K - pc < KC ? K - pc : KC;
                    int first = pc == 0, last = pc + kc >= K;
                    {{NAME}}_pack_b(B, pc, kc, jc, nc, bp); /* omp for: ends with a barrier */
#pragma omp for schedule(dynamic, 1)
                    for (long ic = 0; ic < M; ic += mc_max) {
                        long mc = M - ic < mc_max ? M - ic : mc_max;
                        {{NAME}}_pack_a(A, ic, mc, pc, kc, ap);
                        for (long jr = 0; jr < nc; jr += {{NAME}}_NR) {
                            long nr = nc - jr < {{NAME}}_NR ? nc - jr : {{NAME}}_NR;
                            for (long ir = 0; ir < mc; ir += {{NAME}}_MR) {
                                long mr = mc - ir < {{NAME}}_MR ? mc - ir : {{NAME}}_MR;
                                {{NAME}}_ukernel(kc, ap + ir * kc, bp + jr * kc, tile);
                                for (long r = 0; r < mr; r++) {
                                    long i = ic + ir + r;
                                    float* crow = C + i * {{LDC}} + jc + jr;
                                    const float* trow = tile + r * {{NAME}}_NR;
                                    if (last) {
#pragma omp simd
                                        for (long jj = 0; jj < nr; jj++) {
                                            long j = jc + jr + jj;
                                            float acc = first ? trow[jj] : crow[jj] + trow[jj];
                                            (void)j;
                                            crow[jj] = {{EPILOGUE}};
                                        }
                                    } else if (first) {
#pragma omp simd
                                        for (long jj = 0; jj < nr; jj++) crow[jj] = trow[jj];
                                    } else {
#pragma omp simd
                                        for (long jj = 0; jj < nr; jj++) crow[jj] += trow[jj];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        free(ap);
    }
    free(bp);
}

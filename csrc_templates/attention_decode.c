#define {{NAME}}_BK {{BK}} /* the plan's bk: keys per block (their scores on the stack) */
#define {{NAME}}_SCORE_OPS {{SCORE_OPS}} /* the plan's score_ops: the score's own ops run in a score pass */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the tasks shared among the threads */
#define {{NAME}}_POOL {{POOL}} /* the plan's pool: the tasks are chunks of the claim-based pool, not an OpenMP region */
#define {{NAME}}_K_BF16 {{K_BF16}} /* the plan's k_bf16: the keys are a bf16 KV cache (uint16) */
#define {{NAME}}_V_BF16 {{V_BF16}} /* the plan's v_bf16: the values are a bf16 KV cache (uint16) */
#define {{NAME}}_G {{G}} /* the plan's kv_rows: query rows per task, sharing one pass over the keys and values */
/* an element of k or v as f32: a bf16 cache's widened by a 16-bit shift (exact) */
#if {{K_BF16}}
typedef uint16_t {{NAME}}_kt;
#define {{NAME}}_KW(x) eqf_bf16_f32(x)
#define {{NAME}}_KLOAD(p) eqf_bf16_load16(p)
#else
typedef float {{NAME}}_kt;
#define {{NAME}}_KW(x) (x)
#define {{NAME}}_KLOAD(p) _mm512_loadu_ps(p)
#endif
#if {{V_BF16}}
typedef uint16_t {{NAME}}_vt;
#define {{NAME}}_VW(x) eqf_bf16_f32(x)
#define {{NAME}}_VLOAD(p) eqf_bf16_load16(p)
#else
typedef float {{NAME}}_vt;
#define {{NAME}}_VW(x) (x)
#define {{NAME}}_VLOAD(p) _mm512_loadu_ps(p)
#endif
EQF_WIDE_BEGIN
/* {{NAME}}: decode attention (the plan's decode), {{BATCH}} (batch x head) rows of one query
 * [{{D}}] against {{SK}} keys, Dv = {{DV}}. One task per G = {{G}} query rows (the plan's kv_rows:
 * a grouped-query attention's G query heads of one key/value head, consecutive rows b; else 1).
 * Its keys and values are read in place, row after row, through their strides (a KV cache's rows
 * stream once per task, so once per key/value head): no copy, no transpose, no padding to a block
 * of queries. Per block of BK keys: each key row's G scores q_r . k_j (dot products along D), the
 * score ops (a mask) or the keys past the end to -inf, each row's online softmax in base 2 (the
 * block's maximum; its running maximum raised only when the block's passes it by more than 2^8,
 * rescaling its accumulators; exp2), then acc_r += p_rj v_j over each value row, in f32. A bf16
 * KV cache (K_BF16, V_BF16: precision="bf16") is read as uint16 and widened by a shift: half the
 * bytes streamed, which set this kernel's time.
 * The tasks are independent (each writes its G rows of out and nothing else), so the result does
 * not depend on which thread runs which. With POOL ({{POOL}}) they are chunks of the claim-based
 * pool (common_pool.h), one task a chunk, as the decode step's few-rows GEMMs before and after
 * this kernel: the run function keeps the pool's workers spinning across the step
 * (runtime.program.hold_pool), and no OpenMP team is woken between the GEMMs. Else an OpenMP
 * region when PARALLEL. */
typedef struct {
    {{PARAM_FIELDS}}
} {{NAME}}_job;

static void {{NAME}}_task(void* job, long bg)
{
    enum { BK = {{BK}}, D = {{D}}, DV = {{DV}}, G = {{NAME}}_G };
    const {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
    {
        const long i = 0;  /* (the one query row of each of the G) */
        (void)i;
        const {{NAME}}_kt* restrict kp;
        const {{NAME}}_vt* restrict vp;
        {
            const long b = bg * G;  /* (the G rows read the same keys and values) */
            (void)b;
            kp = (const {{NAME}}_kt*){{K}} + ({{KOFF}});
            vp = (const {{NAME}}_vt*){{V}} + ({{VOFF}});
        }
        float qv[G][D + 16] __attribute__((aligned(64)));  /* q times the folded score scale */
        float acc[G][DV + 16] __attribute__((aligned(64)));
        float s[G][BK] __attribute__((aligned(64)));
        float l[G][16] __attribute__((aligned(64)));  /* each row's sum, in 16 lanes */
        float m[G];
        for (int r = 0; r < G; r++) {
            const long b = bg * G + r;
            (void)b;
{{OFFSETS}}
            const float* restrict qp = {{Q}} + ({{QOFF}});
            m[r] = -INFINITY;
            for (long d = 0; d < D; d++)
                qv[r][d] = qp[d * {{QC}}] * {{QSCALE}};
            for (long e = 0; e < DV; e++)
                acc[r][e] = 0.0f;
            for (int u = 0; u < 16; u++)
                l[r][u] = 0.0f;
        }
        for (long j0 = 0; j0 < {{SK}}; j0 += BK) {  /* (the key count: run-time over a KV cache) */
            const long nk = eqf_minl(BK, {{SK}} - j0);
            /* the scores of this block: each k row, read once, against the G q rows */
#if defined(__AVX512F__)
            if ({{KD}} == 1 && D % 16 == 0) {  /* k rows contiguous: 16 lanes of D at a time */
                for (long jj = 0; jj < nk; jj++) {
                    const {{NAME}}_kt* restrict kr = kp + (j0 + jj) * {{KJ}};
                    __m512 c0[G], c1[G];
                    for (int r = 0; r < G; r++)
                        c0[r] = c1[r] = _mm512_setzero_ps();
                    long d = 0;
                    for (; d + 32 <= D; d += 32) {
                        const __m512 k0 = {{NAME}}_KLOAD(kr + d), k1 = {{NAME}}_KLOAD(kr + d + 16);
                        for (int r = 0; r < G; r++) {
                            c0[r] = _mm512_fmadd_ps(_mm512_load_ps(qv[r] + d), k0, c0[r]);
                            c1[r] = _mm512_fmadd_ps(_mm512_load_ps(qv[r] + d + 16), k1, c1[r]);
                        }
                    }
                    if (d < D) {
                        const __m512 k0 = {{NAME}}_KLOAD(kr + d);
                        for (int r = 0; r < G; r++)
                            c0[r] = _mm512_fmadd_ps(_mm512_load_ps(qv[r] + d), k0, c0[r]);
                    }
                    for (int r = 0; r < G; r++)
                        s[r][jj] = _mm512_reduce_add_ps(_mm512_add_ps(c0[r], c1[r]));
                }
            } else
#endif
            for (long jj = 0; jj < nk; jj++) {
                const {{NAME}}_kt* restrict kr = kp + (j0 + jj) * {{KJ}};
                for (int r = 0; r < G; r++) {
                    float dot = 0.0f;
                    #pragma omp simd reduction(+:dot)
                    for (long d = 0; d < D; d++)
                        dot += qv[r][d] * {{NAME}}_KW(kr[d * {{KD}}]);
                    s[r][jj] = dot;
                }
            }
            for (int r = 0; r < G; r++) {
                const long b = bg * G + r;
                (void)b;
                (void)b;
{{OFFSETS}}
                /* score ops (scale, mask), in base 2: times log2 e. A score that is only q k^T times
                 * a constant was folded into q. The keys past the end get -inf. */
                if ({{SCORE_OPS}}) {
                    #pragma omp simd
                    for (long jj = 0; jj < nk; jj++) {
                        const long j = j0 + jj;
                        const float acc_s = s[r][jj];
                        (void)j;
{{SCORE_BODY}}
                        s[r][jj] = eqf_score2({{SCORE}}, {{SCORE_LOG2E}});
                    }
                }
                for (long jj = nk; jj < BK; jj++)
                    s[r][jj] = -INFINITY;
                /* the online softmax: s becomes p = 2^(s - m) */
#if defined(__AVX512F__)
                if (BK % 16 == 0) {
                    __m512 x[BK / 16], mx = _mm512_set1_ps(-INFINITY);
                    for (int u = 0; u < BK / 16; u++) {
                        x[u] = _mm512_load_ps(s[r] + 16 * u);
                        mx = _mm512_max_ps(mx, x[u]);
                    }
                    const float tm = _mm512_reduce_max_ps(mx);
                    if (tm > m[r] + EQF_LAZY) {
                        const float a = m[r] == -INFINITY ? 0.0f : eqf_exp2(m[r] - tm);
                        for (long e = 0; e < DV; e++)
                            acc[r][e] *= a;
                        for (int u = 0; u < 16; u++)
                            l[r][u] *= a;
                        m[r] = tm;
                    }
                    const __m512 base = _mm512_set1_ps(m[r] == -INFINITY ? 0.0f : m[r]);
                    __m512 sum = _mm512_load_ps(l[r]);
                    for (int u = 0; u < BK / 16; u++) {  /* (-inf gives 0: vscalefps) */
                        const __m512 p = eqf_exp2_ps(_mm512_sub_ps(x[u], base));
                        _mm512_store_ps(s[r] + 16 * u, p);
                        sum = _mm512_add_ps(sum, p);
                    }
                    _mm512_store_ps(l[r], sum);
                } else
#endif
                eqf_softmax2_row(s[r], nk, &m[r], l[r], acc[r], DV);
            }
            /* acc_r += p_r v, each value row streamed once for the G rows */
#if defined(__AVX512F__)
            if ({{VC}} == 1 && DV % 16 == 0 && DV <= 256) {  /* the accumulators in registers */
                __m512 a[G][DV / 16 + 1];
                for (int r = 0; r < G; r++)
                    for (int u = 0; u < DV / 16; u++)
                        a[r][u] = _mm512_load_ps(acc[r] + 16 * u);
                for (long jj = 0; jj < nk; jj++) {
                    const {{NAME}}_vt* restrict vr = vp + (j0 + jj) * {{VR}};
                    for (int u = 0; u < DV / 16; u++) {
                        const __m512 x = {{NAME}}_VLOAD(vr + 16 * u);
                        for (int r = 0; r < G; r++)
                            a[r][u] = _mm512_fmadd_ps(_mm512_set1_ps(s[r][jj]), x, a[r][u]);
                    }
                }
                for (int r = 0; r < G; r++)
                    for (int u = 0; u < DV / 16; u++)
                        _mm512_store_ps(acc[r] + 16 * u, a[r][u]);
            } else
#endif
            for (long jj = 0; jj < nk; jj++) {
                const {{NAME}}_vt* restrict vr = vp + (j0 + jj) * {{VR}};
                for (int r = 0; r < G; r++) {
                    const float p = s[r][jj];
                    #pragma omp simd
                    for (long e = 0; e < DV; e++)
                        acc[r][e] += p * {{NAME}}_VW(vr[e * {{VC}}]);
                }
            }
        }
        for (int r = 0; r < G; r++) {
            const long b = bg * G + r;
            (void)b;
{{OFFSETS}}
            float lsum = 0.0f;
            for (int u = 0; u < 16; u++)
                lsum += l[r][u];
            const float inv = 1.0f / lsum;
            /* A row whose softmax is NaN in numpy: a NaN score, or every key masked with -inf (the
             * max stays -inf). ZERO_NAN ({{ZERO_NAN}}): such a row is 0, as where(isnan(p), 0, p)
             * before the product with V; otherwise it is NaN (as attention.c). */
            const int dead = !(lsum > 0.0f && lsum <= 3.4028235e38f) || m[r] == -INFINITY;
            for (long e = 0; e < DV; e++) {
                const float v = dead ? ({{ZERO_NAN}} ? 0.0f : NAN) : acc[r][e] * inv;
{{EPI_BODY}}
                out[({{OUT_OFF}}) + i * {{OR}} + e * {{OC}}] = {{EPI}};
            }
        }
    }
}

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_job job = { {{PARAM_INIT}} };
#if {{POOL}}
    eqf_parallel_for({{BATCH}} / {{NAME}}_G, {{NAME}}_task, &job, {{PARALLEL}} ? eqf_pool_threads() : 1);
#else
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long bg = 0; bg < {{BATCH}} / {{NAME}}_G; bg++)
        {{NAME}}_task(&job, bg);
#endif
}
EQF_WIDE_END
#undef {{NAME}}_KW
#undef {{NAME}}_KLOAD
#undef {{NAME}}_VW
#undef {{NAME}}_VLOAD

#define {{NAME}}_BK {{BK}} /* the plan's bk: keys per block (their scores on the stack) */
#define {{NAME}}_SCORE_OPS {{SCORE_OPS}} /* the plan's score_ops: the score's own ops run in a score pass */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_K_BF16 {{K_BF16}} /* the plan's k_bf16: the keys are a bf16 KV cache (uint16) */
#define {{NAME}}_V_BF16 {{V_BF16}} /* the plan's v_bf16: the values are a bf16 KV cache (uint16) */
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
 * [{{D}}] against {{SK}} keys, Dv = {{DV}}. One task per query row. Its keys and values are read
 * in place, row after row, through their strides (a KV cache's rows stream once): no copy, no
 * transpose, no padding to a block of queries. Per block of BK keys: the scores q . k_j (each a
 * dot product along D), the score ops (a mask) or the keys past the end to -inf, the online
 * softmax in base 2 (the block's maximum; the running maximum raised only when the block's
 * passes it by more than 2^8, rescaling the accumulators; exp2), then acc += p_j v_j over the
 * value rows, in f32. A bf16 KV cache (K_BF16, V_BF16: precision="bf16") is read as uint16 and
 * widened by a shift: half the bytes streamed, which set this kernel's time. */
void {{NAME}}({{PARAMS}})
{
    enum { BK = {{BK}}, D = {{D}}, DV = {{DV}} };
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long b = 0; b < {{BATCH}}; b++) {
        const long i = 0;  /* (the one query row) */
        (void)i;
        const float* restrict qp = {{Q}} + ({{QOFF}});
        const {{NAME}}_kt* restrict kp = (const {{NAME}}_kt*){{K}} + ({{KOFF}});
        const {{NAME}}_vt* restrict vp = (const {{NAME}}_vt*){{V}} + ({{VOFF}});
{{OFFSETS}}
        float qv[D + 16] __attribute__((aligned(64)));  /* q times the folded score scale */
        float acc[DV + 16] __attribute__((aligned(64)));
        float s[BK] __attribute__((aligned(64)));
        float l[16] __attribute__((aligned(64)));  /* the row sum, in 16 lanes */
        float m = -INFINITY;
        for (long d = 0; d < D; d++)
            qv[d] = qp[d * {{QC}}] * {{QSCALE}};
        for (long e = 0; e < DV; e++)
            acc[e] = 0.0f;
        for (int u = 0; u < 16; u++)
            l[u] = 0.0f;
        for (long j0 = 0; j0 < {{SK}}; j0 += BK) {  /* (the key count: run-time over a KV cache) */
            const long nk = eqf_minl(BK, {{SK}} - j0);
            /* the scores of this block: k's rows against q */
#if defined(__AVX512F__)
            if ({{KD}} == 1 && D % 16 == 0) {  /* k rows contiguous: 16 lanes of D at a time */
                for (long jj = 0; jj < nk; jj++) {
                    const {{NAME}}_kt* restrict kr = kp + (j0 + jj) * {{KJ}};
                    __m512 c0 = _mm512_setzero_ps(), c1 = _mm512_setzero_ps();
                    long d = 0;
                    for (; d + 32 <= D; d += 32) {
                        c0 = _mm512_fmadd_ps(_mm512_load_ps(qv + d), {{NAME}}_KLOAD(kr + d), c0);
                        c1 = _mm512_fmadd_ps(_mm512_load_ps(qv + d + 16), {{NAME}}_KLOAD(kr + d + 16), c1);
                    }
                    if (d < D)
                        c0 = _mm512_fmadd_ps(_mm512_load_ps(qv + d), {{NAME}}_KLOAD(kr + d), c0);
                    s[jj] = _mm512_reduce_add_ps(_mm512_add_ps(c0, c1));
                }
            } else
#endif
            for (long jj = 0; jj < nk; jj++) {
                const {{NAME}}_kt* restrict kr = kp + (j0 + jj) * {{KJ}};
                float dot = 0.0f;
                #pragma omp simd reduction(+:dot)
                for (long d = 0; d < D; d++)
                    dot += qv[d] * {{NAME}}_KW(kr[d * {{KD}}]);
                s[jj] = dot;
            }
            /* score ops (scale, mask), in base 2: times log2 e. A score that is only q k^T times a
             * constant was folded into q. The keys past the end get -inf. */
            if ({{SCORE_OPS}}) {
                #pragma omp simd
                for (long jj = 0; jj < nk; jj++) {
                    const long j = j0 + jj;
                    const float acc_s = s[jj];
                    (void)j;
{{SCORE_BODY}}
                    s[jj] = ({{SCORE}}) * {{SCORE_LOG2E}};
                }
            }
            for (long jj = nk; jj < BK; jj++)
                s[jj] = -INFINITY;
            /* the online softmax: s becomes p = 2^(s - m) */
#if defined(__AVX512F__)
            if (BK % 16 == 0) {
                __m512 x[BK / 16], mx = _mm512_set1_ps(-INFINITY);
                for (int u = 0; u < BK / 16; u++) {
                    x[u] = _mm512_load_ps(s + 16 * u);
                    mx = _mm512_max_ps(mx, x[u]);
                }
                const float tm = _mm512_reduce_max_ps(mx);
                if (tm > m + EQF_LAZY) {
                    const float a = m == -INFINITY ? 0.0f : eqf_exp2(m - tm);
                    for (long e = 0; e < DV; e++)
                        acc[e] *= a;
                    for (int u = 0; u < 16; u++)
                        l[u] *= a;
                    m = tm;
                }
                const __m512 base = _mm512_set1_ps(m == -INFINITY ? 0.0f : m);
                __m512 sum = _mm512_load_ps(l);
                for (int u = 0; u < BK / 16; u++) {  /* (-inf gives 0: vscalefps) */
                    const __m512 p = eqf_exp2_ps(_mm512_sub_ps(x[u], base));
                    _mm512_store_ps(s + 16 * u, p);
                    sum = _mm512_add_ps(sum, p);
                }
                _mm512_store_ps(l, sum);
            } else
#endif
            eqf_softmax2_row(s, nk, &m, l, acc, DV);
            /* acc += p v, the value rows streamed once */
#if defined(__AVX512F__)
            if ({{VC}} == 1 && DV % 16 == 0 && DV <= 256) {  /* the accumulators in registers */
                __m512 a[DV / 16 + 1];
                for (int u = 0; u < DV / 16; u++)
                    a[u] = _mm512_load_ps(acc + 16 * u);
                for (long jj = 0; jj < nk; jj++) {
                    const __m512 p = _mm512_set1_ps(s[jj]);
                    const {{NAME}}_vt* restrict vr = vp + (j0 + jj) * {{VR}};
                    for (int u = 0; u < DV / 16; u++)
                        a[u] = _mm512_fmadd_ps(p, {{NAME}}_VLOAD(vr + 16 * u), a[u]);
                }
                for (int u = 0; u < DV / 16; u++)
                    _mm512_store_ps(acc + 16 * u, a[u]);
            } else
#endif
            for (long jj = 0; jj < nk; jj++) {
                const float p = s[jj];
                const {{NAME}}_vt* restrict vr = vp + (j0 + jj) * {{VR}};
                #pragma omp simd
                for (long e = 0; e < DV; e++)
                    acc[e] += p * {{NAME}}_VW(vr[e * {{VC}}]);
            }
        }
        float lsum = 0.0f;
        for (int u = 0; u < 16; u++)
            lsum += l[u];
        const float inv = 1.0f / lsum;
        /* A row whose softmax is NaN in numpy: a NaN score, or every key masked with -inf (the max
         * stays -inf). ZERO_NAN ({{ZERO_NAN}}): such a row is 0, as where(isnan(p), 0, p) before
         * the product with V; otherwise it is NaN (as attention.c). */
        const int dead = !(lsum > 0.0f && lsum <= 3.4028235e38f) || m == -INFINITY;
        for (long e = 0; e < DV; e++) {
            const float v = dead ? ({{ZERO_NAN}} ? 0.0f : NAN) : acc[e] * inv;
{{EPI_BODY}}
            out[({{OUT_OFF}}) + i * {{OR}} + e * {{OC}}] = {{EPI}};
        }
    }
}
EQF_WIDE_END
#undef {{NAME}}_KW
#undef {{NAME}}_KLOAD
#undef {{NAME}}_VW
#undef {{NAME}}_VLOAD

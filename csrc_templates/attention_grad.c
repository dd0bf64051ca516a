#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_VEC {{VEC}} /* the plan's vec: the AVX-512 micro-kernels */
#define {{NAME}}_RB {{RB}} /* the plan's rb: query rows per block */
EQF_WIDE_BEGIN
/* {{NAME}}: {{WHAT}}, the probabilities recomputed, never stored.
 * {{BATCH}} batches of {{SQ}} queries and {{SK}} keys; q and k rows of D = {{D}}, v and dy rows of
 * DV = {{DV}}. S = q k^T * {{SCALE}} (+ mask), P = softmax(S) over the keys, dP = dy v^T,
 * dS = P * (dP - rowsum(dP * P)) * scale.
 * Phase 1 walks the query rows, RB = {{RB}} at a time: their scores and dP (RB rows of SK floats
 * each, per thread), then each row's max m_i, 1 / sum exp(S - m_i) and D_i = rowsum(dP * P).
 *   dq (MODE 0): rows i of dq = sum_j dS_ij k_j, from those rows alone.
 *   dk (MODE 1), dv (MODE 2): the row statistics are kept (3 floats per query row), and phase 2
 *   walks the key rows, RB at a time: P_ij recomputed for every query from the statistics,
 *   dv_j = sum_i P_ij dy_i and dk_j = sum_i dS_ij q_i.
 * Each thread copies the batch's k^T and v^T (phase 1), or q^T and dy^T (phase 2), into its
 * scratch when it reaches a new batch, so score and dP rows are sums of vector products along the
 * keys (or queries), never horizontal sums. With VEC ({{VEC}}: AVX-512, 64 | SQ and SK, D and DV
 * of 16, 32 or 64, rows contiguous) the products are the attention micro-kernels of common.h
 * (4 rows x 64 in registers); otherwise plain loops.
 * A row whose softmax is NaN in numpy (a NaN or +inf score, or every key masked with -inf) has
 * m_i = NaN here: its P is NaN, or 0 with ZERO_NAN ({{ZERO_NAN}}), as where(isnan(p), 0, p). */
static void {{NAME}}_transpose(const float* restrict src, long rs, long cs, long rows, long cols, float* restrict dst, long ld)
{
    /* dst[c * ld + r] = src[r * rs + c * cs] */
    for (long r = 0; r < rows; r++)
        for (long c = 0; c < cols; c++)
            dst[c * ld + r] = src[r * rs + c * cs];
}

/* s[RB][n] = a[RB][k] (rows at lda) . bt[k][n] (rows at n) */
static void {{NAME}}_rows(const float* restrict a, long lda, const float* restrict bt, long k, long n, float* restrict s)
{
#if defined(__AVX512F__) && {{NAME}}_VEC
    for (long j = 0; j < n; j += 64)
        eqf_qk_4x64(a, lda, bt + j, n, k, s + j, n);
#else
    for (long r = 0; r < {{NAME}}_RB; r++) {
        float* restrict sr = s + r * n;
        for (long j = 0; j < n; j++)
            sr[j] = 0.0f;
        for (long d = 0; d < k; d++) {
            const float ad = a[r * lda + d];
            const float* restrict bd = bt + d * n;
            #pragma omp simd
            for (long j = 0; j < n; j++)
                sr[j] += ad * bd[j];
        }
    }
#endif
}

/* acc[RB][w] = p[RB][n] . x[n][w] (x rows at ldx, columns at cx) */
static void {{NAME}}_acc(const float* restrict p, long n, const float* restrict x, long ldx, long cx, long w,
                         float* restrict acc)
{
    for (long i = 0; i < {{NAME}}_RB * w; i++)
        acc[i] = 0.0f;
#if defined(__AVX512F__) && {{NAME}}_VEC
    (void)cx;
    if (w == 64)
        eqf_pv_4x64(p, n, x, ldx, n, acc, w);
    else if (w == 32)
        eqf_pv_4x32(p, n, x, ldx, n, acc, w);
    else
        eqf_pv_4x16(p, n, x, ldx, n, acc, w);
#else
    for (long r = 0; r < {{NAME}}_RB; r++)
        for (long j = 0; j < n; j++) {
            const float pj = p[r * n + j];
            const float* restrict xj = x + j * ldx;
            #pragma omp simd
            for (long e = 0; e < w; e++)
                acc[r * w + e] += pj * xj[e * cx];
        }
#endif
}

void {{NAME}}({{PARAMS}})
{
    enum { MODE = {{MODE}}, SQ = {{SQ}}, SK = {{SK}}, D = {{D}}, DV = {{DV}}, OUTD = {{OUTD}}, RB = {{NAME}}_RB };
    const long NROWS = {{BATCH}}L * SQ;
    const float scale = {{SCALE}};
    float* restrict stats = NULL; /* m_i, then 1 / l_i, then D_i of every query row (modes 1 and 2) */
    if (MODE != 0 && !(stats = eqf_scratch(EQF_SCRATCH_ATTN_STATS, 3L * {{BATCH}} * SQ))) {
        eqf_nomem_note();
        return;
    }
    const long n1 = (long)(D + DV + 2 * RB) * SK, n2 = MODE == 0 ? 0 : (long)(D + DV + 2 * RB) * SQ;
    int nomem = 0;
    #pragma omp parallel if ({{PARALLEL}})
    {
    float* restrict buf = eqf_scratch(EQF_SCRATCH_ATTN_ROW, n1 > n2 ? n1 : n2);
    if (!buf) {
        #pragma omp atomic write
        nomem = 1;
    }
    long packed = -1;
    #pragma omp for schedule(static)
    for (long t = 0; t < {{BATCH}} * (SQ / RB); t++) {
        if (!buf)
            continue;
        const long b = t / (SQ / RB), i0 = t % (SQ / RB) * RB;
        float* restrict kt = buf;                  /* [D][SK] */
        float* restrict vt = buf + (long)D * SK;   /* [DV][SK] */
        float* restrict S = vt + (long)DV * SK;    /* [RB][SK]: S, then P, then dS */
        float* restrict DP = S + (long)RB * SK;    /* [RB][SK] */
        if (b != packed) {
            {{NAME}}_transpose({{K}} + ({{KOFF}}), {{KR}}, {{KC}}, SK, D, kt, SK);
            if (MODE != 2)
                {{NAME}}_transpose({{V}} + ({{VOFF}}), {{VR}}, {{VC}}, SK, DV, vt, SK);
            packed = b;
        }
        float a[RB][D > DV ? D : DV] __attribute__((aligned(64)));  /* (aligned: see attention.c) */
        for (long r = 0; r < RB; r++)
            for (long d = 0; d < D; d++)
                a[r][d] = {{Q}}[({{QOFF}}) + (i0 + r) * {{QR}} + d * {{QC}}] * scale;
        {{NAME}}_rows(&a[0][0], D > DV ? D : DV, kt, D, SK, S);
        if (MODE != 2) {
            for (long r = 0; r < RB; r++)
                for (long e = 0; e < DV; e++)
                    a[r][e] = {{DY}}[({{DYOFF}}) + (i0 + r) * {{DYR}} + e * {{DYC}}];
            {{NAME}}_rows(&a[0][0], D > DV ? D : DV, vt, DV, SK, DP);
        }
        for (long r = 0; r < RB; r++) {
            const long i = i0 + r;
            float* restrict row = S + r * SK;
            float m = -INFINITY;
            int nan = 0;
            #pragma omp simd reduction(max:m) reduction(|:nan)
            for (long j = 0; j < SK; j++) {
                const float s = row[j]{{MASK_IJ}};
                row[j] = s;
                m = s > m ? s : m;
                nan |= s != s;
            }
            if (nan)
                m = NAN; /* NaN wins, as in numpy's max */
            float l = 0.0f;
            if (m == m && m != INFINITY && m != -INFINITY) {
                #pragma omp simd reduction(+:l)
                for (long j = 0; j < SK; j++) {
                    row[j] = eqf_expf(row[j] - m);
                    l += row[j];
                }
            }
            const int dead = !(l > 0.0f && l <= 3.4028235e38f);
            const float inv = 1.0f / l;
            float dsum = 0.0f;
            const float* restrict dp = DP + r * SK;
            #pragma omp simd reduction(+:dsum)
            for (long j = 0; j < SK; j++) {
                row[j] = dead ? ({{ZERO_NAN}} ? 0.0f : NAN) : row[j] * inv;
                if (MODE != 2)
                    dsum += row[j] * dp[j];
            }
            if (MODE == 0) {
                #pragma omp simd
                for (long j = 0; j < SK; j++)
                    row[j] = row[j] * (dp[j] - dsum) * scale;
            } else {
                stats[b * SQ + i] = dead ? NAN : m;
                stats[NROWS + b * SQ + i] = inv;
                stats[2 * NROWS + b * SQ + i] = dsum;
            }
        }
        if (MODE == 0) {
            float acc[RB * OUTD] __attribute__((aligned(64)));
            {{NAME}}_acc(S, SK, {{K}} + ({{KOFF}}), {{KR}}, {{KC}}, OUTD, acc);
            for (long r = 0; r < RB; r++)
                for (long d = 0; d < OUTD; d++)
                    out[({{OOFF}}) + (i0 + r) * {{OR}} + d * {{OC}}] = acc[r * OUTD + d];
        }
    }
    if (MODE != 0) {
        /* (the loop above ends in a barrier: every row's statistics are in) */
        packed = -1;
        #pragma omp for schedule(static)
        for (long t = 0; t < {{BATCH}} * (SK / RB); t++) {
            if (nomem)
                continue;
            const long b = t / (SK / RB), j0 = t % (SK / RB) * RB;
            float* restrict qt = buf;                  /* [D][SQ] */
            float* restrict dyt = buf + (long)D * SQ;  /* [DV][SQ] */
            float* restrict P = dyt + (long)DV * SQ;   /* [RB][SQ]: P^T, then dS^T */
            float* restrict DP = P + (long)RB * SQ;    /* [RB][SQ] */
            if (b != packed) {
                {{NAME}}_transpose({{Q}} + ({{QOFF}}), {{QR}}, {{QC}}, SQ, D, qt, SQ);
                if (MODE == 1)
                    {{NAME}}_transpose({{DY}} + ({{DYOFF}}), {{DYR}}, {{DYC}}, SQ, DV, dyt, SQ);
                packed = b;
            }
            const float* restrict sm = stats + b * SQ, * restrict sinv = sm + NROWS, * restrict sd = sinv + NROWS;
            float a[RB][D > DV ? D : DV] __attribute__((aligned(64)));  /* (aligned: see attention.c) */
            for (long r = 0; r < RB; r++)
                for (long d = 0; d < D; d++)
                    a[r][d] = {{K}}[({{KOFF}}) + (j0 + r) * {{KR}} + d * {{KC}}] * scale;
            {{NAME}}_rows(&a[0][0], D > DV ? D : DV, qt, D, SQ, P);
            if (MODE == 1) {
                for (long r = 0; r < RB; r++)
                    for (long e = 0; e < DV; e++)
                        a[r][e] = {{V}}[({{VOFF}}) + (j0 + r) * {{VR}} + e * {{VC}}];
                {{NAME}}_rows(&a[0][0], D > DV ? D : DV, dyt, DV, SQ, DP);
            }
            for (long r = 0; r < RB; r++) {
                const long j = j0 + r;
                (void)j;
                float* restrict p = P + r * SQ;
                const float* restrict dp = DP + r * SQ;
                #pragma omp simd
                for (long i = 0; i < SQ; i++) {
                    const float s = p[i]{{MASK_IJ}};
                    const float mi = sm[i];
                    const float pi = mi != mi ? ({{ZERO_NAN}} ? 0.0f : NAN) : eqf_expf(s - mi) * sinv[i];
                    p[i] = MODE == 2 ? pi : pi * (dp[i] - sd[i]) * scale;
                }
            }
            float acc[RB * OUTD] __attribute__((aligned(64)));
            if (MODE == 2)
                {{NAME}}_acc(P, SQ, {{DY}} + ({{DYOFF}}), {{DYR}}, {{DYC}}, OUTD, acc);
            else
                {{NAME}}_acc(P, SQ, {{Q}} + ({{QOFF}}), {{QR}}, {{QC}}, OUTD, acc);
            for (long r = 0; r < RB; r++)
                for (long d = 0; d < OUTD; d++)
                    out[({{OOFF}}) + (j0 + r) * {{OR}} + d * {{OC}}] = acc[r * OUTD + d];
        }
    }
    }
    if (nomem)
        eqf_nomem_note();
}
EQF_WIDE_END

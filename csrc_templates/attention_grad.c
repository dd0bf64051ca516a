EQF_WIDE_BEGIN
/* {{NAME}}: {{WHAT}}, the probabilities recomputed, never stored.
 * {{BATCH}} batches of {{SQ}} queries and {{SK}} keys; q and k rows of D = {{D}}, v and dy rows of
 * DV = {{DV}}. S = q k^T * {{SCALE}} (+ mask), P = softmax(S) over the keys, dP = dy v^T,
 * dS = P * (dP - rowsum(dP * P)) * scale.
 * Phase 1 walks each query row i: its scores and dP in a per-thread row of SK floats, then the
 * row's max m_i, 1 / sum exp(S - m_i) and D_i = rowsum(dP * P).
 *   dq (MODE 0): row i of dq = sum_j dS_ij k_j, from that row alone.
 *   dk (MODE 1), dv (MODE 2): the row statistics are kept (3 floats per query row), and phase 2
 *   walks each key row j: P_ij recomputed from the statistics, dv_j = sum_i P_ij dy_i and
 *   dk_j = sum_i dS_ij q_i.
 * A row whose softmax is NaN in numpy (a NaN or +inf score, or every key masked with -inf) has
 * m_i = NaN here: its P is NaN, or 0 with ZERO_NAN ({{ZERO_NAN}}), as where(isnan(p), 0, p). */
void {{NAME}}({{PARAMS}})
{
    enum { MODE = {{MODE}}, SQ = {{SQ}}, SK = {{SK}}, D = {{D}}, DV = {{DV}}, OUTD = {{OUTD}} };
    const float scale = {{SCALE}};
    float* restrict stats = NULL; /* m_i, 1 / l_i, D_i of every query row (modes 1 and 2) */
    if (MODE != 0 && !(stats = eqf_scratch(EQF_SCRATCH_ATTN_STATS, 3L * {{BATCH}} * SQ))) {
        eqf_nomem_note();
        return;
    }
    int nomem = 0;
    #pragma omp parallel if ({{PARALLEL}})
    {
    float* restrict row = eqf_scratch(EQF_SCRATCH_ATTN_ROW, 2L * SK); /* S then P, and dP */
    if (!row) {
        #pragma omp atomic write
        nomem = 1;
    }
    float* restrict dprow = row ? row + SK : NULL;
    #pragma omp for schedule(static)
    for (long t = 0; t < {{BATCH}} * SQ; t++) {
        if (!row)
            continue;
        const long b = t / SQ, i = t % SQ;
        (void)b;
        const float* restrict qi = {{Q}} + ({{QOFF}}) + i * {{QR}};
        float m = -INFINITY;
        for (long j = 0; j < SK; j++) {
            const float* restrict kj = {{K}} + ({{KOFF}}) + j * {{KR}};
            float s = 0.0f;
            #pragma omp simd reduction(+:s)
            for (long d = 0; d < D; d++)
                s += qi[d * {{QC}}] * kj[d * {{KC}}];
            s = s * scale{{MASK_IJ}};
            row[j] = s;
            m = m != m ? m : (s > m || s != s) ? s : m; /* NaN wins, as in numpy's max */
        }
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
        #pragma omp simd
        for (long j = 0; j < SK; j++)
            row[j] = dead ? ({{ZERO_NAN}} ? 0.0f : NAN) : row[j] * inv;
        float dsum = 0.0f;
        if (MODE != 2) {
            const float* restrict dyi = {{DY}} + ({{DYOFF}}) + i * {{DYR}};
            for (long j = 0; j < SK; j++) {
                const float* restrict vj = {{V}} + ({{VOFF}}) + j * {{VR}};
                float dp = 0.0f;
                #pragma omp simd reduction(+:dp)
                for (long e = 0; e < DV; e++)
                    dp += dyi[e * {{DYC}}] * vj[e * {{VC}}];
                dprow[j] = dp;
            }
            #pragma omp simd reduction(+:dsum)
            for (long j = 0; j < SK; j++)
                dsum += row[j] * dprow[j];
        }
        if (MODE == 0) {
            float acc[OUTD];
            for (long d = 0; d < OUTD; d++)
                acc[d] = 0.0f;
            for (long j = 0; j < SK; j++) {
                const float ds = row[j] * (dprow[j] - dsum) * scale;
                const float* restrict kj = {{K}} + ({{KOFF}}) + j * {{KR}};
                #pragma omp simd
                for (long d = 0; d < OUTD; d++)
                    acc[d] += ds * kj[d * {{KC}}];
            }
            float* restrict o = out + ({{OOFF}}) + i * {{OR}};
            for (long d = 0; d < OUTD; d++)
                o[d * {{OC}}] = acc[d];
        } else {
            stats[3 * t] = dead ? NAN : m;
            stats[3 * t + 1] = inv;
            stats[3 * t + 2] = dsum;
        }
    }
    if (MODE != 0) {
        /* (the loop above ends in a barrier: every row's statistics are in) */
        #pragma omp for schedule(static)
        for (long t = 0; t < {{BATCH}} * SK; t++) {
            if (nomem)
                continue;
            const long b = t / SK, j = t % SK;
            (void)b;
            const float* restrict kj = {{K}} + ({{KOFF}}) + j * {{KR}};
            const float* restrict vj = {{V}} + ({{VOFF}}) + j * {{VR}};
            (void)vj;
            float acc[OUTD];
            for (long d = 0; d < OUTD; d++)
                acc[d] = 0.0f;
            for (long i = 0; i < SQ; i++) {
                const float* restrict qi = {{Q}} + ({{QOFF}}) + i * {{QR}};
                const float* restrict dyi = {{DY}} + ({{DYOFF}}) + i * {{DYR}};
                const float* restrict st = stats + 3 * (b * SQ + i);
                float s = 0.0f;
                #pragma omp simd reduction(+:s)
                for (long d = 0; d < D; d++)
                    s += qi[d * {{QC}}] * kj[d * {{KC}}];
                s = s * scale{{MASK_IJ}};
                const float p = st[0] != st[0] ? ({{ZERO_NAN}} ? 0.0f : NAN) : eqf_expf(s - st[0]) * st[1];
                if (MODE == 2) {
                    #pragma omp simd
                    for (long e = 0; e < OUTD; e++)
                        acc[e] += p * dyi[e * {{DYC}}];
                } else {
                    float dp = 0.0f;
                    #pragma omp simd reduction(+:dp)
                    for (long e = 0; e < DV; e++)
                        dp += dyi[e * {{DYC}}] * vj[e * {{VC}}];
                    const float ds = p * (dp - st[2]) * scale;
                    #pragma omp simd
                    for (long d = 0; d < OUTD; d++)
                        acc[d] += ds * qi[d * {{QC}}];
                }
            }
            float* restrict o = out + ({{OOFF}}) + j * {{OR}};
            for (long d = 0; d < OUTD; d++)
                o[d * {{OC}}] = acc[d];
        }
    }
    }
    if (nomem)
        eqf_nomem_note();
}
EQF_WIDE_END

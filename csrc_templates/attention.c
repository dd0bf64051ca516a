/* {{NAME}}: flash attention, {{BATCH}} x [{{SQ}} x {{D}}] queries against {{SK}} keys, Dv = {{DV}}.
 * Blocks of {{BQ}} queries run against tiles of {{BK}} keys with an online softmax: only a
 * {{BQ}} x {{BK}} score tile exists at any time, never the {{SQ}} x {{SK}} matrix. */
void {{NAME}}({{PARAMS}})
{
    enum { BQ = {{BQ}}, BK = {{BK}}, D = {{D}}, DV = {{DV}} };
    const long nqb = ({{SQ}} + BQ - 1) / BQ;
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long t = 0; t < {{BATCH}} * nqb; t++) {
        const long b = t / nqb;
        const long i0 = (t % nqb) * BQ;
        const long nq = eqf_minl(BQ, {{SQ}} - i0);
        const float* restrict qp = {{Q}} + ({{QOFF}}) + i0 * D;
        const float* restrict kp = {{K}} + ({{KOFF}});
        const float* restrict vp = {{V}} + ({{VOFF}});
{{OFFSETS}}
        float qb[BQ][D], kt[D][BK], s[BQ][BK], acc[BQ][DV], m[BQ], l[BQ];
        for (long ii = 0; ii < BQ; ii++) {
            for (long d = 0; d < D; d++)
                qb[ii][d] = ii < nq ? qp[ii * D + d] : 0.0f;
            for (long e = 0; e < DV; e++)
                acc[ii][e] = 0.0f;
            m[ii] = -INFINITY;
            l[ii] = 0.0f;
        }
        for (long j0 = 0; j0 < {{SK}}; j0 += BK) {
            const long nk = eqf_minl(BK, {{SK}} - j0);
            /* the key tile, transposed to [D][BK] so the score loop runs along keys */
            for (long jj = 0; jj < BK; jj++)
                for (long d = 0; d < D; d++)
                    kt[d][jj] = jj < nk ? {{KLOAD}} : 0.0f;
            for (long ii = 0; ii < BQ; ii++) {
                float sr[BK];
                #pragma omp simd
                for (long jj = 0; jj < BK; jj++)
                    sr[jj] = 0.0f;
                for (long d = 0; d < D; d++) {
                    const float qv = qb[ii][d];
                    #pragma omp simd
                    for (long jj = 0; jj < BK; jj++)
                        sr[jj] += qv * kt[d][jj];
                }
                const long i = i0 + (ii < nq ? ii : 0);
                float mt = m[ii];
                for (long jj = 0; jj < BK; jj++) {
                    const long j = j0 + jj;
                    const float acc_s = sr[jj];
                    (void)i;
                    (void)j;
{{SCORE_BODY}}
                    const float sc = jj < nk ? {{SCORE}} : -INFINITY;
                    s[ii][jj] = sc;
                    mt = sc > mt ? sc : mt;
                }
                const float alpha = eqf_exp(m[ii] - mt);
                float ps = 0.0f;
                #pragma omp simd reduction(+:ps)
                for (long jj = 0; jj < BK; jj++) {
                    const float p = eqf_exp(s[ii][jj] - mt);
                    s[ii][jj] = p;
                    ps += p;
                }
                m[ii] = mt;
                l[ii] = l[ii] * alpha + ps;
                #pragma omp simd
                for (long e = 0; e < DV; e++)
                    acc[ii][e] *= alpha;
            }
            for (long jj = 0; jj < nk; jj++) {
                const float* restrict vr = vp + (j0 + jj) * DV;
                for (long ii = 0; ii < BQ; ii++) {
                    const float p = s[ii][jj];
                    #pragma omp simd
                    for (long e = 0; e < DV; e++)
                        acc[ii][e] += p * vr[e];
                }
            }
        }
        for (long ii = 0; ii < nq; ii++) {
            const long i = i0 + ii;
            const float inv = 1.0f / l[ii];
            for (long e = 0; e < DV; e++) {
                const float v = acc[ii][e] * inv;
{{EPI_OFFSETS}}
{{EPI_BODY}}
                out[({{OUT_OFF}}) + i * DV + e] = {{EPI}};
            }
        }
    }
}

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: blocks of rows split over threads (1) or on one (0) */
#define {{NAME}}_BLOCK {{BLOCK}} /* the plan's lanes: rows a block */
/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows) with the rows in the lanes (the plan's lanes):
 * the row axis is strided and runs of {{RUN}} consecutive rows lie at stride 1 (a channels-first
 * layernorm: the rows are pixels, a row the channels), so a block of {{BLOCK}} rows is loaded as
 * vectors of rows, one element of each at a time, into a tile [element][row] in L1, and the mean,
 * the variance (two passes: the mean, then the squared deviations from it) and the output are
 * vectors over the rows: no gathers and no horizontal sums. Prologue and epilogue fused. */
EQF_WIDE_BEGIN
void {{NAME}}({{PARAMS}})
{
#if {{NAME}}_PARALLEL >= 0
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
#endif
    for (long blk = 0; blk < {{OUTER}} * {{NB}}; blk++) {
        const long q = blk / {{NB}}, p0 = blk % {{NB}} * {{BLOCK}};
        const long n = {{RUN}} - p0 < {{BLOCK}} ? {{RUN}} - p0 : {{BLOCK}};
        (void)q;  /* (no offset reads it when there is one run) */
{{OFFSETS}}
        float t[{{L}}][{{BLOCK}}] __attribute__((aligned(64)));
        float mean[{{BLOCK}}] __attribute__((aligned(64))), acc[{{BLOCK}}] __attribute__((aligned(64)));
        for (long i = 0; i < {{BLOCK}}; i++)
            acc[i] = 0.0f;
        for (long j = 0; j < {{L}}; j++) {
            #pragma omp simd
            for (long i = 0; i < n; i++) {
                const long p = p0 + i;
{{PRO_BODY}}
                const float x = {{X}};
                t[j][i] = x;
                acc[i] += x;
            }
        }
        #pragma omp simd
        for (long i = 0; i < n; i++) {
            mean[i] = acc[i] * (1.0f / {{L}});
            acc[i] = 0.0f;
        }
        for (long j = 0; j < {{L}}; j++) {
            #pragma omp simd
            for (long i = 0; i < n; i++) {
                const float dv = t[j][i] - mean[i];
                acc[i] += dv * dv;
            }
        }
        #pragma omp simd
        for (long i = 0; i < n; i++)
            acc[i] = 1.0f / sqrtf(acc[i] * (1.0f / {{L}}) + {{EPS}});  /* rstd */
        for (long j = 0; j < {{L}}; j++) {
            #pragma omp simd
            for (long i = 0; i < n; i++) {
                const long p = p0 + i;
                const float v = (t[j][i] - mean[i]) * acc[i] * {{GAMMA}}[j] + {{BETA}}[j];
{{EPI_BODY}}
                out[{{YOFF}}] = {{EPI}};
            }
        }
    }
}
EQF_WIDE_END

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
EQF_WIDE_BEGIN
/* {{NAME}}: {{OP}} over rows of {{L}} ({{ROWS}} rows), dy's prologue and the epilogue fused.
 *   softmax_grad (MODE 0): y * (dy - sum(dy * y)), y the forward softmax;
 *   layernorm_grad (MODE 1): rstd * (g dy - mean(g dy) - xhat * mean(g dy xhat)), xhat the
 *   forward's normalized x, from x (two-pass mean and variance).
 * dy (after its prologue) is kept in the output row while the row's sums are taken (in cache). */
void {{NAME}}({{PARAMS}})
{
    enum { MODE = {{MODE}} };
#if {{NAME}}_PARALLEL >= 0
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
#endif
    for (long r = {{R0}}; r < {{ROWS}}; r++) {
        float* restrict o = out + ({{YBASE}});
{{OFFSETS}}
        float s1 = 0.0f;
        #pragma omp simd reduction(+:s1)
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            const float dy = {{X}};
            o[j * {{YS}}] = dy;
            s1 += MODE == 0 ? dy * ({{A1}}) : ({{A1}});
        }
        float mean = 0.0f, rstd = 0.0f, s2 = 0.0f, s3 = 0.0f;
        if (MODE == 1) {
            mean = s1 * (1.0f / {{L}});
            float q = 0.0f;
            #pragma omp simd reduction(+:q)
            for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
                (void)({{X}});
                const float d = ({{A1}}) - mean;
                q += d * d;
            }
            rstd = 1.0f / sqrtf(q * (1.0f / {{L}}) + {{EPS}});
            #pragma omp simd reduction(+:s2, s3)
            for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
                (void)({{X}});
                const float gdy = {{GAMMA_J}} * o[j * {{YS}}];
                s2 += gdy;
                s3 += gdy * (({{A1}}) - mean) * rstd;
            }
            s2 *= 1.0f / {{L}};
            s3 *= 1.0f / {{L}};
        }
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            (void)({{X}});
            const float a1 = {{A1}};
            const float v = MODE == 0 ? a1 * (o[j * {{YS}}] - s1)
                                      : rstd * ({{GAMMA_J}} * o[j * {{YS}}] - s2 - (a1 - mean) * rstd * s3);
{{EPI_BODY}}
            o[j * {{YS}}] = {{EPI}};
        }
    }
}
EQF_WIDE_END

/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * Two-pass mean and variance over the row held in the output row (in cache). */
EQF_WIDE_BEGIN
/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * Two-pass mean and variance over the row held in the output row (in cache). */
void {{NAME}}({{PARAMS}})
{
{{ROW_LOOP_PRAGMA}}
    for (long r = {{R0}}; r < {{ROWS}}; r++) {
        float* restrict y = out + ({{YBASE}});
{{OFFSETS}}
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j] = x;
            s += x;
        }
        const float mean = s * (1.0f / {{L}});
        float q = 0.0f;
        #pragma omp simd reduction(+:q)
        for (long j = 0; j < {{L}}; j++) {
            const float d = y[j] - mean;
            q += d * d;
        }
        const float rstd = 1.0f / sqrtf(q * (1.0f / {{L}}) + {{EPS}});
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = (y[j] - mean) * rstd * {{GAMMA}}[j] + {{BETA}}[j];
{{EPI_BODY}}
            y[j] = {{EPI}};
        }
    }
}
EQF_WIDE_END

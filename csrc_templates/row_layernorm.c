/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * Two-pass mean and variance (eqf_row_sq_dev) over the row held in the output row (in L1). */
EQF_WIDE_BEGIN
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
        const float rstd = 1.0f / sqrtf(eqf_row_sq_dev(y, {{L}}, mean, {{NEXT}}) * (1.0f / {{L}}) + {{EPS}});
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = (y[j] - mean) * rstd * {{GAMMA}}[j] + {{BETA}}[j];
{{EPI_BODY}}
            y[j] = {{EPI}};
        }
    }
}
EQF_WIDE_END

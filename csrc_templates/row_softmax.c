/* {{NAME}}: softmax over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * One thread owns a row; the output row is the scratch buffer: the prologue's values and the
 * maximum, then y = e^(y - max) and its sum (eqf_row_exp_sum), then the scale and the epilogue,
 * all three passes over the row while it is in L1. */
EQF_WIDE_BEGIN
void {{NAME}}({{PARAMS}})
{
{{ROW_LOOP_PRAGMA}}
    for (long r = {{R0}}; r < {{ROWS}}; r++) {
        float* restrict y = out + ({{YBASE}});
{{OFFSETS}}
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j * {{YS}}] = x;
            m = x > m ? x : m;
        }
        const float s = eqf_row_exp_sum(y, {{L}}, {{YS}}, m, {{NEXT}});
        const float inv = 1.0f / s;
        /* ZERO_NAN ({{ZERO_NAN}}): a row whose softmax is NaN (a NaN, or a max of +-inf: fully
         * masked) is 0, as where(isnan(p), 0, p); a finite max makes every p finite */
        const int zero = {{ZERO_NAN}} && !(s > 0.0f && s <= 3.4028235e38f);
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = zero ? 0.0f : y[j * {{YS}}] * inv;
{{EPI_BODY}}
            y[j * {{YS}}] = {{EPI}};
        }
    }
}
EQF_WIDE_END

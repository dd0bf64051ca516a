/* {{NAME}}: softmax over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * One thread owns a row; the output row is the scratch buffer (three passes in cache). */
EQF_WIDE_BEGIN
/* {{NAME}}: softmax over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * One thread owns a row; the output row is the scratch buffer (three passes in cache). */
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
        float s = 0.0f;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < {{L}}; j++) {
            const float e = eqf_exp(y[j * {{YS}}] - m);
            y[j * {{YS}}] = e;
            s += e;
        }
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

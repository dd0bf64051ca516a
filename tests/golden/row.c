/* eqf_kinds_k3_row: softmax over rows of 53 (7 rows), prologue and epilogue fused.
 * One thread owns a row; the output row is the scratch buffer: the prologue's values and the
 * maximum, then y = e^(y - max) and its sum (eqf_row_exp_sum), then the scale and the epilogue,
 * all three passes over the row while it is in L1. */
EQF_WIDE_BEGIN
void eqf_kinds_k3_row(const float* restrict in0, const float* restrict in1, float* restrict out)
{
    #pragma omp parallel for schedule(static) if (0)
    for (long r = 0; r < 7; r++) {
        float* restrict y = out + ((r) * 53);
        const long off0 = (r) * 53;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < 53; j++) {
            const float v0 = in0[off0 + j];
            const float v1 = in1[j];
            const float v2 = (v0 + v1);
            const float x = v2;
            y[j * 1] = x;
            m = x > m ? x : m;
        }
        const float s = eqf_row_exp_sum(y, 53, 1, m, (r + 1 < 7 ? in0 + (r + 1) * 53 : NULL));
        const float inv = 1.0f / s;
        /* ZERO_NAN (0): a row whose softmax is NaN (a NaN, or a max of +-inf: fully
         * masked) is 0, as where(isnan(p), 0, p); a finite max makes every p finite */
        const int zero = 0 && !(s > 0.0f && s <= 3.4028235e38f);
        #pragma omp simd
        for (long j = 0; j < 53; j++) {
            const float v = zero ? 0.0f : y[j * 1] * inv;

            y[j * 1] = v;
        }
    }
}
EQF_WIDE_END

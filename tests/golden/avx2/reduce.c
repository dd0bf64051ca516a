/* eqf_kinds_k4_reduce: sum over axes [1] of [5, 9, 13] -> [5, 13], prologue and epilogue fused.
 * The input is walked in memory order; the first kept loop is split over threads (static
 * schedule: every thread owns the same output slice at each step, so no two threads share one). */
void eqf_kinds_k4_reduce(const float* restrict in0, float* restrict out)
{
    for (long o = 0; o < 65; o++)
        out[o] = 0.0f;
    #pragma omp parallel if (0)
    {
        #pragma omp for schedule(static) nowait
        for (long i0 = 0; i0 < 5; i0++) {
            for (long i1 = 0; i1 < 9; i1++) {
                #pragma omp simd
                for (long i2 = 0; i2 < 13; i2++) {
                        const float v0 = in0[(i0) * 117 + (i1) * 13 + i2];
                    const float x = v0;
                    { const float a = out[i0 * 13 + i2]; out[i0 * 13 + i2] = a + x; }
                }
            }
        }
    }
    #pragma omp parallel for schedule(static) if (0)
    for (long o = 0; o < 65; o++) {
        const float v = out[o] * 1.0f;


        out[o] = v;
    }
}

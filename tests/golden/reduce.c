#define eqf_kinds_k4_reduce_PARALLEL 0 /* the plan's parallel: the `if` of the parallel regions */
#define eqf_kinds_k4_reduce_THREAD_LOOP 2 /* the plan's thread_loop: the loop g<k> split over threads (-1: none) */
#define eqf_kinds_k4_reduce_ACC 0 /* the plan's acc: the innermost loop reduces, into a register */
/* eqf_kinds_k4_reduce: sum over axes [1] of [5, 9, 13] -> [5, 13], prologue and epilogue fused.
 * Loops: g2: kept axes [0], g3: reduced axes [1], g4: kept axes [2].
 * The input is walked in memory order by five loops g0..g4, each over a run of adjacent input
 * axes that are all kept or all reduced (loops of 1 in front where there are fewer runs).
 * The first kept loop is split over threads (static schedule: every thread owns the same output
 * slice at each step, so no two threads share one). When the innermost run is reduced it is
 * accumulated in a register (ACC), else each step updates a vector of outputs. */
void eqf_kinds_k4_reduce(const float* restrict in0, float* restrict out)
{
    for (long o = 0; o < 65; o++)
        out[o] = 0.0f;
    #pragma omp parallel if (0)
    {
#if eqf_kinds_k4_reduce_THREAD_LOOP == 0
        #pragma omp for schedule(static) nowait
#endif
        for (long g0 = 0; g0 < 1; g0++)
#if eqf_kinds_k4_reduce_THREAD_LOOP == 1
        #pragma omp for schedule(static) nowait
#endif
        for (long g1 = 0; g1 < 1; g1++)
#if eqf_kinds_k4_reduce_THREAD_LOOP == 2
        #pragma omp for schedule(static) nowait
#endif
        for (long g2 = 0; g2 < 5; g2++)
#if eqf_kinds_k4_reduce_THREAD_LOOP == 3
        #pragma omp for schedule(static) nowait
#endif
        for (long g3 = 0; g3 < 9; g3++) {
#if eqf_kinds_k4_reduce_ACC
            float a = out[(g2) * 13 + g4];
            int nan = a != a;
            #pragma omp simd reduction(+:a) reduction(|:nan)
            for (long g4 = 0; g4 < 13; g4++) {
                const float v0 = in0[(g2) * 117 + (g3) * 13 + g4];
                const float x = v0;
                a = a + x;
                
            }
            out[(g2) * 13 + g4] = nan ? NAN : a;
#else
#if eqf_kinds_k4_reduce_THREAD_LOOP == 4
            #pragma omp for schedule(static) nowait
#else
            #pragma omp simd
#endif
            for (long g4 = 0; g4 < 13; g4++) {
                const float v0 = in0[(g2) * 117 + (g3) * 13 + g4];
                const float x = v0;
                const float a = out[(g2) * 13 + g4];
                out[(g2) * 13 + g4] = a + x;
            }
#endif
        }
    }
    #pragma omp parallel for schedule(static) if (0)
    for (long o = 0; o < 65; o++) {
        const float v = out[o] * 1.0f;


        out[o] = v;
    }
}

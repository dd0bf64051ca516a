#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel regions */
#define {{NAME}}_THREAD_LOOP {{THREAD_LOOP}} /* the plan's thread_loop: the loop g<k> split over threads (-1: none) */
#define {{NAME}}_ACC {{ACC}} /* the plan's acc: the innermost loop reduces, into a register */
/* {{NAME}}: {{OP}} over axes {{AXES}} of {{SPACE}} -> {{OUT_SPACE}}, prologue and epilogue fused.
 * Loops: {{RUNS}}.
 * The input is walked in memory order by five loops g0..g4, each over a run of adjacent input
 * axes that are all kept or all reduced (loops of 1 in front where there are fewer runs).
 * The first kept loop is split over threads (static schedule: every thread owns the same output
 * slice at each step, so no two threads share one). When the innermost run is reduced it is
 * accumulated in a register (ACC), else each step updates a vector of outputs. */
void {{NAME}}({{PARAMS}})
{
    for (long o = 0; o < {{OUT_SIZE}}; o++)
        out[o] = {{INIT}};
    #pragma omp parallel if ({{PARALLEL}})
    {
#if {{NAME}}_THREAD_LOOP == 0
        #pragma omp for schedule(static) nowait
#endif
        for (long g0 = 0; g0 < {{N0}}; g0++)
#if {{NAME}}_THREAD_LOOP == 1
        #pragma omp for schedule(static) nowait
#endif
        for (long g1 = 0; g1 < {{N1}}; g1++)
#if {{NAME}}_THREAD_LOOP == 2
        #pragma omp for schedule(static) nowait
#endif
        for (long g2 = 0; g2 < {{N2}}; g2++)
#if {{NAME}}_THREAD_LOOP == 3
        #pragma omp for schedule(static) nowait
#endif
        for (long g3 = 0; g3 < {{N3}}; g3++) {
#if {{NAME}}_ACC
            float a = out[{{OUT_OFFSET}}];
            int nan = a != a;
            #pragma omp simd reduction({{OMP_OP}}:a) reduction(|:nan)
            for (long g4 = 0; g4 < {{N4}}; g4++) {
{{PRO_BODY}}
                const float x = {{X}};
                a = {{COMBINE}};
                {{NAN_TRACK}}
            }
            out[{{OUT_OFFSET}}] = nan ? NAN : a;
#else
#if {{NAME}}_THREAD_LOOP == 4
            #pragma omp for schedule(static) nowait
#else
            #pragma omp simd
#endif
            for (long g4 = 0; g4 < {{N4}}; g4++) {
{{PRO_BODY}}
                const float x = {{X}};
                const float a = out[{{OUT_OFFSET}}];
                out[{{OUT_OFFSET}}] = {{COMBINE_NAN}};
            }
#endif
        }
    }
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long o = 0; o < {{OUT_SIZE}}; o++) {
        const float v = out[o] * {{SCALE}};
{{EPI_OFFSETS}}
{{EPI_BODY}}
        out[o] = {{EPI}};
    }
}

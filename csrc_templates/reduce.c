/* {{NAME}}: {{OP}} over axes {{AXES}} of {{SPACE}} -> {{OUT_SPACE}}, prologue and epilogue fused.
 * The input is walked in memory order; the first kept loop is split over threads (static
 * schedule: every thread owns the same output slice at each step, so no two threads share one). */
void {{NAME}}({{PARAMS}})
{
    for (long o = 0; o < {{OUT_SIZE}}; o++)
        out[o] = {{INIT}};
    #pragma omp parallel if ({{PARALLEL}})
    {
{{NEST}}
    }
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long o = 0; o < {{OUT_SIZE}}; o++) {
        const float v = out[o] * {{SCALE}};
{{EPI_OFFSETS}}
{{EPI_BODY}}
        out[o] = {{EPI}};
    }
}

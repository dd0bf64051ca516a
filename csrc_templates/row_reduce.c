/* {{NAME}}: {{OP}} over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused. */
void {{NAME}}({{PARAMS}})
{
{{ROW_LOOP_PRAGMA}}
    for (long r = 0; r < {{ROWS}}; r++) {
{{OFFSETS}}
        float a = {{INIT}};
        #pragma omp simd reduction({{RED}}:a)
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            a = {{COMBINE}};
        }
        const float v = a * {{SCALE}};
{{EPI_OFFSETS}}
{{EPI_BODY}}
        out[r] = {{EPI}};
    }
}

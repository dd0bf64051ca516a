#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
/* {{NAME}}: {{OP}} over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused. */
void {{NAME}}({{PARAMS}})
{
#if {{NAME}}_PARALLEL >= 0
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
#endif
    for (long r = 0; r < {{ROWS}}; r++) {
{{OFFSETS}}
        float a = {{INIT}};
        int nan = 0; /* a NaN was seen (the simd max reduction drops NaN) */
        #pragma omp simd reduction({{RED}}:a) reduction(|:nan)
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            a = {{COMBINE}};
            {{NAN_TRACK}}
        }
        const float v = (nan ? NAN : a) * {{SCALE}};
{{EPI_OFFSETS}}
{{EPI_BODY}}
        out[{{OUT_ROW}}] = {{EPI}};  /* (r, or the row of C it stands for: a dim at run time behind other rows) */
    }
}

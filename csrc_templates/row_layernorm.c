#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
#define {{NAME}}_QUANTIZE_OUT {{QUANTIZE_OUT}} /* the plan's quantize_out: the result is a quantize_linear (u8 / i8 out), the row held in a scratch row of L floats on the stack (1), or f32 held in the output row (0) */
#define {{NAME}}_QATTR EQF_QUANTIZE_ROW_ATTR({{QUANTIZE_OUT}})
/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * Corrected two-pass mean and variance (eqf_row_sq_dev) over the row held in the output row (in L1),
 * or, when the output is quantized (u8 / i8), in a scratch row on the stack: the last pass then
 * quantizes (the epilogue's eqf_quantize) into the output row. */
EQF_WIDE_BEGIN
{{NAME}}_QATTR void {{NAME}}({{PARAMS}})
{
#if {{NAME}}_PARALLEL >= 0
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
#endif
    for (long r = {{R0}}; r < {{ROWS}}; r++) {
#if {{NAME}}_QUANTIZE_OUT
        float yrow[{{L}}];
        float* restrict y = yrow;
#else
        float* restrict y = out + ({{YBASE}});
#endif
{{OFFSETS}}
        float s = 0.0f, st;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < {{L}} / 16 * 16; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j] = x;
            s += x;
        }
        st = s;  /* the last L % 16 apart, as in row_softmax.c */
        #pragma GCC unroll 16
        for (long j = {{L}} / 16 * 16; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j] = x;
            st += x;
        }
        const float mean0 = st * (1.0f / {{L}});
        float dev;
        const float q = eqf_row_sq_dev(y, {{L}}, mean0, {{NEXT}}, &dev);
        const float dm = dev * (1.0f / {{L}});  /* mean = mean0 + dm, applied in two steps below */
        const float var = fmaxf(q - dev * dm, 0.0f) * (1.0f / {{L}});  /* >= 0 also after rounding */
        const float rstd = 1.0f / sqrtf(var + {{EPS}});
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = ((y[j] - mean0) - dm) * rstd * {{GAMMA}}[j] + {{BETA}}[j];
{{EPI_BODY}}
#if {{NAME}}_QUANTIZE_OUT
            out[({{YBASE}}) + j] = {{EPI}};  /* (through out itself: restrict, so the loop needs no overlap check) */
#else
            y[j] = {{EPI}};
#endif
        }
    }
}
#undef {{NAME}}_QATTR
EQF_WIDE_END

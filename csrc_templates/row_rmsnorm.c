#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
#define {{NAME}}_QUANTIZE_OUT {{QUANTIZE_OUT}} /* the plan's quantize_out: the result is a quantize_linear (u8 / i8 out), a block of rows held in scratch rows of L floats on the stack (1), or f32 held in the output row (0) */
#define {{NAME}}_QUANTIZE_FLAT {{QUANTIZE_FLAT}} /* the plan's quantize_flat: a block's rows quantized in one loop over the block (1), or row by row (0) */
#define {{NAME}}_SUM_APART {{SUM_APART}} /* the plan's sum_apart: the first pass stores the row, then eqf_row_sum sums it (1), or the pass sums it (0) */
#define {{NAME}}_QATTR EQF_QUANTIZE_ROW_ATTR({{QUANTIZE_OUT}})
#if {{NAME}}_QUANTIZE_OUT
#define {{NAME}}_RB EQF_ROW_BLOCK({{L}})
#else
#define {{NAME}}_RB 1
#endif
/* {{NAME}}: rmsnorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused; a quantized
 * result (u8 / i8) is computed in scratch rows, a block of EQF_ROW_BLOCK(L) rows, and the block is
 * quantized in a pass of its own, as in row_layernorm.c. */
EQF_WIDE_BEGIN
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"  /* (the offsets the row-by-row quantize does not use) */
{{ROWS_HEAD}}
    for (long rb = eqf_first; rb < eqf_end; rb += {{NAME}}_RB) {
#if {{NAME}}_QUANTIZE_OUT
    const long re = eqf_minl(rb + {{NAME}}_RB, {{ROWS}});
    float ybuf[{{NAME}}_RB * {{L}}L];
    for (long r = rb; r < re; r++) {
        float* restrict y = ybuf + (r - rb) * {{L}}L;
#else
    {
        const long r = rb;
        float* restrict y = out + ({{YBASE}});
#endif
{{OFFSETS}}
#if {{NAME}}_SUM_APART
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
{{PRO_BODY}}
            y[j] = {{X}};
        }
        const float st = eqf_row_sum(y, {{L}}, 1);
#else
        float s = 0.0f, st;
        #pragma omp simd reduction(+:s)
        for (long j = 0; j < {{L}} / 16 * 16; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j] = x;
            s += x * x;
        }
        st = s;  /* the last L % 16 apart, as in row_softmax.c */
        #pragma GCC unroll 16
        for (long j = {{L}} / 16 * 16; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j] = x;
            st += x * x;
        }
#endif
        const float rstd = 1.0f / sqrtf(st * (1.0f / {{L}}) + {{EPS}});
        eqf_prefetch_row({{NEXT}}, {{L}});  /* the next row, while this one is normalized */
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = y[j] * rstd * {{GAMMA}}[j];
#if {{NAME}}_QUANTIZE_OUT
            y[j] = v;
#else
{{EPI_BODY}}
            y[j] = {{EPI}};
#endif
        }
    }
{{QUANTIZE_BLOCK}}
    }
}
#pragma GCC diagnostic pop
#undef {{NAME}}_QATTR
#undef {{NAME}}_RB
EQF_WIDE_END

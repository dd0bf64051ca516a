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
/* {{NAME}}: layernorm over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * Corrected two-pass mean and variance (eqf_row_sq_dev) over the row held in the output row (in L1).
 * A quantized result (u8 / i8) is computed in scratch rows on the stack, a block of
 * EQF_ROW_BLOCK(L) rows (as row_softmax.c's), and the block is quantized (the epilogue's
 * eqf_quantize) in a pass of its own: apart from the rows' passes, it waits on no row's sums. */
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
        const float st = eqf_row_sum(y, {{L}}, 0);
#else
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
#endif
        const float mean0 = st * (1.0f / {{L}});
        float dev;
        const float q = eqf_row_sq_dev(y, {{L}}, mean0, {{NEXT}}, &dev);
        const float dm = dev * (1.0f / {{L}});  /* mean = mean0 + dm, applied in two steps below */
        const float var = fmaxf(q - dev * dm, 0.0f) * (1.0f / {{L}});  /* >= 0 also after rounding */
        const float rstd = 1.0f / sqrtf(var + {{EPS}});
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = ((y[j] - mean0) - dm) * rstd * {{GAMMA}}[j] + {{BETA}}[j];
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

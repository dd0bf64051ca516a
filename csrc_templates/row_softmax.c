#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
#define {{NAME}}_QUANTIZE_OUT {{QUANTIZE_OUT}} /* the plan's quantize_out: the result is a quantize_linear (u8 / i8 out), the block's rows held in scratch rows of L floats on the stack (1), or f32 held in the output rows (0) */
#define {{NAME}}_QUANTIZE_FLAT {{QUANTIZE_FLAT}} /* the plan's quantize_flat: a block's rows quantized in one loop over the block (1), or row by row (0) */
#define {{NAME}}_QATTR EQF_QUANTIZE_ROW_ATTR({{QUANTIZE_OUT}})
#if {{NAME}}_QUANTIZE_OUT
#define {{NAME}}_Y(r) (ybuf + ((r) - rb) * {{L}}L)  /* row r of the block, contiguous */
#define {{NAME}}_YSTEP 1
#else
#define {{NAME}}_Y(r) (out + ({{YBASE}}))
#define {{NAME}}_YSTEP {{YS}}
#endif
/* {{NAME}}: softmax over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * One thread owns a block of EQF_ROW_BLOCK({{L}}) rows, and the output rows are the scratch
 * buffer (in L1): the prologue's values and each row's maximum, then y = e^(y - max) and the
 * row's sum (eqf_row_exp_sum), then the scale and the epilogue. Three passes over a block, not
 * three per row: a short row's passes would wait on its reductions, a block's rows on nothing.
 * Offsets the passes do not all use are declared in both (-Wunused-variable is off). The first
 * pass's last L % 16 elements are a scalar loop of their own: as the epilogue of the SIMD loop,
 * gcc merged them into the vector maximum through the stack (a failed store forwarding per row,
 * on rows of 77). A quantized result (u8 / i8) is computed in scratch rows instead (the output
 * row cannot hold f32), and the block is quantized (the epilogue's eqf_quantize) in a fourth pass, one
 * loop over the block's rows where they are consecutive in the output (quantize_flat): a loop over
 * one short row of floats and u8 is vectorized at the u8's width (a row of 16: 4 floats a vector). */
EQF_WIDE_BEGIN
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  /* (mx and sum: gcc 12 does not see that the loops over r in [rb, re) that read them follow one that wrote them, once the rows are a range of eqf_region) */
{{ROWS_HEAD}}
    for (long rb = eqf_first; rb < eqf_end; rb += EQF_ROW_BLOCK({{L}})) {
        const long re = eqf_minl(rb + EQF_ROW_BLOCK({{L}}), {{ROWS}});
        float mx[EQF_ROW_BLOCK({{L}})], sum[EQF_ROW_BLOCK({{L}})];
#if {{NAME}}_QUANTIZE_OUT
        float ybuf[EQF_ROW_BLOCK({{L}}) * {{L}}L];
#endif
        for (long r = rb; r < re; r++) {
        float* restrict y = {{NAME}}_Y(r);
{{OFFSETS}}
        float m = -INFINITY, mt;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < {{L}} / 16 * 16; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j * {{NAME}}_YSTEP] = x;
            m = x > m ? x : m;
        }
        mt = m;
        #pragma GCC unroll 16
        for (long j = {{L}} / 16 * 16; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j * {{NAME}}_YSTEP] = x;
            mt = x > mt ? x : mt;
        }
        mx[r - rb] = mt;
        }
        for (long r = rb; r < re; r++)
            sum[r - rb] = eqf_row_exp_sum({{NAME}}_Y(r), {{L}}, {{NAME}}_YSTEP, mx[r - rb], {{NEXT}});
        for (long r = rb; r < re; r++) {
        float* restrict y = {{NAME}}_Y(r);
{{OFFSETS}}
        const float s = sum[r - rb], inv = 1.0f / s;
        /* ZERO_NAN ({{ZERO_NAN}}): a row whose softmax is NaN (a NaN, or a max of +-inf: fully
         * masked) is 0, as where(isnan(p), 0, p); a finite max makes every p finite */
        const int zero = {{ZERO_NAN}} && !(s > 0.0f && s <= 3.4028235e38f);
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = zero ? 0.0f : y[j * {{NAME}}_YSTEP] * inv;
#if {{NAME}}_QUANTIZE_OUT
            y[j] = v;
#else
{{EPI_BODY}}
            y[j * {{NAME}}_YSTEP] = {{EPI}};
#endif
        }
        }
{{QUANTIZE_BLOCK}}
    }
}
#pragma GCC diagnostic pop
#undef {{NAME}}_Y
#undef {{NAME}}_YSTEP
#undef {{NAME}}_QATTR
EQF_WIDE_END

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
/* {{NAME}}: softmax over rows of {{L}} ({{ROWS}} rows), prologue and epilogue fused.
 * One thread owns a block of EQF_ROW_BLOCK({{L}}) rows, and the output rows are the scratch
 * buffer (in L1): the prologue's values and each row's maximum, then y = e^(y - max) and the
 * row's sum (eqf_row_exp_sum), then the scale and the epilogue. Three passes over a block, not
 * three per row: a short row's passes would wait on its reductions, a block's rows on nothing.
 * Offsets the passes do not all use are declared in both (-Wunused-variable is off). The first
 * pass's last L % 16 elements are a scalar loop of their own: as the epilogue of the SIMD loop,
 * gcc merged them into the vector maximum through the stack (a failed store forwarding per row,
 * on rows of 77). */
EQF_WIDE_BEGIN
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-variable"
void {{NAME}}({{PARAMS}})
{
#if {{NAME}}_PARALLEL >= 0
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
#endif
    for (long rb = {{R0}}; rb < {{ROWS}}; rb += EQF_ROW_BLOCK({{L}})) {
        const long re = eqf_minl(rb + EQF_ROW_BLOCK({{L}}), {{ROWS}});
        float mx[EQF_ROW_BLOCK({{L}})], sum[EQF_ROW_BLOCK({{L}})];
        for (long r = rb; r < re; r++) {
        float* restrict y = out + ({{YBASE}});
{{OFFSETS}}
        float m = -INFINITY, mt;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < {{L}} / 16 * 16; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j * {{YS}}] = x;
            m = x > m ? x : m;
        }
        mt = m;
        #pragma GCC unroll 16
        for (long j = {{L}} / 16 * 16; j < {{L}}; j++) {
{{PRO_BODY}}
            const float x = {{X}};
            y[j * {{YS}}] = x;
            mt = x > mt ? x : mt;
        }
        mx[r - rb] = mt;
        }
        for (long r = rb; r < re; r++)
            sum[r - rb] = eqf_row_exp_sum(out + ({{YBASE}}), {{L}}, {{YS}}, mx[r - rb], {{NEXT}});
        for (long r = rb; r < re; r++) {
        float* restrict y = out + ({{YBASE}});
{{OFFSETS}}
        const float s = sum[r - rb], inv = 1.0f / s;
        /* ZERO_NAN ({{ZERO_NAN}}): a row whose softmax is NaN (a NaN, or a max of +-inf: fully
         * masked) is 0, as where(isnan(p), 0, p); a finite max makes every p finite */
        const int zero = {{ZERO_NAN}} && !(s > 0.0f && s <= 3.4028235e38f);
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = zero ? 0.0f : y[j * {{YS}}] * inv;
{{EPI_BODY}}
            y[j * {{YS}}] = {{EPI}};
        }
        }
    }
}
#pragma GCC diagnostic pop
EQF_WIDE_END

#define eqf_kinds_k3_row_PARALLEL 0 /* the plan's parallel: rows split over threads (1) or on one (0); -1: a GEMM's row epilogue, run by the thread that finished the rows (the plan's split=rows) */
#define eqf_kinds_k3_row_QUANTIZE_OUT 0 /* the plan's quantize_out: the result is a quantize_linear (u8 / i8 out), the block's rows held in scratch rows of L floats on the stack (1), or f32 held in the output rows (0) */
#define eqf_kinds_k3_row_QUANTIZE_FLAT 0 /* the plan's quantize_flat: a block's rows quantized in one loop over the block (1), or row by row (0) */
#define eqf_kinds_k3_row_QATTR EQF_QUANTIZE_ROW_ATTR(0)
#if eqf_kinds_k3_row_QUANTIZE_OUT
#define eqf_kinds_k3_row_Y(r) (ybuf + ((r) - rb) * 53L)  /* row r of the block, contiguous */
#define eqf_kinds_k3_row_YSTEP 1
#else
#define eqf_kinds_k3_row_Y(r) (out + ((r) * 53))
#define eqf_kinds_k3_row_YSTEP 1
#endif
/* eqf_kinds_k3_row: softmax over rows of 53 (7 rows), prologue and epilogue fused.
 * One thread owns a block of EQF_ROW_BLOCK(53) rows, and the output rows are the scratch
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
#if eqf_kinds_k3_row_PARALLEL >= 0
/* eqf_kinds_k3_row's blocks of EQF_ROW_BLOCK(53) rows are the items of one eqf_region loop (common_pool.h):
 * OpenMP's static split when every core is free, else the claim-based pool (held over the
 * kernel by the run function); blocks_ runs the blocks [eqf_lo, eqf_hi) */
typedef struct {
    const float* restrict in0; const float* restrict in1; float* restrict out;
} eqf_kinds_k3_row_job;
static eqf_kinds_k3_row_QATTR void eqf_kinds_k3_row_blocks(void* eqf_ctx, long eqf_lo, long eqf_hi);
void eqf_kinds_k3_row(const float* restrict in0, const float* restrict in1, float* restrict out)
{
    eqf_kinds_k3_row_job job = { in0, in1, out };
    eqf_region((7 - 0 + EQF_ROW_BLOCK(53) - 1) / EQF_ROW_BLOCK(53), eqf_kinds_k3_row_blocks, &job, eqf_kinds_k3_row_PARALLEL);
}
static eqf_kinds_k3_row_QATTR void eqf_kinds_k3_row_blocks(void* eqf_ctx, long eqf_lo, long eqf_hi)
{
    const eqf_kinds_k3_row_job* jb = eqf_ctx;
    const float* restrict in0 = jb->in0; (void)in0; const float* restrict in1 = jb->in1; (void)in1; float* restrict out = jb->out; (void)out;
    const long eqf_first = 0 + eqf_lo * EQF_ROW_BLOCK(53), eqf_end = eqf_minl(0 + eqf_hi * EQF_ROW_BLOCK(53), 7);
#else
/* (a GEMM's row epilogue: the rows [R0, ROWS) the GEMM's thread has finished, on that thread) */
eqf_kinds_k3_row_QATTR void eqf_kinds_k3_row(const float* restrict in0, const float* restrict in1, float* restrict out)
{
    const long eqf_first = 0, eqf_end = 7;
#endif
    for (long rb = eqf_first; rb < eqf_end; rb += EQF_ROW_BLOCK(53)) {
        const long re = eqf_minl(rb + EQF_ROW_BLOCK(53), 7);
        float mx[EQF_ROW_BLOCK(53)], sum[EQF_ROW_BLOCK(53)];
#if eqf_kinds_k3_row_QUANTIZE_OUT
        float ybuf[EQF_ROW_BLOCK(53) * 53L];
#endif
        for (long r = rb; r < re; r++) {
        float* restrict y = eqf_kinds_k3_row_Y(r);
        const long off0 = (r) * 53;
        float m = -INFINITY, mt;
        #pragma omp simd reduction(max:m)
        for (long j = 0; j < 53 / 16 * 16; j++) {
            const float v0 = in0[off0 + j];
            const float v1 = in1[j];
            const float v2 = (v0 + v1);
            const float x = v2;
            y[j * eqf_kinds_k3_row_YSTEP] = x;
            m = x > m ? x : m;
        }
        mt = m;
        #pragma GCC unroll 16
        for (long j = 53 / 16 * 16; j < 53; j++) {
            const float v0 = in0[off0 + j];
            const float v1 = in1[j];
            const float v2 = (v0 + v1);
            const float x = v2;
            y[j * eqf_kinds_k3_row_YSTEP] = x;
            mt = x > mt ? x : mt;
        }
        mx[r - rb] = mt;
        }
        for (long r = rb; r < re; r++)
            sum[r - rb] = eqf_row_exp_sum(eqf_kinds_k3_row_Y(r), 53, eqf_kinds_k3_row_YSTEP, mx[r - rb], (r + EQF_ROW_BLOCK(53) < 7 ? in0 + (r + EQF_ROW_BLOCK(53)) * 53 : NULL));
        for (long r = rb; r < re; r++) {
        float* restrict y = eqf_kinds_k3_row_Y(r);
        const long off0 = (r) * 53;
        const float s = sum[r - rb], inv = 1.0f / s;
        /* ZERO_NAN (0): a row whose softmax is NaN (a NaN, or a max of +-inf: fully
         * masked) is 0, as where(isnan(p), 0, p); a finite max makes every p finite */
        const int zero = 0 && !(s > 0.0f && s <= 3.4028235e38f);
        #pragma omp simd
        for (long j = 0; j < 53; j++) {
            const float v = zero ? 0.0f : y[j * eqf_kinds_k3_row_YSTEP] * inv;
#if eqf_kinds_k3_row_QUANTIZE_OUT
            y[j] = v;
#else

            y[j * eqf_kinds_k3_row_YSTEP] = v;
#endif
        }
        }

    }
}
#pragma GCC diagnostic pop
#undef eqf_kinds_k3_row_Y
#undef eqf_kinds_k3_row_YSTEP
#undef eqf_kinds_k3_row_QATTR
EQF_WIDE_END

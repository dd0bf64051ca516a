/* eqf_kinds_k6_layout: transpose [13, 5, 9] (a strided copy per input; writes are contiguous). */
void eqf_kinds_k6_layout(const float* restrict in0, float* restrict out)
{
#define eqf_kinds_k6_layout_copy0_PARALLEL 0 /* the plan's block_parallel (this block's): the `if` of its parallel loop */
    #pragma omp parallel for schedule(static) if (0)
    for (long o = 0; o < 13; o++) {
        const long src_off = 0 + o;
        const long dst_off = 0 + (o) * 45;
        (void)o;
        #pragma omp simd
        for (long j = 0; j < 45; j++)
            out[dst_off + j * 1] = (in0[src_off + j * 13]);
    }

}

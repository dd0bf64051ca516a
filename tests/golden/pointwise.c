#define eqf_kinds_k0_pointwise_PARALLEL 0 /* the plan's parallel: the `if` of the parallel region */
#define eqf_kinds_k0_pointwise_TILE 53 /* the plan's tile: elements per tile of the inner loop */
/* eqf_kinds_k0_pointwise: pointwise kernel over [7, 53].
 * Outer dims x tiles of the inner dim are the items of one eqf_region loop (common_pool.h): as
 * OpenMP's static split when every core is free (a thread keeps the same tiles, in its caches,
 * from call to call), else on the claim-based pool, whose caller takes the ranges of a worker the
 * shared machine has descheduled, and which stays awake between the pool's kernels of one call
 * (a quantized model's integer GEMMs: no OpenMP team woken between them). The inner loops are
 * SIMD loops.
 * STREAM (0): the output is far larger than the caches, so it is written with
 * non-temporal stores (no read-for-ownership of the output, no eviction of the inputs). Tiles
 * start on the output's 64-byte lines; a row's partial first and last lines [j0, jh) and
 * [jt, j1) get ordinary stores, every whole line in [jh, jt) is computed as one 16-float
 * vector and streamed, so no line is written both ways. */
#define eqf_kinds_k0_pointwise_STREAM 0
/* TWO_PASS (0): an op of the body has a fast form exact only under a guard (sin and
 * cos: |x| < 2^24, common.h's eqf_sincos_small). Each run of elements (RUN of a tile's loop, a
 * streamed line) is computed with the fast forms while the guards are OR-ed into `big`; if any
 * failed, the run is computed again with the exact forms (in and out never alias: restrict).
 * Without it a run is the whole tile, computed once. */
#define eqf_kinds_k0_pointwise_TWO_PASS 0
#define eqf_kinds_k0_pointwise_RUN 53 /* the plan's run: elements per run of the two passes */
/* QOUT (0): the result is a quantize_linear of one scale and one zero point (a QDQ model's
 * residual add, requantized) into a contiguous output: each block of QBLOCK elements is computed
 * as the floats it quantizes (0), then quantized at once (common_simd.h eqf_quantize_row) */
#define eqf_kinds_k0_pointwise_QOUT 0
#define eqf_kinds_k0_pointwise_QBLOCK 256
typedef struct {
    const float* restrict in0; const float* restrict in1; float* restrict out;
} eqf_kinds_k0_pointwise_job;

/* tiles t0 .. t1 - 1 (t: outer row t / NTILES, tile t % NTILES of it) */
static void eqf_kinds_k0_pointwise_tiles(void* ctx, long t0, long t1)
{
    const eqf_kinds_k0_pointwise_job* jb = ctx;
    const float* restrict in0 = jb->in0; (void)in0; const float* restrict in1 = jb->in1; (void)in1; float* restrict out = jb->out; (void)out;
    const long inner = 53, tile = 53, ntiles = 1;
    (void)tile;
    for (long t = t0; t < t1; t++) {
        const long o = t / ntiles;
        float* restrict dst = out + o * inner;
#if eqf_kinds_k0_pointwise_STREAM
        const long skew = (long)(((uintptr_t)dst & 63) / sizeof(float));
        const long ts = (t % ntiles) * tile;
        const long j0 = ts > skew ? ts - skew : 0;
        const long j1 = eqf_minl(ts + tile - skew, inner);
        const long jh = eqf_minl(j0 + ((-(j0 + skew)) & 15), j1);
        const long jt = jh + (j1 - jh) / 16 * 16;
#else
        const long j0 = (t % ntiles) * tile;
        const long j1 = eqf_minl(j0 + tile, inner);
        const long jh = j1;
#endif
        const long off0 = (o) * 53;
        for (long jr = j0; jr < jh; jr += eqf_kinds_k0_pointwise_RUN) {
            const long je = eqf_minl(jr + eqf_kinds_k0_pointwise_RUN, jh);
            int big = !eqf_kinds_k0_pointwise_TWO_PASS;
#if eqf_kinds_k0_pointwise_TWO_PASS
            #pragma omp simd reduction(|:big)
            for (long j = jr; j < je; j++) {

                big |= !(1);
                dst[j] = 0;
            }
#endif
            if (big) {
#if eqf_kinds_k0_pointwise_QOUT
                for (long jq = jr; jq < je; jq += eqf_kinds_k0_pointwise_QBLOCK) {
                    const long jz = eqf_minl(jq + eqf_kinds_k0_pointwise_QBLOCK, je);
                    float xq[eqf_kinds_k0_pointwise_QBLOCK] __attribute__((aligned(64)));
                    #pragma omp simd
                    for (long j = jq; j < jz; j++) {
            const float v0 = in0[off0 + j];
            const float v2 = (v0 * 2.0f);
            const float v3 = in1[j];
            const float v4 = (v2 + v3);
            const float v5 = eqf_relu(v4);
                        xq[j - jq] = 0;
                    }
                    const float zq = 0;
                    eqf_quantize_row(xq, jz - jq, 0, (float)zq, EQF_QLO(zq), EQF_QHI(zq), (uint8_t*)(dst + jq));
                }
#else
                #pragma omp simd
                for (long j = jr; j < je; j++) {
            const float v0 = in0[off0 + j];
            const float v2 = (v0 * 2.0f);
            const float v3 = in1[j];
            const float v4 = (v2 + v3);
            const float v5 = eqf_relu(v4);
                    dst[j] = v5;
                }
#endif
            }
        }
#if eqf_kinds_k0_pointwise_STREAM
        for (long jl = jh; jl < jt; jl += 16) {
            float line[16] __attribute__((aligned(64)));
#if eqf_kinds_k0_pointwise_TWO_PASS
            int lbig = 0;
            #pragma omp simd reduction(|:lbig)
            for (int k = 0; k < 16; k++) {
                const long j = jl + k;

                lbig |= !(1);
                line[k] = 0;
            }
            if (lbig)
#endif
            #pragma omp simd
            for (int k = 0; k < 16; k++) {
                const long j = jl + k;
                const float v0 = in0[off0 + j];
                const float v2 = (v0 * 2.0f);
                const float v3 = in1[j];
                const float v4 = (v2 + v3);
                const float v5 = eqf_relu(v4);
                line[k] = v5;
            }
            eqf_stream_line(dst + jl, line);
        }
#if eqf_kinds_k0_pointwise_TWO_PASS
        int tbig = 0;
        #pragma omp simd reduction(|:tbig)
        for (long j = jt; j < j1; j++) {

            tbig |= !(1);
            dst[j] = 0;
        }
        if (tbig)
#endif
        #pragma omp simd
        for (long j = jt; j < j1; j++) {
            const float v0 = in0[off0 + j];
            const float v2 = (v0 * 2.0f);
            const float v3 = in1[j];
            const float v4 = (v2 + v3);
            const float v5 = eqf_relu(v4);
            dst[j] = v5;
        }
#endif
    }
#if eqf_kinds_k0_pointwise_STREAM
    eqf_sfence(); /* each thread orders its own streaming stores before the loop's end */
#endif
}

void eqf_kinds_k0_pointwise(const float* restrict in0, const float* restrict in1, float* restrict out)
{
    eqf_kinds_k0_pointwise_job job = { in0, in1, out };
    eqf_region(7 * 1, eqf_kinds_k0_pointwise_tiles, &job, 0);
}

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_TILE {{TILE}} /* the plan's tile: elements per tile of the inner loop */
/* {{NAME}}: pointwise kernel over {{SPACE}}.
 * Outer dims x tiles of the inner dim are the items of one eqf_region loop (common_pool.h): as
 * OpenMP's static split when every core is free (a thread keeps the same tiles, in its caches,
 * from call to call), else on the claim-based pool, whose caller takes the ranges of a worker the
 * shared machine has descheduled, and which stays awake between the pool's kernels of one call
 * (a quantized model's integer GEMMs: no OpenMP team woken between them). The inner loops are
 * SIMD loops.
 * STREAM ({{STREAM}}): the output is far larger than the caches, so it is written with
 * non-temporal stores (no read-for-ownership of the output, no eviction of the inputs). Tiles
 * start on the output's 64-byte lines; a row's partial first and last lines [j0, jh) and
 * [jt, j1) get ordinary stores, every whole line in [jh, jt) is computed as one 16-float
 * vector and streamed, so no line is written both ways. */
#define {{NAME}}_STREAM {{STREAM}}
/* TWO_PASS ({{TWO_PASS}}): an op of the body has a fast form exact only under a guard (sin and
 * cos: |x| < 2^24, common.h's eqf_sincos_small). Each run of elements (RUN of a tile's loop, a
 * streamed line) is computed with the fast forms while the guards are OR-ed into `big`; if any
 * failed, the run is computed again with the exact forms (in and out never alias: restrict).
 * Without it a run is the whole tile, computed once. */
#define {{NAME}}_TWO_PASS {{TWO_PASS}}
#define {{NAME}}_RUN {{RUN}} /* the plan's run: elements per run of the two passes */
/* QOUT ({{QOUT}}): the result is a quantize_linear of one scale and one zero point (a QDQ model's
 * residual add, requantized) into a contiguous output: each block of QBLOCK elements is computed
 * as the floats it quantizes ({{QX}}), then quantized at once (common_simd.h eqf_quantize_row) */
#define {{NAME}}_QOUT {{QOUT}}
#define {{NAME}}_QBLOCK 256
typedef struct {
    {{PARAM_FIELDS}}
} {{NAME}}_job;

/* tiles t0 .. t1 - 1 (t: outer row t / NTILES, tile t % NTILES of it) */
static void {{NAME}}_tiles(void* ctx, long t0, long t1)
{
    const {{NAME}}_job* jb = ctx;
    {{PARAM_UNPACK}}
    const long inner = {{INNER}}, tile = {{TILE}}, ntiles = {{NTILES}};
    (void)tile;
    for (long t = t0; t < t1; t++) {
        const long o = t / ntiles;
        {{OTYPE}}* restrict dst = out + {{DST_BASE}};
#if {{NAME}}_STREAM
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
{{OFFSETS}}
        for (long jr = j0; jr < jh; jr += {{NAME}}_RUN) {
            const long je = eqf_minl(jr + {{NAME}}_RUN, jh);
            int big = !{{NAME}}_TWO_PASS;
#if {{NAME}}_TWO_PASS
            #pragma omp simd reduction(|:big)
            for (long j = jr; j < je; j++) {
{{FAST_BODY}}
                big |= !({{GUARD}});
                dst[{{DST_J}}] = {{FAST_RESULT}};
            }
#endif
            if (big) {
#if {{NAME}}_QOUT
                for (long jq = jr; jq < je; jq += {{NAME}}_QBLOCK) {
                    const long jz = eqf_minl(jq + {{NAME}}_QBLOCK, je);
                    float xq[{{NAME}}_QBLOCK] __attribute__((aligned(64)));
                    #pragma omp simd
                    for (long j = jq; j < jz; j++) {
{{BODY}}
                        xq[j - jq] = {{QX}};
                    }
                    const {{OTYPE}} zq = {{QZP}};
                    eqf_quantize_row(xq, jz - jq, {{QSCALE}}, (float)zq, EQF_QLO(zq), EQF_QHI(zq), (uint8_t*)(dst + jq));
                }
#else
                #pragma omp simd
                for (long j = jr; j < je; j++) {
{{BODY}}
                    dst[{{DST_J}}] = {{RESULT}};
                }
#endif
            }
        }
#if {{NAME}}_STREAM
        for (long jl = jh; jl < jt; jl += 16) {
            float line[16] __attribute__((aligned(64)));
#if {{NAME}}_TWO_PASS
            int lbig = 0;
            #pragma omp simd reduction(|:lbig)
            for (int k = 0; k < 16; k++) {
                const long j = jl + k;
{{FAST_LINE_BODY}}
                lbig |= !({{GUARD}});
                line[k] = {{FAST_RESULT}};
            }
            if (lbig)
#endif
            #pragma omp simd
            for (int k = 0; k < 16; k++) {
                const long j = jl + k;
{{LINE_BODY}}
                line[k] = {{RESULT}};
            }
            eqf_stream_line(dst + jl, line);
        }
#if {{NAME}}_TWO_PASS
        int tbig = 0;
        #pragma omp simd reduction(|:tbig)
        for (long j = jt; j < j1; j++) {
{{FAST_BODY}}
            tbig |= !({{GUARD}});
            dst[j] = {{FAST_RESULT}};
        }
        if (tbig)
#endif
        #pragma omp simd
        for (long j = jt; j < j1; j++) {
{{BODY}}
            dst[j] = {{RESULT}};
        }
#endif
    }
#if {{NAME}}_STREAM
    eqf_sfence(); /* each thread orders its own streaming stores before the loop's end */
#endif
}

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_job job = { {{PARAM_INIT}} };
    eqf_region({{OUTER}} * {{NTILES}}, {{NAME}}_tiles, &job, {{PARALLEL}});
}

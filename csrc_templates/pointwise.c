/* {{NAME}}: pointwise kernel over {{SPACE}}.
 * Outer dims x tiles of the inner dim are spread over threads; the inner loop is one SIMD loop.
 * STREAM ({{STREAM}}): the output is far larger than the caches, so each tile is computed in L1
 * and written with non-temporal stores. */
void {{NAME}}({{PARAMS}})
{
    const long inner = {{INNER}}, tile = {{TILE}}, ntiles = {{NTILES}};
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long t = 0; t < {{OUTER}} * ntiles; t++) {
        const long o = t / ntiles;
        const long j0 = (t % ntiles) * tile;
        const long j1 = eqf_minl(j0 + tile, inner);
#if {{STREAM}}
        float buf[{{TILE}}];
        float* restrict dst = buf - j0;
#else
        float* restrict dst = out + o * inner;
#endif
{{OFFSETS}}
        #pragma omp simd
        for (long j = j0; j < j1; j++) {
{{BODY}}
            dst[j] = {{RESULT}};
        }
#if {{STREAM}}
        eqf_stream(out + o * inner + j0, buf, j1 - j0);
#endif
    }
#if {{STREAM}}
    eqf_sfence();
#endif
}

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's block_parallel (this block's): the `if` of its parallel loop */
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long o = 0; o < {{OUTER}}; o++) {
{{OFFSETS}}
        #pragma omp simd
        for (long j = 0; j < {{INNER}}; j++)
            {{DST}}[dst_off + j * {{DST_STRIDE}}] = {{CVT}}({{SRC}}[src_off + j * {{SRC_STRIDE}}]);
    }

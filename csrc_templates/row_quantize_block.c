#if {{NAME}}_QUANTIZE_OUT && {{NAME}}_QUANTIZE_FLAT
    /* the block's rows are consecutive in the output and the epilogue reads no row or column:
     * one loop over the block (full vectors also on short rows) */
    #pragma omp simd
    for (long i = 0; i < (re - rb) * {{L}}L; i++) {
        const float v = ybuf[i];
{{EPI_BODY}}
        out[rb * {{L}}L + i] = {{EPI}};
    }
#elif {{NAME}}_QUANTIZE_OUT
    for (long r = rb; r < re; r++) {
{{OFFSETS}}
        #pragma omp simd
        for (long j = 0; j < {{L}}; j++) {
            const float v = ybuf[(r - rb) * {{L}}L + j];
{{EPI_BODY}}
            out[({{YBASE}}) + j * {{YS}}] = {{EPI}};  /* (through out itself: restrict, so the loop needs no overlap check) */
        }
    }
#endif

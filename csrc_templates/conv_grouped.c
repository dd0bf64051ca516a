#define {{NAME}}_PLANE {{PLANE}} /* the plan's plane: the pixels of one task, an output plane */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
/* {{NAME}}: grouped conv2d, {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{CG}}x{{KH}}x{{KW}} in {{G}} groups, stride {{SH}}x{{SW}},
 * padding {{PH}}x{{PW}}, dilation {{DH}}x{{DW}} -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out), the epilogue
 * fused into the store.
 *
 * Output channel o reads the CG = {{CG}} input channels of its group (o / OG, OG = {{OG}} output channels per
 * group). One task is an output plane (n, o). Per input channel of the group, the input plane is
 * copied into a zero-padded plane (HP x WP, the thread's own buffer: its border stays zero), so
 * that every tap of every output pixel reads inside it; then each output pixel's sum over the
 * KH x KW taps is made in a register, the taps unrolled (constants) and the pixels of a row in
 * the vector lanes, and added to the plane's partial sums (in the output itself). Last, the
 * epilogue goes over the plane in place. A depthwise conv (CG = 1) reads its input plane twice
 * (the copy, then its rows from L1) and writes each output element twice: it is bound by memory,
 * not by multiply-adds. */
void {{NAME}}({{PARAMS}})
{
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, CG = {{CG}}, OG = {{OG}}, KH = {{KH}}, KW = {{KW}},
           OH = {{OH}}, OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}},
           HP = (OH - 1) * SH + (KH - 1) * DH + 1, WP = (OW - 1) * SW + (KW - 1) * DW + 1,
           /* the input rows and columns that some tap reads */
           HC = H < HP - PH ? H : HP - PH, WC = W < WP - PW ? W : WP - PW };
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wt = {{WEIGHTS}};
    int failed = 0;
    #pragma omp parallel if ({{PARALLEL}}) reduction(| : failed)
    {
        float* restrict xp = (float*)calloc((size_t)HP * WP, sizeof(float));
        if (!xp)
            failed = 1;
        #pragma omp for schedule(static)
        for (long t = 0; t < (long)N * O; t++) {
            if (!xp)
                continue;
            const long b = t / O, i = t % O, grp = i / OG;
            float* restrict acc_plane = out + t * (long){{NAME}}_PLANE;
            for (long ci = 0; ci < CG; ci++) {
                const float* restrict xc = x + (b * C + grp * CG + ci) * (long)H * W;
                for (long ih = 0; ih < HC; ih++)
                    memcpy(xp + (ih + PH) * (long)WP + PW, xc + ih * (long)W, (size_t)WC * sizeof(float));
                float wv[KH * KW];
                for (long k = 0; k < KH * KW; k++)
                    wv[k] = wt[(i * CG + ci) * (long)KH * KW + k];
                for (long oh = 0; oh < OH; oh++) {
                    const float* restrict xr = xp + oh * SH * (long)WP;
                    float* restrict dst = acc_plane + oh * (long)OW;
                    #pragma omp simd
                    for (long ow = 0; ow < OW; ow++) {
                        float s = ci ? dst[ow] : 0.0f;
                        for (long kh = 0; kh < KH; kh++)
                            for (long kw = 0; kw < KW; kw++)
                                s += wv[kh * KW + kw] * xr[kh * DH * (long)WP + ow * SW + kw * DW];
                        dst[ow] = s;
                    }
                }
            }
            #pragma omp simd
            for (long j = 0; j < (long)OH * OW; j++) {
                const float acc = acc_plane[j];
                acc_plane[j] = {{EPILOGUE}};
            }
            (void)b;
        }
        free(xp);
    }
    if (failed)
        eqf_nomem_note();
}

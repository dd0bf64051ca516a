#define {{NAME}}_IM2COL {{IM2COL}} /* the plan's im2col: the column matrix is built (0: x is read as it) */
#define {{NAME}}_IMPLICIT {{IMPLICIT}} /* the plan's implicit: the images copied with their padding, no column matrix */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the im2col loop's parallel region */
/* {{NAME}}: conv2d NCHW x OIHW, {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{C}}x{{KH}}x{{KW}}, stride {{SH}}x{{SW}},
 * padding {{PH}}x{{PW}}, dilation {{DH}}x{{DW}} -> {{N}}x{{O}}x{{OH}}x{{OW}}: im2col, then {{GEMM}} (batched over images,
 * the epilogue fused into its store). */
void {{NAME}}({{PARAMS}})
{
    enum { C = {{C}}, H = {{H}}, W = {{W}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, OW = {{OW}} };
    const long K = (long)C * KH * KW, P = (long)OH * OW;
    (void)K;
    (void)P;
#if {{NAME}}_IMPLICIT
    /* no column matrix: the GEMM (on AMX tiles) packs its panels from the images (im2col_b.c),
     * copied here with their padding, HP x WP planes: every window a read needs lies inside, the
     * rows and columns past the bottom and right edges zero (an uneven padding's too) */
    enum { HP = {{HP}}, WP = {{WP}} };
    float* padded = eqf_scratch(EQF_SCRATCH_CONV_COL, {{N}} * C * (long)HP * WP);
    if (!padded) {
        eqf_nomem_note();
        return;
    }
    #pragma omp parallel for collapse(2) schedule(static) if ({{PARALLEL}})
    for (long n = 0; n < {{N}}; n++)
        for (long c = 0; c < C; c++) {
            float* restrict dst = padded + (n * C + c) * (long)HP * WP;
            const float* restrict src = {{X}} + (n * C + c) * (long)H * W;
            for (long r = 0; r < HP; r++) {
                const long ih = r - {{PH}};
                for (long q = 0; q < WP; q++) {
                    const long iw = q - {{PW}};
                    dst[r * WP + q] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? src[ih * W + iw] : 0.0f;
                }
            }
        }
    const float* col = padded;
#elif !{{NAME}}_IM2COL
    /* no column matrix: a 1x1 conv of stride 1 unpadded, whose image is the column matrix */
    const float* col = {{X}};
#else
    /* the column matrix, in the calling thread's scratch (kept between calls: a fresh malloc of
     * this size is a fresh mmap, page faults on every call) */
    float* colbuf = eqf_scratch(EQF_SCRATCH_CONV_COL, {{N}} * K * P);
    if (!colbuf) {
        eqf_nomem_note();
        return;
    }
    #pragma omp parallel for collapse(2) schedule(static) if ({{PARALLEL}})
    for (long n = 0; n < {{N}}; n++)
        for (long c = 0; c < C; c++)
            for (long kh = 0; kh < KH; kh++)
                for (long kw = 0; kw < KW; kw++) {
                    float* restrict dst = colbuf + ((n * K) + (c * KH + kh) * KW + kw) * P;
                    const float* restrict src = {{X}} + (n * C + c) * (long)H * W;
                    for (long oh = 0; oh < OH; oh++) {
                        const long ih = oh * {{SH}} - {{PH}} + kh * {{DH}};
                        for (long ow = 0; ow < OW; ow++) {
                            const long iw = ow * {{SW}} - {{PW}} + kw * {{DW}};
                            dst[oh * OW + ow] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? src[ih * W + iw] : 0.0f;
                        }
                    }
                }
    const float* col = colbuf;
#endif
    {{GEMM}}({{ARGS}});
}

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_VL {{VL}} /* the plan's vl */
#define {{NAME}}_RO {{RO}} /* the plan's ro */
#define {{NAME}}_BAND {{BAND}} /* the plan's band */
/* {{NAME}}: a depthwise conv2d {{N}}x{{C}}x{{H}}x{{W}} * {{C}}x1x{{KH}}x{{KW}}, stride {{SH}}x{{SW}}, padding
 * {{PH}}x{{PW}}, dilation {{DH}}x{{DW}}, through its prologue (its bias and activation), then the 1x1 conv2d
 * {{O}}x{{C}}x1x1 that reads it, through the epilogue -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out): an
 * inverted residual's depthwise conv and projection in one kernel (conv_dwpw.py).
 *
 * A task is (image, band of BAND = {{BAND}} output rows). Each channel's depthwise conv over the band
 * is made row by row in the tile t[c][BAND x OW] (per tap, the row's pixels whose tap lies inside
 * the image, a loop the compiler vectorizes), then goes through the prologue in place; the tile's
 * rows are padded to whole vectors of VL = {{VL}} pixels with zeros. The 1x1 conv is a GEMM over the
 * tile: a register tile of RO = {{RO}} output channels x VL pixels, each channel of the tile one pixel
 * vector times RO broadcast weights; each result goes through the epilogue into the NCHW output.
 * The depthwise output never leaves the thread's tile. */
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));

void {{NAME}}({{PARAMS}})
{
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, OW = {{OW}},
           SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}}, VL = {{VL}}, RO = {{RO}},
           BAND = {{BAND}}, NBAND = (OH + BAND - 1) / BAND,
           BP = (BAND * OW + VL - 1) / VL * VL /* a band's pixels, whole vectors */ };
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wd = {{WD}};
    const float* restrict wp = {{WP}};
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long task = 0; task < (long)N * NBAND; task++) {
        const long b = task / NBAND, r0 = task % NBAND * BAND;
        const long rows = OH - r0 < BAND ? OH - r0 : BAND, P = rows * OW;
        float t[C][BP] __attribute__((aligned(64)));
        for (long c = 0; c < C; c++) {
            const float* restrict xc = x + (b * C + c) * (long)H * W;
            const float* restrict wc = wd + c * KH * KW;
            float* restrict d = t[c];
            for (long p = 0; p < BP; p++)
                d[p] = 0.0f;
            for (long r = 0; r < rows; r++) {
                float* restrict dr = d + r * OW;
                for (long kh = 0; kh < KH; kh++) {
                    const long ih = (r0 + r) * SH - PH + kh * DH;
                    if (ih < 0 || ih >= H)
                        continue;
                    const float* restrict xr = xc + ih * W;
                    for (long kw = 0; kw < KW; kw++) {
                        /* the columns ow whose tap iw = ow SW + off lies in [0, W) */
                        const long off = kw * DW - PW;
                        const long lo = off < 0 ? (-off + SW - 1) / SW : 0;
                        const long hi0 = W - 1 - off < 0 ? 0 : (W - 1 - off) / SW + 1;
                        const long hi = hi0 < OW ? hi0 : OW;
                        const float wv = wc[kh * KW + kw];
                        for (long ow = lo; ow < hi; ow++)
                            dr[ow] += wv * xr[ow * SW + off];
                    }
                }
            }
            for (long p = 0; p < P; p++) {
                const long i = c, j = r0 * OW + p;
                (void)i; (void)j;
                const float acc = d[p];
                d[p] = {{PROLOGUE}};
            }
        }
        for (long o0 = 0; o0 < O; o0 += RO) {
            const long ro = O - o0 < RO ? O - o0 : RO;
            const float* wq[RO];
            for (long q = 0; q < RO; q++) /* (past O: the last channel's weights again, not stored) */
                wq[q] = wp + (o0 + (q < ro ? q : ro - 1)) * (long)C;
            for (long p0 = 0; p0 < P; p0 += VL) {
                {{NAME}}_vf va[RO];
                for (long q = 0; q < RO; q++)
                    va[q] = ({{NAME}}_vf){0};
                for (long c = 0; c < C; c++) {
                    const {{NAME}}_vf xv = *(const {{NAME}}_vf*)&t[c][p0];
                    for (long q = 0; q < RO; q++)
                        va[q] += wq[q][c] * xv;
                }
                const long np = P - p0 < VL ? P - p0 : VL;
                for (long q = 0; q < ro; q++)
                    for (long l = 0; l < np; l++) {
                        const long i = o0 + q, j = r0 * OW + p0 + l;
                        const float acc = va[q][l];
                        out[(b * O + i) * (long)OH * OW + j] = {{EPILOGUE}};
                    }
            }
        }
    }
}

#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_VL {{VL}} /* the plan's vl */
#define {{NAME}}_RO {{RO}} /* the plan's ro */
#define {{NAME}}_BAND {{BAND}} /* the plan's band */
#define {{NAME}}_FLAT {{FLAT}} /* the plan's flat */
#define {{NAME}}_OLANES {{OLANES}} /* the plan's olanes */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b */
#define {{NAME}}_EXPAND {{EXPAND}} /* the plan's expand */
/* {{NAME}}: a depthwise conv2d {{N}}x{{C}}x{{H}}x{{W}} * {{C}}x1x{{KH}}x{{KW}}, stride {{SH}}x{{SW}}, padding
 * {{PH}}x{{PW}}, dilation {{DH}}x{{DW}}, through its prologue (its bias and activation), then the 1x1 conv2d
 * {{O}}x{{C}}x1x1 that reads it, through the epilogue -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out): an
 * inverted residual's depthwise conv and projection in one kernel (conv_dwpw.py).
 *
 * A task is (image, band of BAND = {{BAND}} output rows). The band's input rows of every channel are
 * copied into zero-padded buffers xp[C][BHP x WP] (no tap needs a bounds check); then per channel,
 * each output pixel's sum over the KH x KW taps (unrolled) goes through the prologue into the tile
 * t[c][BAND x OW], padded to whole vectors of VL = {{VL}} pixels with zeros. FLAT = {{FLAT}}: the sums
 * are vectors over the band's padded rows as one run (below), else pixel by pixel. The 1x1 conv is a GEMM over the
 * tile: a register tile of RO = {{RO}} output channels x VL pixels, each channel of the tile one pixel
 * vector times RO broadcast weights; each result goes through the epilogue into the NCHW output.
 * OLANES = {{OLANES}} (a band of fewer pixels than a vector, as a small image's): channels in the lanes
 * instead. The band's input is transposed into xt[pixel][channel], the depthwise conv computes VL
 * channels of a pixel a vector (one multiply-add a tap), the tile is tt[pixel][channel], and the
 * 1x1 conv has VL output channels in the lanes and RO pixels a register tile, its weights
 * transposed [C][O] (PREPACKED = {{PREPACKED}}: once, when bound by params=; else into a scratch
 * buffer per call).
 * EXPAND = {{EXPAND}} (the whole inverted residual): the depthwise conv's input is the expand 1x1 conv
 * {{C}}x{{CI}}x1x1 of the kernel's input x {{N}}x{{CI}}x{{H}}x{{W}} through its prologue (its bias and
 * activation), computed per task for the band's input rows (the halo rows again in each band)
 * into xe[C][BHP x W, whole vectors + VL] on the stack, which the padded buffers then read in place of x.
 * The depthwise output never leaves the thread's tile. */
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */

enum { {{NAME}}_OP = ({{O}} + {{VL}} - 1) / {{VL}} * {{VL}} };
long {{NAME}}_prepack_floats(void)
{
    return (long){{C}} * {{NAME}}_OP;
}

/* OLANES: the 1x1 conv's weights [O][C] -> [C][OP], a channel's weights of every output channel
 * contiguous (zero past O); made once by the runtime when bound by params=, else per call. */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wp)
{
    for (long c = 0; c < {{C}}; c++)
        for (long o = 0; o < {{NAME}}_OP; o++)
            wp[c * {{NAME}}_OP + o] = o < {{O}} ? wt[o * {{C}} + c] : 0.0f;
}

void {{NAME}}({{PARAMS}})
{
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, OW = {{OW}},
           SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}}, VL = {{VL}}, RO = {{RO}},
           BAND = {{BAND}}, EQF_BAND_SIZES /* NBAND BP (OLANES: whole register tiles) BHP WP WC XP */,
           CP = (C + VL - 1) / VL * VL /* (OLANES: the channels, whole vectors) */,
           CI = {{CI}} /* EXPAND: the expand conv's input channels */ };
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wd = {{WD}};
    const float* restrict wp = {{WP}};
#if {{EXPAND}}
    const float* restrict we = {{WE}};
#endif
#if {{OLANES}}
#if {{PREPACKED}}
    const float* wpk = {{WP}}; /* the weights {{NAME}}_prepack made once */
#else
    float* wpk = eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
    if (!wpk) {
        eqf_nomem_note();
        return;
    }
    {{NAME}}_prepack(wp, wpk);
#endif
#endif
    (void)wp;
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long task = 0; task < (long)N * NBAND; task++) {
        const eqf_band_t band = eqf_band_task(task, NBAND, BAND, H, OH, OW, KH, SH, PH, DH);
        const long b = band.b, r0 = band.r0, rows = band.rows, P = band.P;
#if {{EXPAND}}
        /* the expand 1x1 conv of the band's input rows inside the image: those rows of an input
         * channel are one run of the NCHW input, copied into xb[CI][XEP] (zero past the run, so
         * that whole vectors read it); each vector of the run is then a register tile of RC = 4
         * output channels, a sum over the input channels of a broadcast weight times the vector,
         * and the stored rows go through the expand conv's prologue */
        enum { XEP = (BHP * W + VL - 1) / VL * VL + VL /* (whole vectors, and a run's last stores past it) */, RC = 4 };
        float xe[C][XEP] __attribute__((aligned(64)));
        float xb[CI][XEP] __attribute__((aligned(64)));
        const long ih0 = band.top + band.lo, run = (band.hi - band.lo) * W, o0 = band.lo * W;
        for (long k = 0; k < CI; k++) {
            const float* restrict xr = x + ((b * CI + k) * (long)H + ih0) * W;
            for (long q = 0; q < run; q++)
                xb[k][q] = xr[q];
            for (long q = run; q < (run + VL - 1) / VL * VL; q++)
                xb[k][q] = 0.0f;
        }
        for (long q0 = 0; q0 < run; q0 += VL)
            for (long c0 = 0; c0 < C; c0 += RC) {
                const long nc = C - c0 < RC ? C - c0 : RC;
                {{NAME}}_vf ea[RC];
                for (long u = 0; u < RC; u++)
                    ea[u] = ({{NAME}}_vf){0};
                for (long k = 0; k < CI; k++) {
                    const {{NAME}}_vf xv = *(const {{NAME}}_vf*)&xb[k][q0];
                    for (long u = 0; u < RC; u++) /* (past C: the last channel's weights again, not stored) */
                        ea[u] += we[(c0 + (u < nc ? u : nc - 1)) * CI + k] * xv;
                }
                for (long u = 0; u < nc; u++)
                    *({{NAME}}_vfu*)&xe[c0 + u][o0 + q0] = ea[u];
            }
        for (long c = 0; c < C; c++) {
            float* restrict e = &xe[c][o0];
            for (long q = 0; q < run; q++) {
                const long i = c, j = ih0 * W + q;
                (void)i; (void)j;
                const float acc = e[q];
                e[q] = {{EXPROLOGUE}};
            }
        }
        /* the depthwise conv's input rows of channel c: band row hr at {{NAME}}_ROWS(c) + ({{NAME}}_ROW0 + hr) W */
#define {{NAME}}_ROWS(c) xe[c]
#define {{NAME}}_ROW0 0
#else
#define {{NAME}}_ROWS(c) (x + (b * C + (c)) * (long)H * W)
#define {{NAME}}_ROW0 band.top
#endif
#if {{OLANES}}
        /* channels in the lanes: the band's padded input rows transposed, xt[pixel][channel] (zero
         * past the image and past C), the depthwise weights wt[tap][channel] */
        float xt[BHP * WP][CP] __attribute__((aligned(64)));
        float wt[KH * KW][CP] __attribute__((aligned(64)));
        float tt[BP][CP] __attribute__((aligned(64))); /* the tile, [pixel][channel] */
        for (long q = 0; q < band.bh * WP; q++)
            for (long c = 0; c < CP; c++)
                xt[q][c] = 0.0f;
        for (long k = 0; k < KH * KW; k++)
            for (long c = 0; c < CP; c++)
                wt[k][c] = c < C ? wd[c * KH * KW + k] : 0.0f;
        for (long c = 0; c < C; c++) {
            for (long hr = band.lo; hr < band.hi; hr++) {
                const float* restrict xs = {{NAME}}_ROWS(c) + ({{NAME}}_ROW0 + hr) * W;
                for (long iw = 0; iw < WC; iw++)
                    xt[hr * WP + PW + iw][c] = xs[iw];
            }
        }
        for (long r = 0; r < rows; r++)
            for (long ow = 0; ow < OW; ow++)
                for (long c0 = 0; c0 < CP; c0 += VL) {
                    {{NAME}}_vf acc = ({{NAME}}_vf){0};
                    for (long kh = 0; kh < KH; kh++)
                        for (long kw = 0; kw < KW; kw++)
                            acc += *(const {{NAME}}_vf*)&wt[kh * KW + kw][c0] *
                                   *(const {{NAME}}_vf*)&xt[(r * SH + kh * DH) * WP + ow * SW + kw * DW][c0];
                    *({{NAME}}_vf*)&tt[r * OW + ow][c0] = acc;
                }
        for (long p = 0; p < P; p++)
            for (long c = 0; c < C; c++) {
                const long i = c, j = r0 * OW + p;
                (void)i; (void)j;
                const float acc = tt[p][c];
                tt[p][c] = {{PROLOGUE}};
            }
        for (long p = P; p < BP; p++) /* (the last register tile's pixels past the band) */
            for (long c = 0; c < C; c++)
                tt[p][c] = 0.0f;
        /* the 1x1 conv with VL output channels in the lanes: a register tile of RO pixels, each a
         * broadcast of the tile's value times the channel's weight vector */
        for (long o0 = 0; o0 < O; o0 += VL) {
            const long no = O - o0 < VL ? O - o0 : VL;
            for (long p0 = 0; p0 < P; p0 += RO) {
                const long np = P - p0 < RO ? P - p0 : RO;
                {{NAME}}_vf va[RO];
                for (long q = 0; q < RO; q++)
                    va[q] = ({{NAME}}_vf){0};
                for (long c = 0; c < C; c++) {
                    const {{NAME}}_vf wvec = *(const {{NAME}}_vfu*)&wpk[c * {{NAME}}_OP + o0];
                    for (long q = 0; q < RO; q++)
                        va[q] += tt[p0 + q][c] * wvec;
                }
                for (long q = 0; q < np; q++)
                    for (long l = 0; l < no; l++) {
                        const long i = o0 + l, j = r0 * OW + p0 + q;
                        const float acc = va[q][l];
                        out[(b * O + i) * (long)OH * OW + j] = {{EPILOGUE}};
                    }
            }
        }
#else
        float t[C][BP] __attribute__((aligned(64)));
        float xp[C][XP] __attribute__((aligned(64)));
        float sums[BHP * WP + VL] __attribute__((aligned(64))); /* (FLAT: the sums over q) */
        (void)sums;
        /* the band's input rows of every channel into zero-padded buffers (every tap reads inside;
         * and what FLAT's last vector reads past them), all of them before any is read: a vector
         * load of a row just written by scalar stores would wait for them (no store forwarding
         * across stores) */
        for (long c = 0; c < C; c++)
            eqf_band_rows(xp[c], {{NAME}}_ROWS(c), {{NAME}}_ROW0, &band, W, WP, PW, WC, {{FLAT}} ? XP : band.bh * WP);
        for (long c = 0; c < C; c++) {
            const float* restrict xq = xp[c];
            float wv[KH * KW];
            for (long k = 0; k < KH * KW; k++)
                wv[k] = wd[c * KH * KW + k];
            float* restrict d = t[c];
#if {{FLAT}}
            /* output pixel (r, ow) is the sum at q = r SH WP + ow SW of the padded rows, where tap
             * (kh, kw) reads xq[q + kh DH WP + kw DW]: the sums at every q of the band's rows are
             * one run of vectors (one shifted load a tap, whatever the image's width; a stride
             * computes the q between the outputs too, and drops them) */
            for (long q = 0; q < ((rows - 1) * SH + 1) * WP; q += VL) {
                {{NAME}}_vf acc = ({{NAME}}_vf){0};
                for (long kh = 0; kh < KH; kh++)
                    for (long kw = 0; kw < KW; kw++)
                        acc += wv[kh * KW + kw] * *(const {{NAME}}_vfu*)&xq[q + kh * DH * WP + kw * DW];
                *({{NAME}}_vf*)&sums[q] = acc;
            }
            for (long r = 0; r < rows; r++)
                for (long ow = 0; ow < OW; ow++) {
                    const long i = c, j = (r0 + r) * OW + ow;
                    (void)i; (void)j;
                    const float acc = sums[r * SH * WP + ow * SW];
                    d[r * OW + ow] = {{PROLOGUE}};
                }
#else
            for (long r = 0; r < rows; r++)
                for (long ow = 0; ow < OW; ow++) {
                    float acc = 0.0f;
                    for (long kh = 0; kh < KH; kh++)
                        for (long kw = 0; kw < KW; kw++)
                            acc += xq[(r * SH + kh * DH) * WP + ow * SW + kw * DW] * wv[kh * KW + kw];
                    const long i = c, j = (r0 + r) * OW + ow;
                    (void)i; (void)j;
                    d[r * OW + ow] = {{PROLOGUE}};
                }
#endif
            for (long p = P; p < (P + VL - 1) / VL * VL; p++) /* (the last vector's pixels past the band) */
                d[p] = 0.0f;
        }
        /* the 1x1 conv with the band's pixels in the lanes: a register tile of RO output channels,
         * each a broadcast weight times the tile's pixel vector of a channel */
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
#endif
#undef {{NAME}}_ROWS
#undef {{NAME}}_ROW0
    }
}

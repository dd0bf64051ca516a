#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_VL {{VL}} /* the plan's vl */
#define {{NAME}}_RO {{RO}} /* the plan's ro */
#define {{NAME}}_NV {{NV}} /* the plan's nv */
#define {{NAME}}_BAND {{BAND}} /* the plan's band */
#define {{NAME}}_FLAT {{FLAT}} /* the plan's flat */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b */
/* {{NAME}}: a depthwise conv2d {{N}}x{{C}}x{{H}}x{{W}} * {{C}}x1x{{KH}}x{{KW}} (+ its bias), stride {{SH}}x{{SW}},
 * padding {{PH}}x{{PW}}, dilation {{DH}}x{{DW}}, read as NHWC, a layernorm over its {{C}} channels (eps
 * {{EPS}}), then a matmul by the weights {{C}}x{{F}} through the epilogue -> {{N}}x{{OH}}x{{OW}}x{{F}} (NCHW in,
 * NHWC out): ConvNeXt's depthwise conv, permute, LayerNorm and first Linear in one kernel (conv_dwln.py).
 *
 * A task is (image, band of BAND = {{BAND}} output rows). Channel by channel, the band's input rows go
 * into a zero-padded buffer (the next channel's copied before this channel's sums, so that no vector
 * load waits for the stores just made), and each output pixel's sum over the KH x KW taps (+ the
 * bias) into the tile t[c][pixel] on the stack, its pixels padded with zeros. FLAT = {{FLAT}}: the sums
 * are vectors over the band's padded rows as one run, QU of them at once, else pixel by pixel. The layernorm of a pixel
 * runs over a column of the tile: VL = {{VL}} pixels a vector, the mean, then the variance around it
 * (two passes, as the reference), then the tile normalized in place. The matmul is a GEMM over
 * the tile with the output's channels in the lanes: a register tile of RO = {{RO}} pixels x NV = {{NV}}
 * vectors of channels, each pixel's value broadcast times the weight vectors of its row; each
 * result goes through the epilogue into the NHWC output. The weights are read as panels
 * [F / (NV VL)][C][NV VL] (zero past F), in order (PREPACKED = {{PREPACKED}}: packed once, when bound by
 * params=; else into a scratch buffer per call). Neither the depthwise output nor the
 * normalized tensor leaves the thread's tile (the permutes are the tile's layout). */
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */

enum { {{NAME}}_FB = {{NV}} * {{VL}}, {{NAME}}_FPAD = ({{F}} + {{NAME}}_FB - 1) / {{NAME}}_FB * {{NAME}}_FB };
long {{NAME}}_prepack_floats(void)
{
    return (long){{C}} * {{NAME}}_FPAD;
}

/* the matmul's weights [C][F] (element c, f at {{WM_AT}}: as they are, or a view such as the
 * transpose of torch's [F][C] Linear weight) -> panels [F / FB][C][FB], a panel's row of FB output
 * channels contiguous (zero past F); made once by the runtime when bound by params=, else per call. */
void {{NAME}}_prepack(const float* restrict wm, float* restrict wp)
{
    for (long f0 = 0; f0 < {{NAME}}_FPAD; f0 += {{NAME}}_FB)
        for (long c = 0; c < {{C}}; c++)
            for (long l = 0; l < {{NAME}}_FB; l++)
                wp[f0 * {{C}} + c * {{NAME}}_FB + l] = f0 + l < {{F}} ? {{WM_AT}} : 0.0f;
}

void {{NAME}}({{PARAMS}})
{
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, F = {{F}}, KH = {{KH}}, KW = {{KW}}, OH = {{OH}}, OW = {{OW}},
           SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}}, VL = {{VL}}, RO = {{RO}},
           NV = {{NV}}, BAND = {{BAND}}, EQF_BAND_SIZES /* NBAND BP BHP WP WC XP */,
           QU = 4 /* FLAT: vectors of sums at once */ };
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wd = {{WD}};
#if {{PREPACKED}}
    const float* wpk = {{WM}}; /* the panels {{NAME}}_prepack made once */
#else
    float* wpk = eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
    if (!wpk) {
        eqf_nomem_note();
        return;
    }
    {{NAME}}_prepack({{WM}}, wpk);
#endif
    const float* restrict lg = {{LG}};
    const float* restrict lb = {{LB}};
#if {{BIAS}}
    const float* restrict bd = {{BD}};
#endif
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long task = 0; task < (long)N * NBAND; task++) {
        const eqf_band_t band = eqf_band_task(task, NBAND, BAND, H, OH, OW, KH, SH, PH, DH);
        const long b = band.b, r0 = band.r0, rows = band.rows, P = band.P;
        float t[C][BP] __attribute__((aligned(64)));
        float tp[BP / RO][C][RO] __attribute__((aligned(64))); /* the normalized tile in panels */
        float xq2[2][XP] __attribute__((aligned(64)));
        float sums[BHP * WP + VL] __attribute__((aligned(64))); /* (FLAT: the sums over q) */
        (void)sums;
        for (long c = -1; c < C; c++) {
            if (c + 1 < C) /* channel c + 1's padded input rows (and what FLAT's last vector reads past them) */
                eqf_band_rows(xq2[(c + 1) & 1], x + (b * C + (c + 1)) * (long)H * W, band.top, &band, W, WP, PW, WC,
                              {{FLAT}} ? XP : band.bh * WP);
            if (c < 0)
                continue;
            const float* restrict xq = xq2[c & 1];
            float wv[KH * KW];
            for (long k = 0; k < KH * KW; k++)
                wv[k] = wd[c * KH * KW + k];
#if {{BIAS}}
            const float bias = bd[c];
#else
            const float bias = 0.0f;
#endif
            float* restrict d = t[c];
#if {{FLAT}}
            /* output pixel (r, ow) is the sum at q = r SH WP + ow SW of the padded rows, where tap
             * (kh, kw) reads xq[q + kh DH WP + kw DW] (as conv_dwpw.c) */
            const long run = ((rows - 1) * SH + 1) * WP;
            long q = 0;
            for (; q + QU * VL <= run; q += QU * VL) {
                {{NAME}}_vf acc[QU]; /* (QU independent sums: one would wait on its FMA's latency each tap) */
                for (long u = 0; u < QU; u++)
                    acc[u] = ({{NAME}}_vf){0};
                for (long kh = 0; kh < KH; kh++)
                    for (long kw = 0; kw < KW; kw++)
                        for (long u = 0; u < QU; u++)
                            acc[u] += wv[kh * KW + kw] * *(const {{NAME}}_vfu*)&xq[q + u * VL + kh * DH * WP + kw * DW];
                for (long u = 0; u < QU; u++)
                    *({{NAME}}_vf*)&sums[q + u * VL] = acc[u];
            }
            for (; q < run; q += VL) { /* (the run's last vectors one by one) */
                {{NAME}}_vf acc = ({{NAME}}_vf){0};
                for (long kh = 0; kh < KH; kh++)
                    for (long kw = 0; kw < KW; kw++)
                        acc += wv[kh * KW + kw] * *(const {{NAME}}_vfu*)&xq[q + kh * DH * WP + kw * DW];
                *({{NAME}}_vf*)&sums[q] = acc;
            }
            for (long r = 0; r < rows; r++)
                for (long ow = 0; ow < OW; ow++)
                    d[r * OW + ow] = sums[r * SH * WP + ow * SW] + bias;
#else
            for (long r = 0; r < rows; r++)
                for (long ow = 0; ow < OW; ow++) {
                    float acc = 0.0f;
                    for (long kh = 0; kh < KH; kh++)
                        for (long kw = 0; kw < KW; kw++)
                            acc += xq[(r * SH + kh * DH) * WP + ow * SW + kw * DW] * wv[kh * KW + kw];
                    d[r * OW + ow] = acc + bias;
                }
#endif
            for (long p = P; p < BP; p++) /* (the last vector's pixels past the band) */
                d[p] = 0.0f;
        }
        /* the layernorm of each pixel over the channels: a column of the tile, VL pixels a vector;
         * the normalized values go into the panels tp[pixel / RO][channel][pixel % RO] (RO divides
         * VL), each the A operand of the matmul's register tiles, read in order */
        for (long p0 = 0; p0 < P; p0 += VL) {
            {{NAME}}_vf s = ({{NAME}}_vf){0}, v = ({{NAME}}_vf){0}, rs;
            for (long c = 0; c < C; c++)
                s += *({{NAME}}_vf*)&t[c][p0];
            const {{NAME}}_vf mu = s / (float)C;
            for (long c = 0; c < C; c++) {
                const {{NAME}}_vf e = *({{NAME}}_vf*)&t[c][p0] - mu;
                v += e * e;
            }
            v = v / (float)C + {{EPS}};
            for (long l = 0; l < VL; l++)
                rs[l] = 1.0f / sqrtf(v[l]);
            for (long c = 0; c < C; c++) {
                const {{NAME}}_vf y = (*({{NAME}}_vf*)&t[c][p0] - mu) * rs * lg[c] + lb[c];
                for (long k = 0; k < VL / RO; k++)
                    memcpy(&tp[p0 / RO + k][c][0], (const float*)&y + k * RO, RO * sizeof(float));
            }
        }
        /* the matmul: output channels in the lanes, a register tile of RO pixels (a panel of the
         * tile) x NV vectors (a panel of the weights), each pixel's value broadcast times the
         * weights' row; the register tile then goes into a buffer, and each pixel's row through
         * the epilogue as one vector loop (as gemm.c: the epilogue's functions are vectorizable) */
        float* restrict ob = out + (b * (long)OH * OW + r0 * OW) * F;
        for (long f0 = 0; f0 < F; f0 += NV * VL) {
            const float* restrict wq0 = wpk + f0 * C;
            const long nf = F - f0 < NV * VL ? F - f0 : NV * VL;
            for (long p0 = 0; p0 < P; p0 += RO) {
                const long np = P - p0 < RO ? P - p0 : RO;
                const float* restrict a = &tp[p0 / RO][0][0];
                {{NAME}}_vf va[RO][NV];
                for (long q = 0; q < RO; q++)
                    for (long u = 0; u < NV; u++)
                        va[q][u] = ({{NAME}}_vf){0};
                for (long c = 0; c < C; c++) {
                    {{NAME}}_vf wq[NV];
                    for (long u = 0; u < NV; u++)
                        wq[u] = *(const {{NAME}}_vfu*)&wq0[c * NV * VL + u * VL];
                    for (long q = 0; q < RO; q++)
                        for (long u = 0; u < NV; u++)
                            va[q][u] += a[c * RO + q] * wq[u];
                }
                float vt[RO][NV * VL] __attribute__((aligned(64)));
                for (long q = 0; q < RO; q++)
                    for (long u = 0; u < NV; u++)
                        *({{NAME}}_vf*)&vt[q][u * VL] = va[q][u];
                for (long q = 0; q < np; q++) {
                    float* restrict orow = ob + (p0 + q) * (long)F + f0;
                    const long j = r0 * OW + p0 + q;
                    (void)j;
#pragma omp simd
                    for (long l = 0; l < nf; l++) {
                        const long i = f0 + l;
                        const float acc = vt[q][l];
                        orow[l] = {{EPILOGUE}};
                    }
                }
            }
        }
    }
}

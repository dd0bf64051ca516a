#define {{NAME}}_PLANE {{PLANE}} /* the plan's plane: the pixels of one task, an output plane (0 on the channels path) */
#define {{NAME}}_PARALLEL {{PARALLEL}} /* the plan's parallel: the `if` of the parallel region */
#define {{NAME}}_CHANNELS {{CHANNELS}} /* the plan's channels: VL channels in the vector lanes */
#define {{NAME}}_VL {{VL}} /* the plan's vl */
#define {{NAME}}_RW {{RW}} /* the plan's rw */
#define {{NAME}}_BAND {{BAND}} /* the plan's band */
#define {{NAME}}_GROUPED {{GROUPED}} /* the plan's grouped (derived, printed) */
#define {{NAME}}_PREFETCH {{PREFETCH}} /* the plan's prefetch */
#define {{NAME}}_PREPACKED {{PREPACKED}} /* the plan's prepacked_b */
#define {{NAME}}_BF16 {{BF16}} /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16 */
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
 * not by multiply-adds.
 *
 * CHANNELS = {{CHANNELS}}: VL = {{VL}} output channels in the vector lanes instead (conv_grouped.py's
 * use_channels). A task is (image, block of VL output channels, band of BAND = {{BAND}} output rows),
 * the tasks of a band consecutive (a thread zeroes its tiles' border once per band, the fills write
 * only inside the image): for each of the CG input channels ci of a group, the band's input rows
 * are transposed VL x VL in registers into a zero-padded tile xb[ci][BHP][BWP] of VL-channel
 * vectors, lane l holding the input channel (o / OG) CG + ci that output channel o = c0 + l reads
 * (a depthwise conv: channel o; a channel multiplier: a channel in OG lanes; groups of fewer than
 * VL channels: each group's inputs in its lanes); a register tile is RW = {{RW}} output pixels of a
 * row, each tap a weight vector (the tap's weight of the VL channels) times the input vector at the
 * pixel's tap; the output tile ob[BAND][TW] is transposed back into the NCHW planes through the
 * epilogue (one pass over the output, while it is in registers). Both transposes take VL consecutive pixels of the
 * band (across rows: any width fills the lanes); a block of fewer than VL channels (C % VL) or a
 * band of fewer than VL pixels is transposed element by element. GROUPED = {{GROUPED}}: a grouped conv
 * whose VL output channels of a task lie in one group: the band's rows of the group's CG input
 * planes are copied as they are into zero-padded planes, and each input pixel (broadcast) times the
 * tap's weight vector of the VL output channels is added to the pixel's accumulator. A group of OG
 * output channels that are not whole vectors (24 with VL = 16) takes ceil(OG / VL) blocks, its last
 * one masked (lanes past the group computed on zero weights and not stored); the blocks of one group
 * follow each other, so a thread copies the group's input rows once for all of them. PREFETCH =
 * {{PREFETCH}}: while a task computes, the image rows of the next one are prefetched, a slice per
 * output row.
 * BF16 = {{BF16}} (GROUPED only; precision="bf16", docs/precision.md): the group's input planes are
 * copied as bf16 K-pairs of consecutive input channels (lane halves ci, ci + 1; a zero channel after
 * an odd CG), rounding as they are copied, the weights prepacked once as K-pairs
 * [NCB][CG / 2][KH x KW][VL][2] bf16, and each pixel's pair, broadcast, multiplies a tap's VL pairs
 * (EQF_DP_BF16: vdpbf16ps on 2, on zmm or at VL = 8 on ymm; the widening fallback on 1) into the
 * f32 accumulators; the epilogue is f32. */
typedef float {{NAME}}_vf __attribute__((vector_size({{VL}} * 4)));
typedef float {{NAME}}_vfu __attribute__((vector_size({{VL}} * 4), aligned(4))); /* an unaligned access */

/* The blocks of VL output channels: within a group's OG (GROUPED), else within all O, each span's
 * last block masked past its end; CGP: the input channels a tap steps over (bf16: K-pairs). */
#define {{NAME}}_BLOCKS                                                                           \
    enum { SPAN = {{GROUPED}} ? {{OG}} : {{O}}, BPS = (SPAN + {{VL}} - 1) / {{VL}} /* blocks per span */, \
           NCB = {{O}} / SPAN * BPS, CGP = {{BF16}} ? ({{CG}} + 1) / 2 : {{CG}} }
#if {{BF16}}
#if {{BF16}} == 2 && !(defined(__AVX512BF16__) && ({{VL}} == 16 || ({{VL}} == 8 && defined(__AVX512VL__))))
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif
#if {{BF16}} == 2
#include <immintrin.h>
#endif
typedef uint32_t {{NAME}}_vp __attribute__((vector_size({{VL}} * 4), aligned(4))); /* VL bf16 K-pairs */
#endif
#if {{CHANNELS}}
long {{NAME}}_prepack_floats(void)
{
    {{NAME}}_BLOCKS;
    return (long)NCB * CGP * {{KH}} * {{KW}} * {{VL}}; /* (bf16: a K-pair of halves per float) */
}

/* OIHW weights -> w[NCB][CG][KH x KW][VL] (a tap's weights of a block's VL output channels, one
 * vector), zero past the span's last channel; bf16: w[NCB][CGP][KH x KW][VL][2], the K-pair of input
 * channels 2 cp and 2 cp + 1 in one 32-bit lane. Made once by the runtime when bound by params=. */
void {{NAME}}_prepack(const float* restrict wt, float* restrict wp)
{
    enum { CG = {{CG}}, VL = {{VL}}, KK = {{KH}} * {{KW}} };
    {{NAME}}_BLOCKS;
    for (long ob = 0; ob < NCB; ob++) {
        const long o0 = ob / BPS * SPAN + ob % BPS * VL, n = SPAN - ob % BPS * VL < VL ? SPAN - ob % BPS * VL : VL;
        for (long ci = 0; ci < CGP * ({{BF16}} ? 2 : 1); ci++)
            for (long k = 0; k < KK; k++)
                for (long l = 0; l < VL; l++) {
                    const float v = l < n && ci < CG ? wt[((o0 + l) * CG + ci) * KK + k] : 0.0f;
#if {{BF16}}
                    ((uint16_t*)wp)[(((ob * CGP + ci / 2) * KK + k) * VL + l) * 2 + ci % 2] = eqf_bf16(v);
#else
                    wp[((ob * CG + ci) * KK + k) * VL + l] = v;
#endif
                }
    }
}
#endif

#define {{NAME}}_DIMS                                                                                  \
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, CG = {{CG}}, OG = {{OG}}, KH = {{KH}}, KW = {{KW}},   \
           OH = {{OH}}, OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}},   \
           HP = (OH - 1) * SH + (KH - 1) * DH + 1, WP = (OW - 1) * SW + (KW - 1) * DW + 1,                     \
           /* the input rows and columns that some tap reads */                                             \
           HC = H < HP - PH ? H : HP - PH, WC = W < WP - PW ? W : WP - PW,                                     \
           CHANNELS = {{CHANNELS}}, PREFETCH = {{PREFETCH}}, VL = {{VL}}, RW = {{RW}}, BAND = {{BAND}},          \
           GROUPED = {{GROUPED}}, NBAND = (OH + BAND - 1) / BAND,                                              \
           TW = (OW + RW - 1) / RW * RW /* the columns computed: whole register tiles */,                    \
           BHP = (BAND - 1) * SH + (KH - 1) * DH + 1, BWP = (TW - 1) * SW + (KW - 1) * DW + 1 }

/* The parallel loop over the tasks (channels) or the output planes (pixels), an eqf_region range
 * (common_pool.h): run as OpenMP's static split or on the claim-based pool, as the call picked. A
 * range's tiles are the thread's scratch buffers (EQF_SCRATCH_CONV_TILE), their zero border made
 * at the range's first task of a band (channels) or at its start (pixels). */
typedef struct {
    {{PARAM_FIELDS}}
    const float* wpk; /* (channels) */
    int failed;       /* a range could not get its tiles (atomic) */
} {{NAME}}_job;

#if {{CHANNELS}}

static void {{NAME}}_tasks(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_BLOCKS; /* SPAN, BPS, NCB (the blocks of output channels), CGP */
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* wpk = jb->wpk;
    typedef {{NAME}}_vf vf;
    typedef {{NAME}}_vfu vfu;
    typedef int vi __attribute__((vector_size({{VL}} * 4)));
    (void)sizeof(vi);
    {
        /* (grouped: the band's rows of the group's CG input planes, zero-padded, as they are) */
        const size_t xbytes = ((size_t)BHP * BWP * (GROUPED ? CGP * sizeof(float) : CG * sizeof(vf)) + 63) / 64 * 64;
        const size_t obytes = ((size_t)BAND * TW * sizeof(vf) + 63) / 64 * 64;
        vf* restrict xb = (vf*)eqf_scratch(EQF_SCRATCH_CONV_TILE, (long)((xbytes + obytes) / sizeof(float)));
        vf* restrict ob = xb ? xb + xbytes / sizeof(vf) : NULL;
        if (!xb) {
            __atomic_store_n(&jb->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        long zeroed = -1; /* the band whose zero border xb holds (tasks of one band follow each other) */
        long held = -1; /* GROUPED: the (band, image, group) whose input rows xb holds */
        (void)held;
        for (long t = lo; t < hi; t++) {
            const long oh0 = t / (N * NCB) * BAND, b = t % (N * NCB) / NCB, cb = t % NCB;
            const long c0 = cb / BPS * SPAN + cb % BPS * VL; /* the block's first output channel */
            const long cc = SPAN - cb % BPS * VL < VL ? SPAN - cb % BPS * VL : VL, nh = OH - oh0 < BAND ? OH - oh0 : BAND;
            const long ih0 = oh0 * SH - PH;
            const vfu* restrict wv = (const vfu*)(wpk + cb * (long)CGP * KH * KW * VL);
            /* the band's input rows, channels in the lanes, zero outside the image */
            const long rows = (nh - 1) * SH + (KH - 1) * DH + 1;
            const long wc = W < BWP - PW ? W : BWP - PW; /* the columns some tap reads */
#if {{GROUPED}}
            /* the group's CG input planes (c0 / OG its group: a block of VL output channels lies in
             * one group), the band's rows copied as they are into zero-padded planes (bf16: K-pairs
             * of planes), once for the group's blocks that follow each other */
#if {{BF16}}
            typedef uint32_t xs_t;
#else
            typedef float xs_t;
#endif
            xs_t* restrict xs = (xs_t*)xb;
            const long r0 = ih0 < 0 ? -ih0 : 0, r1 = H - ih0 < rows ? H - ih0 : rows;
            const long key = (oh0 * N + b) * (O / SPAN) + cb / BPS;
            for (long cp = 0; cp < CGP && key != held; cp++) {
                xs_t* restrict pl = xs + cp * (long)BHP * BWP;
                for (long r = 0; r < rows && zeroed != oh0; r++)
                    for (long c = 0; c < BWP; c++)
                        if (r < r0 || r >= r1 || c < PW || c >= PW + wc)
                            pl[r * BWP + c] = 0;
#if {{BF16}}
                const float* restrict src = x + ((b * C + c0 / OG * CG + 2 * cp) * H + ih0) * (long)W;
                for (long r = r0; r < r1; r++)
                    eqf_bf16_pairs(src + r * W, 2 * cp + 1 < CG ? src + (long)H * W + r * W : NULL,
                                   pl + r * BWP + PW, wc);
#else
                const float* restrict src = x + ((b * C + c0 / OG * CG + cp) * H + ih0) * (long)W;
                for (long r = r0; r < r1; r++)
                    memcpy(pl + r * BWP + PW, src + r * W, (size_t)wc * sizeof(float));
#endif
            }
            zeroed = oh0, held = key;
#else
            /* per input channel ci of a group, a tile whose lane l holds input channel
             * ((c0 + l) / OG) CG + ci, the one output channel c0 + l reads (a depthwise conv: CG = OG
             * = 1, lane l is channel c0 + l) */
            const long r0 = ih0 < 0 ? -ih0 : 0, r1 = H - ih0 < rows ? H - ih0 : rows;
            const long q0 = (ih0 + r0) * W, q1 = (ih0 + r1) * W;
            for (long ci = 0; ci < CG; ci++) {
                vf* restrict xt = xb + ci * (long)BHP * BWP;
                for (long r = 0; r < rows && zeroed != oh0; r++) {
                    vf* restrict row = xt + r * (long)BWP;
                    const long ih = ih0 + r;
                    for (long c = 0; c < BWP; c++)
                        if (ih < 0 || ih >= H || c < PW || c >= PW + wc)
                            row[c] = (vf){0};
                }
                /* the image rows of the band are consecutive pixels q of each plane: VL at a time
                 * transposed (the last VL overlapping the previous ones), each to its row and column */
                const float* restrict src = x + (b * C + ci) * (long)H * W;
                if (cc == VL && q1 - q0 >= VL) {
                    for (long q = q0; q < q1; q += VL) {
                        const long qs = q + VL <= q1 ? q : q1 - VL;
                        vf m[VL];
#pragma GCC unroll 16
                        for (int p = 0; p < VL; p++)
                            m[p] = *(const vfu*)(src + (c0 + p) / OG * CG * (long)H * W + qs);
{{TRANSPOSE}}
#pragma GCC unroll 16
                        for (int p = 0; p < VL; p++) {
                            const long ih = (qs + p) / W, iw = (qs + p) % W;
                            if (iw < wc)
                                xt[(ih - ih0) * BWP + PW + iw] = m[p];
                        }
                    }
                } else {
                    for (long q = q0; q < q1; q++)
                        if (q % W < wc)
                            for (long l = 0; l < VL; l++)
                                xt[(q / W - ih0) * BWP + PW + q % W][l] =
                                    l < cc ? src[(c0 + l) / OG * CG * (long)H * W + q] : 0.0f;
                }
            }
            zeroed = oh0;
#endif
            /* the image rows the next task reads, prefetched a slice per output row as this one
             * computes (the transposes then read them from cache: memory and multiply-adds overlap) */
            const long tn = t + 1 < (long)N * NCB * NBAND ? t + 1 : t;
            const long noh0 = tn / (N * NCB) * BAND, nb = tn % (N * NCB) / NCB, nc0 = tn % NCB * VL;
            const long ncc = C - nc0 < VL ? C - nc0 : VL, nnh = OH - noh0 < BAND ? OH - noh0 : BAND;
            const long nih0 = noh0 * SH - PH, nrows = (nnh - 1) * SH + (KH - 1) * DH + 1;
            const long nq0 = (nih0 < 0 ? 0 : nih0) * W, nq1 = (H < nih0 + nrows ? H : nih0 + nrows) * W;
            const float* restrict nsrc = x + (nb * C + nc0) * (long)H * W;
            /* register tiles of RW pixels x VL channels */
            for (long oh = 0; oh < nh; oh++) {
                if ({{PREFETCH}} && tn != t && nq1 > nq0)
                    for (long l = 0; l < ncc; l++)
                        for (long q = nq0 + (nq1 - nq0) * oh / nh; q < nq0 + (nq1 - nq0) * (oh + 1) / nh; q += 16)
                            __builtin_prefetch(nsrc + l * (long)H * W + q, 0, 2);
                /* the kernel rows that read image rows (the others read the tile's zero border:
                 * skipped, a large kernel over a small image reads many) */
                const long ihk = ih0 + oh * SH; /* the image row of kernel row 0 */
                const long kh0 = ihk >= 0 ? 0 : (-ihk + DH - 1) / DH;
                const long kh1 = H - 1 - ihk < 0 ? 0 : ((H - 1 - ihk) / DH + 1 < KH ? (H - 1 - ihk) / DH + 1 : KH);
                for (long ow0 = 0; ow0 < TW; ow0 += RW) {
                    vf acc[RW];
#pragma GCC unroll 16
                    for (int r = 0; r < RW; r++)
                        acc[r] = (vf){0};
                    /* per kernel row: the KW weight vectors in registers, each input vector of
                     * the tile's window loaded once and multiplied into every accumulator whose
                     * pixel reads it (RW + KW + 1 vector registers) */
#if {{GROUPED}}
                    /* each input channel's pixel (a scalar, broadcast) times the tap's weights of
                     * the VL output channels (bf16: a pixel's K-pair of channels times the tap's VL
                     * pairs) */
                    for (long kh = kh0; kh < kh1; kh++)
                        for (long cp = 0; cp < CGP; cp++) {
                            const xs_t* restrict xr = xs + (cp * BHP + oh * SH + kh * DH) * (long)BWP + ow0 * SW;
#pragma GCC unroll 32
                            for (int kw = 0; kw < KW; kw++) {
#if {{BF16}}
                                const {{NAME}}_vp wk = ((const {{NAME}}_vp*)wv)[(cp * KH + kh) * KW + kw];
#pragma GCC unroll 16
                                for (int r = 0; r < RW; r++)
                                    acc[r] = EQF_DP_BF16({{BF16}}, {{VL}}, acc[r], xr[r * SW + kw * DW], wk);
#else
                                const vf wk = wv[(cp * KH + kh) * KW + kw];
#pragma GCC unroll 16
                                for (int r = 0; r < RW; r++)
                                    acc[r] += xr[r * SW + kw * DW] * wk;
#endif
                            }
                        }
#else
                    for (long ci = 0; ci < CG; ci++)
                    for (long kh = kh0; kh < kh1; kh++) {
                        const vf* restrict xr = xb + (ci * BHP + oh * SH + kh * DH) * (long)BWP + ow0 * SW;
                        vf wk[KW];
#pragma GCC unroll 32
                        for (int kw = 0; kw < KW; kw++)
                            wk[kw] = wv[(ci * KH + kh) * KW + kw];
#pragma GCC unroll 64
                        for (int c = 0; c < (RW - 1) * SW + (KW - 1) * DW + 1; c++) {
                            vf xv = xr[c];
                            EQF_IN_REGISTER(xv);
#pragma GCC unroll 32
                            for (int kw = 0; kw < KW; kw++) {
                                const int e = c - kw * DW;
                                if (e >= 0 && e % SW == 0 && e / SW < RW)
                                    acc[e / SW] += xv * wk[kw];
                            }
                        }
                    }
#endif
#pragma GCC unroll 16
                    for (int r = 0; r < RW; r++)
                        ob[oh * TW + ow0 + r] = acc[r];
                }
            }
            /* the output tile back into the NCHW planes through the epilogue (the band's rows are
             * consecutive pixels of each plane: VL at a time; the last VL may overlap the previous
             * ones, which writes the same values again) */
            float* restrict dst = out + (b * O + c0) * (long)OH * OW + oh0 * OW;
            if (nh * OW >= VL) { /* (a masked block: its first cc lanes stored) */
                for (long j0 = 0; j0 < nh * OW; j0 += VL) {
                    const long js = j0 + VL <= nh * OW ? j0 : nh * OW - VL;
                    vf m[VL];
#pragma GCC unroll 16
                    for (int p = 0; p < VL; p++)
                        m[p] = ob[(js + p) / OW * TW + (js + p) % OW];
{{TRANSPOSE}}
#pragma GCC unroll 16
                    for (int l = 0; l < VL; l++) {
                        if (l >= cc)
                            break;
                        const long i = c0 + l;
                        float* restrict q = dst + l * (long)OH * OW + js;
                        #pragma omp simd
                        for (int e = 0; e < VL; e++) {
                            const long j = oh0 * OW + js + e;
                            const float acc = m[l][e];
                            (void)i, (void)j;
                            q[e] = {{EPILOGUE}};
                        }
                    }
                }
            } else {
                for (long l = 0; l < cc; l++) {
                    const long i = c0 + l;
                    for (long jt = 0; jt < nh * OW; jt++) {
                        const long j = oh0 * OW + jt;
                        const float acc = ob[jt / OW * TW + jt % OW][l];
                        (void)i, (void)j;
                        dst[l * (long)OH * OW + jt] = {{EPILOGUE}};
                    }
                }
            }
        }
    }
}
#else
static void {{NAME}}_planes(void* job, long lo, long hi)
{
    {{NAME}}_DIMS;
    {{NAME}}_job* jb = job;
    {{PARAM_UNPACK}}
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wt = {{WEIGHTS}};
    {
        float* restrict xp = eqf_scratch(EQF_SCRATCH_CONV_TILE, (long)HP * WP);
        if (!xp) {
            __atomic_store_n(&jb->failed, 1, __ATOMIC_RELAXED);
            return;
        }
        /* the copy's border, which no task writes (the copies fill rows PH.. and columns PW..) */
        for (long r = 0; r < HP; r++)
            for (long c = 0; c < WP; c++)
                if (r < PH || r >= PH + HC || c < PW || c >= PW + WC)
                    xp[r * WP + c] = 0.0f;
        for (long t = lo; t < hi; t++) {
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
    }
}
#endif

void {{NAME}}({{PARAMS}})
{
    {{NAME}}_DIMS;
    int failed = 0;
#if {{CHANNELS}}
    {{NAME}}_BLOCKS;
#if {{PREPACKED}}
    const float* wpk = {{WEIGHTS}}; /* the blocks {{NAME}}_prepack made once */
#else
    float* wpk = eqf_scratch(EQF_SCRATCH_GEMM_B, {{NAME}}_prepack_floats());
    if (!wpk) {
        eqf_nomem_note();
        return;
    }
    {{NAME}}_prepack({{WEIGHTS}}, wpk);
#endif
    {{NAME}}_job job = { {{PARAM_INIT}}, wpk, 0 };
    eqf_region((long)N * NCB * NBAND, {{NAME}}_tasks, &job, {{PARALLEL}});
    failed = job.failed;
#else
    {{NAME}}_job job = { {{PARAM_INIT}}, NULL, 0 };
    eqf_region((long)N * O, {{NAME}}_planes, &job, {{PARALLEL}});
    failed = job.failed;
#endif
    if (failed)
        eqf_nomem_note();
}

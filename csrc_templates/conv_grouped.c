/* {{NAME}}: grouped conv2d, {{N}}x{{C}}x{{H}}x{{W}} * {{O}}x{{CG}}x{{KH}}x{{KW}} in {{G}} groups, stride {{SH}}x{{SW}},
 * padding {{PH}}x{{PW}}, dilation {{DH}}x{{DW}} -> {{N}}x{{O}}x{{OH}}x{{OW}} (NCHW in and out), the epilogue
 * fused into the store.
 *
 * Output channel o reads the CG = {{CG}} input channels of its group (o / OG, OG = {{OG}} output channels per
 * group). One task is an output plane (n, o): for each output row, an accumulator row of OW floats
 * gets, per input channel of the group and tap (kh, kw), the tap's weight times the input row at
 * stride SW: a multiply-add over the row's pixels, the loop the compiler vectorizes over the
 * width. The pixels whose window reaches past the image's edge for a tap skip that tap (the
 * padding's zeros), so the loop bounds are per tap and there are no branches inside. A depthwise
 * conv (CG = 1) makes KH x KW such passes per output row: it reads each input row KH times
 * from L1, writes each output element once, and is bound by memory, not by multiply-adds. */
void {{NAME}}({{PARAMS}})
{
    enum { N = {{N}}, C = {{C}}, H = {{H}}, W = {{W}}, O = {{O}}, CG = {{CG}}, OG = {{OG}}, KH = {{KH}}, KW = {{KW}},
           OH = {{OH}}, OW = {{OW}}, SH = {{SH}}, SW = {{SW}}, PH = {{PH}}, PW = {{PW}}, DH = {{DH}}, DW = {{DW}} };
{{EXTRAS}}
    const float* restrict x = {{X}};
    const float* restrict wt = {{WEIGHTS}};
    /* the first and one past the last output column whose tap kw reads inside the image */
    long lo[KW], hi[KW];
    for (long kw = 0; kw < KW; kw++) {
        const long off = kw * DW - PW; /* input column = ow * SW + off */
        long a = off >= 0 ? 0 : (-off + SW - 1) / SW;
        long e = (W - 1 - off) >= 0 ? (W - 1 - off) / SW + 1 : 0;
        if (e > OW)
            e = OW;
        if (a > e)
            a = e;
        lo[kw] = a;
        hi[kw] = e;
    }
    #pragma omp parallel for schedule(static) if ({{PARALLEL}})
    for (long t = 0; t < (long)N * O; t++) {
        const long b = t / O, i = t % O, grp = i / OG;
        float row[OW] __attribute__((aligned(64)));
        for (long oh = 0; oh < OH; oh++) {
            for (long ow = 0; ow < OW; ow++)
                row[ow] = 0.0f;
            for (long ci = 0; ci < CG; ci++) {
                const float* restrict xc = x + (b * C + grp * CG + ci) * (long)H * W;
                const float* restrict wc = wt + (i * CG + ci) * (long)KH * KW;
                for (long kh = 0; kh < KH; kh++) {
                    const long ih = oh * SH - PH + kh * DH;
                    if (ih < 0 || ih >= H)
                        continue;
                    const float* restrict xr = xc + ih * (long)W;
                    for (long kw = 0; kw < KW; kw++) {
                        const float wv = wc[kh * KW + kw];
                        const float* restrict xs = xr + kw * DW - PW;
                        const long a = lo[kw], e = hi[kw];
                        #pragma omp simd
                        for (long ow = a; ow < e; ow++)
                            row[ow] += wv * xs[ow * SW];
                    }
                }
            }
            float* restrict dst = out + (t * OH + oh) * (long)OW;
            #pragma omp simd
            for (long ow = 0; ow < OW; ow++) {
                const long j = oh * OW + ow;
                const float acc = row[ow];
                (void)j;
                dst[ow] = {{EPILOGUE}};
            }
        }
        (void)b;
    }
}

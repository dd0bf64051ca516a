/* {{NAME}}: the implicit im2col of a conv2d on AMX tiles (csrc_templates/gemm.c with IMPLICIT):
 * the GEMM's B is the image itself, one of {{C}}x{{H}}x{{W}} per batch, and its element (k, j) is
 * the column matrix's, k = (c, kh, kw) and j = (oh, ow), read where the window puts it (zero in
 * the padding). The panels are packed from it directly: no column matrix is written or read.
 * Stride {{SH}}x{{SW}}, padding {{PH}}x{{PW}} (top, left: reads past the bottom or right edge are
 * zero too), dilation {{DH}}x{{DW}}, {{OH}}x{{OW}} output pixels. */
enum { {{NAME}}_C = {{C}}, {{NAME}}_H = {{H}}, {{NAME}}_W = {{W}}, {{NAME}}_KH = {{KH}}, {{NAME}}_KW = {{KW}},
       {{NAME}}_OW = {{OW}}, {{NAME}}_SH = {{SH}}, {{NAME}}_SW = {{SW}}, {{NAME}}_PH = {{PH}}, {{NAME}}_PW = {{PW}},
       {{NAME}}_DH = {{DH}}, {{NAME}}_DW = {{DW}} };

/* the column matrix's element (k, j) of image x */
static inline float {{NAME}}_col(const float* restrict x, long k, long j)
{
    const long c = k / ({{NAME}}_KH * {{NAME}}_KW), t = k % ({{NAME}}_KH * {{NAME}}_KW);
    const long ih = j / {{NAME}}_OW * {{NAME}}_SH - {{NAME}}_PH + t / {{NAME}}_KW * {{NAME}}_DH;
    const long iw = j % {{NAME}}_OW * {{NAME}}_SW - {{NAME}}_PW + t % {{NAME}}_KW * {{NAME}}_DW;
    return ih >= 0 && ih < {{NAME}}_H && iw >= 0 && iw < {{NAME}}_W ? x[(c * {{NAME}}_H + ih) * {{NAME}}_W + iw] : 0.0f;
}

#if defined(__AVX512F__)
/* lanes [a, b) set, 0 <= a, b <= 16 */
static inline __mmask16 {{NAME}}_lanes(long a, long b)
{
    return a < b ? (__mmask16)(((1u << b) - 1u) & ~((1u << a) - 1u)) : 0;
}

/* the elements (k, j + l) for lanes l < n, zero from n on: per output row the lanes span, one
 * masked load where the stride is 1 (the row's pixels read consecutive input columns; the lanes
 * in the padding masked off, which a masked load does not read), else a masked gather */
static inline __m512 {{NAME}}_col16(const float* restrict x, long k, long j, long n)
{
    const long c = k / ({{NAME}}_KH * {{NAME}}_KW), t = k % ({{NAME}}_KH * {{NAME}}_KW);
    const long kh = t / {{NAME}}_KW * {{NAME}}_DH, kw = t % {{NAME}}_KW * {{NAME}}_DW;
    const float* restrict plane = x + c * {{NAME}}_H * {{NAME}}_W;
    __m512 v = _mm512_setzero_ps();
    long oh = j / {{NAME}}_OW, ow = j % {{NAME}}_OW;
    for (long l = 0; l < n; oh++, ow = 0) {
        const long len = {{NAME}}_OW - ow < n - l ? {{NAME}}_OW - ow : n - l; /* lanes [l, l + len): row oh */
        const long ih = oh * {{NAME}}_SH - {{NAME}}_PH + kh, iw = ow * {{NAME}}_SW - {{NAME}}_PW + kw;
        if (ih >= 0 && ih < {{NAME}}_H) {
            const float* restrict row = plane + ih * {{NAME}}_W;
#if {{SW}} == 1
            /* lane l + u reads column iw + u: inside the image for -iw <= u < W - iw */
            const long u0 = iw < 0 ? -iw : 0, u1 = {{NAME}}_W - iw < len ? {{NAME}}_W - iw : len;
            if (u1 > u0)
                v = _mm512_mask_loadu_ps(v, {{NAME}}_lanes(l + u0, l + u1), row + iw - l);
#else
            const __m512i cols = _mm512_add_epi32(
                _mm512_set1_epi32((int)(iw - l * {{NAME}}_SW)),
                _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32({{NAME}}_SW)));
            const __mmask16 in = _mm512_cmpge_epi32_mask(cols, _mm512_setzero_si512())
                                 & _mm512_cmplt_epi32_mask(cols, _mm512_set1_epi32({{NAME}}_W));
            v = _mm512_mask_i32gather_ps(v, in & {{NAME}}_lanes(l, l + len), cols, row, 4);
#endif
        }
        l += len;
    }
    return v;
}
#endif

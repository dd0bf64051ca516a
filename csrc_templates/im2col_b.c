/* {{NAME}}: the implicit im2col of a conv2d on AMX tiles (csrc_templates/gemm.c with IMPLICIT):
 * the GEMM's B is the conv's input as the wrapper copied it, zero padded (conv2d.c: HP x WP
 * planes, the padding inside, so that no read needs a bounds check), one copy of C x HP x WP per
 * image, and B's element (k, j) is the column matrix's, k = (c, kh, kw) and j = (oh, ow): the
 * panels are packed from the padded copy directly, and no column matrix is written or read.
 * Stride {{SH}}x{{SW}}, dilation {{DH}}x{{DW}}, {{OH}}x{{OW}} output pixels. */
enum { {{NAME}}_KH = {{KH}}, {{NAME}}_KW = {{KW}}, {{NAME}}_OW = {{OW}}, {{NAME}}_SH = {{SH}}, {{NAME}}_SW = {{SW}},
       {{NAME}}_DH = {{DH}}, {{NAME}}_DW = {{DW}}, {{NAME}}_HP = {{HP}}, {{NAME}}_WP = {{WP}} };

/* the offset in an image's padded copy of row k's tap at output pixel (0, 0) */
static inline long {{NAME}}_tap(long k)
{
    const long c = k / ({{NAME}}_KH * {{NAME}}_KW), t = k % ({{NAME}}_KH * {{NAME}}_KW);
    return (c * {{NAME}}_HP + t / {{NAME}}_KW * {{NAME}}_DH) * {{NAME}}_WP + t % {{NAME}}_KW * {{NAME}}_DW;
}

/* ... and of output pixel j's window, from its tap's */
static inline long {{NAME}}_pixel(long j)
{
    return j / {{NAME}}_OW * {{NAME}}_SH * {{NAME}}_WP + j % {{NAME}}_OW * {{NAME}}_SW;
}

/* the column matrix's element (k, j) of the padded copy xp */
static inline float {{NAME}}_col(const float* restrict xp, long k, long j)
{
    return xp[{{NAME}}_tap(k) + {{NAME}}_pixel(j)];
}

#if defined(__AVX512F__)
/* A group of 16 output pixels j .. j + 15, of which the first n exist: where lane q's window
 * lies in the padded plane (the tap-(0, 0) offsets `at`), and, at stride 1, the runs of lanes
 * that read consecutive floats (one per output row the group spans: runs[r] lanes from lane
 * first[r], read from at[first[r]] on). The same for every row k of the panel: made once. */
#define {{NAME}}_RUNS (16 / {{NAME}}_OW + 2)
typedef struct {
    __m512i at;
    __mmask16 lanes;
    int nruns;
    __mmask16 run[{{NAME}}_RUNS];
    long from[{{NAME}}_RUNS]; /* the offset lane 0 would read at, had the run's lanes begun there */
} {{NAME}}_group;

static inline void {{NAME}}_group_of(long j, long n, {{NAME}}_group* restrict g)
{
    int at[16] = {0};
    g->lanes = n > 0 ? (__mmask16)((1u << n) - 1u) : 0;
    g->nruns = 0;
    for (int r = 0; r < {{NAME}}_RUNS; r++) { /* (all of it written: the unused runs too) */
        g->run[r] = 0;
        g->from[r] = 0;
    }
    long oh = j / {{NAME}}_OW, ow = j % {{NAME}}_OW;
    for (long l = 0; l < n; oh++, ow = 0) {
        const long len = {{NAME}}_OW - ow < n - l ? {{NAME}}_OW - ow : n - l; /* lanes [l, l + len): row oh */
        const long base = oh * {{NAME}}_SH * {{NAME}}_WP + ow * {{NAME}}_SW;
        for (long q = 0; q < len; q++)
            at[l + q] = (int)(base + q * {{NAME}}_SW);
        g->run[g->nruns] = (__mmask16)(((1u << (l + len)) - 1u) & ~((1u << l) - 1u));
        g->from[g->nruns++] = base - l;
        l += len;
    }
    g->at = _mm512_loadu_si512((const void*)at);
}

/* row k of the group: lanes past n zero */
static inline __m512 {{NAME}}_cols(const float* restrict xp, long k, const {{NAME}}_group* restrict g)
{
    const float* restrict tap = xp + {{NAME}}_tap(k);
#if {{SW}} == 1
    __m512 v = _mm512_setzero_ps();
    for (int r = 0; r < g->nruns; r++)
        v = _mm512_mask_loadu_ps(v, g->run[r], tap + g->from[r]);
    return v;
#else
    return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), g->lanes, g->at, tap, 4);
#endif
}
#endif

#define eqf_kinds_k5_attention_BQ 32 /* the plan's bq: queries per block */
#define eqf_kinds_k5_attention_BK 64 /* the plan's bk: keys per tile */
#define eqf_kinds_k5_attention_SCORE_OPS 0 /* the plan's score_ops: the score's own ops run in a score pass */
#define eqf_kinds_k5_attention_PARALLEL 0 /* the plan's parallel: the `if` of the parallel region */
#define eqf_kinds_k5_attention_BF16 0 /* the plan's precision path: 0 f32, 1 the bf16 fallback, 2 AVX512_BF16, 3 AMX-BF16 */
#if 0 == 2 && !defined(__AVX512BF16__)
#error "the plan chose the AVX512_BF16 path (vdpbf16ps) but the compiler does not target AVX512_BF16"
#endif
#if 0 == 3
#include <immintrin.h>
#if !defined(EQF_AMX_EMULATE) && !(defined(__AMX_TILE__) && defined(__AMX_BF16__))
#error "the plan chose the AMX-BF16 path (tdpbf16ps) but the compiler does not target AMX-TILE and AMX-BF16"
#endif
#endif
#if 0 == 1
#define eqf_kinds_k5_attention_R(x) eqf_bf16_round(x) /* an operand rounded to bf16, held as f32 (the fallback) */
#else
#define eqf_kinds_k5_attention_R(x) (x)
#endif
EQF_WIDE_BEGIN
#if 0 == 3
/* AMX-BF16 (path 3): the two products on tiles of common_amx.h's configuration (16 rows x 64 bytes),
 * 2 x 2 C tiles of 16 x 16 f32 (tiles 0-3), two A tiles of 16 rows x 32 bf16 (4, 5) and two B tiles
 * of 16 K-pairs x 16 columns (6, 7); R (rows, a multiple of 16) and the widths are whole tiles.
 * s[R][BK] = qh[R][DP] k^T: qh rows of DP bf16 (zeros past D), kt the key tile's K-pairs
 * [DP / 2][BK][2]. */
static inline void eqf_kinds_k5_attention_qk_amx(const uint16_t* qh, long DP, const uint16_t* kt, long BK, long R, float* s)
{
    EQF_AMX_FENCE(); /* (the operands' stores before the tile loads; the scores' loads after the stores) */
    for (long r = 0; r < R; r += 32) {
        const int two = R - r >= 32; /* a second row tile */
        for (long j = 0; j < BK; j += 32) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (long k = 0; k < DP; k += 32) {
                _tile_loadd(4, qh + r * DP + k, DP * 2);
                _tile_loadd(6, kt + (k / 2 * BK + j) * 2, BK * 4);
                _tile_loadd(7, kt + (k / 2 * BK + j + 16) * 2, BK * 4);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                if (two) {
                    _tile_loadd(5, qh + (r + 16) * DP + k, DP * 2);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, s + r * BK + j, BK * 4);
            _tile_stored(1, s + r * BK + j + 16, BK * 4);
            if (two) {
                _tile_stored(2, s + (r + 16) * BK + j, BK * 4);
                _tile_stored(3, s + (r + 16) * BK + j + 16, BK * 4);
            }
        }
    }
    EQF_AMX_FENCE();
}

/* acc[R][DV] += ph[R][BK] v: ph the probabilities in bf16, v the tile's K-pairs [BK / 2][DV][2]
 * (DV a multiple of 16); the accumulators are loaded into the C tiles and stored back. */
static inline void eqf_kinds_k5_attention_pv_amx(const uint16_t* ph, long BK, const uint16_t* v, long DV, long R, float* acc)
{
    EQF_AMX_FENCE();
    for (long r = 0; r < R; r += 32) {
        const int two = R - r >= 32;
        for (long e = 0; e < DV; e += 32) {
            const int wide = DV - e >= 32; /* a second column tile */
            _tile_loadd(0, acc + r * DV + e, DV * 4);
            if (wide)
                _tile_loadd(1, acc + r * DV + e + 16, DV * 4);
            if (two) {
                _tile_loadd(2, acc + (r + 16) * DV + e, DV * 4);
                if (wide)
                    _tile_loadd(3, acc + (r + 16) * DV + e + 16, DV * 4);
            }
            for (long k = 0; k < BK; k += 32) {
                _tile_loadd(4, ph + r * BK + k, BK * 2);
                _tile_loadd(6, v + (k * DV + 2 * e), DV * 4);
                _tile_dpbf16ps(0, 4, 6);
                if (wide) {
                    _tile_loadd(7, v + (k * DV + 2 * e + 32), DV * 4);
                    _tile_dpbf16ps(1, 4, 7);
                }
                if (two) {
                    _tile_loadd(5, ph + (r + 16) * BK + k, BK * 2);
                    _tile_dpbf16ps(2, 5, 6);
                    if (wide)
                        _tile_dpbf16ps(3, 5, 7);
                }
            }
            _tile_stored(0, acc + r * DV + e, DV * 4);
            if (wide)
                _tile_stored(1, acc + r * DV + e + 16, DV * 4);
            if (two) {
                _tile_stored(2, acc + (r + 16) * DV + e, DV * 4);
                if (wide)
                    _tile_stored(3, acc + (r + 16) * DV + e + 16, DV * 4);
            }
        }
    }
    EQF_AMX_FENCE();
}
#endif

/* eqf_kinds_k5_attention: flash attention, 3 x [19 x 24] queries against 29 keys, Dv = 40.
 * Blocks of 32 queries run against tiles of 64 keys with an online softmax: only a
 * 32 x 64 score tile exists at any time, never the 19 x 29 matrix.
 * K is transposed per head into tiles [SKP / BK][D][BK] (keys padded to whole tiles with
 * zeros), in a per-thread buffer: each key tile is one contiguous block, so it stays in L1 (rows
 * SKP apart would fall into a few cache sets and evict each other).
 * q, k^T and v are read through strides (row, column) and the result is written through
 * strides, so head split and merge transposes cost nothing.
 * BF16 (0; precision="bf16", the plan's path): q k^T and p v multiply bf16 operands and
 * accumulate in f32; the softmax stays f32. 1 = the fallback: q, k^T, p and v are rounded to bf16
 * (eqf_bf16, as vcvtne2ps2bf16 rounds) and held as f32, v in a per-head copy of rows of DV; the
 * f32 FMA multiplies them exactly. 2 = AVX512_BF16: k^T tiles are held as K-pairs of bf16
 * [D2 / 2][BK][2], v as K-pairs [SKP / 2][DV][2] per head, q and p as bf16 rows, and vdpbf16ps
 * multiplies them (the vectorized micro-kernels only: the plan takes this path only with vec).
 * 3 = AMX-BF16: the same K-pairs, q's rows padded with zeros to whole 32-element K blocks (D2), both
 * products on tiles (eqf_kinds_k5_attention_qk_amx, eqf_kinds_k5_attention_pv_amx: blocks of whole 16-query tiles, the
 * accumulators loaded into the C tiles and stored back) and the online softmax between them on
 * the vectors, as path 2 (the plan takes it with vec and query blocks of whole tiles). */
void eqf_kinds_k5_attention(const float* restrict in0, const float* restrict in1, const float* restrict in2, float* restrict out)
{
    enum { BQ = 32, BK = 64, D = 24, DV = 40, SKP = 64, D2 = 0 == 3 ? (D + 31) / 32 * 32 : D + D % 2 }; /* q's bf16 row: K-pairs, whole A tile rows on AMX */
    const long nqb = (19 + BQ - 1) / BQ;
    int nomem = 0; /* a thread's k^T buffer could not be allocated: it skips its blocks, the caller learns it */
#if 0 == 3
    if (!eqf_amx_ready()) { /* the tile state refused (common_amx.h): no tile instruction runs */
        eqf_fail_note(EQF_NO_AMX);
        return;
    }
#endif
    #pragma omp parallel if (0)
    {
    /* each thread's copy of one head's k^T, made when its blocks reach a new head (threads take
     * consecutive blocks, so each head is copied about once) */
#if 0 >= 2
    /* an f32 staging tile [D][BK], then the K-pairs of every tile; v's K-pairs */
    float* restrict ktp = eqf_scratch(EQF_SCRATCH_ATTENTION_KT, (long)D * BK + (long)D2 * SKP / 2);
    uint16_t* restrict kth = ktp ? (uint16_t*)(ktp + (long)D * BK) : NULL;
    float* restrict vpk = eqf_scratch(EQF_SCRATCH_ATTENTION_V, (long)SKP * DV / 2 + 1);
    uint16_t* restrict vh = (uint16_t*)vpk;
#elif 0 == 1
    float* restrict ktp = eqf_scratch(EQF_SCRATCH_ATTENTION_KT, (long)D * SKP);
    float* restrict vpk = eqf_scratch(EQF_SCRATCH_ATTENTION_V, (long)SKP * DV);  /* v rounded, rows of DV */
#else
    float* restrict ktp = eqf_scratch(EQF_SCRATCH_ATTENTION_KT, (long)D * SKP);
    float* restrict vpk = ktp;  /* (unused: v is read in place) */
#endif
    if (!ktp || !vpk) {
        #pragma omp atomic write
        nomem = 1;
    }
#if 0 == 3
    eqf_amx_begin(); /* (in each thread: the tile configuration is a thread's) */
#endif
    long packed = -1, vpacked = -1;
    (void)vpacked;
    #pragma omp for schedule(static)
    for (long t = 0; t < 3 * nqb; t++) {
        if (!ktp || !vpk)
            continue;
        const long b = t / nqb;
        const long i0 = (t % nqb) * BQ;
        const long nq = eqf_minl(BQ, 19 - i0);
        const long kb = b;
        (void)b;
        if (kb != packed) {
            const float* restrict kp = in1 + ((kb) * 696);
            /* read k in its memory order: the inner loop runs along the smaller stride */
            for (long kt = 0; kt < (29 + BK - 1) / BK; kt++) {  /* (the key count: run-time over a KV cache) */
                float* restrict tile = 0 >= 2 ? ktp : ktp + kt * D * BK;
                const long nk = eqf_minl(BK, 29 - kt * BK);
#if 0 >= 2 && defined(__AVX512BF16__) && defined(__AVX512BW__)
                if (1 == 1 && D % 32 == 0 && nk == BK) { /* whole tile, k rows contiguous: each key's row */
                    uint32_t w[BK][D / 2] __attribute__((aligned(64))); /* rounded to K-pairs (a 32-bit word each), */
                    for (long jj = 0; jj < BK; jj++)                      /* then 16 x 16 transposes of the words */
                        for (long d = 0; d < D; d += 32) {
                            const float* restrict r = kp + (kt * BK + jj) * 24 + d;
                            _mm512_store_si512((void*)&w[jj][d / 2],
                                               (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(r + 16), _mm512_loadu_ps(r)));
                        }
                    for (long jj = 0; jj < BK; jj += 16)
                        for (long d2 = 0; d2 < D / 2; d2 += 16)
                            eqf_transpose_16x16((const float*)&w[jj][d2], D / 2, (float*)(kth + kt * D2 * BK) + d2 * BK + jj, BK);
                    continue;
                }
#endif
#define eqf_kinds_k5_attention_VEC 0 /* the plan's vec: the AVX-512 micro-kernels */
#if defined(__AVX512F__)
                if (1 == 1 && D % 16 == 0 && nk == BK) {  /* whole tile, k rows contiguous: */
                    for (long jj = 0; jj < BK; jj += 16)           /* 16 x 16 register transposes */
                        for (long d = 0; d < D; d += 16)
                            eqf_transpose_16x16(kp + d + (kt * BK + jj) * 24, 24, tile + d * BK + jj, BK);
                } else
#endif
                if (1 <= 24) {
                    for (long jj = 0; jj < nk; jj++)
                        for (long d = 0; d < D; d++)
                            tile[d * BK + jj] = kp[d * 1 + (kt * BK + jj) * 24];
                } else {
                    for (long d = 0; d < D; d++)
                        for (long jj = 0; jj < nk; jj++)
                            tile[d * BK + jj] = kp[d * 1 + (kt * BK + jj) * 24];
                }
                for (long d = 0; d < D; d++)
                    for (long jj = nk; jj < BK; jj++)
                        tile[d * BK + jj] = 0.0f;
#if 0 == 1
                for (long x = 0; x < (long)D * BK; x++)
                    tile[x] = eqf_bf16_round(tile[x]);
#elif 0 >= 2
                uint16_t* restrict kh = kth + kt * D2 * BK;  /* K-pairs: rows d and d + 1 interleaved, zeros past D */
                for (long d = 0; d < D2; d += 2)
                    for (long jj = 0; jj < BK; jj++)
                        ((uint32_t*)kh)[(d >> 1) * BK + jj] =
                            eqf_bf16_pair(d < D ? tile[d * BK + jj] : 0.0f, d + 1 < D ? tile[(d + 1) * BK + jj] : 0.0f);
#endif
            }
            packed = kb;
        }
        const float* restrict qp = in0 + ((b) * 456) + i0 * 24;
#if 0
        /* this head's v, rounded to bf16, packed when the blocks reach a new head */
        if (((b) * 1160) != vpacked) {
            const float* restrict vsrc = in2 + ((b) * 1160);
#if 0 >= 2
            long j0 = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
            if (1 == 1 && DV % 16 == 0) { /* rows j and j + 1 rounded, 16 columns at a time, their halves interleaved */
                const __m512i ix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                    23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
                for (; j0 + 1 < 29; j0 += 2)
                    for (long e = 0; e < DV; e += 16) {
                        const __m512bh h = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(vsrc + (j0 + 1) * 40 + e),
                                                               _mm512_loadu_ps(vsrc + j0 * 40 + e));
                        _mm512_storeu_si512((void*)(vh + j0 * DV + 2 * e), _mm512_permutexvar_epi16(ix, (__m512i)h));
                    }
            }
#endif
            for (long j = j0; j < SKP; j += 2)  /* K-pairs: rows j and j + 1 interleaved, zeros past the keys */
                for (long e = 0; e < DV; e++)
                    ((uint32_t*)vh)[(j >> 1) * DV + e] =
                        eqf_bf16_pair(j < 29 ? vsrc[j * 40 + e * 1] : 0.0f,
                                      j + 1 < 29 ? vsrc[(j + 1) * 40 + e * 1] : 0.0f);
#else
            for (long j = 0; j < 29; j++)
                for (long e = 0; e < DV; e++)
                    vpk[j * DV + e] = eqf_bf16_round(vsrc[j * 40 + e * 1]);
#endif
            vpacked = (b) * 1160;
        }
        const float* restrict vp = vpk;
        (void)vp;
        enum { VRS = DV, VCS = 1 };
#else
        const float* restrict vp = in2 + ((b) * 1160);
        enum { VRS = 40, VCS = 1 };
#endif

        /* (aligned: gcc's vectorizer, asked for 512-bit vectors here, raises these arrays' alignment
         * and then stores to them with aligned moves, but left to itself it did not realign this
         * OpenMP function's frame: a row width like DV = 47 then put an array off its boundary and
         * the aligned store faulted; tests/test_bf16_random.py's attention examples found it) */
        float qb[BQ][D] __attribute__((aligned(64))), s[BQ][BK] __attribute__((aligned(64)));
        float acc[BQ][DV] __attribute__((aligned(64))), m[BQ] __attribute__((aligned(64)));
        float l[BQ][16] __attribute__((aligned(64)));
#if 0 >= 2
        uint16_t qh[BQ][D2] __attribute__((aligned(64))), ph[BQ][BK] __attribute__((aligned(64)));  /* q, p in bf16: K-pair rows */
#endif
        /* the block's rows computed: its nq, in whole blocks of 4 for the micro-kernels, of 16 for
         * the tiles (the rows past nq are zero queries, never stored; a run-time length's few
         * queries, or the last block's, take no more than that) */
        const long nq4 = 0 == 3 ? (nq + 15) & ~15L : (nq + 3) & ~3L;
        for (long ii = 0; ii < nq4; ii++) {
            for (long d = 0; d < D; d++)
                qb[ii][d] = eqf_kinds_k5_attention_R(ii < nq ? qp[ii * 24 + d * 1] * 0.2885390081777927f : 0.0f);
#if 0 >= 2
            for (long d = 0; d < D2; d++)
                qh[ii][d] = d < D ? eqf_bf16(qb[ii][d]) : 0;
#endif
            for (long e = 0; e < DV; e++)
                acc[ii][e] = 0.0f;
            m[ii] = -INFINITY;
            for (int u = 0; u < 16; u++)
                l[ii][u] = 0.0f;
        }
        for (long j0 = 0; j0 < 29; j0 += BK) {
            const long nk = eqf_minl(BK, 29 - j0);
            /* Spread over the key tiles: prefetch the next query block's rows of q and this block's
             * rows of the output, so neither waits on memory when its turn comes. */
            const long NT = (29 + BK - 1) / BK, PF = (BQ + NT - 1) / NT;
            for (long ii = j0 / BK * PF; ii < eqf_minl(BQ, (j0 / BK + 1) * PF); ii++) {
                if (1 == 1 && i0 + BQ + ii < 19)
                    for (long d = 0; d < D; d += 16)
                        __builtin_prefetch(qp + (BQ + ii) * 24 + d, 0, 3);
                if (1 == 1 && ii < nq)
                    for (long e = 0; e < DV; e += 16)
                        __builtin_prefetch(out + ((b) * 760) + (i0 + ii) * 40 + e, 1, 3);
            }
#if defined(__AVX512F__) && eqf_kinds_k5_attention_VEC
            if (!0 && nk == BK && BK == 64 && 0 != 3) {
                /* scores and their softmax step in registers (the score scale is in the q block) */
                for (long ii = 0; ii < nq4; ii += 4)
#if 0 == 2
                    eqf_qk_softmax2_bf16_4x64(&qh[ii][0], D2, kth + j0 * D2, BK, D2, &s[ii][0], BK, &m[ii],
                                              &l[ii][0], &acc[ii][0], DV, DV);
#else
                    eqf_qk_softmax2_4x64(&qb[ii][0], D, ktp + j0 * D, BK, D, &s[ii][0], BK, &m[ii], &l[ii][0],
                                         &acc[ii][0], DV, DV);
#endif
            } else
#endif
            {
                /* scores s = q k^T for this tile */
#if 0 == 3
                eqf_kinds_k5_attention_qk_amx(&qh[0][0], D2, kth + j0 * D2, BK, nq4, &s[0][0]);
#elif defined(__AVX512F__) && eqf_kinds_k5_attention_VEC
                for (long ii = 0; ii < nq4; ii += 4)
                    for (long jb = 0; jb < BK; jb += 64)
#if 0 == 2
                        eqf_qk_bf16_4x64(&qh[ii][0], D2, kth + j0 * D2 + 2 * jb, BK, D2, &s[ii][jb], BK);
#else
                        eqf_qk_4x64(&qb[ii][0], D, ktp + j0 * D + jb, BK, D, &s[ii][jb], BK);
#endif
#else
                for (long ii = 0; ii < nq4; ii++) {
                    float sr[BK];
                    #pragma omp simd
                    for (long jj = 0; jj < BK; jj++)
                        sr[jj] = 0.0f;
                    for (long d = 0; d < D; d++) {
                        const float qv = qb[ii][d];
                        #pragma omp simd
                        for (long jj = 0; jj < BK; jj++)
                            sr[jj] += qv * ktp[j0 * D + d * BK + jj];
                    }
                    for (long jj = 0; jj < BK; jj++)
                        s[ii][jj] = sr[jj];
                }
#endif
                /* score ops (scale, mask), in base 2: times log2 e; keys past the end get -inf.
                 * A score that is only q k^T times a constant was folded into the q block. */
                for (long ii = 0; ii < nq4 && (0 || nk < BK); ii++) {
                    const long i = i0 + (ii < nq ? ii : 0);
                    (void)i;
                    /* (over the nk keys, j in step with jj: a mask's loads are contiguous and the loop
                     * vectorizes; a key index clamped per lane made each load a gather, or scalar) */
                    #pragma omp simd
                    for (long jj = 0; jj < nk; jj++) {
                        const long j = j0 + jj;
                        const float acc_s = s[ii][jj];
                        (void)j;

                        s[ii][jj] = eqf_score2(acc_s, 1.0f);
                    }
                    for (long jj = nk; jj < BK; jj++)
                        s[ii][jj] = -INFINITY;
                }
                /* the online softmax: s becomes p = 2^(s - m) */
#if defined(__AVX512F__) && eqf_kinds_k5_attention_VEC
                for (long ii = 0; ii < nq4; ii += 4)
                    eqf_softmax2_4x64(&s[ii][0], BK, &m[ii], &l[ii][0], &acc[ii][0], DV, DV);
#else
                for (long ii = 0; ii < nq4; ii++)
                    eqf_softmax2_row(s[ii], BK, &m[ii], l[ii], acc[ii], DV);
#endif
            }
            /* acc += p v (p rounded to bf16 under BF16; the row sums l keep the f32 p) */
#if 0 == 1
            for (long ii = 0; ii < nq4; ii++)
                for (long jj = 0; jj < BK; jj++)
                    s[ii][jj] = eqf_bf16_round(s[ii][jj]);
#endif
#if 0 >= 2
            for (long ii = 0; ii < nq4; ii++) {
#if defined(__AVX512BF16__)
                eqf_bf16_row(&s[ii][0], &ph[ii][0], BK);
#else /* (the AMX path built without AVX512_BF16: an emulated run's on an AVX2 host) */
                for (long jj = 0; jj < BK; jj++)
                    ph[ii][jj] = eqf_bf16(s[ii][jj]);
#endif
                for (long jj = nk; jj < BK; jj++)  /* (an odd nk's last pair: a zero, never a NaN) */
                    ph[ii][jj] = 0;
            }
#endif
#if 0 == 3
            eqf_kinds_k5_attention_pv_amx(&ph[0][0], BK, vh + j0 * DV, DV, nq4, &acc[0][0]);
#elif 0 == 2
            for (long ii = 0; ii < nq4; ii += 4) {  /* the same blocks of columns on K-pairs */
                long e0 = 0;
                for (; e0 + 64 <= DV; e0 += 64)
                    eqf_pv_bf16_4x64(&ph[ii][0], BK, vh + j0 * DV + 2 * e0, DV, nk, &acc[ii][e0], DV);
                if (e0 + 32 <= DV) {
                    eqf_pv_bf16_4x32(&ph[ii][0], BK, vh + j0 * DV + 2 * e0, DV, nk, &acc[ii][e0], DV);
                    e0 += 32;
                }
                if (e0 + 16 <= DV)
                    eqf_pv_bf16_4x16(&ph[ii][0], BK, vh + j0 * DV + 2 * e0, DV, nk, &acc[ii][e0], DV);
            }
#elif defined(__AVX512F__) && eqf_kinds_k5_attention_VEC
            for (long ii = 0; ii < nq4; ii += 4) {  /* DV a multiple of 16: 64 columns at a time, then 32, 16 */
                long e0 = 0;
                for (; e0 + 64 <= DV; e0 += 64)
                    eqf_pv_4x64(&s[ii][0], BK, vp + j0 * VRS + e0, VRS, nk, &acc[ii][e0], DV);
                if (e0 + 32 <= DV) {
                    eqf_pv_4x32(&s[ii][0], BK, vp + j0 * VRS + e0, VRS, nk, &acc[ii][e0], DV);
                    e0 += 32;
                }
                if (e0 + 16 <= DV)
                    eqf_pv_4x16(&s[ii][0], BK, vp + j0 * VRS + e0, VRS, nk, &acc[ii][e0], DV);
            }
#else
            for (long jj = 0; jj < nk; jj++) {
                const float* restrict vr = vp + (j0 + jj) * VRS;
                for (long ii = 0; ii < nq4; ii++) {
                    const float p = s[ii][jj];
                    #pragma omp simd
                    for (long e = 0; e < DV; e++)
                        acc[ii][e] += p * vr[e * VCS];
                }
            }
#endif
        }
        for (long ii = 0; ii < nq; ii++) {
            const long i = i0 + ii;
            float lsum = 0.0f;
            for (int u = 0; u < 16; u++)
                lsum += l[ii][u];
            const float inv = 1.0f / lsum;
            /* A row whose softmax is NaN in numpy: a NaN score, or every key masked with -inf
             * (the max stays -inf; the portable exp2 gives 2^-126, not 0, for -inf, so the sum
             * alone would not show it). ZERO_NAN (0): such a row is 0, as
             * where(isnan(p), 0, p) before the product with V; otherwise it is NaN. */
            const int dead = !(lsum > 0.0f && lsum <= 3.4028235e38f) || m[ii] == -INFINITY;
            for (long e = 0; e < DV; e++) {
                const float v = dead ? (0 ? 0.0f : NAN) : acc[ii][e] * inv;

                out[((b) * 760) + i * 40 + e * 1] = v;
            }
        }
    }
#if 0 == 3
    _tile_release();
#endif
    }
    if (nomem)
        eqf_nomem_note();
}
EQF_WIDE_END

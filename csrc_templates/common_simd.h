/* eqfuse common header, continued (after common.h): vector helpers -- streaming stores, the
 * attention micro-kernels, the row kernels' exp and sums. */
/* Rows of a softmax block (row_softmax.c): ~2 KiB of short rows, so that their three passes stay
 * in L1 and the reductions of one row overlap the work of the others; long rows one at a time
 * (softmax 12x128x128 and 4096x1024: benchmarks/bench_rows.py --threads 1). */
#define EQF_ROW_BLOCK(L) ((L) <= 64 ? 8 : (L) <= 128 ? 4 : (L) <= 256 ? 2 : 1)

/* Keep a loaded vector in a register: gcc may otherwise fold its load into every FMA that uses
 * it (a memory operand per FMA: bound by loads; conv_grouped.c's register tiles). */
#if defined(__x86_64__) && defined(__SSE__)
#define EQF_IN_REGISTER(a) __asm__("" : "+v"(a))
#else
#define EQF_IN_REGISTER(a) ((void)0)
#endif

/* acc + lo(a) lo(w) + hi(a) hi(w), lane by lane: `a` one bf16 K-pair (lo at k, hi at k + 1, as
 * eqf_bf16_pair makes it), `w` a vector of VL K-pairs (32-bit lanes), `acc` a vector of VL floats
 * (GCC vector types). The register tiles of the bf16 convs (conv_direct.c, conv_winograd.c,
 * conv_grouped.c) on their plan's path, PATH and VL literals (the templates' BF16 and VL):
 * 2 = vdpbf16ps (AVX512_BF16: on zmm at 16 lanes, on ymm at 8 with AVX512VL; the template includes
 * <immintrin.h>); 1 = the fallback, w's halves widened to f32 by a shift and a mask, two FMAs on
 * the same bf16 operands (products of two bf16 are exact in f32: both paths give the same sums
 * up to the order of the two adds). */
#define EQF_DP_BF16(PATH, VL, acc, a, w) EQF_DP_BF16_##PATH##_##VL(acc, a, w)
#define EQF_DP_WIDEN(acc, a, w)                                                                   \
    ((acc) + eqf_bf16_f32((uint16_t)(a)) * (__typeof__(acc))((w) << 16)                           \
     + eqf_bf16_f32((uint16_t)((a) >> 16)) * (__typeof__(acc))((w) & 0xffff0000u))
#define EQF_DP_BF16_1_4(acc, a, w) EQF_DP_WIDEN(acc, a, w)
#define EQF_DP_BF16_1_8(acc, a, w) EQF_DP_WIDEN(acc, a, w)
#define EQF_DP_BF16_1_16(acc, a, w) EQF_DP_WIDEN(acc, a, w)
#define EQF_DP_BF16_2_16(acc, a, w)                                                               \
    ((__typeof__(acc))_mm512_dpbf16_ps((__m512)(acc), (__m512bh)_mm512_set1_epi32((int)(a)), (__m512bh)(w)))
#define EQF_DP_BF16_2_8(acc, a, w)                                                                \
    ((__typeof__(acc))_mm256_dpbf16_ps((__m256)(acc), (__m256bh)_mm256_set1_epi32((int)(a)), (__m256bh)(w)))

/* Everything below uses the x86 intrinsics, and is compiled only in a module whose code needs
 * them: the module defines EQF_INTRINSICS before this header (eqfuse.backend.cbuild.intrinsics_define
 * decides from the code). <immintrin.h> alone is about half of gcc's time on a small module
 * (a sigmoid kernel at -O3), and half of the test suite's modules use no intrinsic.
 * A helper used without the define is an implicit declaration: an error (-Werror) or a library
 * that does not load, never a silent fallback to the portable loops. */
#if defined(EQF_INTRINSICS)
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
/* 16 bf16 (a bf16 KV cache's row) widened to f32: each shifted into the top half of its lane (exact) */
static inline __m512 eqf_bf16_load16(const uint16_t* p)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16));
}
#endif
/* quantize_linear of n floats with one scale s and zero point zp (the range [lo, hi] of zp's
 * type), each byte the low byte of the int32 result (u8 or i8): eqf_quantize's operations
 * (x / s rounded half to even, + zp, a NaN to lo, clamped) 16 floats at a time. An integer
 * GEMM's quantized epilogue (gemm_u8s8.c, QOUT) quantizes its rows of floats so; gcc's own
 * vectorization of eqf_quantize in the epilogue's loop took four times as long a byte
 * (`benchmarks/bench_models.py --quantized static --model resnet_stages`). */
static inline void eqf_quantize_row(const float* restrict x, long n, float s, float zp, float lo, float hi,
                                    uint8_t* restrict out)
{
    long k = 0;
#if defined(__AVX512F__)
    const __m512 vs = _mm512_set1_ps(s), vz = _mm512_set1_ps(zp), vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
    for (; k + 16 <= n; k += 16) {
        const __m512 r = _mm512_add_ps(_mm512_roundscale_ps(_mm512_div_ps(_mm512_loadu_ps(x + k), vs),
                                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), vz);
        /* (max(r, lo) is lo for a NaN r, as r > lo ? r : lo) */
        const __m512 t = _mm512_min_ps(_mm512_max_ps(r, vlo), vhi);
        _mm_storeu_si128((__m128i*)(out + k), _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(t)));
    }
#endif
#pragma omp simd
    for (long t = k; t < n; t++)
        out[t] = (uint8_t)(int32_t)eqf_quantize(x[t], s, zp, lo, hi);
}

/* Store one 64-byte line (16 floats, dst 64-byte aligned, src aligned) with a non-temporal
 * store: no read-for-ownership of the destination, for outputs much larger than the caches.
 * gcc keeps `src` (a line computed by a 16-iteration SIMD loop) in a register. Each thread that
 * streams ends with eqf_sfence(). */
static inline void eqf_stream_line(float* restrict dst, const float* restrict src)
{
#if defined(__AVX512F__)
    _mm512_stream_ps(dst, _mm512_load_ps(src));
#elif defined(__AVX__)
    _mm256_stream_ps(dst, _mm256_load_ps(src));
    _mm256_stream_ps(dst + 8, _mm256_load_ps(src + 8));
#elif defined(__SSE__)
    for (int k = 0; k < 16; k += 4)
        _mm_stream_ps(dst + k, _mm_load_ps(src + k));
#else
    memcpy(dst, src, 16 * sizeof(float));
#endif
}
#if defined(__SSE__)
static inline void eqf_sfence(void) { _mm_sfence(); }
#else
static inline void eqf_sfence(void) {}
#endif

#if defined(__AVX512F__)
/* The lanes i of a 16-float load at w0 + i that fall inside a row of W floats (a stride-2 max
 * pool's masked loads, eqfuse.backend.kinds.index._max_pool_stride2). */
static inline __mmask16 eqf_pool_lanes(long w0, long W)
{
    const long lo = w0 < 0 ? -w0 : 0, hi = W - w0 < 16 ? W - w0 : 16;
    return hi <= lo ? 0 : (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

#if defined(__AVX512BW__)
/* The lanes i of a 64-byte load at w0 + i that fall inside a row of W bytes (the stride-2 max
 * pool of u8 / i8, eqfuse.backend.kinds.index._max_pool_stride2_int). */
static inline __mmask64 eqf_pool_lanes64(long w0, long W)
{
    const long lo = w0 < 0 ? -w0 : 0, hi = W - w0 < 64 ? W - w0 : 64;
    return hi <= lo ? 0 : (__mmask64)((hi == 64 ? ~0ull : (1ull << hi) - 1) & ~((1ull << lo) - 1));
}
#endif

/* Keep four loaded vectors in registers: without this gcc folds each load into the FMAs that
 * use it (one memory operand per FMA: 16 loads + 4 broadcasts per 16 FMAs, load-bound). */
#define EQF_IN_REGISTERS(a, b, c, d) __asm__("" : "+v"(a), "+v"(b), "+v"(c), "+v"(d))

/* Attention micro-kernels: 4 rows at a time, 16 zmm accumulators. Kept out of line: inlined
 * into the attention loop nest, gcc merges two calls' accumulators and spills them.
 * c[4][4 x 16] = q[4][D] . kt[D][64]  (q rows at stride ldq, kt rows at stride ldk) */
static inline __attribute__((always_inline)) void eqf_qk_regs(const float* restrict q, long ldq,
                                                              const float* restrict kt, long ldk, long D,
                                                              __m512 c[4][4])
{
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++)
            c[r][u] = _mm512_setzero_ps();
    for (long d = 0; d < D; d++) {
        const float* k = kt + d * ldk;
        __m512 k0 = _mm512_loadu_ps(k), k1 = _mm512_loadu_ps(k + 16);
        __m512 k2 = _mm512_loadu_ps(k + 32), k3 = _mm512_loadu_ps(k + 48);
        EQF_IN_REGISTERS(k0, k1, k2, k3);
        for (int r = 0; r < 4; r++) {
            __m512 a = _mm512_set1_ps(q[r * ldq + d]);
            c[r][0] = _mm512_fmadd_ps(a, k0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(a, k1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(a, k2, c[r][2]);
            c[r][3] = _mm512_fmadd_ps(a, k3, c[r][3]);
        }
    }
}

/* s[4][64] = q k^T (s rows at lds) */
__attribute__((noinline, unused)) static void eqf_qk_4x64(const float* restrict q, long ldq,
                                                         const float* restrict kt, long ldk, long D,
                                                         float* restrict s, long lds)
{
    __m512 c[4][4];
    eqf_qk_regs(q, ldq, kt, ldk, D, c);
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++)
            _mm512_storeu_ps(s + r * lds + u * 16, c[r][u]);
}

/* 2^x, 16 lanes: x = floor(x) + f with 0 <= f < 1 (vreduceps), 2^f by a degree-5 fit (relative
 * error < 2e-7), times 2^floor(x) by vscalefps, which gives 0 below the float range and for -inf,
 * inf above it, and keeps NaN: no clamps needed. */
static inline __m512 eqf_exp2_ps(__m512 x)
{
    const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 p = _mm512_set1_ps(1.8775766948238015e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.989340625703335e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.582631751894951e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4015361070632935e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931530833244324e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999999403953552e-1f));
    return _mm512_scalef_ps(p, x);
}

/* eqf_softmax2_row for 4 rows of 64 scores held in registers x (s rows at lds receive p, l rows
 * of 16 lanes, acc rows at ldacc of dv, a multiple of 16). The four maxima are taken first and
 * the 16 exps follow with no dependence between them. */
static inline __attribute__((always_inline)) void eqf_softmax2_regs(__m512 x[4][4], float* restrict s, long lds,
                                                                    float* restrict m, float* restrict l,
                                                                    float* restrict acc, long ldacc, long dv)
{
    float tm[4];
    for (int r = 0; r < 4; r++)
        tm[r] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(x[r][0], x[r][1]),
                                                   _mm512_max_ps(x[r][2], x[r][3])));
    for (int r = 0; r < 4; r++)
        if (tm[r] > m[r] + EQF_LAZY) {
            const float a = m[r] == -INFINITY ? 0.0f : eqf_exp2(m[r] - tm[r]);
            const __m512 alpha = _mm512_set1_ps(a);
            for (long e = 0; e < dv; e += 16)
                _mm512_storeu_ps(acc + r * ldacc + e, _mm512_mul_ps(alpha, _mm512_loadu_ps(acc + r * ldacc + e)));
            _mm512_storeu_ps(l + 16 * r, _mm512_mul_ps(alpha, _mm512_loadu_ps(l + 16 * r)));
            m[r] = tm[r];
        }
    for (int r = 0; r < 4; r++) {
        const __m512 base = _mm512_set1_ps(m[r] == -INFINITY ? 0.0f : m[r]);
        __m512 sum = _mm512_loadu_ps(l + 16 * r);
        for (int u = 0; u < 4; u++) {
            const __m512 p = eqf_exp2_ps(_mm512_sub_ps(x[r][u], base));
            _mm512_storeu_ps(s + r * lds + 16 * u, p);
            sum = _mm512_add_ps(sum, p);
        }
        _mm512_storeu_ps(l + 16 * r, sum);
    }
}

/* The softmax step of 4 score rows of 64 already in s (after the general score pass). */
__attribute__((noinline, unused)) static void eqf_softmax2_4x64(float* restrict s, long lds,
                                                               float* restrict m, float* restrict l,
                                                               float* restrict acc, long ldacc, long dv)
{
    __m512 x[4][4];
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++)
            x[r][u] = _mm512_loadu_ps(s + r * lds + 16 * u);
    eqf_softmax2_regs(x, s, lds, m, l, acc, ldacc, dv);
}

/* eqf_qk_4x64 and the softmax step in one, for scores that are q k^T (a constant scale folded
 * into q): the scores go from the accumulators to the exps without a trip through s. */
__attribute__((noinline, unused)) static void eqf_qk_softmax2_4x64(const float* restrict q, long ldq,
                                                                  const float* restrict kt, long ldk, long D,
                                                                  float* restrict s, long lds, float* restrict m,
                                                                  float* restrict l, float* restrict acc,
                                                                  long ldacc, long dv)
{
    __m512 c[4][4];
    eqf_qk_regs(q, ldq, kt, ldk, D, c);
    eqf_softmax2_regs(c, s, lds, m, l, acc, ldacc, dv);
}

/* dst[c][r] = src[r][c] for a 16 x 16 block (src rows at lds, dst rows at ldd): four rounds of
 * shuffles in registers, 64 for 256 floats, instead of 256 strided scalar stores. */
static inline void eqf_transpose_16x16(const float* restrict src, long lds, float* restrict dst, long ldd)
{
    __m512 a[16], b[16];
    for (int r = 0; r < 16; r++)
        a[r] = _mm512_loadu_ps(src + r * lds);
    for (int r = 0; r < 16; r += 2) {  /* interleave pairs of rows: 32-bit elements */
        b[r] = _mm512_unpacklo_ps(a[r], a[r + 1]);
        b[r + 1] = _mm512_unpackhi_ps(a[r], a[r + 1]);
    }
    for (int r = 0; r < 16; r += 4)    /* then pairs of pairs: 64-bit elements */
        for (int u = 0; u < 2; u++) {
            a[r + u] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(b[r + u]), _mm512_castps_pd(b[r + u + 2])));
            a[r + u + 2] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(b[r + u]), _mm512_castps_pd(b[r + u + 2])));
        }
    for (int r = 0; r < 16; r += 8)    /* 128-bit lanes, rows 4 apart */
        for (int u = 0; u < 4; u++) {
            b[r + u] = _mm512_shuffle_f32x4(a[r + u], a[r + u + 4], 0x88);
            b[r + u + 4] = _mm512_shuffle_f32x4(a[r + u], a[r + u + 4], 0xdd);
        }
    for (int u = 0; u < 8; u++) {      /* 128-bit lanes, rows 8 apart */
        a[u] = _mm512_shuffle_f32x4(b[u], b[u + 8], 0x88);
        a[u + 8] = _mm512_shuffle_f32x4(b[u], b[u + 8], 0xdd);
    }
    /* a[k] now holds column c of the block for the permutation below */
    static const int col[16] = {0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15};
    for (int k = 0; k < 16; k++)
        _mm512_storeu_ps(dst + col[k] * ldd, a[k]);
}

/* acc[4][16 V] += p[4][nk] . v[nk][16 V]  (p rows at stride ldp, v rows at ldv, acc rows at ldacc);
 * V (1, 2 or 4 vectors) is a constant once inlined into the wrappers below. */
static inline __attribute__((always_inline)) void eqf_pv_rows(const float* restrict p, long ldp,
                                                              const float* restrict v, long ldv, long nk,
                                                              float* restrict acc, long ldacc, const int V)
{
    __m512 c[4][4];
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < V; u++)
            c[r][u] = _mm512_loadu_ps(acc + r * ldacc + u * 16);
    for (long j = 0; j < nk; j++) {
        const float* w = v + j * ldv;
        __m512 v0 = _mm512_loadu_ps(w), v1 = V > 1 ? _mm512_loadu_ps(w + 16) : v0;
        __m512 v2 = V > 2 ? _mm512_loadu_ps(w + 32) : v0, v3 = V > 2 ? _mm512_loadu_ps(w + 48) : v0;
        EQF_IN_REGISTERS(v0, v1, v2, v3);
        for (int r = 0; r < 4; r++) {
            __m512 a = _mm512_set1_ps(p[r * ldp + j]);
            c[r][0] = _mm512_fmadd_ps(a, v0, c[r][0]);
            if (V > 1)
                c[r][1] = _mm512_fmadd_ps(a, v1, c[r][1]);
            if (V > 2) {
                c[r][2] = _mm512_fmadd_ps(a, v2, c[r][2]);
                c[r][3] = _mm512_fmadd_ps(a, v3, c[r][3]);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < V; u++)
            _mm512_storeu_ps(acc + r * ldacc + u * 16, c[r][u]);
}

__attribute__((noinline, unused)) static void eqf_pv_4x64(const float* restrict p, long ldp,
                                                         const float* restrict v, long ldv, long nk,
                                                         float* restrict acc, long ldacc)
{
    eqf_pv_rows(p, ldp, v, ldv, nk, acc, ldacc, 4);
}
__attribute__((noinline, unused)) static void eqf_pv_4x32(const float* restrict p, long ldp,
                                                         const float* restrict v, long ldv, long nk,
                                                         float* restrict acc, long ldacc)
{
    eqf_pv_rows(p, ldp, v, ldv, nk, acc, ldacc, 2);
}
__attribute__((noinline, unused)) static void eqf_pv_4x16(const float* restrict p, long ldp,
                                                         const float* restrict v, long ldv, long nk,
                                                         float* restrict acc, long ldacc)
{
    eqf_pv_rows(p, ldp, v, ldv, nk, acc, ldacc, 1);
}
#if defined(__AVX512BF16__)
/* The bf16 micro-kernels of attention (precision="bf16", the AVX512_BF16 path): operands are
 * K-pairs of bf16, two consecutive elements of the reduction in one 32-bit lane (lo at the even
 * index), as vdpbf16ps takes them; it adds both products into the f32 lane. */
static inline uint32_t eqf_pair_at(const uint16_t* p) { uint32_t x; memcpy(&x, p, 4); return x; }

/* c[4][4 x 16] = q k^T over D2 (even) of the reduction: q rows of bf16 at ldq halves, k^T tile as
 * K-pairs [D2 / 2][keys at ldk][2] */
static inline __attribute__((always_inline)) void eqf_qk_bf16_regs(const uint16_t* restrict q, long ldq,
                                                                   const uint16_t* restrict kt, long ldk, long D2,
                                                                   __m512 c[4][4])
{
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++)
            c[r][u] = _mm512_setzero_ps();
    for (long dp = 0; dp < D2 / 2; dp++) {
        const uint16_t* kr = kt + dp * 2 * ldk;
        __m512i k0 = _mm512_loadu_si512(kr), k1 = _mm512_loadu_si512(kr + 32);
        __m512i k2 = _mm512_loadu_si512(kr + 64), k3 = _mm512_loadu_si512(kr + 96);
        EQF_IN_REGISTERS(k0, k1, k2, k3);
        for (int r = 0; r < 4; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)eqf_pair_at(q + r * ldq + 2 * dp));
            c[r][0] = _mm512_dpbf16_ps(c[r][0], a, (__m512bh)k0);
            c[r][1] = _mm512_dpbf16_ps(c[r][1], a, (__m512bh)k1);
            c[r][2] = _mm512_dpbf16_ps(c[r][2], a, (__m512bh)k2);
            c[r][3] = _mm512_dpbf16_ps(c[r][3], a, (__m512bh)k3);
        }
    }
}

/* eqf_qk_4x64 on bf16 operands */
__attribute__((noinline, unused)) static void eqf_qk_bf16_4x64(const uint16_t* restrict q, long ldq,
                                                              const uint16_t* restrict kt, long ldk, long D2,
                                                              float* restrict s, long lds)
{
    __m512 c[4][4];
    eqf_qk_bf16_regs(q, ldq, kt, ldk, D2, c);
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < 4; u++)
            _mm512_storeu_ps(s + r * lds + u * 16, c[r][u]);
}

/* eqf_qk_softmax2_4x64 on bf16 operands */
__attribute__((noinline, unused)) static void eqf_qk_softmax2_bf16_4x64(const uint16_t* restrict q, long ldq,
                                                                       const uint16_t* restrict kt, long ldk,
                                                                       long D2, float* restrict s, long lds,
                                                                       float* restrict m, float* restrict l,
                                                                       float* restrict acc, long ldacc, long dv)
{
    __m512 c[4][4];
    eqf_qk_bf16_regs(q, ldq, kt, ldk, D2, c);
    eqf_softmax2_regs(c, s, lds, m, l, acc, ldacc, dv);
}

/* dst[n] = x[n] rounded to bf16 by vcvtne2ps2bf16 (n a multiple of 32) */
static inline void eqf_bf16_row(const float* restrict x, uint16_t* restrict dst, long n)
{
    for (long j = 0; j < n; j += 32)
        _mm512_storeu_si512(dst + j, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + j + 16), _mm512_loadu_ps(x + j)));
}

/* acc[4][V x 16] += p[4][nk] . v[nk][V x 16] on bf16 K-pairs: p rows at ldp halves, v as K-pairs
 * [nk / 2][columns at ldv][2] (an odd nk's last pair completed by zeros in p and v) */
static inline __attribute__((always_inline)) void eqf_pv_bf16_rows(const uint16_t* restrict p, long ldp,
                                                                   const uint16_t* restrict v, long ldv, long nk,
                                                                   float* restrict acc, long ldacc, const int V)
{
    __m512 c[4][4];
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < V; u++)
            c[r][u] = _mm512_loadu_ps(acc + r * ldacc + u * 16);
    for (long jp = 0; jp < (nk + 1) / 2; jp++) {
        const uint16_t* w = v + jp * 2 * ldv;
        __m512i v0 = _mm512_loadu_si512(w), v1 = V > 1 ? _mm512_loadu_si512(w + 32) : v0;
        __m512i v2 = V > 2 ? _mm512_loadu_si512(w + 64) : v0, v3 = V > 2 ? _mm512_loadu_si512(w + 96) : v0;
        EQF_IN_REGISTERS(v0, v1, v2, v3);
        for (int r = 0; r < 4; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)eqf_pair_at(p + r * ldp + 2 * jp));
            c[r][0] = _mm512_dpbf16_ps(c[r][0], a, (__m512bh)v0);
            if (V > 1)
                c[r][1] = _mm512_dpbf16_ps(c[r][1], a, (__m512bh)v1);
            if (V > 2) {
                c[r][2] = _mm512_dpbf16_ps(c[r][2], a, (__m512bh)v2);
                c[r][3] = _mm512_dpbf16_ps(c[r][3], a, (__m512bh)v3);
            }
        }
    }
    for (int r = 0; r < 4; r++)
        for (int u = 0; u < V; u++)
            _mm512_storeu_ps(acc + r * ldacc + u * 16, c[r][u]);
}
__attribute__((noinline, unused)) static void eqf_pv_bf16_4x64(const uint16_t* restrict p, long ldp,
                                                              const uint16_t* restrict v, long ldv, long nk,
                                                              float* restrict acc, long ldacc)
{
    eqf_pv_bf16_rows(p, ldp, v, ldv, nk, acc, ldacc, 4);
}
__attribute__((noinline, unused)) static void eqf_pv_bf16_4x32(const uint16_t* restrict p, long ldp,
                                                              const uint16_t* restrict v, long ldv, long nk,
                                                              float* restrict acc, long ldacc)
{
    eqf_pv_bf16_rows(p, ldp, v, ldv, nk, acc, ldacc, 2);
}
__attribute__((noinline, unused)) static void eqf_pv_bf16_4x16(const uint16_t* restrict p, long ldp,
                                                              const uint16_t* restrict v, long ldv, long nk,
                                                              float* restrict acc, long ldacc)
{
    eqf_pv_bf16_rows(p, ldp, v, ldv, nk, acc, ldacc, 1);
}
#endif
#endif

/* Passes of the row templates (row_softmax.c, row_layernorm.c) over a row y of n floats at stride
 * ys, a literal there: the contiguous rows (ys == 1) of AVX-512 builds take the explicit loops
 * below, the rest the portable ones. Two or four accumulators: a single vector accumulator makes a
 * pass over a row in L1 wait on the adds' latency. `next` (or NULL) is the next row's input, n
 * contiguous floats, prefetched a line per vector while this row computes (spread over the pass:
 * a burst of 64 prefetches overflows the miss buffers and gained a third as much). */
static inline void eqf_prefetch(const float* next, long j)
{
#if defined(__SSE__)
    if (next)
        _mm_prefetch((const char*)(next + j), _MM_HINT_T0);
#else
    (void)next, (void)j;
#endif
}
static inline void eqf_prefetch_row(const float* next, long n)
{
    for (long j = 0; j < n; j += 16)
        eqf_prefetch(next, j);
}
#if defined(__AVX512F__)
/* e^x for softmax's x - max (x <= 0, -inf or NaN), 16 lanes: eqf_exp2_ps of x log2 e, 8 operations
 * (the exp pass is bound by the FMA pipes; Cody-Waite and Cephes' polynomial took 13). The rounding
 * of x log2 e (half an ulp: 4e-6 at -126) is the error that remains, relative to e^x. */
static inline __m512 eqf_exp_ps(__m512 x)
{
    return eqf_exp2_ps(_mm512_mul_ps(x, _mm512_set1_ps(EQF_LOG2E)));
}
#endif

/* y = e^(y - m) over the row; returns the sum */
static inline float eqf_row_exp_sum(float* restrict y, long n, long ys, float m, const float* next)
{
    long j = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    if (ys == 1) {
        const __m512 mv = _mm512_set1_ps(m);
        __m512 s0 = _mm512_setzero_ps(), s1 = s0;
        for (; j + 32 <= n; j += 32) {
            eqf_prefetch(next, j);
            eqf_prefetch(next, j + 16);
            const __m512 e0 = eqf_exp_ps(_mm512_sub_ps(_mm512_loadu_ps(y + j), mv));
            const __m512 e1 = eqf_exp_ps(_mm512_sub_ps(_mm512_loadu_ps(y + j + 16), mv));
            _mm512_storeu_ps(y + j, e0);
            _mm512_storeu_ps(y + j + 16, e1);
            s0 = _mm512_add_ps(s0, e0);
            s1 = _mm512_add_ps(s1, e1);
        }
        for (; j < n; j += 16) {  /* the tail, under masks of up to 16 lanes */
            const __mmask16 k = (__mmask16)(n - j >= 16 ? 0xFFFF : (1u << (n - j)) - 1);
            const __m512 e = eqf_exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, y + j), mv));
            _mm512_mask_storeu_ps(y + j, k, e);
            s0 = _mm512_add_ps(s0, _mm512_maskz_mov_ps(k, e));
        }
        return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
    }
#endif
    (void)next;
    #pragma omp simd reduction(+:s)
    for (j = 0; j < n; j++) {
        const float e = eqf_exp(y[j * ys] - m);
        y[j * ys] = e;
        s += e;
    }
    return s;
}

/* The sum of a contiguous row (SQ 0), or of its squares (SQ 1): four vector accumulators, added
 * as a tree at the end. The norms' first pass calls it (their plan's sum_apart) when its prologue
 * reads bytes: gcc's loop then has 64 lanes, which a reduction in the loop sums one after another. */
static inline float eqf_row_sum(const float* restrict y, long n, int sq)
{
    long j = 0;
    float s = 0.0f;
#if defined(__AVX512F__)
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (; j + 64 <= n; j += 64) {
        const __m512 a0 = _mm512_loadu_ps(y + j), a1 = _mm512_loadu_ps(y + j + 16);
        const __m512 a2 = _mm512_loadu_ps(y + j + 32), a3 = _mm512_loadu_ps(y + j + 48);
        s0 = sq ? _mm512_fmadd_ps(a0, a0, s0) : _mm512_add_ps(s0, a0);
        s1 = sq ? _mm512_fmadd_ps(a1, a1, s1) : _mm512_add_ps(s1, a1);
        s2 = sq ? _mm512_fmadd_ps(a2, a2, s2) : _mm512_add_ps(s2, a2);
        s3 = sq ? _mm512_fmadd_ps(a3, a3, s3) : _mm512_add_ps(s3, a3);
    }
    for (; j + 16 <= n; j += 16) {
        const __m512 a = _mm512_loadu_ps(y + j);
        s0 = sq ? _mm512_fmadd_ps(a, a, s0) : _mm512_add_ps(s0, a);
    }
    s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
#endif
    for (; j < n; j++)
        s += sq ? y[j] * y[j] : y[j];
    return s;
}

/* Over a contiguous row: the sum of (y - mean)^2, and in *dev the sum of (y - mean), which is
 * not 0 by the rounding of mean: the corrected two-pass algorithm (Chan, Golub and LeVeque) takes
 * it out of both the mean and the variance, so a row of 1000 + N(0, 0.1) keeps its digits. */
static inline float eqf_row_sq_dev(const float* restrict y, long n, float mean, const float* next, float* dev)
{
    long j = 0;
    float q = 0.0f, c = 0.0f;
#if defined(__AVX512F__)
    const __m512 mv = _mm512_set1_ps(mean);
    __m512 q0 = _mm512_setzero_ps(), q1 = q0, q2 = q0, q3 = q0, c0 = q0, c1 = q0;
    for (; j + 64 <= n; j += 64) {
        for (int u = 0; u < 64; u += 16)
            eqf_prefetch(next, j + u);
        const __m512 d0 = _mm512_sub_ps(_mm512_loadu_ps(y + j), mv), d1 = _mm512_sub_ps(_mm512_loadu_ps(y + j + 16), mv);
        const __m512 d2 = _mm512_sub_ps(_mm512_loadu_ps(y + j + 32), mv), d3 = _mm512_sub_ps(_mm512_loadu_ps(y + j + 48), mv);
        q0 = _mm512_fmadd_ps(d0, d0, q0);
        q1 = _mm512_fmadd_ps(d1, d1, q1);
        q2 = _mm512_fmadd_ps(d2, d2, q2);
        q3 = _mm512_fmadd_ps(d3, d3, q3);
        c0 = _mm512_add_ps(c0, _mm512_add_ps(d0, d1));
        c1 = _mm512_add_ps(c1, _mm512_add_ps(d2, d3));
    }
    for (; j + 16 <= n; j += 16) {
        const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(y + j), mv);
        q0 = _mm512_fmadd_ps(d, d, q0);
        c0 = _mm512_add_ps(c0, d);
    }
    q = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(q0, q1), _mm512_add_ps(q2, q3)));
    c = _mm512_reduce_add_ps(_mm512_add_ps(c0, c1));
#else
    (void)next;
#endif
    #pragma omp simd reduction(+:q, c)
    for (long i = j; i < n; i++) {
        const float d = y[i] - mean;
        q += d * d;
        c += d;
    }
    *dev = c;
    return q;
}
#endif /* EQF_INTRINSICS */

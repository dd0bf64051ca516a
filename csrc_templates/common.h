/* eqfuse common header: helpers named by the op table's C expressions and by the templates.
 * Every generated source starts with this header; all helpers are static inline so that
 * several kernels (and several builds) can include it without clashes. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_getcpu, CPU_SET (common_pool.h); a cffi module has it from Python.h */
#endif
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* The runtime's state and functions (the scratch buffers below, the pool of common_pool.h) are
 * defined in csrc_templates/runtime.c, which is compiled once per compiler and flags and linked
 * into every kernel library (eqfuse.backend.cbuild.runtime_object): each library has its own
 * copy, hidden from the others. Compiled in each library, they were a large part of a small
 * library's compile, and gcc copied the pool's machinery into every kernel that starts a loop. */
#define EQF_HIDDEN __attribute__((visibility("hidden")))

/* NaN-propagating like numpy's maximum/minimum (and relu = maximum(x, 0)). */
static inline float eqf_max(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float eqf_min(float a, float b) { return (a != a || a < b) ? a : b; }
/* div: integers truncate (C's and ONNX's Div); an integer divided by 0 gives 0 as in floordiv
 * and mod, and INT64_MIN / -1 wraps to INT64_MIN: never a trap (C's division would raise SIGFPE) */
static inline int64_t eqf_div_i(int64_t a, int64_t b)
{
    if (b == 0 || b == -1)
        return b == 0 ? 0 : (int64_t)(0 - (uint64_t)a);
    return a / b;
}
static inline float eqf_div_f(float a, float b) { return a / b; }
#define eqf_div(a, b) _Generic((a) + (b), float: eqf_div_f, double: eqf_div_f, default: eqf_div_i)((a), (b))
/* floordiv and mod as numpy's floor_divide and remainder: floored, the remainder has the
 * divisor's sign; an integer divided by 0 gives 0 (numpy's result; C's would trap) */
static inline int64_t eqf_floordiv_i(int64_t a, int64_t b)
{
    if (b == 0 || (b == -1 && a == INT64_MIN))
        return b == 0 ? 0 : a;
    int64_t q = a / b;
    return q - ((a % b != 0) && ((a < 0) != (b < 0)));
}
static inline int64_t eqf_mod_i(int64_t a, int64_t b)
{
    if (b == 0 || b == -1)
        return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline float eqf_floordiv_f(float a, float b) { return floorf(a / b); }
static inline float eqf_mod_f(float a, float b)
{
    float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
#define eqf_floordiv(a, b) _Generic((a) + (b), float: eqf_floordiv_f, double: eqf_floordiv_f, default: eqf_floordiv_i)((a), (b))
#define eqf_mod(a, b) _Generic((a) + (b), float: eqf_mod_f, double: eqf_mod_f, default: eqf_mod_i)((a), (b))
/* bf16 (the top 16 bits of an f32) as vcvtne2ps2bf16 rounds: to nearest even, a zero or
 * denormal input to a zero of its sign, a NaN to a quiet NaN. The scalar packing code and the
 * fallback path (no AVX512_BF16) round with it, so every path multiplies the same bf16 values
 * (docs/precision.md). */
static inline uint32_t eqf_bf16_bits(uint32_t u) /* (of an f32's bits; branchless: loops of it vectorize) */
{
    const uint32_t r = (u & 0x7f800000u) == 0 ? (u >> 16) & 0x8000u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x0040u) & 0xffffu : r;
}
static inline uint16_t eqf_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return (uint16_t)eqf_bf16_bits(u);
}
/* a bf16 widened to f32 (exact: a shift) */
static inline float eqf_bf16_f32(uint16_t h)
{
    const uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
/* x rounded to bf16, as an f32 */
static inline float eqf_bf16_round(float x) { return eqf_bf16_f32(eqf_bf16(x)); }
/* the K-pair (lo at k, hi at k + 1) as one 32-bit lane of a vdpbf16ps operand: lo in the low half */
static inline uint32_t eqf_bf16_pair(float lo, float hi) { return (uint32_t)eqf_bf16(lo) | (uint32_t)eqf_bf16(hi) << 16; }
/* dst[c] = the K-pairs (lo[c], hi[c]) for c < n, hi NULL: a zero high half (a row of pairs of two
 * input planes, the bf16 grouped conv's copy, conv_grouped.c) */
static inline void eqf_bf16_pairs(const float* restrict lo, const float* restrict hi, uint32_t* restrict dst, long n)
{
    uint32_t a, b;
    if (hi)
        for (long c = 0; c < n; c++) {
            memcpy(&a, lo + c, 4);
            memcpy(&b, hi + c, 4);
            dst[c] = eqf_bf16_bits(a) | eqf_bf16_bits(b) << 16;
        }
    else
        for (long c = 0; c < n; c++) {
            memcpy(&a, lo + c, 4);
            dst[c] = eqf_bf16_bits(a);
        }
}

/* ONNX QuantizeLinear as onnxruntime computes it: x / scale (a true division), rounded half to even
 * (nearbyintf in the default rounding mode), plus the zero point, saturated to [lo, hi] (the
 * integer type's range, from the zero point's C type by EQF_QLO/EQF_QHI); a NaN gives lo, as
 * onnxruntime's max(x, lo) does: r > lo is false for a NaN, so the lower bound's compare is the
 * NaN test too (a vector loop: one compare a bound, no third for r != r) */
static inline float eqf_quantize(float x, float s, float zp, float lo, float hi)
{
    const float r = nearbyintf(x / s) + zp;
    const float t = r > lo ? r : lo;
    return t < hi ? t : hi;
}
/* ONNX DynamicQuantizeLinear's scale and zero point of the two floats (a, b) of dynamic_range: the
 * range [lo, hi] of {a, b, 0} (a NaN passed over, as the range pass does; over a range, lo = a
 * and hi = b), scale = (hi - lo) / 255 in f32 (1 when hi == lo), zero point =
 * saturate(round_half_even(-lo / scale)) as onnxruntime. Read by the kernels that compute them
 * from the range's two floats (a scalar kernel, a GEMM epilogue, the integer GEMM's quantize_a). */
static inline float eqf_range_scale(float a, float b)
{
    float lo = a < 0.0f ? a : 0.0f, hi = a > 0.0f ? a : 0.0f;
    lo = b < lo ? b : lo;
    hi = b > hi ? b : hi;
    return hi == lo ? 1.0f : (hi - lo) / 255.0f;
}
static inline uint8_t eqf_range_zero_point(float a, float b)
{
    float lo = a < 0.0f ? a : 0.0f;
    lo = b < lo ? b : lo;
    return (uint8_t)eqf_quantize(-lo, eqf_range_scale(a, b), 0.0f, 0.0f, 255.0f);
}
#define EQF_QSIGNED(z) ((__typeof__(z))-1 < 0)
#define EQF_QLO(z) (EQF_QSIGNED(z) ? -128.0f : 0.0f)
#define EQF_QHI(z) (EQF_QSIGNED(z) ? 127.0f : 255.0f)

static inline float eqf_relu(float x) { return (x != x || x > 0.0f) ? x : 0.0f; }

/* An attention score in base 2 (x times log2 e, for the online softmax's 2^(s - m)). A mask of
 * the most negative float (transformers' eager attentions: masked_fill with finfo.min) times
 * log2 e would overflow to -inf, and a row whose every key is masked so would be NaN where
 * numpy's softmax of those finite scores weighs the keys evenly: such a score stays the most
 * negative float. -inf (a key left out) and NaN stay what they are. */
static inline float eqf_score2(float x, float log2e)
{
    const float y = x * log2e;
    return (y < -3.4028235e38f && x > -INFINITY) ? -3.4028235e38f : y;
}
/* a ** b; a square or a cube as products (the optimizer's cube_as_pow writes x * x * x as x ** 3,
 * and its rules pow_two and pow_three prove them equal), with a constant b folded by the compiler,
 * so that a loop over it vectorizes: libm's powf is a scalar call (a quantized GPT-2's GELU, whose
 * dequantized cube matches no gelu pattern: benchmarks/bench_models.py --quantized static) */
static inline float eqf_pow(float a, float b) { return b == 2.0f ? a * a : b == 3.0f ? a * a * a : powf(a, b); }

/* e^x = 2^k * y: k = round(x / ln 2) by the 1.5 * 2^23 trick, y = Cephes' degree-6 polynomial of
 * the remainder (relative error < 2e-7). Plain arithmetic and memcpy bit casts, so `omp simd`
 * loops and GEMM epilogues vectorize it (libm's expf does not without -ffast-math). */
static inline float eqf_exp_parts(float x, int32_t* k)
{
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    /* the polynomial by Estrin's scheme (pairs, then powers r^2 and r^4): a dependency chain of
     * three multiply-adds where Horner's has six, so that a loop over exp (a GELU or softmax
     * epilogue) overlaps more elements in flight (benchmarks/bench_gemm.py --peers --only 256x3072x768) */
    const float r2 = r * r, r4 = r2 * r2;
    const float p = (5.0000001201e-1f + r * 1.6666665459e-1f) + r2 * (4.1665795894e-2f + r * 8.3334519073e-3f)
                    + r4 * (1.3981999507e-3f + r * 1.9875691500e-4f);
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    *k = ti - 0x4B400000;
    return p * r2 + r + 1.0f;
}

static inline float eqf_pow2i(int32_t k)  /* 2^k for -126 <= k <= 127 */
{
    const int32_t si = (k + 127) * (1 << 23);
    float s;
    memcpy(&s, &si, sizeof s);
    return s;
}

/* exp for softmax and attention (inputs <= 0 there): x clamped to [-87, 88] and 0 below -87,
 * so that a key masked by f32's lowest value gets probability 0 exactly, as with AVX-512's
 * vscalefps (eqf_exp2_ps) and onnxruntime; one scale multiply (the op table's exp is eqf_expf). */
static inline float eqf_exp(float x)
{
    int32_t k;
    const float y = eqf_exp_parts(x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x), &k);
    return x < -87.0f ? 0.0f : y * eqf_pow2i(k);
}

/* exp, tanh and erf of the op table (and sigmoid, silu, gelu built on them), written so that gcc
 * vectorizes them inside kernel loops and GEMM epilogues: libm's expf / tanhf / erff are scalar
 * calls without -ffast-math (a gelu epilogue then cost more than the GEMM before it:
 * benchmarks/bench_gemm.py --peers --only 256x3072x768).
 * Branch-free: both sides of each select are computed. Errors (float32, checked against float64
 * in tests/test_kernels_c.py, over [-120, 120] and the special values): relative < 1e-6. */
static inline float eqf_expf(float x)
{
    /* the exp op over its full range: inf above 88.72, subnormal results down to -103.97, 0
     * below. 2^k as 2^(k/2) * 2^(k - k/2): both halves are normal for -150 <= k <= 128, y * 2^(k/2)
     * is exact and the second product rounds once, into the subnormals when k < -126 (the same
     * two multiplies as for k near 128: no extra work on the common path) */
    int32_t k;
    const float y = eqf_exp_parts(x < -103.98f ? -103.98f : (x > 88.7228394f ? 88.7228394f : x), &k);
    const float e = y * eqf_pow2i(k / 2) * eqf_pow2i(k - k / 2);
    return x > 88.7228394f ? INFINITY : (x < -103.98f ? 0.0f : e);
}

static inline float eqf_tanhf(float x)
{
    const float a = fabsf(x), a2 = a * a;
    const float e = eqf_expf(-2.0f * a);
    const float big = (1.0f - e) / (1.0f + e);
    /* below 0.25 the series: 1 - e would cancel */
    const float small = a * (1.0f + a2 * (-0.333333333f + a2 * (0.133333333f + a2 * (-0.0539682540f
                                                                                  + a2 * 0.0218694885f))));
    return copysignf(a < 0.25f ? small : big, x);
}

/* erfc for a >= 0 (Numerical Recipes' erfcc, Chebyshev fit: relative error ~1e-7 everywhere, so
 * tails like gelu's 1 + erf(-4) = erfc(4) keep their digits). The exp is eqf_exp, which clamps
 * below -87 instead of going subnormal: its argument p - a^2 is below -87 only for a > 9.3, where
 * erfc < 1e-38, and eqf_exp costs a multiply and three selects less (the GELU epilogue of
 * benchmarks/bench_gemm.py --peers --only 256x3072x768) */
static inline float eqf_erfc_pos(float a)
{
    const float t = 2.0f / (2.0f + a);
    /* Estrin's scheme, as in eqf_exp_parts: four multiply-adds deep instead of Horner's nine */
    const float t2 = t * t, t4 = t2 * t2, t8 = t4 * t4;
    const float p = ((-1.26551223f + t * 1.00002368f) + t2 * (0.37409196f + t * 0.09678418f))
                    + t4 * ((-0.18628806f + t * 0.27886807f) + t2 * (-1.13520398f + t * 1.48851587f))
                    + t8 * (-0.82215223f + t * 0.17087277f);
    return t * eqf_exp(p - a * a);
}

static inline float eqf_erff(float x)
{
    const float a = fabsf(x), a2 = a * a;
    /* below 0.5 the Taylor series (relative accuracy near 0), above 1 - erfc */
    const float small = 1.1283791671f * a * (1.0f + a2 * (-0.333333333f + a2 * (0.1f + a2 * (-0.0238095238f
                                                        + a2 * (0.00462962963f - a2 * 0.000757575758f)))));
    return copysignf(a < 0.5f ? small : 1.0f - eqf_erfc_pos(a), x);
}

static inline float eqf_sigmoid(float x)
{
    const float e = eqf_expf(-fabsf(x));  /* never overflows: sigmoid(-x) = e / (1 + e) keeps its digits */
    return (x < 0.0f ? e : 1.0f) / (1.0f + e);
}
/* x sigmoid(x) = x / (1 + e) for x >= 0, x e / (1 + e) for x < 0 (e = e^-|x|). For x < 0 the
 * product x y / (1 + e) is formed before the scale 2^k of e = y 2^k is applied, so a subnormal
 * result (x below -87) rounds once instead of carrying x times a subnormal's rounding error */
static inline float eqf_silu(float x)
{
    int32_t k;
    const float a = -fabsf(x);
    const float y = eqf_exp_parts(a < -120.0f ? -120.0f : a, &k);
    const float s1 = eqf_pow2i(k / 2), s2 = eqf_pow2i(k - k / 2);  /* k >= -174: both normal */
    const float q = (x < 0.0f ? x * y : x) / (1.0f + y * s1 * s2);  /* one division */
    const float neg = x < -120.0f ? x * 0.0f : q * s1 * s2;  /* -0, and NaN at -inf as numpy */
    return x < 0.0f ? neg : q;
}
/* clip(alpha x + beta, 0, 1); NaN passes through (both comparisons are false) */
static inline float eqf_hard_sigmoid(float x, float alpha, float beta)
{
    const float y = alpha * x + beta;
    return y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y);
}
/* log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)): never overflows */
static inline float eqf_softplus(float x)
{
    return (x > 0.0f ? x : 0.0f) + log1pf(eqf_expf(-fabsf(x)));
}
/* gelu's 1 + tanh(u) and 1 + erf(z) written without the cancellation of 1 + (-0.99999...) */
static inline float eqf_gelu_tanh(float x)
{
    const float u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
    const float e = eqf_expf(-2.0f * fabsf(u));
    return 0.5f * x * ((u < 0.0f ? 2.0f * e : 2.0f) / (1.0f + e));
}
static inline float eqf_gelu_erf(float x)
{
    const float c = eqf_erfc_pos(fabsf(x) * 0.7071067811865476f);
    return 0.5f * x * (x < 0.0f ? c : 2.0f - c);
}

/* sin and cos, vectorizable (libm's sinf / cosf are scalar calls: an `omp simd` loop over them
 * does not vectorize). x = n pi/2 + r with |r| <= pi/4 (a hair more where x 2/pi rounds near a
 * half), then sin or cos of r by the quadrant n mod 4, all in double and rounded once to float:
 * - |x| < 2^24: n = round(x 2/pi) < 2^24, r = ((x - n P1) - n P2) - n P3 (Cody and Waite; P1 and
 *   P2 hold 29 bits of pi/2, so n P1 and n P2 are exact and x - n P1 is exact by Sterbenz's
 *   lemma; P3 the next 53 bits): |r's error| <= 2^-52 |r| + 2^-85;
 * - |x| >= 2^24: x = m 2^E (m < 2^24 an integer, 1 <= E <= 104) and x 2/pi mod 4 = m (2^E 2/pi
 *   mod 4), the latter from eqf_2opi[.][E - 1]: its 72 bits from weight 2 down to 2^-70 in three
 *   24-bit integers (Payne and Hanek's reduction, by table), so each product m x chunk is exact in
 *   double: |r's error| <= (2^-46 + 2^-50) pi/2 < 3e-14;
 * - the Taylor polynomials of sin r (to r^11) and cos r (to r^12) on |r| <= pi/4: remainder
 *   <= 1e-11 relative.
 * So for |x| < 2^24 the float result is within 1 ulp of sin x (half an ulp from the final
 * rounding, a relative 1e-11 before it), for larger |x| within 1 ulp + 3e-14; inf and NaN give
 * NaN, -0 gives -0 (sin). Checked against numpy's float64 sin and cos in tests/test_kernels_c.py
 * (test_sin_cos_accuracy) over |x| <= 1e4 densely and random x up to 3e38. The table is 2/pi's
 * bits: int(2^(E + 71) / pi) mod 2^72, split in 24-bit chunks (the test recomputes it). */
static const int32_t eqf_2opi[3][104] = {
  {
    5340353, 10680707, 4584198, 9168397, 1559579, 3119158, 6238317, 12476635, 8176055, 16352110, 15927004,
    15076793, 13376370, 9975524, 3173833, 6347667, 12695335, 8613454, 449692, 899385, 1798770, 3597540,
    7195080, 14390161, 12003106, 7228996, 14457992, 12138768, 7500320, 15000641, 13224066, 9670917, 2564618,
    5129237, 10258474, 3739732, 7479465, 14958930, 13140645, 9504074, 2230932, 4461865, 8923731, 1070247,
    2140495, 4280991, 8561983, 346751, 693502, 1387004, 2774008, 5548016, 11096033, 5414850, 10829700,
    4882185, 9764371, 2751527, 5503054, 11006109, 5235002, 10470005, 4162794, 8325589, 16651179, 16525143,
    16273071, 15768927, 14760638, 12744061, 8710906, 644596, 1289192, 2578385, 5156771, 10313543, 3849871,
    7699743, 15399486, 14021757, 11266298, 5755381, 11510762, 6244308, 12488617, 8200019, 16400038, 16022861,
    15268506, 13759796, 10742377, 4707539, 9415078, 2052941, 4105883, 8211767, 16423534, 16069853, 15362491,
    13947767, 11118318, 5459420, 10918840, 5060464
  }, {
    12003106, 7228996, 14457992, 12138768, 7500320, 15000641, 13224066, 9670917, 2564618, 5129237, 10258474,
    3739732, 7479465, 14958930, 13140645, 9504074, 2230932, 4461865, 8923731, 1070247, 2140495, 4280991,
    8561983, 346751, 693502, 1387004, 2774008, 5548016, 11096033, 5414850, 10829700, 4882185, 9764371,
    2751527, 5503054, 11006109, 5235002, 10470005, 4162794, 8325589, 16651179, 16525143, 16273071, 15768927,
    14760638, 12744061, 8710906, 644596, 1289192, 2578385, 5156771, 10313543, 3849871, 7699743, 15399486,
    14021757, 11266298, 5755381, 11510762, 6244308, 12488617, 8200019, 16400038, 16022861, 15268506,
    13759796, 10742377, 4707539, 9415078, 2052941, 4105883, 8211767, 16423534, 16069853, 15362491, 13947767,
    11118318, 5459420, 10918840, 5060464, 10120928, 3464640, 6929281, 13858563, 10939910, 5102605, 10205211,
    3633206, 7266413, 14532827, 12288438, 7799661, 15599323, 14421430, 12065644, 7354072, 14708145, 12639074,
    8500933, 224650, 449300, 898601, 1797202, 3594405
  }, {
    693502, 1387004, 2774008, 5548016, 11096033, 5414850, 10829700, 4882185, 9764371, 2751527, 5503054,
    11006109, 5235002, 10470005, 4162794, 8325589, 16651179, 16525143, 16273071, 15768927, 14760638,
    12744061, 8710906, 644596, 1289192, 2578385, 5156771, 10313543, 3849871, 7699743, 15399486, 14021757,
    11266298, 5755381, 11510762, 6244308, 12488617, 8200019, 16400038, 16022861, 15268506, 13759796,
    10742377, 4707539, 9415078, 2052941, 4105883, 8211767, 16423534, 16069853, 15362491, 13947767, 11118318,
    5459420, 10918840, 5060464, 10120928, 3464640, 6929281, 13858563, 10939910, 5102605, 10205211, 3633206,
    7266413, 14532827, 12288438, 7799661, 15599323, 14421430, 12065644, 7354072, 14708145, 12639074, 8500933,
    224650, 449300, 898601, 1797202, 3594405, 7188810, 14377621, 11978027, 7178838, 14357676, 11938137,
    7099059, 14198118, 11619020, 6460825, 12921650, 9066084, 1354953, 2709907, 5419815, 10839631, 4902046,
    9804092, 2830968, 5661937, 11323874, 5870532, 11741064, 6704912
  }
};

/* sin r or cos r by the quadrant q (n + cosine) mod 4, rounded once to float */
static inline float eqf_sincos_poly(double r, int32_t q)
{
    const double r2 = r * r;
    const double s = r + r * r2 * (-1.6666666666666666e-1 + r2 * (8.3333333333333333e-3 + r2 * (-1.9841269841269841e-4
                     + r2 * (2.7557319223985891e-6 + r2 * (-2.5052108385441719e-8)))));
    const double c = 1.0 + r2 * (-0.5 + r2 * (4.1666666666666667e-2 + r2 * (-1.3888888888888889e-3
                     + r2 * (2.4801587301587302e-5 + r2 * (-2.7557319223985891e-7 + r2 * 2.0876756987868099e-9)))));
    const double v = q & 1 ? c : s;
    return (float)(q & 2 ? -v : v);
}

/* The reduction of |x| < 2^24 only (Cody and Waite), and its result: exact there, meaningless
 * for larger |x|, inf and NaN. A pointwise kernel computes a tile with it and, if any element of
 * the tile fails the op table's guard (|x| < 2^24, false for NaN), computes the tile again with
 * eqf_sincos: the table reduction's loads and integer steps are then paid only by tiles that need
 * them, where a single vector loop would compute both reductions for every lane. */
static inline float eqf_sincos_small(float x, int cosine)
{
    const double xd = x, big = 6755399441055744.0; /* 1.5 x 2^52: adding it rounds to an integer */
    const double n = (xd * 0.63661977236758134 + big) - big;
    const double r = ((xd - n * 1.5707963258028030) - n * 9.9209357742879870e-10) - n * 2.2517417741562176e-18;
    const float res = eqf_sincos_poly(r, ((int32_t)n + cosine) & 3);
    return !cosine && x == 0.0f ? x : res;
}

static inline float eqf_sincos(float x, int cosine)
{
    const double xd = x, big = 6755399441055744.0; /* 1.5 x 2^52: adding it rounds to an integer */
    /* |x| < 2^24 */
    const double nm = (xd * 0.63661977236758134 + big) - big;
    const double rm = ((xd - nm * 1.5707963258028030) - nm * 9.9209357742879870e-10) - nm * 2.2517417741562176e-18;
    /* |x| >= 2^24 */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int32_t e = (int32_t)((u >> 23) & 0xff) - 150, i = e < 1 ? 0 : (e > 104 ? 103 : e - 1);
    const double m = (double)(int32_t)((u & 0x7fffff) | 0x800000);
    const double p0 = m * (double)eqf_2opi[0][i]; /* an integer below 2^48: its bits from weight 2 up are 0 mod 4 */
    const double y = (p0 - 16777216.0 * floor(p0 * 5.9604644775390625e-8)) * 2.384185791015625e-7
                     + m * (double)eqf_2opi[1][i] * 1.4210854715202004e-14
                     + m * (double)eqf_2opi[2][i] * 8.470329472543003e-22;
    const double nl = (y + big) - big;
    const double rl = (y - nl) * 1.5707963267948966;
    const int large = fabsf(x) >= 16777216.0f;
    const double r = large ? (x < 0.0f ? -rl : rl) : rm, n = large ? (x < 0.0f ? -nl : nl) : nm;
    const float res = eqf_sincos_poly(r, ((int32_t)n + cosine) & 3);
    return fabsf(x) <= 3.4028235e38f ? (!cosine && x == 0.0f ? x : res) : x - x;
}
static inline float eqf_sinf(float x) { return eqf_sincos(x, 0); }
static inline float eqf_cosf(float x) { return eqf_sincos(x, 1); }
static inline float eqf_sinf_small(float x) { return eqf_sincos_small(x, 0); }
static inline float eqf_cosf_small(float x) { return eqf_sincos_small(x, 1); }

/* Online softmax step of flash attention, in base 2 (scores arrive multiplied by log2 e), for one
 * row of n scores s (in place: s becomes p = 2^(s - m)). m is the row's running maximum; it is
 * raised only when the tile's maximum passes it by more than EQF_LAZY (so p stays below 2^8),
 * and raising it rescales the row's accumulators acc[dv] and sum by 2^(m_old - m_new): after the
 * first tiles that is rare (the lazy rescale of FlashAttention-4). While the row has seen only
 * -inf (masked keys), the base is 0. The sum l is kept in 16 lanes (the AVX-512 version adds one
 * vector per tile and reduces once at the end; this portable one uses lane 0). */
#define EQF_LAZY 8.0f
#define EQF_LOG2E 1.44269504088896341f
static inline float eqf_exp2(float x)  /* 2^x for x <= 0 in softmax; 0 below -125.5 (eqf_exp) */
{
    return eqf_exp((x < -126.0f ? -126.0f : x) * 0.693147180559945309f);
}
static inline void eqf_softmax2_row(float* restrict s, long n, float* restrict m, float* restrict l,
                                    float* restrict acc, long dv)
{
    float tm = -INFINITY;
    #pragma omp simd reduction(max:tm)
    for (long j = 0; j < n; j++)
        tm = s[j] > tm ? s[j] : tm;
    if (tm > *m + EQF_LAZY) {
        const float alpha = *m == -INFINITY ? 0.0f : eqf_exp2(*m - tm);
        #pragma omp simd
        for (long e = 0; e < dv; e++)
            acc[e] *= alpha;
        for (int u = 0; u < 16; u++)
            l[u] *= alpha;
        *m = tm;
    }
    const float base = *m == -INFINITY ? 0.0f : *m;
    float ps = 0.0f;
    #pragma omp simd reduction(+:ps)
    for (long j = 0; j < n; j++) {
        const float p = eqf_exp2(s[j] - base);
        s[j] = p;
        ps += p;
    }
    l[0] += ps;
}

/* Scratch buffer `slot` of the calling thread, at least `floats` long, 64-byte aligned, or NULL
 * when it cannot be allocated. Kept from call to call: a fresh buffer of a few MB is a fresh mmap,
 * and its page faults cost more than packing a small problem. A slot is shared by every kernel
 * of its kind in the module (kernels run one after another); per thread, so concurrent callers
 * (cffi releases the GIL) and the threads of a parallel region never share one. A thread's
 * buffers hang off a pthread key whose destructor frees them when the thread exits (a Python
 * thread, and the OpenMP workers of its team), so short-lived threads do not leak them.
 * EQFUSE_SCRATCH_LIMIT=BYTES (read when a buffer grows) makes any larger buffer fail as an
 * allocation failure would: a cap, and the hook the tests use to check the MemoryError path. */
enum { EQF_SCRATCH_GEMM_A, EQF_SCRATCH_GEMM_B, EQF_SCRATCH_ATTENTION_KT, EQF_SCRATCH_CONV_COL, EQF_SCRATCH_ATTN_ROW,
       EQF_SCRATCH_ATTN_STATS, EQF_SCRATCH_ATTENTION_V, EQF_SCRATCH_CONV_TILE, EQF_SCRATCH_SLOTS };
typedef struct { float* buf[EQF_SCRATCH_SLOTS]; long cap[EQF_SCRATCH_SLOTS]; } eqf_scratch_set;
EQF_HIDDEN float* eqf_scratch(int slot, long floats);

/* A kernel whose scratch buffer could not be allocated skips its work and, on the calling thread
 * after its parallel region, calls eqf_nomem_note(); the graph's run function checks
 * eqf_nomem_take() after each kernel and returns EQF_NOMEM (Python raises MemoryError). A kernel
 * that cannot run for another reason notes its code the same way (eqf_fail_note): EQF_NO_AMX, the
 * AMX tile state refused by the operating system (common_amx.h). */
enum { EQF_NOMEM = -1, EQF_NO_AMX = -3 };
extern EQF_HIDDEN _Thread_local int eqf_nomem; /* 0, or the code of the failure a kernel noted */
__attribute__((unused)) static void eqf_nomem_note(void) { eqf_nomem = EQF_NOMEM; }
__attribute__((unused)) static void eqf_fail_note(int code) { eqf_nomem = code; }
__attribute__((unused)) static int eqf_nomem_take(void)
{
    const int r = eqf_nomem;
    eqf_nomem = 0;
    return r;
}

static inline long eqf_minl(long a, long b) { return a < b ? a : b; }

/* The attribute of a row kernel's function by its plan's quantize_out (EQF_QUANTIZE_ROW_ATTR(1) or
 * (0)): gcc's partial redundancy elimination turns a scalar the prologue and the quantize both read
 * (quantize_static's one zero point for a DequantizeLinear and the QuantizeLinear after the row op)
 * into control flow in the last pass, which then is not vectorized (-fopt-info-vec: "control flow
 * in loop"); without it, the pass vectorizes. An f32 row keeps gcc's default. */
#define EQF_QUANTIZE_ROW_ATTR_1 __attribute__((optimize("no-tree-pre")))
#define EQF_QUANTIZE_ROW_ATTR_0
#define EQF_QUANTIZE_ROW_ATTR_(q) EQF_QUANTIZE_ROW_ATTR_##q
#define EQF_QUANTIZE_ROW_ATTR(q) EQF_QUANTIZE_ROW_ATTR_(q)

/* Compute-bound templates open with EQF_WIDE_BEGIN and close with EQF_WIDE_END: gcc prefers
 * 256-bit vectors on these cores by default; full 512-bit ones pay off inside cache-resident tiles. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define EQF_WIDE_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"prefer-vector-width=512\")")
#define EQF_WIDE_END _Pragma("GCC pop_options")
#else
#define EQF_WIDE_BEGIN
#define EQF_WIDE_END
#endif

/* ---- A depthwise conv over bands of output rows (conv_dwpw.c, conv_dwln.c).
 * EQF_BAND_SIZES: the members of a template's enum that follow from its shape (W, OH, OW, KH, KW,
 * SH, SW, PW, DH, DW), its vector's floats VL and its band's output rows BAND, which it names first.
 * The padded rows BHP x WP match ConvGeometry.in_rows and in_cols (backend/kinds/contraction/conv_geometry.py). */
#define EQF_BAND_SIZES                                                                                       \
    NBAND = (OH + BAND - 1) / BAND /* bands per image */,                                                    \
    BP = (BAND * OW + VL - 1) / VL * VL /* a band's pixels, whole vectors */,                                \
    BHP = (BAND - 1) * SH + (KH - 1) * DH + 1, WP = (OW - 1) * SW + (KW - 1) * DW + 1 /* a band's padded input */, \
    WC = W < WP - PW ? W : WP - PW /* the input columns that some tap reads */,                              \
    XP = BHP * WP + VL + KW * DW /* (and what the last vector over q reads past the rows) */
/* Task `task`, of NBAND bands of BAND rows per image: image b's output rows [r0, r0 + rows), its
 * P = rows x OW pixels, which read bh padded input rows: band row hr is input row top + hr, inside
 * the image for hr in [lo, hi), above it before lo, below it from hi. */
typedef struct {
    long b, r0, rows, P, bh, top, lo, hi;
} eqf_band_t;

static inline eqf_band_t eqf_band_task(long task, long NBAND, long BAND, long H, long OH, long OW, long KH, long SH,
                                       long PH, long DH)
{
    eqf_band_t t;
    t.b = task / NBAND;
    t.r0 = task % NBAND * BAND;
    t.rows = OH - t.r0 < BAND ? OH - t.r0 : BAND;
    t.P = t.rows * OW;
    t.bh = (t.rows - 1) * SH + (KH - 1) * DH + 1;
    t.top = t.r0 * SH - PH;
    t.lo = t.top < 0 ? (-t.top < t.bh ? -t.top : t.bh) : 0;
    t.hi = H - t.top < t.lo ? t.lo : (H - t.top < t.bh ? H - t.top : t.bh);
    return t;
}

/* One channel's band of zero-padded input rows xq[bh][WP] (every tap reads inside), then zeros up
 * to xq[n] (n = bh WP: none; a template's vectors over the run of rows read past them): band row hr
 * inside the image is the WC columns at src + (row0 + hr) W, at column PW. Three loops over the
 * rows without a branch inside: gcc 12 at -O3 vectorized one loop with the branch over the rows
 * wrongly, a stride-2 conv of 9-pixel rows reading garbage. A row's columns are one memcpy of a
 * constant size, which gcc writes as whole-vector moves; as a loop, once this function was
 * inlined, gcc unrolled it into scalar moves (the fused inverted residuals of
 * benchmarks/bench_dwpw.py --blocks, each built from both in one process, calls alternating:
 * 4-5% slower than with the loop written in conv_dwpw.c). */
static inline void eqf_band_rows(float* restrict xq, const float* restrict src, long row0, const eqf_band_t* t,
                                 long W, long WP, long PW, long WC, long n)
{
    for (long q = 0; q < t->lo * WP; q++)
        xq[q] = 0.0f;
    for (long hr = t->lo; hr < t->hi; hr++) {
        float* xr = xq + hr * WP;
        const float* restrict xs = src + (row0 + hr) * W;
        for (long q = 0; q < PW; q++)
            xr[q] = 0.0f;
        memcpy(xr + PW, xs, WC * sizeof(float));
        for (long q = PW + WC; q < WP; q++)
            xr[q] = 0.0f;
    }
    for (long q = t->hi * WP; q < n; q++)
        xq[q] = 0.0f;
}

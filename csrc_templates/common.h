/* eqfuse common header: helpers named by the op table's C expressions and by the templates.
 * Every generated source starts with this header; all helpers are static inline so that
 * several kernels (and several builds) can include it without clashes. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* NaN-propagating like numpy's maximum/minimum (and relu = maximum(x, 0)). */
static inline float eqf_max(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float eqf_min(float a, float b) { return (a != a || a < b) ? a : b; }
static inline float eqf_relu(float x) { return (x != x || x > 0.0f) ? x : 0.0f; }
static inline float eqf_pow(float a, float b) { return powf(a, b); }
static inline float eqf_gelu_tanh(float x)
{
    return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}
static inline float eqf_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

/* exp for softmax and attention: Cephes-style range reduction and a degree-6 polynomial,
 * plain arithmetic so that `omp simd` loops vectorize it (libm's expf does not without
 * -ffast-math). Relative error ~2 ulp on [-87, 88]; inputs below -87 give ~1e-38, not 0. */
static inline float eqf_exp(float x)
{
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    union { int32_t i; float f; } s;
    s.i = ((int32_t)n + 127) << 23;
    return y * s.f;
}

static inline long eqf_minl(long a, long b) { return a < b ? a : b; }

/* Copy a tile to memory with non-temporal stores (no read-for-ownership of the destination):
 * for outputs much larger than the caches. Callers end the kernel with eqf_sfence(). */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline void eqf_stream(float* restrict dst, const float* restrict src, long n)
{
    long k = 0;
    for (; k < n && ((uintptr_t)(dst + k) & 63); k++)
        dst[k] = src[k];
    for (; k + 16 <= n; k += 16)
        _mm512_stream_ps(dst + k, _mm512_loadu_ps(src + k));
    for (; k < n; k++)
        dst[k] = src[k];
}
static inline void eqf_sfence(void) { _mm_sfence(); }
#else
static inline void eqf_stream(float* restrict dst, const float* restrict src, long n)
{
    memcpy(dst, src, sizeof(float) * (size_t)n);
}
static inline void eqf_sfence(void) {}
#endif

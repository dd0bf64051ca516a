/* eqfuse common header: helpers named by the op table's C expressions and by the templates.
 * Every generated source starts with this header; all helpers are static inline so that
 * several kernels (and several builds) can include it without clashes. */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* NaN-propagating like numpy's maximum/minimum (and relu = maximum(x, 0)). */
static inline float eqf_max(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float eqf_min(float a, float b) { return (a != a || a < b) ? a : b; }
static inline float eqf_relu(float x) { return (x != x || x > 0.0f) ? x : 0.0f; }
static inline float eqf_pow(float a, float b) { return powf(a, b); }

/* e^x = 2^k * y: k = round(x / ln 2) by the 1.5 * 2^23 trick, y = Cephes' degree-6 polynomial of
 * the remainder (relative error < 2e-7). Plain arithmetic and memcpy bit casts, so `omp simd`
 * loops and GEMM epilogues vectorize it (libm's expf does not without -ffast-math). */
static inline float eqf_exp_parts(float x, int32_t* k)
{
    const float t = x * 1.44269504088896341f + 12582912.0f;
    const float n = t - 12582912.0f;
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    int32_t ti;
    memcpy(&ti, &t, sizeof ti);
    *k = ti - 0x4B400000;
    return p * r * r + r + 1.0f;
}

static inline float eqf_pow2i(int32_t k)  /* 2^k for -126 <= k <= 127 */
{
    const int32_t si = (k + 127) * (1 << 23);
    float s;
    memcpy(&s, &si, sizeof s);
    return s;
}

/* exp for softmax and attention (inputs <= 0 there): x clamped to [-87, 88], so below -87 it
 * gives ~1e-38 rather than 0; one scale multiply (the op table's exp is eqf_expf). */
static inline float eqf_exp(float x)
{
    int32_t k;
    const float y = eqf_exp_parts(x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x), &k);
    return y * eqf_pow2i(k);
}

/* exp, tanh and erf of the op table (and sigmoid, silu, gelu built on them), written so that gcc
 * vectorizes them inside kernel loops and GEMM epilogues: libm's expf / tanhf / erff are scalar
 * calls without -ffast-math (a gelu epilogue cost 11 ns per element, twice the GEMM before it).
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
 * tails like gelu's 1 + erf(-4) = erfc(4) keep their digits) */
static inline float eqf_erfc_pos(float a)
{
    const float t = 2.0f / (2.0f + a);
    const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f
                    + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f
                    + t * 0.17087277f))))))));
    return t * eqf_expf(p - a * a);
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

/* Online softmax step of flash attention, in base 2 (scores arrive multiplied by log2 e), for one
 * row of n scores s (in place: s becomes p = 2^(s - m)). m is the row's running maximum; it is
 * raised only when the tile's maximum passes it by more than EQF_LAZY (so p stays below 2^8),
 * and raising it rescales the row's accumulators acc[dv] and sum by 2^(m_old - m_new): after the
 * first tiles that is rare (the lazy rescale of FlashAttention-4). While the row has seen only
 * -inf (masked keys), the base is 0. The sum l is kept in 16 lanes (the AVX-512 version adds one
 * vector per tile and reduces once at the end; this portable one uses lane 0). */
#define EQF_LAZY 8.0f
#define EQF_LOG2E 1.44269504088896341f
static inline float eqf_exp2(float x)  /* 2^x for x <= 0 in softmax; below -126 gives 2^-126 */
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
       EQF_SCRATCH_ATTN_STATS, EQF_SCRATCH_SLOTS };
typedef struct { float* buf[EQF_SCRATCH_SLOTS]; long cap[EQF_SCRATCH_SLOTS]; } eqf_scratch_set;
static pthread_key_t eqf_scratch_key;
static pthread_once_t eqf_scratch_once = PTHREAD_ONCE_INIT;
static int eqf_scratch_keyed;
static void eqf_scratch_free(void* p)
{
    eqf_scratch_set* s = p;
    for (int i = 0; i < EQF_SCRATCH_SLOTS; i++)
        free(s->buf[i]);
    free(s);
}
static void eqf_scratch_init(void)
{
    if (!eqf_scratch_keyed)
        eqf_scratch_keyed = pthread_key_create(&eqf_scratch_key, eqf_scratch_free) == 0;
}
/* eqfuse's Python runtime gives every module the process's one key (HEADER_C of
 * eqfuse/backend/cbuild.py: eqf_scratch_key_get / eqf_scratch_key_adopt) */
__attribute__((unused)) static float* eqf_scratch(int slot, long floats)
{
    pthread_once(&eqf_scratch_once, eqf_scratch_init);
    if (!eqf_scratch_keyed)
        return NULL;
    eqf_scratch_set* s = pthread_getspecific(eqf_scratch_key);
    if (!s) {
        if (!(s = calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(eqf_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < floats) {
        free(s->buf[slot]);
        s->buf[slot] = NULL;
        s->cap[slot] = 0;
        const long cap = (floats + 15) / 16 * 16; /* aligned_alloc wants a multiple of the alignment */
        const char* lim = getenv("EQFUSE_SCRATCH_LIMIT");
        if (floats < 0 || (unsigned long)cap > (unsigned long)PTRDIFF_MAX / sizeof(float)
            || (lim && *lim && strtod(lim, NULL) < (double)cap * sizeof(float)))
            return NULL;
        if (!(s->buf[slot] = aligned_alloc(64, sizeof(float) * (size_t)cap)))
            return NULL;
        s->cap[slot] = cap;
    }
    return s->buf[slot];
}

/* A kernel whose scratch buffer could not be allocated skips its work and, on the calling thread
 * after its parallel region, calls eqf_nomem_note(); the graph's run function checks
 * eqf_nomem_take() after each kernel and returns EQF_NOMEM (Python raises MemoryError). */
enum { EQF_NOMEM = -1 };
static _Thread_local int eqf_nomem;
__attribute__((unused)) static void eqf_nomem_note(void) { eqf_nomem = 1; }
__attribute__((unused)) static int eqf_nomem_take(void)
{
    const int r = eqf_nomem;
    eqf_nomem = 0;
    return r;
}

static inline long eqf_minl(long a, long b) { return a < b ? a : b; }

/* Compute-bound templates open with EQF_WIDE_BEGIN and close with EQF_WIDE_END: gcc prefers
 * 256-bit vectors on these cores by default; full 512-bit ones pay off inside cache-resident tiles. */
#if defined(__AVX512F__) && defined(__GNUC__) && !defined(__clang__)
#define EQF_WIDE_BEGIN _Pragma("GCC push_options") _Pragma("GCC target(\"prefer-vector-width=512\")")
#define EQF_WIDE_END _Pragma("GCC pop_options")
#else
#define EQF_WIDE_BEGIN
#define EQF_WIDE_END
#endif

/* Store one 64-byte line (16 floats, dst 64-byte aligned, src aligned) with a non-temporal
 * store: no read-for-ownership of the destination, for outputs much larger than the caches.
 * gcc keeps `src` (a line computed by a 16-iteration SIMD loop) in a register. Each thread that
 * streams ends with eqf_sfence(). */
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE__)
#include <immintrin.h>
#endif
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
#endif

/* ---- A claim-based thread pool (the skinny GEMM's parallel loop).
 * eqf_parallel_for(n, fn, ctx, threads) runs fn(ctx, 0..n-1), each chunk once, on the calling
 * thread and on up to threads - 1 pool workers. Chunks are claimed one at a time from an atomic
 * counter, and the caller waits only for the chunks that were claimed, never for a worker that
 * has not started: when another process holds a core and a worker is not scheduled, the caller
 * takes its chunks itself. (An OpenMP region waits at its end for every thread of the team.)
 * The counter holds the job's generation in its high half, so a worker waking late cannot claim
 * a chunk of a later job. One pool per module, its workers started at its first parallel call. */
typedef void (*eqf_chunk_fn)(void* ctx, long chunk);
enum { EQF_POOL_MAX = 64 };
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    unsigned long word; /* generation << 32 | next chunk (atomic) */
    long n, done;       /* chunks of the current job, and how many have finished (atomic) */
    int allowed;        /* workers that may take part in the current job */
    eqf_chunk_fn fn;
    void* ctx;
    int workers;        /* started */
} eqf_pool_t;
static eqf_pool_t eqf_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, NULL, NULL, 0};
/* held by the caller for a whole job: a second caller at the same time (another Python thread)
 * runs its chunks itself instead of waiting */
static pthread_mutex_t eqf_pool_busy = PTHREAD_MUTEX_INITIALIZER;

/* claim and run chunks of generation gen until none is left */
static void eqf_pool_drain(unsigned long gen)
{
    for (;;) {
        unsigned long w = __atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE);
        if ((w >> 32) != gen)
            return;
        const eqf_chunk_fn fn = eqf_pool.fn;
        void* const ctx = eqf_pool.ctx;
        const long n = eqf_pool.n;
        const long k = (long)(w & 0xffffffffUL);
        if (k >= n)
            return;
        if (__atomic_compare_exchange_n(&eqf_pool.word, &w, w + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            fn(ctx, k);
            __atomic_fetch_add(&eqf_pool.done, 1, __ATOMIC_RELEASE);
        }
    }
}

static void* eqf_pool_worker(void* arg)
{
    const int id = (int)(long)arg;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&eqf_pool.mu);
        while ((__atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE) >> 32) == seen)
            pthread_cond_wait(&eqf_pool.wake, &eqf_pool.mu);
        seen = __atomic_load_n(&eqf_pool.word, __ATOMIC_ACQUIRE) >> 32;
        const int allowed = eqf_pool.allowed;
        pthread_mutex_unlock(&eqf_pool.mu);
        if (id < allowed)
            eqf_pool_drain(seen);
    }
    return NULL;
}

__attribute__((unused)) static void eqf_parallel_for(long n, eqf_chunk_fn fn, void* ctx, int threads)
{
    if (threads > EQF_POOL_MAX)
        threads = EQF_POOL_MAX;
    if (threads <= 1 || n <= 1 || pthread_mutex_trylock(&eqf_pool_busy) != 0) {
        for (long k = 0; k < n; k++)
            fn(ctx, k);
        return;
    }
    pthread_mutex_lock(&eqf_pool.mu);
    while (eqf_pool.workers < threads - 1) { /* start the missing workers (detached, for the process's life) */
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        const int ok = pthread_create(&t, &at, eqf_pool_worker, (void*)(long)eqf_pool.workers) == 0;
        pthread_attr_destroy(&at);
        if (!ok)
            break;
        eqf_pool.workers++;
    }
    const unsigned long gen = (__atomic_load_n(&eqf_pool.word, __ATOMIC_RELAXED) >> 32) + 1;
    eqf_pool.fn = fn;
    eqf_pool.ctx = ctx;
    eqf_pool.n = n;
    eqf_pool.allowed = threads - 1;
    __atomic_store_n(&eqf_pool.done, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&eqf_pool.word, (gen & 0xffffffffUL) << 32, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&eqf_pool.wake);
    pthread_mutex_unlock(&eqf_pool.mu);
    eqf_pool_drain(gen & 0xffffffffUL);
    /* every chunk is claimed: wait for the ones running on workers */
    for (long spins = 0; __atomic_load_n(&eqf_pool.done, __ATOMIC_ACQUIRE) < n; spins++)
        if (spins > 4096)
            sched_yield();
    pthread_mutex_unlock(&eqf_pool_busy);
}

/* Passes of the row templates (row_softmax.c, row_layernorm.c) over a row y of n floats at stride
 * ys, a literal there: the contiguous rows (ys == 1) of AVX-512 builds take the explicit loops
 * below, the rest the portable ones. Two or four accumulators: a single vector accumulator makes a
 * pass over a row in L1 wait on the adds' latency. `next` (or NULL) is the next row's input, n
 * contiguous floats, prefetched a line per vector while this row computes (spread over the pass:
 * a burst of 64 prefetches overflows the miss buffers and gained a third as much). */
/* Rows of a softmax block (row_softmax.c): ~2 KiB of short rows, so that their three passes stay
 * in L1 and the reductions of one row overlap the work of the others (12 x 128 x 128 scores: 34 ->
 * 29 us on one Zen 5 core); long rows one at a time (blocks of 4 x 1024 were 15% slower). */
#define EQF_ROW_BLOCK(L) ((L) <= 64 ? 8 : (L) <= 128 ? 4 : (L) <= 256 ? 2 : 1)
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

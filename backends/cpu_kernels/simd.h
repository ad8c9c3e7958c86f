/* The pieces that differ between tiers. dot32_sum: the integer dot product of a group of 32
 * int8 weights with 32 int16 activation codes, in 8 int32 lanes: lane l sums weights 2l, 2l + 1,
 * 16 + 2l and 17 + 2l (on AVX-512 VNNI one madd and one dpwssd, two instructions where madd,
 * madd and an add take three). fma8: a * b + c in 8 float lanes, rounded once (a fused
 * multiply-add is exact before its one rounding in every tier). widen8: 8 int8 codes as floats
 * (exact); widen8u: the 8 bytes of a word, LSB first, as floats; widen_half8 (x86 tiers, F16C;
 * others: attention.c's integer steps): 8 float16 as floats (exact). Integer sums are exact in
 * every tier, so the tiers agree bit for bit. Weight codes lie in [-128, 127], activation
 * codes in [-32767, 32767]: a lane is at most 4 * 128 * 32767, far from overflowing. */
#ifndef SPRIG_SIMD_H
#define SPRIG_SIMD_H

#include <stdint.h>

typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int16_t i16x8 __attribute__((vector_size(16))); /* 8 codes, narrowed from v8i */

#if defined(__AVX2__) /* and AVX-512, whose dot32_sum starts from madd: a dpwssd from zero would cost a zeroing move */
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && defined(SPRIG_YMM)
#define SPRIG_TIER "avx512_ymm"
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define SPRIG_TIER "avx512"
#else
#define SPRIG_TIER "avx2"
#endif
static inline v8i dot32_sum(const int8_t *w, const int16_t *x) {
    __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
    __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
    __m256i lo = _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)x));
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return (v8i)_mm256_dpwssd_epi32(lo, w1, _mm256_loadu_si256((const __m256i *)(x + 16)));
#else
    return (v8i)_mm256_add_epi32(lo, _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(x + 16))));
#endif
}
static inline v8f fma8(v8f a, v8f b, v8f c) { return (v8f)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c); }
static inline v8f widen8u(uint64_t bytes) {
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)bytes)));
}
static inline v8f widen8(const int8_t *q) {
    return (v8f)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}
static inline v8f widen_half8(const unsigned char *h) { return (v8f)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h)); }
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define SPRIG_TIER "neon"
static inline int32x4_t pair_sums(int8x8_t w, int16x8_t x) { /* 8 weights: 4 lanes of 2 */
    int16x8_t w16 = vmovl_s8(w);
    return vpaddq_s32(vmull_s16(vget_low_s16(w16), vget_low_s16(x)), vmull_high_s16(w16, x));
}
static inline v8i dot32_sum(const int8_t *w, const int16_t *x) {
    v8i out;
    int32_t *l = (int32_t *)&out;
    vst1q_s32(l, vaddq_s32(pair_sums(vld1_s8(w), vld1q_s16(x)), pair_sums(vld1_s8(w + 16), vld1q_s16(x + 16))));
    vst1q_s32(l + 4, vaddq_s32(pair_sums(vld1_s8(w + 8), vld1q_s16(x + 8)), pair_sums(vld1_s8(w + 24), vld1q_s16(x + 24))));
    return out;
}
static inline v8f widen8u(uint64_t bytes) {
    uint16x8_t q16 = vmovl_u8(vcreate_u8(bytes));
    v8f out;
    vst1q_f32((float *)&out, vcvtq_f32_u32(vmovl_u16(vget_low_u16(q16))));
    vst1q_f32((float *)&out + 4, vcvtq_f32_u32(vmovl_high_u16(q16)));
    return out;
}
static inline v8f fma8(v8f a, v8f b, v8f c) {
    float *pa = (float *)&a, *pb = (float *)&b, *pc = (float *)&c;
    vst1q_f32(pc, vfmaq_f32(vld1q_f32(pc), vld1q_f32(pa), vld1q_f32(pb)));
    vst1q_f32(pc + 4, vfmaq_f32(vld1q_f32(pc + 4), vld1q_f32(pa + 4), vld1q_f32(pb + 4)));
    return c;
}
static inline v8f widen8(const int8_t *q) {
    int16x8_t q16 = vmovl_s8(vld1_s8(q));
    v8f out;
    vst1q_f32((float *)&out, vcvtq_f32_s32(vmovl_s16(vget_low_s16(q16))));
    vst1q_f32((float *)&out + 4, vcvtq_f32_s32(vmovl_high_s16(q16)));
    return out;
}
#else
#define SPRIG_TIER "scalar"
static inline v8i dot32_sum(const int8_t *w, const int16_t *x) {
    v8i out;
    for (int l = 0; l < 8; l++)
        out[l] = ((int32_t)w[2 * l] * x[2 * l] + (int32_t)w[2 * l + 1] * x[2 * l + 1]) +
                 ((int32_t)w[16 + 2 * l] * x[16 + 2 * l] + (int32_t)w[17 + 2 * l] * x[17 + 2 * l]);
    return out;
}
static inline v8f widen8u(uint64_t bytes) {
    v8f out;
    for (int l = 0; l < 8; l++) out[l] = (float)(uint8_t)(bytes >> (8 * l));
    return out;
}
#include <math.h>
static inline v8f fma8(v8f a, v8f b, v8f c) {
    for (int l = 0; l < 8; l++) c[l] = fmaf(a[l], b[l], c[l]);
    return c;
}
static inline v8f widen8(const int8_t *q) {
    v8f out;
    for (int l = 0; l < 8; l++) out[l] = (float)q[l];
    return out;
}
#endif

/* Shared float helpers: plain C, the same operations in every tier (inline, since
 * the kernels call them in their inner loops). */
#include <math.h> /* INFINITY */
#include <string.h>

/* The largest |x[i]| of n values, nan if any is nan (a plain a > amax would pass over a nan,
 * and a group holding one would be quantized as if finite); the activations' quantizers refuse
 * a group whose result is not finite. */
static inline float abs_max(const float *x, int n) {
    v8f top = {0};
    v8i nan = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8) { /* 8 lanes: the largest is the same number in any order */
        v8f a;
        memcpy(&a, x + i, sizeof a);
        a = (v8f)((v8i)a & 0x7fffffff);
        v8i larger = a > top;
        top = (v8f)(((v8i)a & larger) | ((v8i)top & ~larger));
        nan |= a != a;
    }
    float amax = 0.0f;
    for (int l = 0; l < 8; l++) amax = top[l] > amax || nan[l] ? (nan[l] ? NAN : top[l]) : amax;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        amax = a > amax || a != a ? a : amax;
    }
    return amax;
}

/* round to the nearest integer, ties to even (nearbyintf in the default rounding mode), 8 lanes */
static inline v8i round8(v8f v) {
#if defined(__AVX2__)
    return (v8i)_mm256_cvtps_epi32((__m256)v);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    v8i out;
    vst1q_s32((int32_t *)&out, vcvtnq_s32_f32(vld1q_f32((const float *)&v)));
    vst1q_s32((int32_t *)&out + 4, vcvtnq_s32_f32(vld1q_f32((const float *)&v + 4)));
    return out;
#else
    v8i out;
    for (int l = 0; l < 8; l++) out[l] = (int32_t)nearbyintf(v[l]);
    return out;
#endif
}

static inline v8f splat8(float x) { return (v8f){x, x, x, x, x, x, x, x}; } /* x in every lane */

static inline float reduce8(v8f a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

/* sum of w[i] * x[i] in 8 lanes (lane i mod 8), then reduce8 */
static inline float dot_float(const float *w, const float *x, int64_t K) {
    v8f acc = {0};
    int64_t i = 0;
    for (; i + 8 <= K; i += 8) {
        v8f a, b;
        memcpy(&a, w + i, sizeof a);
        memcpy(&b, x + i, sizeof b);
        acc += a * b;
    }
    for (int l = 0; i + l < K; l++) acc[l] += w[i + l] * x[i + l];
    return reduce8(acc);
}


/* exp of 8 floats (Cephes' expf: n = round(x / ln 2), r = x - n ln 2 in two parts, a degree-6
 * polynomial, times 2^n as two factors so that subnormal results keep their bits). About 1 ulp;
 * exp(0) = 1 exactly, exp(-inf) = 0, exp(+inf) = +inf, exp(nan) = nan. Plain C in 8 lanes, so
 * every tier rounds alike. */
static inline v8f exp8(v8f x) {
    const v8f hi = {88.7228394f, 88.7228394f, 88.7228394f, 88.7228394f, 88.7228394f, 88.7228394f, 88.7228394f, 88.7228394f};
    const v8f lo = -hi - 15.0f; /* below -103.72 the result rounds to 0 */
    v8i nan = x != x, over = x > hi, under = x < lo;
    v8f c = x;
    c = (v8f)(((v8i)c & ~(over | under | nan)) | ((v8i)hi & over) | ((v8i)lo & under));
    v8f t = c * 1.44269504088896341f + 0.5f;
    v8f n = __builtin_convertvector(__builtin_convertvector(t, v8i), v8f);
    n -= (v8f)((v8i)(v8f){1, 1, 1, 1, 1, 1, 1, 1} & (n > t)); /* floor(t) */
    v8f r = c - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    v8f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    v8f y = p * (r * r) + r + 1.0f;
    v8i k = __builtin_convertvector(n, v8i), k1 = k / 2, k2 = k - k1; /* 2^n = 2^k1 * 2^k2, each normal */
    v8f s1 = (v8f)((k1 + 127) << 23), s2 = (v8f)((k2 + 127) << 23);
    y = y * s1 * s2;
    const v8f inf = {INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY};
    y = (v8f)(((v8i)y & ~(over | under | nan)) | ((v8i)inf & over) | ((v8i)x & nan));
    return y;
}

/* exp of n (0 .. 8) floats: lanes past n are padding, so a value's result never depends on its
 * neighbours or where a range was cut */
static inline void exp_floats(const float *x, float *out, int64_t n) {
    v8f a = {0};
    memcpy(&a, x, sizeof(float) * (size_t)n);
    a = exp8(a);
    memcpy(out, &a, sizeof(float) * (size_t)n);
}

#endif

/* The one piece that differs between tiers: the int8 dot product of a group of 32 weights
 * with 32 activation codes, as 8 int32 lanes, lane l summing bytes 4l .. 4l+3.
 * Integer sums are exact in every tier, so the tiers agree bit for bit.
 * Weight codes lie in [-128, 127]; activation codes in [-127, 127]. */
#ifndef SPRIG_SIMD_H
#define SPRIG_SIMD_H

#include <stdint.h>

typedef int32_t v8i __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SPRIG_TIER "avx512"
static inline v8i dot32(const int8_t *w, const int8_t *x) {
    __m256i a = _mm256_loadu_si256((const __m256i *)w);
    __m256i b = _mm256_loadu_si256((const __m256i *)x);
    /* vpdpbusd multiplies unsigned by signed: move w's sign onto x */
    return (v8i)_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
}
#elif defined(__AVX2__)
#include <immintrin.h>
#define SPRIG_TIER "avx2"
static inline v8i dot32(const int8_t *w, const int8_t *x) {
    __m256i a = _mm256_loadu_si256((const __m256i *)w);
    __m256i b = _mm256_loadu_si256((const __m256i *)x);
    /* |w| * (x * sign w): pairs in int16 (at most 2 * 128 * 127, no saturation), then fours in int32 */
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
    return (v8i)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}
#elif defined(__ARM_FEATURE_DOTPROD)
#include <arm_neon.h>
#define SPRIG_TIER "neon"
static inline v8i dot32(const int8_t *w, const int8_t *x) {
    int32x4_t lo = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(x));
    int32x4_t hi = vdotq_s32(vdupq_n_s32(0), vld1q_s8(w + 16), vld1q_s8(x + 16));
    v8i out;
    vst1q_s32((int32_t *)&out, lo);
    vst1q_s32((int32_t *)&out + 4, hi);
    return out;
}
#else
#define SPRIG_TIER "scalar"
static inline v8i dot32(const int8_t *w, const int8_t *x) {
    v8i out;
    for (int l = 0; l < 8; l++) {
        int32_t s = 0;
        for (int i = 0; i < 4; i++) s += (int32_t)w[4 * l + i] * (int32_t)x[4 * l + i];
        out[l] = s;
    }
    return out;
}
#endif

#endif

/* The x86 tiers' int16 weight vectors, shared by the products that build int16 weights in
 * registers (int16_panels.c); nothing is defined on the other tiers. */
#ifndef SPRIG_INT16_WORDS_H
#define SPRIG_INT16_WORDS_H

#include <stdint.h>

/* The x86 tiers' int16 vectors (vw, VW_WORDS words) and the float vectors of their lanes (vf):
 * vw_u8 widens bytes to words, vw_times multiplies by the word pair of an int32, vw_bit4 sets
 * bit 4 where `bits` has it (vw_top2 bits 4-5), vw_sub32 takes 32 off, vw_dot adds the pair
 * sums of a * b to acc's int32 lanes (exact), vf_fma adds float(sums) * s to acc. */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define VW_WORDS 32
typedef __m512i vw;
typedef __m512 vf;
static inline vw vw_u8(const uint8_t *p) { return _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)p)); }
static inline vw vw_load(const int16_t *p) { return _mm512_loadu_si512((const void *)p); }
static inline void vw_store(int16_t *p, vw v) { _mm512_storeu_si512((void *)p, v); }
static inline vw vw_zero(void) { return _mm512_setzero_si512(); }
static inline vw vw_low4(vw a) { return _mm512_and_si512(a, _mm512_set1_epi16(15)); }
#define vw_srli _mm512_srli_epi16
#define vw_slli _mm512_slli_epi16
static inline vw vw_times(vw a, int32_t pair) { return _mm512_mullo_epi16(a, _mm512_set1_epi32(pair)); }
static inline vw vw_bit4(vw a, vw bits) { return _mm512_ternarylogic_epi32(a, bits, _mm512_set1_epi16(16), 0xf8); }
static inline vw vw_top2(vw a, vw bits) { return _mm512_ternarylogic_epi32(a, bits, _mm512_set1_epi16(48), 0xf8); }
static inline vw vw_sub32(vw a) { return _mm512_sub_epi16(a, _mm512_set1_epi16(32)); }
static inline vw vw_dot(vw acc, vw a, vw b) { return _mm512_dpwssd_epi32(acc, a, b); }
static inline vf vf_zero(void) { return _mm512_setzero_ps(); }
static inline vf vf_fma(vf acc, vw sums, float s) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(s), acc); }
#elif defined(__AVX2__)
#include <immintrin.h>
#define VW_WORDS 16
typedef __m256i vw;
typedef __m256 vf;
static inline vw vw_u8(const uint8_t *p) { return _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p)); }
static inline vw vw_load(const int16_t *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void vw_store(int16_t *p, vw v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline vw vw_zero(void) { return _mm256_setzero_si256(); }
static inline vw vw_low4(vw a) { return _mm256_and_si256(a, _mm256_set1_epi16(15)); }
#define vw_srli _mm256_srli_epi16
#define vw_slli _mm256_slli_epi16
static inline vw vw_times(vw a, int32_t pair) { return _mm256_mullo_epi16(a, _mm256_set1_epi32(pair)); }
static inline vw vw_bit4(vw a, vw bits) { return _mm256_or_si256(a, _mm256_and_si256(bits, _mm256_set1_epi16(16))); }
static inline vw vw_top2(vw a, vw bits) { return _mm256_or_si256(a, _mm256_and_si256(bits, _mm256_set1_epi16(48))); }
static inline vw vw_sub32(vw a) { return _mm256_sub_epi16(a, _mm256_set1_epi16(32)); }
static inline vw vw_dot(vw acc, vw a, vw b) { return _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)); }
static inline vf vf_zero(void) { return _mm256_setzero_ps(); }
static inline vf vf_fma(vf acc, vw sums, float s) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(s), acc); }
#endif

#if defined(VW_WORDS)
/* A Q6_K block's 16 int8 sub-block scales as q6_k_group takes them: AVX-512, as 16 words (a
 * permute picks a group's two); AVX2, each in both words of an int32 (vw_times). */
#if VW_WORDS == 32
typedef vw Q6Scales;
static inline Q6Scales q6_k_block_scales(const uint8_t *b) {
    return _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))));
}
#else
typedef struct {
    int32_t pairs[16];
} Q6Scales;
static inline Q6Scales q6_k_block_scales(const uint8_t *b) {
    Q6Scales s;
    const __m256i words = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
    const __m256i low = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(words));
    const __m256i high = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(words, 1));
    _mm256_storeu_si256((__m256i *)s.pairs, _mm256_mullo_epi32(low, _mm256_set1_epi32(0x10001)));
    _mm256_storeu_si256((__m256i *)(s.pairs + 8), _mm256_mullo_epi32(high, _mm256_set1_epi32(0x10001)));
    return s;
}
#endif

/* Words VW_WORDS * h .. of group g of a Q6_K block as int16 weights sc * (q - 32) (unpack_q6_k's
 * layout: group 4n + j of half n takes its low 4 bits from ql bytes 64n .. 64n + 31 (j even) or
 * 64n + 32 .. (j odd), their high nibble for j >= 2, its top 2 bits from bits 2j of qh bytes
 * 128 + 32n ..), its scales `sc` (q6_k_block_scales). */
static inline __attribute__((always_inline)) vw q6_k_group(const uint8_t *b, const int g, const int h, const Q6Scales *sc) {
    const int n = g / 4, j = g % 4;
    const vw ql = vw_u8(b + 64 * n + 32 * (j & 1) + VW_WORDS * h), qh = vw_u8(b + 128 + 32 * n + VW_WORDS * h);
    const vw low = vw_low4(j >= 2 ? vw_srli(ql, 4) : ql);
    const vw top = j <= 1 ? vw_slli(qh, 4 - 2 * j) : vw_srli(qh, 2 * j - 4); /* bits 4-5 */
    const vw code = vw_sub32(vw_top2(low, top));
#if VW_WORDS == 32 /* words 0-15 times sc[2g], 16-31 times sc[2g + 1] */
    const __m512i halves = _mm512_set_epi16(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                            0, 0, 0, 0, 0, 0, 0);
    return _mm512_mullo_epi16(code, _mm512_permutexvar_epi16(_mm512_add_epi16(halves, _mm512_set1_epi16((short)(2 * g))), *sc));
#else
    return vw_times(code, sc->pairs[2 * g + h]);
#endif
}
#endif

#endif

/* The sign bits of the IQ grid types, as the AVX2 byte products take them: shared by iq_dots.c
 * (int16 activation codes) and codes8_dots.c (8-bit ones). */
#ifndef SPRIG_IQ_SIGNS_H
#define SPRIG_IQ_SIGNS_H

#include <stdint.h>

typedef uint32_t u32x8 __attribute__((vector_size(32)));

/* The sign words of 8 IQ2_XXS or IQ3_XXS groups from their aux words: byte l of each is
 * ksigns_iq2xs[(aux >> 7l) & 127], the 7 stored sign bits and their parity in bit 7 (the count
 * of minus signs of 8 weights is even); bit j of a word is the sign of the group's weight j. */
static inline u32x8 aux_sign_words(u32x8 aux) {
    u32x8 bits = (aux & 0x7f) | ((aux << 1) & 0x7f00) | ((aux << 2) & 0x7f0000) | ((aux << 3) & 0x7f000000);
    u32x8 parity = bits ^ (bits >> 4); /* bit 0 of each byte: the parity of its bits */
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    return bits | (parity & 0x01010101) << 7;
}

#if defined(__AVX2__)
#include <immintrin.h>

/* The byte shuffle (each 128-bit half its own) that takes byte k + i of a 32 or 64-bit word
 * broadcast to every lane to the 8 positions 8i .. 8i + 7, i = 0-3: the word's 32 bits (k = 0)
 * or those of its second 32 (k = 4), one to each of the 32 bytes, for sign_source. */
#define SPREAD_INDEX(k)                                                                                           \
    _mm256_setr_epi8(k, k, k, k, k, k, k, k, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 1, k + 2, k + 2, \
                     k + 2, k + 2, k + 2, k + 2, k + 2, k + 2, k + 3, k + 3, k + 3, k + 3, k + 3, k + 3, k + 3, k + 3)

/* From bytes whose byte j holds bit j % 8 of interest (SPREAD_INDEX's shuffle): 32 bytes that
 * are 127 where that bit is clear and 128-255 (negative) where it is set, the second operand of
 * _mm256_sign_epi8 that negates where the bit is set (never 0, which would clear). */
static inline __m256i sign_source(__m256i spread) {
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    return _mm256_add_epi8(_mm256_and_si256(spread, select), _mm256_set1_epi8(127));
}

/* IQ2_XXS (layout in quants.c: group g's 8 bytes at 2 + 8g are 4 grid indices and aux): the
 * aux words of the block's 8 groups. */
static inline u32x8 iq2_xxs_aux(const uint8_t *b) {
    /* the odd 32-bit words of bytes 2-65: [a0 a1 a4 a5 | a2 a3 a6 a7], then in order */
    __m256 odd = _mm256_shuffle_ps(_mm256_loadu_ps((const float *)(b + 2)), _mm256_loadu_ps((const float *)(b + 34)),
                                   _MM_SHUFFLE(3, 1, 3, 1));
    return (u32x8)_mm256_permute4x64_epi64(_mm256_castps_si256(odd), _MM_SHUFFLE(3, 1, 2, 0));
}

/* sign_source of the 32 bits of `bits`, bit j for byte j. */
static inline __m256i sign_bytes(uint32_t bits) {
    return sign_source(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), SPREAD_INDEX(0)));
}
#endif

#endif

/* Products with 8-bit activation codes (form OWN8 in kernels.h): Q2_K, Q3_K, IQ4_XS, IQ3_XXS,
 * IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M.
 *
 * Each of these types' blocks of 256 weights is, per 16-weight sub-block j, an integer scale
 * sc[j] times integer codes c, all times one float per block D (quants.c draws their bits:
 * unpack_q2_k, unpack_q3_k and the unpack functions of the IQ types):
 *   Q2_K:    weight = d * sc[j] * c - dmin * m[j]    (c 0 .. 3; sc and the min m 4-bit)     D = d
 *   Q3_K:    weight = d * sc[j] * (c - 4)            (c = low 2 bits | high bit << 2, 0 .. 7;
 *                                                     sc 6-bit minus 32)                    D = d
 *   IQ4_XS:  weight = d * sc * c                     (c = kvalues_iq4nl[nibble], -127 .. 113;
 *                                                     sc 6-bit minus 32, one per 32 weights) D = d
 *   the IQ grids: weight = D * sc * c, c a grid value with its sign (iq_scale: sc):
 *     IQ3_XXS: sc = 2 (aux >> 28) + 1 per 32 weights, grid values up to 62,   D = d / 4
 *     IQ3_S:   sc = 1 + 2 (4-bit scale) per 32 weights, values up to 15,      D = d
 *     IQ2_XXS: sc = 2 (aux >> 28) + 1 per 32 weights, values 8, 25 or 43,     D = d / 8
 *     IQ2_XS, IQ2_S: sc = 2 (4-bit scale) + 1 per 16 weights, values to 43,   D = d / 8
 *     IQ1_S:   sc = 2 (3-bit scale) + 1 per 32 weights,                       D = d / 8
 *     IQ1_M:   sc = 2 (3-bit scale) + 1 per 16 weights,                       D = d / 8
 *              (the IQ1 codes: 8 v + delta, v a grid value -1, 0 or 1, delta -1 or 1: eighths)
 * (d / 4 and d / 8 are exact, and gguf-py's d * (0.5 + s) * 0.25 is the same number as
 * d / 8 * (2s + 1).)
 * A token's block of 256 codes q has a scale xd[g] per group g of 32 and sums per 16 (Codes8).
 * Each group's products are summed exactly in 8 int32 lanes, lane l taking weights 4l .. 4l + 3
 * (so sub-block 2g + l / 4):
 *   isum_g[l] = sc[2g + l / 4] * (c q summed over weights 32g + 4l .. 32g + 4l + 3)
 * (at most 32 * 4 * 127 * 127, IQ4_XS's, below 2^24) and the sums terms, lane l taking group l
 * (sub-blocks 2l and 2l + 1):
 *   Q3_K: corr[l] = -4 * (sc[2l] sums[2l] + sc[2l + 1] sums[2l + 1])
 *   Q2_K: mins[l] = m[2l] sums[2l] + m[2l + 1] sums[2l + 1]
 * all far below 2^24, so their floats are exact. Then, per token, in 8 float lanes, each fma
 * rounded once:
 *   part_e[l] = fma(isum_g[l], xd[g], part_e[l])   from 0, for the block's groups g in order,
 *                                                 e = g mod 2 (two chains of fmas, not one)
 *   part[l] = part_0[l] + part_1[l]
 *   Q3_K: part[l] = fma(corr[l], xd[l], part[l])
 *   acc[l] = fma(part[l], D, acc[l])
 *   Q2_K: acc[l] = fma(mins[l] * xd[l], -dmin, acc[l])    (the product rounded first)
 * over the blocks in order, and out = reduce8(acc). Only the integer lanes come from tier code,
 * and they are exact, so every tier agrees bit for bit.
 *
 * x86 (the avx2 and avx512 tiers) takes a group of 32 weights at a time: the codes as 32
 * unsigned bytes (the IQ types': |c|, c's signs moved onto the token's codes by sign_epi8),
 * _mm256_maddubs_epi16 with the token's 32 codes (pair sums of at most 2 * 127 * 127: no
 * saturation), _mm256_madd_epi16 with the sub-block scales (words 0-7 the group's first
 * sub-block, 8-15 its second): the lanes above. The codes and scales are unpacked once for the
 * n <= ROW_TOKENS tokens. The portable form (scalar, NEON) sums the same lanes in C, the IQ
 * types' signed codes as the generic form unpacks them (unpack_row). */
#include <string.h>

#include "bytes.h"    /* f16, u32, u64, q3_k_scale, iq4_xs_scale: a block's scales */
#include "iq_grids.h" /* kvalues_iq4nl, ksigns_iq2xs and the IQ grids */
#include "iq_signs.h" /* aux_sign_words, iq2_xxs_aux, sign_source, sign_bytes */
#include "kernels.h"
#include "simd.h"

/* whether the type's codes are signed (the IQ types; the k-quants' offsets are sums terms) */
static inline int signed_codes(int type) { return type != T_Q2_K && type != T_Q3_K; }

/* The IQ types' integer scale of sub-block k (k < 16; module comment). */
static inline int iq_scale(int type, const uint8_t *b, int k) {
    int g = k / 2;
    switch (type) {
    case T_IQ4_XS: return iq4_xs_scale(b, g);
    case T_IQ2_XXS: return 2 * (int)(u32(b + 6 + 8 * g) >> 28) + 1;
    case T_IQ3_XXS: return 2 * (int)(u32(b + 66 + 4 * g) >> 28) + 1;
    case T_IQ3_S: return 1 + 2 * ((b[106 + g / 2] >> (4 * (g % 2))) & 15);
    case T_IQ1_S: return 2 * ((u16(b + 34 + 2 * g) >> 12) & 7) + 1;
    case T_IQ1_M: return 2 * ((u16(b + 48 + 2 * (k / 4)) >> (3 * (k % 4))) & 7) + 1;
    default: return 2 * ((b[(type == T_IQ2_XS ? 66 : 74) + k / 2] >> (4 * (k % 2))) & 15) + 1; /* IQ2_XS, IQ2_S */
    }
}


/* One token's block terms, given its groups' part and its sums terms (Q3_K: corr, Q2_K: mins;
 * unused for the others): the module comment's float arithmetic, the same C in every tier. */
static inline v8f add_block(int type, v8f acc, v8f part, v8i sums_terms, float D, float dmin, const float *xd) {
    v8f xs, terms = __builtin_convertvector(sums_terms, v8f);
    memcpy(&xs, xd, sizeof xs);
    if (type == T_Q3_K) part = fma8(terms, xs, part);
    acc = fma8(part, splat8(D), acc);
    if (type == T_Q2_K) acc = fma8(terms * xs, splat8(-dmin), acc);
    return acc;
}

#if defined(__AVX2__)
#include <immintrin.h>

/* Q3_K's 16 six-bit scales minus 32 (q3_k_scale in bytes.h), int8 in the order of its
 * sub-blocks, 16 at a time. */
static inline __m128i q3_k_scales(const uint8_t *sc) {
    uint32_t top;
    memcpy(&top, sc + 8, 4);
    __m128i a = _mm_loadl_epi64((const __m128i *)sc);
    __m128i low = _mm_and_si128(_mm_unpacklo_epi64(a, _mm_srli_epi16(a, 4)), _mm_set1_epi8(15));
    __m128i high = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)top), _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    return _mm_sub_epi8(_mm_or_si128(low, _mm_slli_epi16(high, 4)), _mm_set1_epi8(32));
}

/* pshufb controls: from a register holding 8 scale words in each 128-bit lane (sub-blocks
 * 8h .. 8h + 7), words 0-7 <- word 2g mod 8, words 8-15 <- word 2g + 1 mod 8, for g mod 4. */
static inline __m256i scale_control(int g) {
    int lo = 4 * (g % 4), hi = lo + 2;
    return _mm256_setr_epi8(lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1, lo,
                            lo + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                            hi, hi + 1);
}

/* What a block's groups share, unpacked once: Q2_K and Q3_K's 16 sub-block scales as int16
 * (half_scales[n]: those of groups 4n .. 4n + 3 in each 128-bit half) and the factors of their
 * sums terms (Q2_K: m; Q3_K: -4 sc), Q3_K's high bits; IQ2_XS's and IQ2_S's 16 scales as Q2_K's;
 * the other IQ types' 8 group scales as int16 in each 128-bit half (half_scales[0]); IQ2_XXS's
 * and IQ3_XXS's sign words (those of groups 4n .. 4n + 3 in each 128-bit half of
 * sign_words[n]). */
typedef struct {
    __m256i half_scales[2], sums_factor, hm, sign_words[2];
} Block8;

/* 8 int32 scales as 8 int16 words in each 128-bit half */
static inline __m256i words_twice(v8i v) {
    __m256i w = (__m256i)v;
    return _mm256_broadcastsi128_si256(_mm_packs_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
}

/* pshufb control: every word <- word g of each 128-bit half */
static inline __m256i word_control(int g) {
    return _mm256_set1_epi16((short)(2 * g | (2 * g + 1) << 8));
}

/* 16 sub-block scales (int16, sub-block order) as half_scales */
static inline void set_half_scales(Block8 *s, __m256i sc16) {
    s->half_scales[0] = _mm256_permute4x64_epi64(sc16, 0x44);
    s->half_scales[1] = _mm256_permute4x64_epi64(sc16, 0xee);
}

/* IQ2_XXS's and IQ3_XXS's sign words (aux_sign_words) as sign_words, their scales as half_scales[0] */
static inline void set_aux(Block8 *s, u32x8 aux) {
    __m256i words = (__m256i)aux_sign_words(aux);
    s->sign_words[0] = _mm256_permute2x128_si256(words, words, 0x00); /* groups 0-3's in each half */
    s->sign_words[1] = _mm256_permute2x128_si256(words, words, 0x11); /* groups 4-7's */
    s->half_scales[0] = words_twice(2 * (v8i)(aux >> 28) + 1);        /* iq_scale */
}

static inline __attribute__((always_inline)) Block8 unpack_block(int type, const uint8_t *b) {
    Block8 s;
    const u32x8 k = {0, 1, 2, 3, 4, 5, 6, 7};
    if (type == T_Q2_K) {
        __m128i packed = _mm_loadu_si128((const __m128i *)b);
        __m256i sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(15)));
        s.sums_factor = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(15)));
        set_half_scales(&s, sc16);
    } else if (type == T_Q3_K) {
        __m256i sc16 = _mm256_cvtepi8_epi16(q3_k_scales(b + 96));
        s.sums_factor = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 2);
        set_half_scales(&s, sc16);
        s.hm = _mm256_loadu_si256((const __m256i *)b);
    } else if (type == T_IQ4_XS) { /* iq4_xs_scale's bits, for the 8 groups at once */
        u32x8 low = (u32(b + 4) >> (4 * k)) & 15, high = ((uint32_t)u16(b + 2) >> (2 * k)) & 3;
        s.half_scales[0] = words_twice((v8i)(low | high << 4) - 32);
    } else if (type == T_IQ2_XXS) {
        set_aux(&s, iq2_xxs_aux(b));
    } else if (type == T_IQ3_XXS) {
        u32x8 aux;
        memcpy(&aux, b + 66, sizeof aux);
        set_aux(&s, aux);
    } else if (type == T_IQ3_S) { /* iq_scale's nibbles of the word at 106, 8 at once */
        s.half_scales[0] = words_twice(1 + 2 * (v8i)((u32(b + 106) >> (4 * k)) & 15));
    } else if (type == T_IQ1_S) { /* iq_scale's 3 bits of the 8 words at 34 */
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34)));
        s.half_scales[0] = words_twice(2 * (v8i)_mm256_and_si256(_mm256_srli_epi32(h, 12), _mm256_set1_epi32(7)) + 1);
    } else if (type == T_IQ1_M) { /* iq_scale: bits 3 (k % 4) of word k / 4, moved to the top 3 and back */
        __m128i w8 = _mm_loadl_epi64((const __m128i *)(b + 48));
        __m256i w = _mm256_setr_m128i(_mm_shuffle_epi8(w8, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3)),
                                      _mm_shuffle_epi8(w8, _mm_setr_epi8(4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7)));
        __m256i top = _mm256_mullo_epi16(w, _mm256_setr_epi16(1 << 13, 1 << 10, 1 << 7, 1 << 4, 1 << 13, 1 << 10, 1 << 7,
                                                              1 << 4, 1 << 13, 1 << 10, 1 << 7, 1 << 4, 1 << 13, 1 << 10,
                                                              1 << 7, 1 << 4));
        set_half_scales(&s, _mm256_add_epi16(_mm256_slli_epi16(_mm256_srli_epi16(top, 13), 1), _mm256_set1_epi16(1)));
    } else { /* IQ2_XS, IQ2_S: the 16 nibbles of 8 bytes, low nibble first, as 2n + 1 */
        __m128i bytes = _mm_loadl_epi64((const __m128i *)(b + (type == T_IQ2_XS ? 66 : 74)));
        __m128i nibbles = _mm_and_si128(_mm_unpacklo_epi8(bytes, _mm_srli_epi16(bytes, 4)), _mm_set1_epi8(15));
        set_half_scales(&s, _mm256_add_epi16(_mm256_slli_epi16(_mm256_cvtepu8_epi16(nibbles), 1), _mm256_set1_epi16(1)));
    }
    return s;
}

/* 8-byte grid points as a 64-bit lane, 4-byte ones as a 32-bit lane */
#define POINT8(grid, i) ((long long)u64((const uint8_t *)(grid)[i]))
#define POINT4(grid, i) ((int)u32((grid)[i]))

/* IQ1 codes (module comment) of grid values v, the delta -1 where `negative`'s bytes are -1, else 1 */
static inline __m256i iq1_eighths(__m256i v, __m256i negative) {
    __m256i eight = _mm256_and_si256(_mm256_slli_epi16(v, 3), _mm256_set1_epi8((char)0xf8));
    return _mm256_add_epi8(eight, _mm256_or_si256(negative, _mm256_set1_epi8(1)));
}

/* Group g of block b: its codes as unsigned bytes, the signs to give the token's codes (the
 * IQ types: c itself for IQ4_XS, the grid points' sign bits (sign_source) for the others) and
 * its scales, 16 words. */
static inline __attribute__((always_inline)) void unpack_group(int type, const uint8_t *b, const Block8 *s, int g,
                                                               __m256i *codes, __m256i *signs, __m256i *scales) {
    if (type == T_Q2_K || type == T_Q3_K) {
        const int n = g / 4, j = g % 4;
        const __m256i packed = _mm256_loadu_si256((const __m256i *)(b + (type == T_Q2_K ? 16 : 32) + 32 * n));
        *codes = _mm256_and_si256(j ? _mm256_srli_epi16(packed, 2 * j) : packed, _mm256_set1_epi8(3));
        if (type == T_Q3_K) { /* bit g of each hmask byte, moved to bit 2 */
            __m256i bit = g < 2 ? _mm256_slli_epi16(s->hm, 2 - g) : g > 2 ? _mm256_srli_epi16(s->hm, g - 2) : s->hm;
            *codes = _mm256_or_si256(*codes, _mm256_and_si256(bit, _mm256_set1_epi8(4)));
        }
        *scales = _mm256_shuffle_epi8(s->half_scales[n], scale_control(g));
    } else if (type == T_IQ4_XS) { /* low nibbles of qs[16g ..] weights 0-15, high ones 16-31 */
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        __m128i packed = _mm_loadu_si128((const __m128i *)(b + 8 + 16 * g));
        __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
        *signs = _mm256_shuffle_epi8(table, nibbles);
        *codes = _mm256_abs_epi8(*signs);
    } else if (type == T_IQ2_XXS) { /* weights 8l .. 8l + 7 the grid point of index byte l at 2 + 8g */
        const uint8_t *at = b + 2 + 8 * g;
        *codes = _mm256_setr_epi64x(POINT8(iq2xxs_grid, at[0]), POINT8(iq2xxs_grid, at[1]), POINT8(iq2xxs_grid, at[2]),
                                    POINT8(iq2xxs_grid, at[3]));
        *signs = sign_source(_mm256_shuffle_epi8(s->sign_words[g / 4], SPREAD_INDEX(4 * (g % 4))));
    } else if (type == T_IQ3_XXS) { /* weights 4l .. 4l + 3 the grid point of index byte l at 2 + 8g */
        const uint8_t *at = b + 2 + 8 * g;
        *codes = _mm256_setr_epi32(POINT4(iq3xxs_grid, at[0]), POINT4(iq3xxs_grid, at[1]), POINT4(iq3xxs_grid, at[2]),
                                   POINT4(iq3xxs_grid, at[3]), POINT4(iq3xxs_grid, at[4]), POINT4(iq3xxs_grid, at[5]),
                                   POINT4(iq3xxs_grid, at[6]), POINT4(iq3xxs_grid, at[7]));
        *signs = sign_source(_mm256_shuffle_epi8(s->sign_words[g / 4], SPREAD_INDEX(4 * (g % 4))));
    } else if (type == T_IQ3_S) { /* weights 4l .. 4l + 3: qs[8g + l] and bit l of qh[g] as index */
        const uint8_t *qs = b + 2 + 8 * g;
        const unsigned qh = b[66 + g];
#define AT(l) POINT4(iq3s_grid, qs[l] | ((qh >> (l)) & 1) << 8)
        *codes = _mm256_setr_epi32(AT(0), AT(1), AT(2), AT(3), AT(4), AT(5), AT(6), AT(7));
#undef AT
        *signs = sign_bytes(u32(b + 74 + 4 * g));
    } else if (type == T_IQ2_XS) { /* weights 8l .. 8l + 7: the 16-bit word l at 2 + 8g, 9 bits of index, 7 of signs */
        const uint8_t *at = b + 2 + 8 * g;
#define AT(l) POINT8(iq2xs_grid, u16(at + 2 * (l)) & 511)
        *codes = _mm256_setr_epi64x(AT(0), AT(1), AT(2), AT(3));
#undef AT
        uint32_t bits = 0;
        for (int l = 0; l < 4; l++) bits |= (uint32_t)ksigns_iq2xs[u16(at + 2 * l) >> 9] << (8 * l);
        *signs = sign_bytes(bits);
    } else if (type == T_IQ1_S) { /* weights 8l .. 8l + 7: qs[4g + l] and bits 3l .. 3l + 2 of the word at 34 + 2g */
        const uint8_t *qs = b + 2 + 4 * g;
        const unsigned h = u16(b + 34 + 2 * g);
#define AT(l) POINT8(iq1s_grid, qs[l] | ((h >> (3 * (l))) & 7) << 8)
        *signs = iq1_eighths(_mm256_setr_epi64x(AT(0), AT(1), AT(2), AT(3)), _mm256_set1_epi8(h & 0x8000 ? -1 : 0));
#undef AT
        *codes = _mm256_abs_epi8(*signs);
    } else if (type == T_IQ1_M) { /* weights 8l .. 8l + 7: qs[4g + l] and nibble 4g + l of qh (3 bits, the delta's sign) */
        const uint8_t *qs = b + 4 * g;
        const unsigned nib = u16(b + 32 + 2 * g);
#define AT(l) POINT8(iq1s_grid, qs[l] | ((nib >> (4 * (l))) & 7) << 8)
#define NEG(l) ((nib >> (4 * (l) + 3)) & 1 ? -1LL : 0LL)
        *signs = iq1_eighths(_mm256_setr_epi64x(AT(0), AT(1), AT(2), AT(3)), _mm256_setr_epi64x(NEG(0), NEG(1), NEG(2), NEG(3)));
#undef NEG
#undef AT
        *codes = _mm256_abs_epi8(*signs);
    } else { /* IQ2_S: weights 8l .. 8l + 7: qs[4g + l] and bits 2l, 2l + 1 of qh[g] as index */
        const uint8_t *qs = b + 2 + 4 * g;
        const unsigned qh = b[66 + g];
#define AT(l) POINT8(iq2s_grid, qs[l] | ((qh >> (2 * (l))) & 3) << 8)
        *codes = _mm256_setr_epi64x(AT(0), AT(1), AT(2), AT(3));
#undef AT
        *signs = sign_bytes(u32(b + 34 + 4 * g));
    }
    if (signed_codes(type)) /* the IQ types' scales */
        *scales = type_split(type) ? _mm256_shuffle_epi8(s->half_scales[g / 4], scale_control(g))
                                     : _mm256_shuffle_epi8(s->half_scales[0], word_control(g));
}

/* The avx512_ymm build (SPRIG_YMM) takes AVX2's group at a time: faster where a core runs a
 * 512-bit operation as two halves. */
#if defined(__AVX512BW__) && !defined(SPRIG_YMM)

/* Groups 2i and 2i + 1 of block b in one 512-bit register each (the first group in the low 256
 * bits): their codes as unsigned bytes, the bytes of the token's codes to negate (the IQ types'
 * signs; AVX-512 has no byte sign instruction) and their scales, 32 words. Q2_K, Q3_K and IQ4_XS
 * unpack both groups at once, the other types each group as unpack_group does. */
static inline __attribute__((always_inline)) void unpack_pair(int type, const uint8_t *b, const Block8 *s, int i,
                                                              __m512i *codes, __mmask64 *negative, __m512i *scales) {
    const int g = 2 * i;
    *negative = 0;
    if (type == T_Q2_K || type == T_Q3_K) { /* unpack_group's fields j and j + 1 of the same 32 bytes */
        const int n = g / 4, j = g % 4;
        const __m512i packed = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + (type == T_Q2_K ? 16 : 32) + 32 * n)));
        const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * j)), _mm256_set1_epi16((short)(2 * j + 2)), 1);
        *codes = _mm512_and_si512(_mm512_srlv_epi16(packed, shifts), _mm512_set1_epi8(3));
        if (type == T_Q3_K) { /* bit g (g + 1) of each hmask byte rotated to bit 2 */
            const __m512i turns = _mm512_inserti64x4(_mm512_set1_epi64((g - 2) & 63), _mm256_set1_epi64x((g - 1) & 63), 1);
            const __m512i bit = _mm512_rorv_epi64(_mm512_broadcast_i64x4(s->hm), turns);
            *codes = _mm512_or_si512(*codes, _mm512_and_si512(bit, _mm512_set1_epi8(4)));
        }
    } else if (type == T_IQ4_XS) { /* the 32 bytes of both groups as [low nibbles, high nibbles] of each */
        const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
        const __m512i packed = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 8 + 16 * g)));
        const __m512i twice = _mm512_shuffle_i64x2(packed, packed, _MM_SHUFFLE(1, 1, 0, 0));
        const __m512i nibbles = _mm512_and_si512(_mm512_mask_srli_epi16(twice, 0xff00ff00, twice, 4), _mm512_set1_epi8(15));
        const __m512i values = _mm512_shuffle_epi8(table, nibbles);
        *negative = _mm512_movepi8_mask(values);
        *codes = _mm512_abs_epi8(values);
    } else {
        __m256i c[2], sg[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, sc;
        for (int h = 0; h < 2; h++) unpack_group(type, b, s, g + h, &c[h], &sg[h], &sc);
        *codes = _mm512_inserti64x4(_mm512_castsi256_si512(c[0]), c[1], 1);
        if (signed_codes(type)) *negative = _mm512_movepi8_mask(_mm512_inserti64x4(_mm512_castsi256_si512(sg[0]), sg[1], 1));
    }
    const __m512i control = _mm512_inserti64x4(_mm512_castsi256_si512(type_split(type) ? scale_control(g) : word_control(g)),
                                               type_split(type) ? scale_control(g + 1) : word_control(g + 1), 1);
    *scales = _mm512_shuffle_epi8(_mm512_broadcast_i64x4(s->half_scales[type_split(type) ? g / 4 : 0]), control);
}

/* One block b of a row times N tokens into their acc, token k's codes of the block at x[k * B]:
 * a pair of groups at a time, the even group's fma chain (part_0 of the module comment) in the
 * low 8 lanes and the odd group's (part_1) in the high 8, so the same operations as AVX2's. */
static inline __attribute__((always_inline)) void block_tokens(int type, const uint8_t *b, const Codes8 *x,
                                                               int64_t B, const int N, v8f *acc) {
    const Block8 s = unpack_block(type, b);
    __m512 part[ROW_TOKENS];
    for (int k = 0; k < N; k++) part[k] = _mm512_setzero_ps();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i codes, scales;
        __mmask64 negative;
        unpack_pair(type, b, &s, i, &codes, &negative, &scales);
        const __m512i pair = _mm512_inserti64x4(_mm512_set1_epi32(2 * i), _mm256_set1_epi32(2 * i + 1), 1);
        for (int k = 0; k < N; k++) {
            __m512i q = _mm512_loadu_si512((const __m512i *)(x[k * B].q + 64 * i));
            if (signed_codes(type)) q = _mm512_mask_sub_epi8(q, negative, _mm512_setzero_si512(), q);
            __m512i isum = _mm512_madd_epi16(_mm512_maddubs_epi16(codes, q), scales);
            __m512 xs = _mm512_permutexvar_ps(pair, _mm512_castps256_ps512(_mm256_loadu_ps(x[k * B].d)));
            part[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), xs, part[k]);
        }
    }
    const float D = block_scale(type, b), dmin = type == T_Q2_K ? f16(b + 82) : 0.0f;
    for (int k = 0; k < N; k++) {
        v8i lanes = {0};
        if (!signed_codes(type))
            lanes = (v8i)_mm256_madd_epi16(s.sums_factor, _mm256_loadu_si256((const __m256i *)x[k * B].sums));
        v8f even = (v8f)_mm512_castps512_ps256(part[k]), odd = (v8f)_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(part[k]), 1));
        acc[k] = add_block(type, acc[k], even + odd, lanes, D, dmin, x[k * B].d);
    }
}

#else

/* One block b of a row times N tokens into their acc, token k's codes of the block at x[k * B]. */
static inline __attribute__((always_inline)) void block_tokens(int type, const uint8_t *b, const Codes8 *x,
                                                               int64_t B, const int N, v8f *acc) {
    const Block8 s = unpack_block(type, b);
    __m256 part[ROW_TOKENS][2];
    for (int k = 0; k < N; k++) part[k][0] = part[k][1] = _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int g = 0; g < 8; g++) {
        __m256i codes, signs = _mm256_setzero_si256(), scales;
        unpack_group(type, b, &s, g, &codes, &signs, &scales);
        for (int k = 0; k < N; k++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(x[k * B].q + 32 * g));
            if (signed_codes(type)) q = _mm256_sign_epi8(q, signs);
            __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), scales);
            part[k][g % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(x[k * B].d + g), part[k][g % 2]);
        }
    }
    const float D = block_scale(type, b), dmin = type == T_Q2_K ? f16(b + 82) : 0.0f;
    for (int k = 0; k < N; k++) {
        v8i lanes = {0};
        if (!signed_codes(type))
            lanes = (v8i)_mm256_madd_epi16(s.sums_factor, _mm256_loadu_si256((const __m256i *)x[k * B].sums));
        acc[k] = add_block(type, acc[k], (v8f)part[k][0] + (v8f)part[k][1], lanes, D, dmin, x[k * B].d);
    }
}

#endif

#else

/* A block's 16 sub-block scales, the factors of its sums terms (Q2_K: m; Q3_K: -4 sc; none for
 * the others) and its 256 codes c (module comment). */
static inline void block_codes(int type, const uint8_t *b, int32_t sc[16], int32_t factor[16], int8_t c[256]) {
    memset(factor, 0, 16 * sizeof *factor);
    if (type == T_Q2_K || type == T_Q3_K) {
        const uint8_t *qs = b + (type == T_Q2_K ? 16 : 32);
        for (int e = 0; e < 256; e++) {
            int n = e / 128, j = (e / 32) % 4, l = e % 32;
            c[e] = (int8_t)((qs[32 * n + l] >> (2 * j)) & 3);
            if (type == T_Q3_K) c[e] |= (int8_t)(((b[l] >> (e / 32)) & 1) << 2); /* bit e / 32 of hmask[l] */
        }
    }
    for (int k = 0; k < 16; k++) {
        if (type == T_Q2_K) {
            sc[k] = b[k] & 15;
            factor[k] = b[k] >> 4;
        } else if (type == T_Q3_K) {
            sc[k] = q3_k_scale(b + 96, k);
            factor[k] = -4 * sc[k];
        } else {
            sc[k] = iq_scale(type, b, k);
        }
    }
    if (signed_codes(type)) { /* the IQ types' codes, as the generic form unpacks them (quants.c) */
        float scale[BLOCK8 / GROUP * HALVES], min[BLOCK8 / GROUP];
        RowBuffer buf = {.q = c, .scale = scale, .min = min};
        unpack_row(type, b, BLOCK8, &buf);
    }
}

static inline __attribute__((always_inline)) void block_tokens(int type, const uint8_t *b, const Codes8 *x8,
                                                               int64_t B, const int N, v8f *acc) {
    int32_t sc[16], factor[16];
    int8_t c[256];
    block_codes(type, b, sc, factor, c);
    const float D = block_scale(type, b), dmin = type == T_Q2_K ? f16(b + 82) : 0.0f;
    for (int k = 0; k < N; k++) {
        const Codes8 *x = &x8[k * B];
        v8f part[2] = {{0}};
        for (int g = 0; g < 8; g++) { /* the module comment's lanes */
            v8i isum;
            for (int l = 0; l < 8; l++) {
                int32_t s = 0;
                for (int i = 32 * g + 4 * l; i < 32 * g + 4 * l + 4; i++) s += c[i] * x->q[i];
                isum[l] = sc[2 * g + l / 4] * s;
            }
            part[g % 2] = fma8(__builtin_convertvector(isum, v8f), splat8(x->d[g]), part[g % 2]);
        }
        v8i lanes;
        for (int l = 0; l < 8; l++) lanes[l] = factor[2 * l] * x->sums[2 * l] + factor[2 * l + 1] * x->sums[2 * l + 1];
        acc[k] = add_block(type, acc[k], part[0] + part[1], lanes, D, dmin, x->d);
    }
}

#endif

/* A block's 256 codes, signed (Q3_K's minus 4, as unpack_row gives them), its 16 sub-block
 * scales D * sc and its min factors (Q2_K: -dmin * m, unpack_q2_k's; zeros for the others):
 * unpack_row's values, the x86 tiers' from the registers above (D * sc is exact: module comment). */
static inline __attribute__((always_inline)) void block_of(int type, const uint8_t *b, int8_t *c, float *scale,
                                                           float *min) {
#if defined(__AVX2__)
    const Block8 s = unpack_block(type, b);
#if defined(__AVX512BW__) && !defined(SPRIG_YMM)
    for (int i = 0; i < 4; i++) {
        __m512i codes, scales;
        __mmask64 negative;
        unpack_pair(type, b, &s, i, &codes, &negative, &scales);
        codes = _mm512_mask_sub_epi8(codes, negative, _mm512_setzero_si512(), codes);
        if (type == T_Q3_K) codes = _mm512_sub_epi8(codes, _mm512_set1_epi8(4));
        _mm512_storeu_si512((void *)(c + 64 * i), codes);
    }
#else
    for (int g = 0; g < 8; g++) {
        __m256i codes, signs = _mm256_setzero_si256(), scales;
        unpack_group(type, b, &s, g, &codes, &signs, &scales);
        if (signed_codes(type)) codes = _mm256_sign_epi8(codes, signs);
        if (type == T_Q3_K) codes = _mm256_sub_epi8(codes, _mm256_set1_epi8(4));
        _mm256_storeu_si256((__m256i *)(c + 32 * g), codes);
    }
#endif
    /* the integer scales of sub-blocks 0-7 and 8-15 (Block8's words; one per group: each twice) */
    const __m128i first = _mm256_castsi256_si128(s.half_scales[0]);
    const __m256i pairs = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
    const int split = type_split(type);
    const __m256i lo = split ? _mm256_cvtepi16_epi32(first) : _mm256_permutevar8x32_epi32(_mm256_cvtepi16_epi32(first), pairs);
    const __m256i hi = split ? _mm256_cvtepi16_epi32(_mm256_castsi256_si128(s.half_scales[1]))
                             : _mm256_permutevar8x32_epi32(_mm256_cvtepi16_epi32(first), _mm256_add_epi32(pairs, _mm256_set1_epi32(4)));
    const v8f D = splat8(block_scale(type, b));
    const v8f scales[2] = {D * __builtin_convertvector((v8i)lo, v8f), D * __builtin_convertvector((v8i)hi, v8f)};
    memcpy(scale, scales, sizeof scales);
    v8f mins[2] = {{0}, {0}};
    if (type == T_Q2_K) { /* -(dmin * m), as unpack_q2_k */
        const v8f dmin = splat8(f16(b + 82));
        mins[0] = -(dmin * __builtin_convertvector((v8i)_mm256_cvtepi16_epi32(_mm256_castsi256_si128(s.sums_factor)), v8f));
        mins[1] = -(dmin * __builtin_convertvector((v8i)_mm256_cvtepi16_epi32(_mm256_extracti128_si256(s.sums_factor, 1)), v8f));
    }
    memcpy(min, mins, type == T_Q2_K ? sizeof mins : sizeof mins[0]);
#else
    RowBuffer buf = {.q = c, .scale = scale, .min = min};
    unpack_row(type, b, BLOCK8, &buf);
#endif
}
void codes8_block(int type, const uint8_t *b, int8_t *c, float *scale, float *min) {
    switch (type) { /* one body per type: its branches fold */
#define BLOCK_OF(name) case T_##name: block_of(T_##name, b, c, scale, min); break;
    BLOCK_OF(Q2_K) BLOCK_OF(Q3_K) BLOCK_OF(IQ4_XS) BLOCK_OF(IQ3_XXS) BLOCK_OF(IQ3_S) BLOCK_OF(IQ2_XXS) BLOCK_OF(IQ2_XS)
    BLOCK_OF(IQ2_S) BLOCK_OF(IQ1_S) BLOCK_OF(IQ1_M)
#undef BLOCK_OF
    }
}

static inline __attribute__((always_inline)) void rows_tokens(int type, const uint8_t *row, int64_t K,
                                                              const Codes8 *x8, const int N, float *out,
                                                              int64_t stride) {
    const int64_t B = K / BLOCK8;
    v8f acc[ROW_TOKENS] = {{0}};
    const size_t ahead = prefetch_ahead((size_t)(B * type_bytes(type)));
    for (int64_t blk = 0; blk < B; blk++) {
        prefetch_block(row + blk * type_bytes(type), type_bytes(type), ahead);
        block_tokens(type, row + blk * type_bytes(type), x8 + blk, B, N, acc);
    }
    for (int k = 0; k < N; k++) out[k * stride] = reduce8(acc[k]);
}

/* dot_<type> (kernels.h's product functions of the OWN8 types): one body per count of tokens,
 * so that the loop over them unrolls. */
#define CODES8_DOT(name)                                                                                        \
    void dot_##name(const uint8_t *row, int64_t K, const Codes8 *x8, int n, float *out, int64_t stride) {      \
        switch (n) {                                                                                            \
        case 1: rows_tokens(T_##name, row, K, x8, 1, out, stride); break;                                       \
        case 2: rows_tokens(T_##name, row, K, x8, 2, out, stride); break;                                       \
        case 3: rows_tokens(T_##name, row, K, x8, 3, out, stride); break;                                       \
        default: rows_tokens(T_##name, row, K, x8, ROW_TOKENS, out, stride); break;                            \
        }                                                                                                       \
    }
CODES8_DOT(Q2_K)
CODES8_DOT(Q3_K)
CODES8_DOT(IQ4_XS)
CODES8_DOT(IQ3_XXS)
CODES8_DOT(IQ3_S)
CODES8_DOT(IQ2_XXS)
CODES8_DOT(IQ2_XS)
CODES8_DOT(IQ2_S)
CODES8_DOT(IQ1_S)
CODES8_DOT(IQ1_M)

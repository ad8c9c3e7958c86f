/* The IQ types' own dequantization on the AVX2 and AVX-512 tiers (IQ4_NL, IQ4_XS, IQ3_XXS,
 * IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M), and IQ4_NL's products with int16 activation
 * codes (the others' take 8-bit ones: codes8_dots.c; IQ4_NL's 32-weight blocks do not fit
 * their 256-weight groups of codes): each block unpacked in registers, two groups of 32 at a
 * time (the product's shared by the n <= ROW_TOKENS tokens of dot_row_tokens, with no stack
 * round trip). The arithmetic is the generic form's (kernels.h, row_tokens and dequantize_row
 * in quants.c), bit for bit: per group, exact int32 sums in 8 lanes, lane l taking weights
 * 2l, 2l + 1, 16 + 2l and 17 + 2l; acc[l] += sums * (scale * xscale), the groups in order;
 * reduce8. Only the integer sums are formed differently, and they are exact.
 *
 * A pair of groups g, h = g + 1 is two vectors of 32 int8 codes:
 *     lo = [weights 0-15 of g | weights 0-15 of h],   hi = [weights 16-31 of g | 16-31 of h]
 * AVX-512 widens each to 32 int16 and takes both groups' sums in one 16-lane register (lanes
 * 0-7 g's, 8-15 h's): madd(lo, x lo halves) + dpwssd(hi, x hi halves), the activations of the
 * two groups' halves side by side. AVX2 does the same one group at a time in 8 lanes.
 * Other tiers (scalar, NEON) and types keep the generic form: the entry points return 0. */
#include <string.h>

#include "bytes.h"    /* u16, u32, u64, f16 */
#include "iq_grids.h" /* kvalues_iq4nl, ksigns_iq2xs and the IQ grids */
#include "iq_signs.h" /* aux_sign_words, iq2_xxs_aux, sign_bytes */
#include "kernels.h"
#include "simd.h"

#if defined(__AVX2__)
#include <immintrin.h>

#define INLINED __attribute__((always_inline))

typedef uint16_t u16x16 __attribute__((vector_size(32)));

#if !(defined(__AVX512BW__) && defined(__AVX512VL__))
/* AVX2: the 32 codes of w negated where byte j of `spread` has its bit j % 8 set (sign_source) */
static inline __m256i negate_spread(__m256i w, __m256i spread) { return _mm256_sign_epi8(w, sign_source(spread)); }
#endif

/* The 32 codes of w negated where bit j of `bits` is set (byte j). */
static inline __m256i negate_where(__m256i w, uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_sub_epi8(w, (__mmask32)bits, _mm256_setzero_si256(), w);
#else
    /* byte k of `bits` to the 8 positions 8k .. 8k + 7, then each position's own bit */
    return _mm256_sign_epi8(w, sign_bytes(bits));
#endif
}

/* -- the pairs of each type: codes in the lo/hi layout above, and the groups' scales ------- */

/* IQ4 nibbles of 32 bytes [16 of g | 16 of h] (low nibbles weights 0-15, high 16-31) as codes */
static inline INLINED void iq4_pair(__m256i packed, __m256i *lo, __m256i *hi) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kvalues_iq4nl));
    const __m256i low4 = _mm256_set1_epi8(15);
    *lo = _mm256_shuffle_epi8(table, _mm256_and_si256(packed, low4));
    *hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(packed, 4), low4));
}

/* IQ4_XS (layout in quants.c): groups 2p, 2p + 1 of a block are qs[32p .. 32p + 31] */
static inline INLINED void iq4_xs_pair(const uint8_t *b, int p, __m256i *lo, __m256i *hi) {
    iq4_pair(_mm256_loadu_si256((const __m256i *)(b + 8 + 32 * p)), lo, hi);
}

/* the 8 group scales of an IQ4_XS block, d * (sc - 32), sc's low 4 bits being bits 4k of
 * scales_l (as a 32-bit word) and its high 2 bits bits 2k of scales_h */
static inline INLINED v8f iq4_xs_scales(const uint8_t *b) {
    const u32x8 k = {0, 1, 2, 3, 4, 5, 6, 7};
    u32x8 low = (u32(b + 4) >> (4 * k)) & 15, high = ((uint32_t)u16(b + 2) >> (2 * k)) & 3;
    v8i sc = (v8i)(low | high << 4) - 32;
    return f16(b) * __builtin_convertvector(sc, v8f);
}

/* the scales d of 8 IQ4_NL blocks from b */
static inline INLINED v8f iq4_nl_scales(const uint8_t *b) {
    __m128i d = _mm_setr_epi16((short)u16(b), (short)u16(b + 18), (short)u16(b + 36), (short)u16(b + 54),
                               (short)u16(b + 72), (short)u16(b + 90), (short)u16(b + 108), (short)u16(b + 126));
    return (v8f)_mm256_cvtph_ps(d); /* exact, as f16 */
}

/* IQ4_NL: blocks b (group g) and b + 18 (group h, if both; else g again, never added) */
static inline INLINED void iq4_nl_pair(const uint8_t *b, int both, __m256i *lo, __m256i *hi) {
    __m128i qg = _mm_loadu_si128((const __m128i *)(b + 2)), qh = both ? _mm_loadu_si128((const __m128i *)(b + 20)) : qg;
    iq4_pair(_mm256_inserti128_si256(_mm256_castsi128_si256(qg), qh, 1), lo, hi);
}

/* The sign words of a block's 8 groups (bit j: weight j) in the pair layout: masks[2p] those
 * of pair p's lo (weights 0-15 of group 2p, then of 2p + 1), masks[2p + 1] those of its hi. */
static inline INLINED void pair_masks(u32x8 signs, uint32_t masks[8]) {
    u16x16 w = __builtin_shufflevector((u16x16)signs, (u16x16)signs, 0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    memcpy(masks, &w, sizeof w);
}

/* The signs of 8 groups as 32 bits each (byte l: ksigns_iq2xs[(aux >> 7l) & 127], i.e. the 7
 * bits and their parity in bit 7: IQ2_XXS, IQ3_XXS) into masks (pair_masks), and the group
 * scales d * (0.5 + (aux >> 28)) * factor, from the groups' aux words. */
static inline INLINED v8f aux_signs_scales(u32x8 aux, float d, float factor, uint32_t masks[8]) {
    pair_masks(aux_sign_words(aux), masks);
    return d * (0.5f + __builtin_convertvector((v8i)(aux >> 28), v8f)) * factor;
}

/* IQ2_XXS (layout in quants.c): group g's 8 bytes at 2 + 8g are 4 grid indices and aux */
static inline INLINED v8f iq2_xxs_scales(const uint8_t *b, uint32_t masks[8]) {
    return aux_signs_scales(iq2_xxs_aux(b), f16(b), 0.25f, masks);
}

/* lo and hi of a pair negated where their masks (pair_masks) say */
static inline INLINED void signed_pair(__m256i *lo, __m256i *hi, const uint32_t mask[2]) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    *lo = negate_where(*lo, mask[0]);
    *hi = negate_where(*hi, mask[1]);
#else
    /* both masks in every 64-bit lane, one broadcast for the two: lo's bytes 0-3, hi's 4-7 */
    __m256i both = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)mask));
    *lo = negate_spread(*lo, _mm256_shuffle_epi8(both, SPREAD_INDEX(0)));
    *hi = negate_spread(*hi, _mm256_shuffle_epi8(both, SPREAD_INDEX(4)));
#endif
}

/* 8-byte grid points (IQ2, IQ1: weights 8l .. 8l + 7 of a group) as a 64-bit lane */
#define POINT8(grid, i) ((long long)u64((const uint8_t *)(grid)[i]))
/* 4-byte ones (IQ3: weights 4l .. 4l + 3) */
#define POINT4(grid, i) ((int)u32((grid)[i]))

static inline INLINED void iq2_xxs_pair(const uint8_t *b, int p, const uint32_t masks[8], __m256i *lo, __m256i *hi) {
    const uint8_t *ig = b + 2 + 16 * p, *ih = ig + 8; /* grid indices of groups 2p, 2p + 1 */
    *lo = _mm256_setr_epi64x(POINT8(iq2xxs_grid, ig[0]), POINT8(iq2xxs_grid, ig[1]), POINT8(iq2xxs_grid, ih[0]),
                             POINT8(iq2xxs_grid, ih[1]));
    *hi = _mm256_setr_epi64x(POINT8(iq2xxs_grid, ig[2]), POINT8(iq2xxs_grid, ig[3]), POINT8(iq2xxs_grid, ih[2]),
                             POINT8(iq2xxs_grid, ih[3]));
    signed_pair(lo, hi, masks + 2 * p);
}

/* IQ3_XXS: qs[8g + m] the grid index of weights 4m .. 4m + 3 of group g; aux words at 66 */
static inline INLINED v8f iq3_xxs_scales(const uint8_t *b, uint32_t masks[8]) {
    u32x8 aux;
    memcpy(&aux, b + 66, sizeof aux);
    return aux_signs_scales(aux, f16(b), 0.5f, masks);
}

/* the 4-byte points of indices i[0 .. 7] (group g) and j[0 .. 7] (group h) in the pair layout */
#define PAIR4(grid, i, j, lo, hi)                                                                                   \
    do {                                                                                                            \
        *(lo) = _mm256_setr_epi32(POINT4(grid, i[0]), POINT4(grid, i[1]), POINT4(grid, i[2]), POINT4(grid, i[3]),   \
                                  POINT4(grid, j[0]), POINT4(grid, j[1]), POINT4(grid, j[2]), POINT4(grid, j[3]));  \
        *(hi) = _mm256_setr_epi32(POINT4(grid, i[4]), POINT4(grid, i[5]), POINT4(grid, i[6]), POINT4(grid, i[7]),   \
                                  POINT4(grid, j[4]), POINT4(grid, j[5]), POINT4(grid, j[6]), POINT4(grid, j[7]));  \
    } while (0)

static inline INLINED void iq3_xxs_pair(const uint8_t *b, int p, const uint32_t masks[8], __m256i *lo, __m256i *hi) {
    const uint8_t *ig = b + 2 + 16 * p, *ih = ig + 8;
    PAIR4(iq3xxs_grid, ig, ih, lo, hi);
    signed_pair(lo, hi, masks + 2 * p);
}

/* the signs of IQ3_S and IQ2_S, group g's 32 bits at at + 4g, into masks (pair_masks) */
static inline INLINED void stored_signs(const uint8_t *b, int at, uint32_t masks[8]) {
    u32x8 signs;
    memcpy(&signs, b + at, sizeof signs);
    pair_masks(signs, masks);
}

/* IQ3_S: weights 4l .. 4l + 3 of group g are iq3s_grid[qs[8g + l] | bit l of qh[g] << 8];
 * signs of group g the 32 bits at 74 + 4g; scale d * (1 + 2 (bits 4g of the scales word)) */
static inline INLINED v8f iq3_s_scales(const uint8_t *b, uint32_t masks[8]) {
    stored_signs(b, 74, masks);
    const u32x8 k = {0, 1, 2, 3, 4, 5, 6, 7};
    v8i odd = (v8i)((u32(b + 106) >> (4 * k)) & 15);
    return f16(b) * __builtin_convertvector(1 + 2 * odd, v8f);
}

static inline INLINED void iq3_s_pair(const uint8_t *b, int p, const uint32_t masks[8], __m256i *lo, __m256i *hi) {
    const uint8_t *qs = b + 2 + 16 * p, *qh = b + 66 + 2 * p;
    int i[8], j[8];
    for (int l = 0; l < 8; l++) {
        i[l] = qs[l] | ((qh[0] >> l) & 1) << 8;
        j[l] = qs[8 + l] | ((qh[1] >> l) & 1) << 8;
    }
    PAIR4(iq3s_grid, i, j, lo, hi);
    signed_pair(lo, hi, masks + 2 * p);
}

/* The group (half group) scales of the IQ2_XS and IQ2_S blocks: d * (0.5 + nibble) * 0.25, the
 * 16 nibbles of the scale bytes at `at` (low nibble first): halves 0-15 (lo) and 16-31 (hi). */
static inline INLINED void iq2_half_scales(const uint8_t *b, int at, v8f *lo, v8f *hi) {
    u32x8 bytes = (u32x8)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + at))); /* group g's: byte g */
    float d = f16(b);
    *lo = d * (0.5f + __builtin_convertvector((v8i)(bytes & 15), v8f)) * 0.25f;
    *hi = d * (0.5f + __builtin_convertvector((v8i)(bytes >> 4), v8f)) * 0.25f;
}

/* IQ2_XS: weights 8i .. 8i + 7 are iq2xs_grid[qs[i] & 511], signs ksigns_iq2xs[qs[i] >> 9] */
static inline INLINED void iq2_xs_pair(const uint8_t *b, int p, __m256i *lo, __m256i *hi) {
    const uint8_t *q = b + 2 + 16 * p; /* 16-bit words of group 2p: q, of 2p + 1: q + 8 */
    uint32_t sg = 0, sh = 0;
    for (int l = 0; l < 4; l++) {
        sg |= (uint32_t)ksigns_iq2xs[u16(q + 2 * l) >> 9] << (8 * l);
        sh |= (uint32_t)ksigns_iq2xs[u16(q + 8 + 2 * l) >> 9] << (8 * l);
    }
#define AT(o) POINT8(iq2xs_grid, u16(q + (o)) & 511)
    *lo = _mm256_setr_epi64x(AT(0), AT(2), AT(8), AT(10));
    *hi = _mm256_setr_epi64x(AT(4), AT(6), AT(12), AT(14));
#undef AT
    const uint32_t mask[2] = {(sg & 0xffff) | sh << 16, sg >> 16 | (sh & 0xffff0000u)}; /* as pair_masks */
    signed_pair(lo, hi, mask);
}

/* IQ2_S: weights 8i .. 8i + 7 are iq2s_grid[qs[i] | ((qh[i / 4] >> 2 (i % 4)) & 3) << 8], the
 * signs of group g the 32 bits at 34 + 4g */
static inline INLINED void iq2_s_pair(const uint8_t *b, int p, const uint32_t masks[8], __m256i *lo, __m256i *hi) {
    const uint8_t *qs = b + 2 + 8 * p, *qh = b + 66 + 2 * p;
#define AT(l, h) POINT8(iq2s_grid, qs[l] | ((h >> (2 * ((l) % 4))) & 3) << 8)
    *lo = _mm256_setr_epi64x(AT(0, qh[0]), AT(1, qh[0]), AT(4, qh[1]), AT(5, qh[1]));
    *hi = _mm256_setr_epi64x(AT(2, qh[0]), AT(3, qh[0]), AT(6, qh[1]), AT(7, qh[1]));
#undef AT
    signed_pair(lo, hi, masks + 2 * p);
}

/* IQ1 codes: the grid's -1, 0, 1 as 8 v + delta, delta -1 where bit j of `negative` is set, else +1 */
static inline INLINED __m256i iq1_eighths(__m256i v, uint32_t negative) {
    __m256i eight = _mm256_and_si256(_mm256_slli_epi16(v, 3), _mm256_set1_epi8((char)0xf8));
    return _mm256_add_epi8(eight, negate_where(_mm256_set1_epi8(1), negative));
}

/* IQ1_S: group g's weights 8l .. 8l + 7 are iq1s_grid[qs[4g + l] | ((h >> 3l) & 7) << 8], h the
 * 16-bit word at 34 + 2g, whose bit 15 is the delta's sign; scale d * (2 ((h >> 12) & 7) + 1) / 8 */
static inline INLINED v8f iq1_s_scales(const uint8_t *b) {
    __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(b + 34)));
    v8i s = (v8i)_mm256_and_si256(_mm256_srli_epi32(h, 12), _mm256_set1_epi32(7));
    return f16(b) * __builtin_convertvector(2 * s + 1, v8f) * 0.125f;
}

static inline INLINED void iq1_s_pair(const uint8_t *b, int p, __m256i *lo, __m256i *hi) {
    const uint8_t *qs = b + 2 + 8 * p;
    uint32_t hg = u16(b + 34 + 4 * p), hh = u16(b + 36 + 4 * p);
#define AT(l, h) POINT8(iq1s_grid, qs[l] | ((h >> (3 * ((l) % 4))) & 7) << 8)
    *lo = _mm256_setr_epi64x(AT(0, hg), AT(1, hg), AT(4, hh), AT(5, hh));
    *hi = _mm256_setr_epi64x(AT(2, hg), AT(3, hg), AT(6, hh), AT(7, hh));
#undef AT
    uint32_t negative = (hg & 0x8000 ? 0xffffu : 0) | (hh & 0x8000 ? 0xffff0000u : 0); /* per half: the same */
    *lo = iq1_eighths(*lo, negative);
    *hi = iq1_eighths(*hi, negative);
}

/* IQ1_M: nibble i of qh (16 bytes at 32, low nibble first) holds 3 high grid-index bits and the
 * delta's sign of weights 8i .. 8i + 7; half k's scale d * (2 ((word k / 4 >> 3 (k % 4)) & 7) + 1) / 8,
 * the words at 48, d their top 4 bits (low word first) as fp16 */
static inline INLINED void iq1_m_scales(const uint8_t *b, v8f *lo, v8f *hi) {
    const uint8_t *sc = b + 48;
    uint16_t d = iq1m_d(sc);
    const u32x8 k = {0, 1, 2, 3, 4, 5, 6, 7};
    u32x8 word = {u16(sc), u16(sc), u16(sc + 2), u16(sc + 2), u16(sc + 4), u16(sc + 4), u16(sc + 6), u16(sc + 6)};
    u32x8 half0 = (word >> (3 * (2 * k % 4))) & 7, half1 = (word >> (3 * (2 * k % 4 + 1))) & 7; /* k = 2g, 2g + 1 */
    float df = _cvtsh_ss(d);
    *lo = df * __builtin_convertvector(2 * (v8i)half0 + 1, v8f) * 0.125f;
    *hi = df * __builtin_convertvector(2 * (v8i)half1 + 1, v8f) * 0.125f;
}

static inline INLINED void iq1_m_pair(const uint8_t *b, int p, __m256i *lo, __m256i *hi) {
    const uint8_t *qs = b + 8 * p, *qh = b + 32 + 4 * p; /* nibbles 8p .. 8p + 7: bytes 4p .. 4p + 3 */
    uint32_t nib = u32(qh);
#define NIB(l) ((nib >> (4 * (l))) & 15)
#define AT(l) POINT8(iq1s_grid, qs[l] | (NIB(l) & 7) << 8)
    *lo = _mm256_setr_epi64x(AT(0), AT(1), AT(4), AT(5));
    *hi = _mm256_setr_epi64x(AT(2), AT(3), AT(6), AT(7));
    /* lo's 8-byte lanes: points 0, 1, 4, 5; hi's: 2, 3, 6, 7 */
    static const int order[2][4] = {{0, 1, 4, 5}, {2, 3, 6, 7}};
    uint32_t neg[2] = {0, 0};
    for (int v = 0; v < 2; v++)
        for (int l = 0; l < 4; l++) neg[v] |= NIB(order[v][l]) & 8 ? 0xffu << (8 * l) : 0;
#undef AT
#undef NIB
    *lo = iq1_eighths(*lo, neg[0]);
    *hi = iq1_eighths(*hi, neg[1]);
}

/* -- a pair's products with n tokens (IQ4_NL's) ------------------------------------------------
 * acc[k] += group g's terms, then group h's (both: whether h exists), for token k whose codes
 * of group g start at x + k * K; flo[k] holds scale * xscale of g at index i, of h at i + 1. */
static inline INLINED void pair_terms(__m256i lo, __m256i hi, const int16_t *x, int64_t K, const v8f *flo, int i,
                                      int both, const int n, v8f *acc) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(SPRIG_YMM) /* (Zen 4: the 256-bit form 1.02-1.13x) */
    __m512i wlo = _mm512_cvtepi8_epi16(lo), whi = _mm512_cvtepi8_epi16(hi);
    const __m512i at = _mm512_setr_epi32(i, i, i, i, i, i, i, i, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1);
    for (int k = 0; k < n; k++) {
        const int16_t *xk = x + k * K;
        /* [x_g 0-15 | x_h 0-15] and [x_g 16-31 | x_h 16-31] (h's halves undefined when absent, never added) */
        __m512i xlo = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)xk));
        __m512i xhi = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(xk + 16)));
        if (both) {
            xlo = _mm512_inserti64x4(xlo, _mm256_loadu_si256((const __m256i *)(xk + 32)), 1);
            xhi = _mm512_inserti64x4(xhi, _mm256_loadu_si256((const __m256i *)(xk + 48)), 1);
        }
        __m512 slo = _mm512_permutexvar_ps(at, _mm512_castps256_ps512((__m256)flo[k]));
        __m512i sums = _mm512_dpwssd_epi32(_mm512_madd_epi16(wlo, xlo), whi, xhi);
        __m512 terms = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), slo);
        acc[k] += (v8f)_mm512_castps512_ps256(terms);
        if (both) acc[k] += (v8f)_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(terms), 1));
    }
#else
    __m256i w[4] = {_mm256_cvtepi8_epi16(_mm256_castsi256_si128(lo)), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(hi)),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256(lo, 1)),
                    _mm256_cvtepi8_epi16(_mm256_extracti128_si256(hi, 1))};
    for (int k = 0; k < n; k++) {
        const int16_t *xk = x + k * K;
        for (int j = 0; j < 1 + both; j++) { /* group g, then h */
            __m256i slo = _mm256_madd_epi16(w[2 * j], _mm256_loadu_si256((const __m256i *)(xk + 32 * j)));
            __m256i shi = _mm256_madd_epi16(w[2 * j + 1], _mm256_loadu_si256((const __m256i *)(xk + 32 * j + 16)));
            /* the group's scale in every lane (no index register: the compiler picks the shuffles) */
            __m256 scale = _mm256_set1_ps(flo[k][i + j]);
            acc[k] += (v8f)_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(slo, shi)), scale);
        }
    }
#endif
}

/* A pair's 64 weights as floats, as dequantize_row gives them: code * scale + 0 (its min term),
 * group g at out[0 .. 31], h (if both) at out[32 .. 63]; the scales of g at index i of slo, of h
 * at i + 1 (split: of weights 0-15, and of weights 16-31 in shi). */
static inline INLINED void pair_floats(__m256i lo, __m256i hi, v8f slo, v8f shi, int i, int both, int split,
                                       float *out) {
    for (int j = 0; j < 1 + both; j++) {
        __m128i codes[2] = {j ? _mm256_extracti128_si256(lo, 1) : _mm256_castsi256_si128(lo),
                            j ? _mm256_extracti128_si256(hi, 1) : _mm256_castsi256_si128(hi)};
        for (int half = 0; half < 2; half++) {
            float s = half && split ? shi[i + j] : slo[i + j];
#if defined(__AVX512F__)
            __m512 w = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes[half])), _mm512_set1_ps(s));
            _mm512_storeu_ps(out + 32 * j + 16 * half, _mm512_add_ps(w, _mm512_setzero_ps()));
#else
            for (int e = 0; e < 2; e++) {
                __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(codes[half], 8 * e))),
                                         _mm256_set1_ps(s));
                _mm256_storeu_ps(out + 32 * j + 16 * half + 8 * e, _mm256_add_ps(w, _mm256_setzero_ps()));
            }
#endif
        }
    }
}

/* Every pair of a row of the types of 256 weights (8 groups, 4 pairs) per block, and IQ4_NL's
 * runs of 8 blocks: `scales` sets the block's 8 group scales slo (split: slo of weights 0-15,
 * shi of 16-31) and whatever its pairs need (aux), `pair` the codes of pair p, into lo and hi;
 * `prepare` runs once per block, `use` once per pair. */
#define BLOCKS_256(bytes, split, scales, pair, prepare, use)                                              \
    for (int64_t blk = 0; blk < K / 256; blk++) {                                                          \
        const uint8_t *b = row + blk * (bytes);                                                            \
        uint32_t aux[8];                                                                                   \
        v8f slo, shi = {0};                                                                                \
        (void)aux, (void)shi;                                                                              \
        scales;                                                                                            \
        prepare;                                                                                           \
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                              \
            __m256i lo, hi;                                                                                \
            pair;                                                                                          \
            use;                                                                                           \
        }                                                                                                  \
    }
#define IQ_BLOCKS(prepare, use)                                                                                       \
    case T_IQ4_XS: BLOCKS_256(136, 0, slo = iq4_xs_scales(b), iq4_xs_pair(b, p, &lo, &hi), prepare(0), use(0)) break; \
    case T_IQ2_XXS:                                                                                                   \
        BLOCKS_256(66, 0, slo = iq2_xxs_scales(b, aux), iq2_xxs_pair(b, p, aux, &lo, &hi), prepare(0), use(0)) break;   \
    case T_IQ3_XXS:                                                                                                   \
        BLOCKS_256(98, 0, slo = iq3_xxs_scales(b, aux), iq3_xxs_pair(b, p, aux, &lo, &hi), prepare(0), use(0)) break;   \
    case T_IQ3_S:                                                                                                     \
        BLOCKS_256(110, 0, slo = iq3_s_scales(b, aux), iq3_s_pair(b, p, aux, &lo, &hi), prepare(0), use(0)) break;      \
    case T_IQ1_S: BLOCKS_256(50, 0, slo = iq1_s_scales(b), iq1_s_pair(b, p, &lo, &hi), prepare(0), use(0)) break;      \
    case T_IQ2_XS:                                                                                                    \
        BLOCKS_256(74, 1, iq2_half_scales(b, 66, &slo, &shi), iq2_xs_pair(b, p, &lo, &hi), prepare(1), use(1)) break;   \
    case T_IQ2_S:                                                                                                     \
        BLOCKS_256(82, 1, (iq2_half_scales(b, 74, &slo, &shi), stored_signs(b, 34, aux)),                              \
                   iq2_s_pair(b, p, aux, &lo, &hi), prepare(1), use(1)) break;                                         \
    case T_IQ1_M: BLOCKS_256(56, 1, iq1_m_scales(b, &slo, &shi), iq1_m_pair(b, p, &lo, &hi), prepare(1), use(1)) break; \
    case T_IQ4_NL: /* 8 blocks of 32 at a time as one of 256; the rest after the switch */                          \
        BLOCKS_256(8 * 18, 0, slo = iq4_nl_scales(b), iq4_nl_pair(b + 36 * p, 1, &lo, &hi), prepare(0), use(0)) break;

/* IQ4_NL's blocks after the runs of 8: pairs of blocks, the last one maybe alone */
#define IQ4_NL_TAIL(...) /* the statements that use a pair */                          \
    for (int64_t g = K / 256 * 8; type == T_IQ4_NL && g < K / GROUP; g += 2) {            \
        const uint8_t *b = row + g * 18;                                                  \
        int both = g + 1 < K / GROUP;                                                     \
        v8f sc = {f16(b), both ? f16(b + 18) : 0.0f};                                     \
        __m256i lo, hi;                                                                   \
        iq4_nl_pair(b, both, &lo, &hi);                                                   \
        __VA_ARGS__;                                                                      \
    }

/* n tokens times one IQ4_NL row, as row_tokens would give them */
static inline INLINED void iq4_nl_row(const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, const int n,
                                      float *out, int64_t stride) {
    const int type = T_IQ4_NL;
    v8f acc[ROW_TOKENS] = {{0}}, f[ROW_TOKENS];
    int64_t G = K / GROUP;
    const size_t ahead = prefetch_ahead((size_t)(G * 18));
#define TOKEN_SCALES                                           \
    prefetch_block(b, 8 * 18, ahead);                          \
    for (int k = 0; k < n; k++) { /* scale * xscale */         \
        v8f xs;                                                \
        memcpy(&xs, xd + k * G + 8 * blk, sizeof xs);          \
        f[k] = slo * xs;                                       \
    }
    BLOCKS_256(8 * 18, 0, slo = iq4_nl_scales(b), iq4_nl_pair(b + 36 * p, 1, &lo, &hi), TOKEN_SCALES,
               pair_terms(lo, hi, xq + blk * 256 + 64 * p, K, f, 2 * p, 1, n, acc))
#undef TOKEN_SCALES
    IQ4_NL_TAIL(for (int k = 0; k < n; k++) f[k] = sc * (v8f){xd[k * G + g], both ? xd[k * G + g + 1] : 0.0f};
                pair_terms(lo, hi, xq + g * GROUP, K, f, 0, both, n, acc))
    for (int k = 0; k < n; k++) out[k * stride] = reduce8(acc[k]);
}

static __attribute__((noinline)) void iq_dequantize(int type, const uint8_t *row, int64_t K, float *out) {
#define NOTHING(split)
#define FLOATS(split) pair_floats(lo, hi, slo, shi, 2 * p, 1, split, out + blk * 256 + 64 * p)
    switch (type) { IQ_BLOCKS(NOTHING, FLOATS) }
#undef NOTHING
#undef FLOATS
    IQ4_NL_TAIL(pair_floats(lo, hi, sc, sc, 0, both, 0, out + g * GROUP))
}
#undef IQ4_NL_TAIL
#undef IQ_BLOCKS
#undef BLOCKS_256

/* IQ4_NL is the only type whose product is here: the others take 8-bit codes (codes8_dots.c) */
static __attribute__((noinline)) void iq4_nl_dot(const uint8_t *row, int64_t K, const int16_t *xq, const float *xd,
                                                 int n, float *out, int64_t stride) {
    switch (n) { /* one body per count, each block's codes shared by the tokens */
    case 1: iq4_nl_row(row, K, xq, xd, 1, out, stride); break;
    case 2: iq4_nl_row(row, K, xq, xd, 2, out, stride); break;
    case 3: iq4_nl_row(row, K, xq, xd, 3, out, stride); break;
    default: iq4_nl_row(row, K, xq, xd, ROW_TOKENS, out, stride); break;
    }
}

int iq_dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, int n, float *out,
                      int64_t stride) {
    if (type != T_IQ4_NL) return 0;
    iq4_nl_dot(row, K, xq, xd, n, out, stride);
    return 1;
}

int iq_dequantize_row(int type, const uint8_t *row, int64_t K, float *out) {
#define IQ_CASE(name) case T_##name:
    switch (type) {
        IQ_CASE(IQ4_NL)
        IQ_CASE(IQ4_XS)
        IQ_CASE(IQ3_XXS)
        IQ_CASE(IQ3_S)
        IQ_CASE(IQ2_XXS)
        IQ_CASE(IQ2_XS)
        IQ_CASE(IQ2_S)
        IQ_CASE(IQ1_S)
        IQ_CASE(IQ1_M)
        iq_dequantize(type, row, K, out);
        return 1;
    default: return 0;
    }
#undef IQ_CASE
}

#else /* scalar, NEON: the generic form */
int iq_dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, int n, float *out,
                      int64_t stride) {
    (void)type, (void)row, (void)K, (void)xq, (void)xd, (void)n, (void)out, (void)stride;
    return 0;
}

int iq_dequantize_row(int type, const uint8_t *row, int64_t K, float *out) {
    (void)type, (void)row, (void)K, (void)out;
    return 0;
}
#endif

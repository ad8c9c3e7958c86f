/* The IQ types' own products on the AVX2 and AVX-512 tiers (IQ4_NL, IQ4_XS, IQ2_XXS): each
 * block unpacked in registers, two groups of 32 at a time, and shared by the n <= ROW_TOKENS
 * tokens of dot_row_tokens, with no stack round trip. The arithmetic is the generic form's
 * (kernels.h, row_tokens in quants.c), bit for bit: per group, exact int32 sums in 8 lanes,
 * lane l taking weights 2l, 2l + 1, 16 + 2l and 17 + 2l; acc[l] += sums * (scale * xscale),
 * the groups in order; reduce8. Only the integer sums are formed differently, and they are exact.
 *
 * A pair of groups g, h = g + 1 is two vectors of 32 int8 codes:
 *     lo = [weights 0-15 of g | weights 0-15 of h],   hi = [weights 16-31 of g | 16-31 of h]
 * AVX-512 widens each to 32 int16 and takes both groups' sums in one 16-lane register (lanes
 * 0-7 g's, 8-15 h's): madd(lo, x lo halves) + dpwssd(hi, x hi halves), the activations of the
 * two groups' halves side by side. AVX2 does the same one group at a time in 8 lanes.
 * Other tiers (scalar, NEON) and types keep the generic form: iq_dot_row_tokens returns 0. */
#include <string.h>

#include "iq_grids.h" /* kvalues_iq4nl, iq2xxs_grid */
#include "kernels.h"
#include "simd.h"

#if defined(__AVX2__)
#include <immintrin.h>

#define INLINED __attribute__((always_inline))

typedef uint32_t u32x8 __attribute__((vector_size(32)));

static inline uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline float f16(const uint8_t *p) { return _cvtsh_ss(u16(p)); } /* exact, as quants.c's */
static inline uint32_t u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t u64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The 32 codes of w negated where bit j of `bits` is set (byte j). */
static inline __m256i negate_where(__m256i w, uint32_t bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_mask_sub_epi8(w, (__mmask32)bits, _mm256_setzero_si256(), w);
#else
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    /* byte k of `bits` to the 8 positions 8k .. 8k + 7, then each position's own bit */
    const __m256i spread_index = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                  2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread_index);
    __m256i m = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    return _mm256_sub_epi8(_mm256_xor_si256(w, m), m); /* (w ^ -1) + 1 = -w where set */
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

/* IQ4_NL: blocks b (group g) and b + 18 (group h, if both; else g again, never added) */
static inline INLINED void iq4_nl_pair(const uint8_t *b, int both, __m256i *lo, __m256i *hi) {
    __m128i qg = _mm_loadu_si128((const __m128i *)(b + 2)), qh = both ? _mm_loadu_si128((const __m128i *)(b + 20)) : qg;
    iq4_pair(_mm256_inserti128_si256(_mm256_castsi128_si256(qg), qh, 1), lo, hi);
}

/* IQ2_XXS (layout in quants.c): group g's 8 bytes at 2 + 8g are 4 grid indices and aux. The
 * signs of group g as 32 bits (byte l: ksigns_iq2xs[(aux >> 7l) & 127], i.e. the 7 bits and
 * their parity in bit 7) and its scale d * (0.5 + (aux >> 28)) * 0.25, for all 8 groups at once. */
static inline INLINED v8f iq2_xxs_signs_scales(const uint8_t *b, uint32_t signs[8]) {
    /* the odd 32-bit words of bytes 2-65: [a0 a1 a4 a5 | a2 a3 a6 a7], then in order */
    __m256 odd = _mm256_shuffle_ps(_mm256_loadu_ps((const float *)(b + 2)), _mm256_loadu_ps((const float *)(b + 34)),
                                   _MM_SHUFFLE(3, 1, 3, 1));
    u32x8 aux = (u32x8)_mm256_permute4x64_epi64(_mm256_castps_si256(odd), _MM_SHUFFLE(3, 1, 2, 0));
    u32x8 bits = (aux & 0x7f) | ((aux << 1) & 0x7f00) | ((aux << 2) & 0x7f0000) | ((aux << 3) & 0x7f000000);
    u32x8 parity = bits ^ (bits >> 4); /* bit 0 of each byte: the parity of its bits */
    parity ^= parity >> 2;
    parity ^= parity >> 1;
    bits |= (parity & 0x01010101) << 7;
    memcpy(signs, &bits, sizeof bits);
    return f16(b) * (0.5f + __builtin_convertvector((v8i)(aux >> 28), v8f)) * 0.25f;
}

static inline INLINED void iq2_xxs_pair(const uint8_t *b, int p, const uint32_t signs[8], __m256i *lo, __m256i *hi) {
    const uint8_t *ig = b + 2 + 16 * p, *ih = ig + 8; /* grid indices of groups 2p, 2p + 1 */
#define GRID(i) ((long long)u64(iq2xxs_grid[i]))
    *lo = _mm256_setr_epi64x(GRID(ig[0]), GRID(ig[1]), GRID(ih[0]), GRID(ih[1]));
    *hi = _mm256_setr_epi64x(GRID(ig[2]), GRID(ig[3]), GRID(ih[2]), GRID(ih[3]));
#undef GRID
    uint32_t sg = signs[2 * p], sh = signs[2 * p + 1];
    *lo = negate_where(*lo, (sg & 0xffff) | sh << 16);
    *hi = negate_where(*hi, sg >> 16 | (sh & 0xffff0000u));
}

/* -- a pair's products with n tokens --------------------------------------------------------
 * acc[k] += group g's terms, then group h's (both: whether h exists), for token k whose codes
 * of group g start at x + k * K; f[k] holds scale * xscale of g at index i, of h at i + 1. */
static inline INLINED void pair_terms(__m256i lo, __m256i hi, const int16_t *x, int64_t K, const v8f *f, int i,
                                      int both, const int n, v8f *acc) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    __m512i wlo = _mm512_cvtepi8_epi16(lo), whi = _mm512_cvtepi8_epi16(hi);
    const __m512i at = _mm512_setr_epi32(i, i, i, i, i, i, i, i, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1, i + 1);
    for (int k = 0; k < n; k++) {
        const int16_t *xk = x + k * K;
        /* [x_g 0-15 | x_h 0-15] and [x_g 16-31 | x_h 16-31] (h's half zeros when absent) */
        __m256i g0 = _mm256_loadu_si256((const __m256i *)xk), g1 = _mm256_loadu_si256((const __m256i *)(xk + 16));
        __m512i xlo = _mm512_castsi256_si512(g0), xhi = _mm512_castsi256_si512(g1);
        if (both) {
            xlo = _mm512_inserti64x4(xlo, _mm256_loadu_si256((const __m256i *)(xk + 32)), 1);
            xhi = _mm512_inserti64x4(xhi, _mm256_loadu_si256((const __m256i *)(xk + 48)), 1);
        }
        __m512i sums = _mm512_dpwssd_epi32(_mm512_madd_epi16(wlo, xlo), whi, xhi);
        __m512 scale = _mm512_permutexvar_ps(at, _mm512_castps256_ps512((__m256)f[k]));
        __m512 terms = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), scale);
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
            __m256i sums = _mm256_add_epi32(
                _mm256_madd_epi16(w[2 * j], _mm256_loadu_si256((const __m256i *)(xk + 32 * j))),
                _mm256_madd_epi16(w[2 * j + 1], _mm256_loadu_si256((const __m256i *)(xk + 32 * j + 16))));
            __m256 scale = _mm256_permutevar8x32_ps((__m256)f[k], _mm256_set1_epi32(i + j));
            acc[k] += (v8f)_mm256_mul_ps(_mm256_cvtepi32_ps(sums), scale);
        }
    }
#endif
}

/* The types of 256 weights (8 groups, 4 pairs) per block: `scales` gives the block's 8 group
 * scales (and whatever its pairs need, into `aux`), `pair` the codes of pair p. */
#define BLOCKS_256(bytes, scales, pair)                                                                   \
    for (int64_t blk = 0; blk < K / 256; blk++) {                                                          \
        const uint8_t *b = row + blk * (bytes);                                                            \
        uint32_t aux[8];                                                                                   \
        v8f sc = scales, f[ROW_TOKENS];                                                                    \
        (void)aux;                                                                                         \
        for (int k = 0; k < n; k++) {                                                                      \
            v8f xs;                                                                                        \
            memcpy(&xs, xd + k * G + 8 * blk, sizeof xs);                                                  \
            f[k] = sc * xs;                                                                                \
        }                                                                                                  \
        _Pragma("GCC unroll 4") for (int p = 0; p < 4; p++) {                                              \
            __m256i lo, hi;                                                                                \
            pair;                                                                                          \
            pair_terms(lo, hi, xq + blk * 256 + 64 * p, K, f, 2 * p, 1, n, acc);                           \
        }                                                                                                  \
    }

/* n tokens times one row of `type`, as row_tokens would give them */
static inline INLINED void iq_row(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd,
                                  const int n, float *out, int64_t stride) {
    v8f acc[ROW_TOKENS] = {{0}};
    int64_t G = K / GROUP;
    switch (type) {
    case T_IQ4_XS: BLOCKS_256(136, iq4_xs_scales(b), iq4_xs_pair(b, p, &lo, &hi)) break;
    case T_IQ2_XXS: BLOCKS_256(66, iq2_xxs_signs_scales(b, aux), iq2_xxs_pair(b, p, aux, &lo, &hi)) break;
    case T_IQ4_NL:
        for (int64_t g = 0; g < G; g += 2) { /* blocks of 32: a pair of blocks, or the last one alone */
            const uint8_t *b = row + g * 18;
            int both = g + 1 < G;
            v8f sc = {f16(b), both ? f16(b + 18) : 0.0f}, f[ROW_TOKENS];
            for (int k = 0; k < n; k++) f[k] = sc * (v8f){xd[k * G + g], both ? xd[k * G + g + 1] : 0.0f};
            __m256i lo, hi;
            iq4_nl_pair(b, both, &lo, &hi);
            pair_terms(lo, hi, xq + g * GROUP, K, f, 0, both, n, acc);
        }
        break;
    }
    for (int k = 0; k < n; k++) out[k * stride] = reduce8(acc[k]);
}
#undef BLOCKS_256

#define IQ_DOT(name, number)                                                                                       \
    static __attribute__((noinline)) void iq_dot_##name(const uint8_t *row, int64_t K, const int16_t *xq,        \
                                                        const float *xd, int n, float *out, int64_t stride) {      \
        switch (n) { /* one body per count, each block's codes shared by the tokens */                           \
        case 1: iq_row(number, row, K, xq, xd, 1, out, stride); break;                                            \
        case 2: iq_row(number, row, K, xq, xd, 2, out, stride); break;                                            \
        case 3: iq_row(number, row, K, xq, xd, 3, out, stride); break;                                            \
        default: iq_row(number, row, K, xq, xd, ROW_TOKENS, out, stride); break;                                  \
        }                                                                                                         \
    }
IQ_DOT(IQ4_NL, T_IQ4_NL)
IQ_DOT(IQ4_XS, T_IQ4_XS)
IQ_DOT(IQ2_XXS, T_IQ2_XXS)
#undef IQ_DOT

int iq_dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, int n, float *out,
                      int64_t stride) {
    switch (type) {
    case T_IQ4_NL: iq_dot_IQ4_NL(row, K, xq, xd, n, out, stride); return 1;
    case T_IQ4_XS: iq_dot_IQ4_XS(row, K, xq, xd, n, out, stride); return 1;
    case T_IQ2_XXS: iq_dot_IQ2_XXS(row, K, xq, xd, n, out, stride); return 1;
    default: return 0;
    }
}

#else /* scalar, NEON: the generic form */
int iq_dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, int n, float *out,
                      int64_t stride) {
    (void)type, (void)row, (void)K, (void)xq, (void)xd, (void)n, (void)out, (void)stride;
    return 0;
}
#endif

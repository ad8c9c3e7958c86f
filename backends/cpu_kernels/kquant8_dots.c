/* Q2_K and Q3_K times 8-bit activation codes (form OWN8 in kernels.h).
 *
 * Both types have 16-weight sub-blocks j with integer scales sc[j] and unsigned 2- or 3-bit codes
 * c (quants.c draws their bits: unpack_q2_k, unpack_q3_k):
 *   Q2_K: weight = d * sc[j] * c - dmin * m[j]   (c 0 .. 3; sc and the min m 4-bit)
 *   Q3_K: weight = d * sc[j] * (c - 4)           (c = low 2 bits | high bit << 2, 0 .. 7; sc 6-bit minus 32)
 * A token's block of 256 codes q has a scale xd[g] per group g of 32 and sums per 16 (Codes8).
 * Each group's products are summed exactly in 8 int32 lanes, lane l taking weights 4l .. 4l + 3
 * (so sub-block 2g + l / 4):
 *   isum_g[l] = sc[2g + l / 4] * (c q summed over weights 32g + 4l .. 32g + 4l + 3)
 * and the sums terms, lane l taking group l (sub-blocks 2l and 2l + 1):
 *   Q3_K: corr[l] = -4 * (sc[2l] sums[2l] + sc[2l + 1] sums[2l + 1])
 *   Q2_K: mins[l] = m[2l] sums[2l] + m[2l + 1] sums[2l + 1]
 * all far below 2^24, so their floats are exact. Then, per token, in 8 float lanes, each fma
 * rounded once:
 *   part_e[l] = fma(isum_g[l], xd[g], part_e[l])   from 0, for the block's groups g in order,
 *                                                 e = g mod 2 (two chains of fmas, not one)
 *   part[l] = part_0[l] + part_1[l]
 *   Q3_K: part[l] = fma(corr[l], xd[l], part[l])
 *   acc[l] = fma(part[l], d, acc[l])
 *   Q2_K: acc[l] = fma(mins[l] * xd[l], -dmin, acc[l])    (the product rounded first)
 * over the blocks in order, and out = reduce8(acc). Only the integer lanes come from tier code,
 * and they are exact, so every tier agrees bit for bit.
 *
 * x86 (the avx2 and avx512 tiers) takes a group of 32 weights at a time: the codes as 32 bytes,
 * _mm256_maddubs_epi16 with the token's 32 codes (pair sums of at most 2 * 7 * 127: no
 * saturation), _mm256_madd_epi16 with the sub-block scales (words 0-7 the group's first
 * sub-block, 8-15 its second): the lanes above. The codes and scales are unpacked once for the
 * n <= ROW_TOKENS tokens. The portable form (scalar, NEON) sums the same lanes in C. */
#include <string.h>

#include "bytes.h" /* f16, q3_k_scale: a block's scales */
#include "kernels.h"
#include "simd.h"

#define Q2_K_BYTES 84
#define Q3_K_BYTES 110

static inline v8f splat(float v) { return (v8f){v, v, v, v, v, v, v, v}; }

/* One token's block terms, given its groups' part and its sums terms (Q3_K: corr, Q2_K: mins):
 * the module comment's float arithmetic, the same C in every tier. */
static inline v8f add_block(int type, v8f acc, v8f part, v8i sums_terms, float d, float dmin, const float *xd) {
    v8f xs, terms = __builtin_convertvector(sums_terms, v8f);
    memcpy(&xs, xd, sizeof xs);
    if (type == T_Q3_K) part = fma8(terms, xs, part);
    acc = fma8(part, splat(d), acc);
    if (type == T_Q2_K) acc = fma8(terms * xs, splat(-dmin), acc);
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

static inline __attribute__((always_inline)) void rows_tokens(int type, const uint8_t *row, int64_t K,
                                                              const Codes8 *x8, const int N, float *out,
                                                              int64_t stride) {
    const int64_t B = K / BLOCK8;
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    v8f acc[ROW_TOKENS] = {{0}};
    for (int64_t blk = 0; blk < B; blk++) {
        const uint8_t *b = row + blk * (type == T_Q2_K ? Q2_K_BYTES : Q3_K_BYTES);
        __m256i sc16, sums_factor, hm = _mm256_setzero_si256();
        const uint8_t *qs;
        float d, dmin = 0.0f;
        if (type == T_Q2_K) {
            __m128i packed = _mm_loadu_si128((const __m128i *)b);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, _mm_set1_epi8(15)));
            sums_factor = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(15))); /* m */
            qs = b + 16;
            d = f16(b + 80);
            dmin = f16(b + 82);
        } else {
            sc16 = _mm256_cvtepi8_epi16(q3_k_scales(b + 96));
            sums_factor = _mm256_slli_epi16(_mm256_sub_epi16(_mm256_setzero_si256(), sc16), 2); /* -4 sc */
            hm = _mm256_loadu_si256((const __m256i *)b);
            qs = b + 32;
            d = f16(b + 108);
        }
        const __m256i half_scales[2] = {_mm256_permute4x64_epi64(sc16, 0x44), _mm256_permute4x64_epi64(sc16, 0xee)};
        __m256 part[ROW_TOKENS][2];
        for (int k = 0; k < N; k++) part[k][0] = part[k][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const int g = 4 * n + j;
                __m256i codes = _mm256_and_si256(j ? _mm256_srli_epi16(packed, 2 * j) : packed, three);
                if (type == T_Q3_K) { /* bit g of each hmask byte, moved to bit 2 */
                    __m256i bit = g < 2 ? _mm256_slli_epi16(hm, 2 - g) : g > 2 ? _mm256_srli_epi16(hm, g - 2) : hm;
                    codes = _mm256_or_si256(codes, _mm256_and_si256(bit, four));
                }
                const __m256i scales = _mm256_shuffle_epi8(half_scales[n], scale_control(g));
                for (int k = 0; k < N; k++) {
                    const Codes8 *x = &x8[k * B + blk];
                    __m256i q = _mm256_loadu_si256((const __m256i *)(x->q + 32 * g));
                    __m256i isum = _mm256_madd_epi16(_mm256_maddubs_epi16(codes, q), scales);
                    part[k][j % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(x->d + g), part[k][j % 2]);
                }
            }
        }
        for (int k = 0; k < N; k++) {
            const Codes8 *x = &x8[k * B + blk];
            v8i lanes = (v8i)_mm256_madd_epi16(sums_factor, _mm256_loadu_si256((const __m256i *)x->sums));
            acc[k] = add_block(type, acc[k], (v8f)part[k][0] + (v8f)part[k][1], lanes, d, dmin, x->d);
        }
    }
    for (int k = 0; k < N; k++) out[k * stride] = reduce8(acc[k]);
}

#else

/* A block's 16 sub-block scales, the factors of its sums terms (Q2_K: m; Q3_K: -4 sc), and its
 * 256 codes c (module comment). */
static inline void block_codes(int type, const uint8_t *b, int32_t sc[16], int32_t factor[16], uint8_t c[256]) {
    const uint8_t *qs = b + (type == T_Q2_K ? 16 : 32);
    for (int e = 0; e < 256; e++) {
        int n = e / 128, j = (e / 32) % 4, l = e % 32;
        c[e] = (qs[32 * n + l] >> (2 * j)) & 3;
        if (type == T_Q3_K) c[e] |= ((b[l] >> (e / 32)) & 1) << 2; /* bit e / 32 of hmask[l] */
    }
    if (type == T_Q2_K) {
        for (int k = 0; k < 16; k++) {
            sc[k] = b[k] & 15;
            factor[k] = b[k] >> 4;
        }
    } else {
        for (int k = 0; k < 16; k++) {
            sc[k] = q3_k_scale(b + 96, k);
            factor[k] = -4 * sc[k];
        }
    }
}

static inline __attribute__((always_inline)) void rows_tokens(int type, const uint8_t *row, int64_t K,
                                                              const Codes8 *x8, const int N, float *out,
                                                              int64_t stride) {
    const int64_t B = K / BLOCK8;
    v8f acc[ROW_TOKENS] = {{0}};
    for (int64_t blk = 0; blk < B; blk++) {
        const uint8_t *b = row + blk * (type == T_Q2_K ? Q2_K_BYTES : Q3_K_BYTES);
        int32_t sc[16], factor[16];
        uint8_t c[256];
        block_codes(type, b, sc, factor, c);
        float d = f16(b + (type == T_Q2_K ? 80 : 108)), dmin = type == T_Q2_K ? f16(b + 82) : 0.0f;
        for (int k = 0; k < N; k++) {
            const Codes8 *x = &x8[k * B + blk];
            v8f part[2] = {{0}};
            for (int g = 0; g < 8; g++) { /* the module comment's lanes */
                v8i isum;
                for (int l = 0; l < 8; l++) {
                    int32_t s = 0;
                    for (int i = 32 * g + 4 * l; i < 32 * g + 4 * l + 4; i++) s += c[i] * x->q[i];
                    isum[l] = sc[2 * g + l / 4] * s;
                }
                part[g % 2] = fma8(__builtin_convertvector(isum, v8f), splat(x->d[g]), part[g % 2]);
            }
            v8i lanes;
            for (int l = 0; l < 8; l++) lanes[l] = factor[2 * l] * x->sums[2 * l] + factor[2 * l + 1] * x->sums[2 * l + 1];
            acc[k] = add_block(type, acc[k], part[0] + part[1], lanes, d, dmin, x->d);
        }
    }
    for (int k = 0; k < N; k++) out[k * stride] = reduce8(acc[k]);
}

#endif

/* dot_Q2_K and dot_Q3_K (kernels.h's product functions of the OWN8 types): one body per count of
 * tokens, so that the loop over them unrolls. */
#define KQUANT8_DOT(name)                                                                                       \
    void dot_##name(const uint8_t *row, int64_t K, const Codes8 *x8, int n, float *out, int64_t stride) {      \
        switch (n) {                                                                                            \
        case 1: rows_tokens(T_##name, row, K, x8, 1, out, stride); break;                                       \
        case 2: rows_tokens(T_##name, row, K, x8, 2, out, stride); break;                                       \
        case 3: rows_tokens(T_##name, row, K, x8, 3, out, stride); break;                                       \
        default: rows_tokens(T_##name, row, K, x8, ROW_TOKENS, out, stride); break;                            \
        }                                                                                                       \
    }
KQUANT8_DOT(Q2_K)
KQUANT8_DOT(Q3_K)

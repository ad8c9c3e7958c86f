/* Q6_K times int16 activation codes: the type's own product (form OWN in kernels.h).
 *
 * Q6_K has 16-weight sub-blocks with int8 scales, and one float d per block of 256 weights. The
 * integer scale goes into the weights, so that a group of 32 is one integer dot product:
 *     w[e] = sc[e / 16] * code[e]   (scales[k] (int8) * (q - 32), q of 6 bits)
 *     isum[l] = w[2l] x[2l] + w[2l + 1] x[2l + 1]   for the 16 lanes l of a group
 * With |x| <= 32767 and |w| <= 4096, |isum| < 2^28 (no int32 overflow), and its float is rounded
 * to nearest (at most 2^-24 of it, far below the activations' own rounding), the same in every
 * tier. For each token, in 16 float lanes (every operation a fused multiply-add, rounded once):
 *     part[l] = 0;  part[l] = fma(isum_g[l], xd[g], part[l])   for the block's 8 groups g in order
 *     acc[l]  = fma(part[l], d, acc[l])
 * over the blocks in order, and the row's result is reduce8(acc[0..7] + acc[8..15]). Every tier
 * does exactly these operations, so they agree bit for bit: AVX-512 unpacks each group into one
 * 512-bit register of 32 int16 weights (its 16 lanes the 16 of the group), AVX2 into two 256-bit
 * ones, and the portable form (scalar, NEON) writes the block's weights to the stack. A block is
 * unpacked once for the n <= ROW_TOKENS tokens. q6_k_block_int16 writes a block's int16 weights
 * out, each tier as its products make them, for the int16 prefill (int16_panels.c). */
#include <string.h>

#include "bytes.h" /* f16: a block's fp16 scales */
#include "kernels.h"
#include "simd.h"
#include "int16_words.h" /* q6_k_group: a group's int16 weights (x86) */

#define BLOCK_GROUPS 8 /* groups of 32 in a block of 256 */
#define Q6_K_BYTES 210

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

/* n tokens times one row: the module comment's arithmetic in 16 lanes of one register. */
static inline __attribute__((always_inline)) void rows_tokens(const uint8_t *row, int64_t K, const int16_t *xq,
                                                              const float *xd, const int N, float *out, int64_t stride) {
    const int64_t G = K / GROUP;
    __m512 acc[ROW_TOKENS];
    for (int k = 0; k < N; k++) acc[k] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < K / 256; blk++) {
        const uint8_t *b = row + blk * Q6_K_BYTES;
        const int64_t g0 = blk * BLOCK_GROUPS;
        prefetch_block(b, Q6_K_BYTES, prefetch_ahead((size_t)(K / 256 * Q6_K_BYTES)));
        const Q6Scales sc = q6_k_block_scales(b);
        __m512 part[ROW_TOKENS];
        for (int k = 0; k < N; k++) part[k] = _mm512_setzero_ps();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                int g = 4 * n + j;
                __m512i w = q6_k_group(b, g, 0, &sc);
                for (int k = 0; k < N; k++) {
                    __m512i isum = _mm512_madd_epi16(w, _mm512_loadu_si512(xq + k * K + (g0 + g) * GROUP));
                    part[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_set1_ps(xd[k * G + g0 + g]), part[k]);
                }
            }
        }
        const float d = f16(b + 208);
        for (int k = 0; k < N; k++) acc[k] = _mm512_fmadd_ps(part[k], _mm512_set1_ps(d), acc[k]);
    }
    for (int k = 0; k < N; k++) {
        v8f lo, hi;
        memcpy(&lo, &acc[k], sizeof lo);
        memcpy(&hi, (const float *)&acc[k] + 8, sizeof hi);
        out[k * stride] = reduce8(lo + hi);
    }
}

#elif defined(__AVX2__)

/* A group as two registers of 16 int16 weights: weights 0-15 (lanes 0-7), 16-31 (lanes 8-15). */
static inline __attribute__((always_inline)) void rows_tokens(const uint8_t *row, int64_t K, const int16_t *xq,
                                                              const float *xd, const int N, float *out, int64_t stride) {
    const int64_t G = K / GROUP;
    __m256 acc[ROW_TOKENS][2];
    for (int k = 0; k < N; k++) acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < K / 256; blk++) {
        const uint8_t *b = row + blk * Q6_K_BYTES;
        const int64_t g0 = blk * BLOCK_GROUPS;
        prefetch_block(b, Q6_K_BYTES, prefetch_ahead((size_t)(K / 256 * Q6_K_BYTES)));
        const Q6Scales sc = q6_k_block_scales(b);
        __m256 part[ROW_TOKENS][2];
        for (int k = 0; k < N; k++) part[k][0] = part[k][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                int g = 4 * n + j;
                __m256i w[2];
                for (int h = 0; h < 2; h++) w[h] = q6_k_group(b, g, h, &sc);
                for (int k = 0; k < N; k++) {
                    const int16_t *x = xq + k * K + (g0 + g) * GROUP;
                    __m256 xs = _mm256_set1_ps(xd[k * G + g0 + g]);
                    for (int h = 0; h < 2; h++) {
                        __m256i isum = _mm256_madd_epi16(w[h], _mm256_loadu_si256((const __m256i *)(x + 16 * h)));
                        part[k][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), xs, part[k][h]);
                    }
                }
            }
        }
        const float d = f16(b + 208);
        for (int k = 0; k < N; k++)
            for (int h = 0; h < 2; h++) acc[k][h] = _mm256_fmadd_ps(part[k][h], _mm256_set1_ps(d), acc[k][h]);
    }
    for (int k = 0; k < N; k++) out[k * stride] = reduce8((v8f)acc[k][0] + (v8f)acc[k][1]);
}

#else

typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));

/* The codes of group g of a block, as bytes (the negative ones wrapped): Q6_K's 4 low bits and 2
 * high bits minus 32 (unpack_q6_k). */
static inline u8x32 group_codes(const uint8_t *b, int g) {
    const int n = g / 4, j = g % 4;
    u8x32 codes, high;
    memcpy(&codes, b + 64 * n + 32 * (j & 1), sizeof codes);
    memcpy(&high, b + 128 + 32 * n, sizeof high);
    return (((codes >> (4 * (j >> 1))) & 15) | (((high >> (2 * j)) & 3) << 4)) - 32;
}

/* The block's 256 int16 weights sc * code, and its d (GCC vector extensions: NEON registers on
 * arm64). */
static inline void block_weights(const uint8_t *b, int16_t *w, float *d) {
    for (int g = 0; g < BLOCK_GROUPS; g++) {
        u8x32 codes = group_codes(b, g);
        for (int h = 0; h < 2; h++) {
            i8x16 half_codes;
            memcpy(&half_codes, (const int8_t *)&codes + 16 * h, sizeof half_codes);
            i16x16 weights = __builtin_convertvector(half_codes, i16x16) * (int16_t)(int8_t)b[192 + 2 * g + h];
            memcpy(w + 32 * g + 16 * h, &weights, sizeof weights);
        }
    }
    *d = f16(b + 208);
}

void q6_k_block_int16(const uint8_t *b, int16_t *w) {
    float d;
    block_weights(b, w, &d);
}

/* isum[l] = w[2l] x[2l] + w[2l + 1] x[2l + 1] for the 8 lanes of 16 weights */
static inline v8i pair_sums16(const int16_t *w, const int16_t *x) {
    v8i out;
#if defined(__ARM_NEON) && defined(__aarch64__)
    int16x8_t w0 = vld1q_s16(w), w1 = vld1q_s16(w + 8), x0 = vld1q_s16(x), x1 = vld1q_s16(x + 8);
    vst1q_s32((int32_t *)&out, vpaddq_s32(vmull_s16(vget_low_s16(w0), vget_low_s16(x0)), vmull_high_s16(w0, x0)));
    vst1q_s32((int32_t *)&out + 4, vpaddq_s32(vmull_s16(vget_low_s16(w1), vget_low_s16(x1)), vmull_high_s16(w1, x1)));
#else
    for (int l = 0; l < 8; l++) out[l] = w[2 * l] * x[2 * l] + w[2 * l + 1] * x[2 * l + 1];
#endif
    return out;
}

static inline __attribute__((always_inline)) void rows_tokens(const uint8_t *row, int64_t K, const int16_t *xq,
                                                              const float *xd, const int N, float *out, int64_t stride) {
    const int64_t G = K / GROUP;
    v8f acc[ROW_TOKENS][2] = {{{0}}};
    for (int64_t blk = 0; blk < K / 256; blk++) {
        int16_t w[256];
        float d;
        const int64_t g0 = blk * BLOCK_GROUPS;
        prefetch_block(row + blk * Q6_K_BYTES, Q6_K_BYTES, prefetch_ahead((size_t)(K / 256 * Q6_K_BYTES)));
        block_weights(row + blk * Q6_K_BYTES, w, &d);
        const v8f dv = {d, d, d, d, d, d, d, d};
        for (int k = 0; k < N; k++) {
            v8f part[2] = {{0}};
            for (int g = 0; g < BLOCK_GROUPS; g++) {
                const int16_t *x = xq + k * K + (g0 + g) * GROUP, *wg = w + GROUP * g;
                float s = xd[k * G + g0 + g];
                const v8f xs = {s, s, s, s, s, s, s, s};
                for (int h = 0; h < 2; h++)
                    part[h] = fma8(__builtin_convertvector(pair_sums16(wg + 16 * h, x + 16 * h), v8f), xs, part[h]);
            }
            for (int h = 0; h < 2; h++) acc[k][h] = fma8(part[h], dv, acc[k][h]);
        }
    }
    for (int k = 0; k < N; k++) out[k * stride] = reduce8(acc[k][0] + acc[k][1]);
}

#endif

#if defined(VW_WORDS) /* the x86 tiers (the others: block_weights, above) */
void q6_k_block_int16(const uint8_t *b, int16_t *w) {
    const Q6Scales sc = q6_k_block_scales(b);
    for (int g = 0; g < BLOCK_GROUPS; g++)
        for (int h = 0; h < 32 / VW_WORDS; h++) vw_store(w + 32 * g + VW_WORDS * h, q6_k_group(b, g, h, &sc));
}
#endif

/* dot_Q6_K (kernels.h's product function of the OWN type): one body per count of tokens, so that
 * the loop over them unrolls. */
void dot_Q6_K(const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, const float *xs, const float *xh,
              float *mins, int n, float *out, int64_t stride) {
    (void)xs, (void)xh, (void)mins; /* group and half-group sums, min scratch: the generic row form's */
    switch (n) {
    case 1: rows_tokens(row, K, xq, xd, 1, out, stride); break;
    case 2: rows_tokens(row, K, xq, xd, 2, out, stride); break;
    case 3: rows_tokens(row, K, xq, xd, 3, out, stride); break;
    default: rows_tokens(row, K, xq, xd, ROW_TOKENS, out, stride); break;
    }
}

/* TQ1_0 and TQ2_0 (ternary) products by table lookup, as q1_tiles.c multiplies Q1_0.
 *
 * Weights. At load, a ternary matrix is regrouped (tq_tile_matrix) into tiles of
 * Q1_TILE = 32 rows, the last one padded with zero rows. Each weight is the code c = w + 1,
 * two bits (0, 1, 2; TQ2_0's unused code 3 is kept, and means w = 2 as gguf-py reads it).
 * For each block of 256 columns a tile holds the 32 rows' fp16 scales d in row order
 * (64 bytes), then 64 steps of 32 bytes: step s is one byte per row, the codes of weights
 * 4s .. 4s + 3 as c0 | c1 << 2 | c2 << 4 | c3 << 6, the byte at position p belonging to
 * row tq_lane_row[p]. A tile row takes 66 bytes per block, as a TQ2_0 block: TQ2_0 keeps
 * its size, TQ1_0 (54 bytes) grows by a fifth.
 *
 * Activations. Each token is quantized to 11-bit codes (|q| <= 1023) in groups of 32, one
 * float scale per group, and for every pair of codes a table of the 16 sums
 * T[n] = (n % 4 - 1) q0 + (n / 4 - 1) q1 is built, as int16 split into 16 low bytes and 16
 * high bytes (32 bytes per pair).
 *
 * Product. Each nibble of a step indexes its pair's table: one vector shuffle looks up 32
 * rows at once. Four steps (8 lookups, |sum| <= 8 * 2 * 2 * 1023 = 32736) are summed in
 * int16, a group's two such sums in int32, and each row's float accumulator takes
 *     acc += (float)isum * (d_row * xscale_group)
 * group after group, in the same order in every tier: every tier gives the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

#define BLOCK 256                                  /* weights per block: a TQ block */
#define STEPS (BLOCK / 4)                          /* bytes of codes per row and block */
#define BLOCK_BYTES (Q1_TILE * 2 + STEPS * Q1_TILE) /* scales, then the steps */
#define PAIR_BYTES 32                              /* a pair's table: 16 low bytes, 16 high bytes */
#define GROUP_STEPS (GROUP / 4)
#define CODE_MAX 1023.0f

static int lane_row[Q1_TILE]; /* byte position in a step -> row of the tile */
static int row_lane[Q1_TILE];

/* The AVX2 kernel's lookups come out as int16 pairs, unpacked low/high within 128-bit
 * halves and split into even and odd int32 lanes, as in q1_tiles.c: result vector k, lane l
 * belongs to byte position (l < 4 ? 0 : 16) + (k >= 2 ? 8 : 0) + 2 (l mod 4) + (k mod 2). */
void tq_tiles_init(void) {
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 8; l++) {
            int p = (l < 4 ? 0 : 16) + (k >= 2 ? 8 : 0) + 2 * (l % 4) + (k % 2);
            lane_row[p] = 8 * k + l;
            row_lane[8 * k + l] = p;
        }
}

int64_t tq_table_bytes(int64_t K) { return K / 2 * PAIR_BYTES; }

int64_t tq_tiled_bytes(int64_t rows, int64_t K) { return (rows + Q1_TILE - 1) / Q1_TILE * (K / BLOCK) * BLOCK_BYTES; }

int tq_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, uint8_t *tiles) {
    int weights, bytes;
    if ((type != T_TQ1_0 && type != T_TQ2_0) || !type_block(type, &weights, &bytes) || K % BLOCK) return -1;
    int8_t *q = malloc((size_t)K);
    float *scale = malloc(sizeof(float) * (size_t)(K / GROUP * HALVES)), *min = malloc(sizeof(float) * (size_t)(K / GROUP));
    if (!q || !scale || !min) {
        free(q), free(scale), free(min);
        return -1;
    }
    RowBuffer buf = {q, scale, min, NULL};
    int64_t n_blocks = K / BLOCK, row_bytes = n_blocks * bytes;
    memset(tiles, 0, (size_t)tq_tiled_bytes(rows, K));
    for (int64_t r = 0; r < rows; r++) {
        int64_t tile = r / Q1_TILE, in_tile = r % Q1_TILE;
        const uint8_t *row = raw + r * row_bytes;
        unpack_row(type, row, K, &buf); /* codes w in -1 .. 2 */
        for (int64_t b = 0; b < n_blocks; b++) {
            uint8_t *block = tiles + (tile * n_blocks + b) * BLOCK_BYTES;
            memcpy(block + 2 * in_tile, row + b * bytes + bytes - 2, 2); /* d: the block's last two bytes */
            const int8_t *w = q + b * BLOCK;
            for (int s = 0; s < STEPS; s++) {
                uint8_t byte = 0;
                for (int i = 0; i < 4; i++) byte |= (uint8_t)((w[4 * s + i] + 1) << (2 * i));
                block[2 * Q1_TILE + Q1_TILE * s + row_lane[in_tile]] = byte;
            }
        }
    }
    free(q), free(scale), free(min);
    return 0;
}

void tq_tables(const float *x, int64_t K, uint8_t *tables, float *xscale) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        uint8_t *t = tables + g * (GROUP / 2) * PAIR_BYTES;
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
        }
        if (!(amax <= 3.4e38f)) { /* inf or nan: the result must not look finite */
            memset(t, 0, (GROUP / 2) * PAIR_BYTES);
            xscale[g] = NAN;
            continue;
        }
        float inverse = amax > 0.0f ? CODE_MAX / amax : 0.0f;
        xscale[g] = amax / CODE_MAX;
        for (int pair = 0; pair < GROUP / 2; pair++, t += PAIR_BYTES) {
            int32_t q0 = (int32_t)nearbyintf(xg[2 * pair] * inverse), q1 = (int32_t)nearbyintf(xg[2 * pair + 1] * inverse);
            for (int n = 0; n < 16; n++) {
                int32_t sum = (n % 4 - 1) * q0 + (n / 4 - 1) * q1;
                t[n] = (uint8_t)(sum & 0xff);
                t[16 + n] = (uint8_t)((uint16_t)(int16_t)sum >> 8);
            }
        }
    }
}

/* One tile (32 rows, K columns) times n tokens' tables (token j's at tables[j], xscale[j]):
 * out[32 j + row]. The codes of a step are split into nibbles once for all the tokens. */
#if defined(__AVX2__)
#include <immintrin.h>

static inline __m256i table_half(const uint8_t *t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)); }

/* the 8 lookups of 4 steps (pairs 2s, 2s + 1 of each) of one token, summed in int16: even
 * and odd byte positions of each 128-bit half, as unpacklo / unpackhi give them */
static inline void four_steps(const __m256i *n, const uint8_t *t, __m256i *lo16, __m256i *hi16) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int i = 0; i < 8; i++, t += PAIR_BYTES) {
        __m256i l = _mm256_shuffle_epi8(table_half(t), n[i]), h = _mm256_shuffle_epi8(table_half(t + 16), n[i]);
        lo = _mm256_add_epi16(lo, _mm256_unpacklo_epi8(l, h));
        hi = _mm256_add_epi16(hi, _mm256_unpackhi_epi8(l, h));
    }
    *lo16 = lo;
    *hi16 = hi;
}

static void tile_product(const uint8_t *tile, int64_t K, const uint8_t *const *tables, const float *const *xscale, int n,
                         float *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256 acc[TQ_TOKENS][4];
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 4; k++) acc[j][k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES, *codes = block + 2 * Q1_TILE;
        __m256 d[4];
        for (int k = 0; k < 4; k++) d[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 16 * k)));
        for (int g = 0; g < BLOCK / GROUP; g++) {
            __m256i nib[2][8]; /* the nibbles of the group's two halves of 4 steps, in pair order */
            for (int h = 0; h < 2; h++)
                for (int s = 0; s < 4; s++) {
                    __m256i w = _mm256_loadu_si256((const __m256i *)(codes + 32 * (GROUP_STEPS * g + 4 * h + s)));
                    nib[h][2 * s] = _mm256_and_si256(w, low4);
                    nib[h][2 * s + 1] = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                }
            for (int j = 0; j < n; j++) {
                const uint8_t *t = tables[j] + (b * (BLOCK / 2) + g * (GROUP / 2)) * PAIR_BYTES;
                __m256i isum[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                                   _mm256_setzero_si256()};
                for (int h = 0; h < 2; h++) {
                    __m256i lo16, hi16;
                    four_steps(nib[h], t + 8 * h * PAIR_BYTES, &lo16, &hi16);
                    isum[0] = _mm256_add_epi32(isum[0], _mm256_srai_epi32(_mm256_slli_epi32(lo16, 16), 16));
                    isum[1] = _mm256_add_epi32(isum[1], _mm256_srai_epi32(lo16, 16));
                    isum[2] = _mm256_add_epi32(isum[2], _mm256_srai_epi32(_mm256_slli_epi32(hi16, 16), 16));
                    isum[3] = _mm256_add_epi32(isum[3], _mm256_srai_epi32(hi16, 16));
                }
                __m256 xs = _mm256_set1_ps(xscale[j][b * (BLOCK / GROUP) + g]);
                for (int k = 0; k < 4; k++)
                    acc[j][k] = _mm256_add_ps(acc[j][k], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_mul_ps(d[k], xs)));
            }
        }
    }
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + Q1_TILE * j + 8 * k, acc[j][k]);
}
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

/* 16 rows per 128-bit half of a step; each half's lookups widen to int32 lanes in byte
 * position order, so the scales are taken in that order too. */
static void tile_product(const uint8_t *tile, int64_t K, const uint8_t *const *tables, const float *const *xscale, int n,
                         float *out) {
    const uint8x16_t low4 = vdupq_n_u8(0x0f);
    float32x4_t acc[TQ_TOKENS][8];
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 8; k++) acc[j][k] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES, *codes = block + 2 * Q1_TILE;
        float d[Q1_TILE];
        for (int p = 0; p < Q1_TILE; p++)
            d[p] = fp16_to_float((uint16_t)(block[2 * lane_row[p]] | block[2 * lane_row[p] + 1] << 8));
        for (int g = 0; g < BLOCK / GROUP; g++) {
            for (int j = 0; j < n; j++) {
                const uint8_t *tg = tables[j] + (b * (BLOCK / 2) + g * (GROUP / 2)) * PAIR_BYTES;
                int32x4_t isum[8];
                for (int k = 0; k < 8; k++) isum[k] = vdupq_n_s32(0);
                for (int h = 0; h < 2; h++) { /* 4 steps, 8 lookups per row, summed in int16 */
                    int16x8_t sum16[4] = {vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0)};
                    for (int s = GROUP_STEPS * g + 4 * h; s < GROUP_STEPS * g + 4 * h + 4; s++) {
                        const uint8_t *t = tg + 2 * (s - GROUP_STEPS * g) * PAIR_BYTES;
                        uint8x16_t tl0 = vld1q_u8(t), th0 = vld1q_u8(t + 16), tl1 = vld1q_u8(t + 32), th1 = vld1q_u8(t + 48);
                        for (int half = 0; half < 2; half++) {
                            uint8x16_t w = vld1q_u8(codes + 32 * s + 16 * half);
                            uint8x16_t n0 = vandq_u8(w, low4), n1 = vshrq_n_u8(w, 4);
                            uint8x16_t l0 = vqtbl1q_u8(tl0, n0), h0 = vqtbl1q_u8(th0, n0);
                            uint8x16_t l1 = vqtbl1q_u8(tl1, n1), h1 = vqtbl1q_u8(th1, n1);
                            int16x8_t a = vaddq_s16(vreinterpretq_s16_u8(vzip1q_u8(l0, h0)), vreinterpretq_s16_u8(vzip1q_u8(l1, h1)));
                            int16x8_t c = vaddq_s16(vreinterpretq_s16_u8(vzip2q_u8(l0, h0)), vreinterpretq_s16_u8(vzip2q_u8(l1, h1)));
                            sum16[2 * half] = vaddq_s16(sum16[2 * half], a);
                            sum16[2 * half + 1] = vaddq_s16(sum16[2 * half + 1], c);
                        }
                    }
                    for (int i = 0; i < 4; i++) { /* positions 8i .. 8i + 7 */
                        isum[2 * i] = vaddw_s16(isum[2 * i], vget_low_s16(sum16[i]));
                        isum[2 * i + 1] = vaddw_high_s16(isum[2 * i + 1], sum16[i]);
                    }
                }
                float32x4_t xs = vdupq_n_f32(xscale[j][b * (BLOCK / GROUP) + g]);
                for (int k = 0; k < 8; k++)
                    acc[j][k] = vaddq_f32(acc[j][k], vmulq_f32(vcvtq_f32_s32(isum[k]), vmulq_f32(vld1q_f32(d + 4 * k), xs)));
            }
        }
    }
    for (int j = 0; j < n; j++) {
        float by_position[Q1_TILE];
        for (int k = 0; k < 8; k++) vst1q_f32(by_position + 4 * k, acc[j][k]);
        for (int p = 0; p < Q1_TILE; p++) out[Q1_TILE * j + lane_row[p]] = by_position[p];
    }
}
#else
static inline int32_t lookup(const uint8_t *table, int index) {
    return (int16_t)(uint16_t)(table[index] | table[16 + index] << 8);
}

static void tile_product(const uint8_t *tile, int64_t K, const uint8_t *const *tables, const float *const *xscale, int n,
                         float *out) {
    for (int j = 0; j < n; j++)
        for (int r = 0; r < Q1_TILE; r++) {
            int p = row_lane[r];
            float acc = 0.0f;
            for (int64_t b = 0; b < K / BLOCK; b++) {
                const uint8_t *block = tile + b * BLOCK_BYTES, *codes = block + 2 * Q1_TILE;
                float d = fp16_to_float((uint16_t)(block[2 * r] | block[2 * r + 1] << 8));
                for (int g = 0; g < BLOCK / GROUP; g++) {
                    int32_t isum = 0;
                    for (int s = GROUP_STEPS * g; s < GROUP_STEPS * (g + 1); s++) {
                        const uint8_t *t = tables[j] + (b * (BLOCK / 2) + 2 * s) * PAIR_BYTES;
                        uint8_t byte = codes[32 * s + p];
                        isum += lookup(t, byte & 15) + lookup(t + PAIR_BYTES, byte >> 4);
                    }
                    acc = acc + (float)isum * (d * xscale[j][b * (BLOCK / GROUP) + g]);
                }
            }
            out[Q1_TILE * j + r] = acc;
        }
}
#endif

void tq_tile_rows(const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, const uint8_t *const *tables,
                  const float *const *xscale, int n, float *const *out) {
    float result[TQ_TOKENS * Q1_TILE];
    tile_product(tiles + tile * (K / BLOCK) * BLOCK_BYTES, K, tables, xscale, n, result);
    int64_t r0 = tile * Q1_TILE, count = rows - r0 < Q1_TILE ? rows - r0 : Q1_TILE;
    for (int j = 0; j < n; j++) memcpy(out[j] + r0, result + Q1_TILE * j, sizeof(float) * (size_t)count);
}

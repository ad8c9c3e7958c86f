/* Q1_0 (PrismML Bonsai) products by table lookup, in the manner of T-MAC and bitnet.cpp's
 * TL kernels.
 *
 * Weights. At load, a Q1_0 matrix is regrouped (q1_tile_matrix) into tiles of
 * Q1_TILE = 32 rows, the last one padded with zero rows. For each block of 128 columns a tile holds the 32 rows' fp16
 * scales d in row order (64 bytes), then 16 steps of 32 bytes: step s is byte s of each
 * row's block, the bits of weights 8s .. 8s + 7, the byte at position p belonging to row
 * lane_row[p] (tile_lanes, tiles.h). Nothing is dequantized; the bits are the file's, moved.
 *
 * Activations. Each token is quantized to 12-bit codes (|q| <= 2047) in groups of 32, one
 * float scale per group, and for every quad of 4 codes a table of the 16 signed sums
 * T[n] = sum_i (bit i of n ? +q_i : -q_i) is built, as int16 split into a 16-byte table of
 * low bytes and one of high bytes (32 bytes per quad).
 *
 * Product. The 4 bits of a quad index its table: one vector shuffle looks up 32 rows at
 * once. A group's 8 lookups per row are summed exactly in integers (int16 for four lookups,
 * |sum| <= 4 * 4 * 2047 = 32752, then int32), and each row's float accumulator takes
 *     acc += (float)isum * (d_row * xscale_group)
 * group after group. The vector and the portable code compute the same integers and the
 * same float operations in the same order, so every tier gives the same bits.
 */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "tiles.h"

#define STEPS 16                                /* bytes of bits per row and block of 128 */
#define BLOCK_BYTES (Q1_TILE * 2 + STEPS * Q1_TILE) /* scales, then the steps */
#define Q1_AHEAD 16384 /* bytes of tiles asked for ahead (prefetch_block): 8 to 32 KB measured the same */
#define QUAD_BYTES 32                           /* a quad's table: 16 low bytes, 16 high bytes */
#define CODE_MAX 2047.0f

static int lane_row[Q1_TILE]; /* byte position in a step -> row of the tile (tile_lanes) */
static int row_lane[Q1_TILE];

void q1_tiles_init(void) { tile_lanes(lane_row, row_lane); }

int64_t q1_table_bytes(int64_t K) { return K / 4 * QUAD_BYTES; }

int64_t q1_tiled_bytes(int64_t rows, int64_t K) { return (rows + Q1_TILE - 1) / Q1_TILE * (K / 128) * BLOCK_BYTES; }

int q1_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles) {
    const int64_t n_blocks = K / 128, row_bytes = n_blocks * 18, r1 = rows < t1 * Q1_TILE ? rows : t1 * Q1_TILE;
    if (type != T_Q1_0 || K % 128) return -1;
    memset(tiles + t0 * n_blocks * BLOCK_BYTES, 0, (size_t)((t1 - t0) * n_blocks * BLOCK_BYTES));
    for (int64_t r = t0 * Q1_TILE; r < r1; r++) {
        int64_t tile = r / Q1_TILE, in_tile = r % Q1_TILE;
        for (int64_t b = 0; b < n_blocks; b++) {
            const uint8_t *src = raw + r * row_bytes + b * 18;
            uint8_t *block = tiles + (tile * n_blocks + b) * BLOCK_BYTES;
            memcpy(block + 2 * in_tile, src, 2);
            for (int s = 0; s < STEPS; s++) block[2 * Q1_TILE + Q1_TILE * s + row_lane[in_tile]] = src[2 + s];
        }
    }
    return 0;
}

void q1_tables(const float *x, int64_t K, uint8_t *tables, float *xscale) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        uint8_t *t = tables + g * (GROUP / 4) * QUAD_BYTES;
        float inverse;
        if (!group_codes(xg, CODE_MAX, &inverse, xscale + g)) {
            memset(t, 0, (GROUP / 4) * QUAD_BYTES);
            continue;
        }
        for (int quad = 0; quad < GROUP / 4; quad++, t += QUAD_BYTES) {
            int32_t q[4];
            for (int i = 0; i < 4; i++) q[i] = (int32_t)nearbyintf(xg[4 * quad + i] * inverse);
            for (int n = 0; n < 16; n++) {
                int32_t sum = 0;
                for (int i = 0; i < 4; i++) sum += (n >> i) & 1 ? q[i] : -q[i];
                table_entry(t, t + 16, n, sum);
            }
        }
    }
}

/* Tiles tile .. tile + tiles - 1 (32 rows, K columns each) times one token's tables: out[32 i + row]
 * for tile i. */
#if defined(__AVX2__)
#include <immintrin.h>

/* Tiles one pass takes at once: where 32 vector registers hold two tiles' sums, 2, each table
 * vector then loaded once for both (the tables, 8 bytes a column, do not stay in L1 beside the
 * streaming bits: 32 KB at K = 4096, and tile after tile read them again from L2) */
#if defined(__AVX512VL__)
#define Q1_TILES 2
#else
#define Q1_TILES 1
#endif

static inline __m256i table_half(const uint8_t *t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)); }

static inline __attribute__((always_inline)) void tiles_product(const uint8_t *tile, int64_t K, const int tiles,
                                                                const uint8_t *tables, const float *xscale, float *out) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    const int64_t tile_bytes = K / 128 * BLOCK_BYTES;
    __m256 acc[Q1_TILES][4];
    for (int i = 0; i < tiles; i++)
        for (int k = 0; k < 4; k++) acc[i][k] = _mm256_setzero_ps();
    for (int64_t b = 0; b < K / 128; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES;
        __m256 d[Q1_TILES][4];
        for (int i = 0; i < tiles; i++) {
            prefetch_block(block + i * tile_bytes, BLOCK_BYTES, Q1_AHEAD);
            for (int k = 0; k < 4; k++) d[i][k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + i * tile_bytes + 16 * k)));
        }
        for (int g = 0; g < 4; g++) { /* groups of 32 weights: 4 steps */
            __m256i isum[Q1_TILES][4];
            for (int i = 0; i < tiles; i++)
                for (int k = 0; k < 4; k++) isum[i][k] = _mm256_setzero_si256();
            for (int h = 0; h < 2; h++) { /* 2 steps, 4 lookups per row, summed in int16 */
                __m256i lo16[Q1_TILES], hi16[Q1_TILES];
                for (int i = 0; i < tiles; i++) lo16[i] = hi16[i] = _mm256_setzero_si256();
                for (int s = 4 * g + 2 * h; s < 4 * g + 2 * h + 2; s++) {
                    const uint8_t *t = tables + (b * 32 + 2 * s) * QUAD_BYTES;
                    const __m256i tl0 = table_half(t), th0 = table_half(t + 16), tl1 = table_half(t + 32), th1 = table_half(t + 48);
                    for (int i = 0; i < tiles; i++) {
                        __m256i w = _mm256_loadu_si256((const __m256i *)(block + i * tile_bytes + 2 * Q1_TILE + 32 * s));
                        __m256i n0 = _mm256_and_si256(w, low4), n1 = _mm256_and_si256(_mm256_srli_epi16(w, 4), low4);
                        __m256i l0 = _mm256_shuffle_epi8(tl0, n0), h0 = _mm256_shuffle_epi8(th0, n0);
                        __m256i l1 = _mm256_shuffle_epi8(tl1, n1), h1 = _mm256_shuffle_epi8(th1, n1);
                        lo16[i] = _mm256_add_epi16(lo16[i], _mm256_add_epi16(_mm256_unpacklo_epi8(l0, h0), _mm256_unpacklo_epi8(l1, h1)));
                        hi16[i] = _mm256_add_epi16(hi16[i], _mm256_add_epi16(_mm256_unpackhi_epi8(l0, h0), _mm256_unpackhi_epi8(l1, h1)));
                    }
                }
                for (int i = 0; i < tiles; i++) {
                    isum[i][0] = _mm256_add_epi32(isum[i][0], _mm256_srai_epi32(_mm256_slli_epi32(lo16[i], 16), 16));
                    isum[i][1] = _mm256_add_epi32(isum[i][1], _mm256_srai_epi32(lo16[i], 16));
                    isum[i][2] = _mm256_add_epi32(isum[i][2], _mm256_srai_epi32(_mm256_slli_epi32(hi16[i], 16), 16));
                    isum[i][3] = _mm256_add_epi32(isum[i][3], _mm256_srai_epi32(hi16[i], 16));
                }
            }
            __m256 xs = _mm256_set1_ps(xscale[b * 4 + g]);
            for (int i = 0; i < tiles; i++)
                for (int k = 0; k < 4; k++)
                    acc[i][k] = _mm256_add_ps(acc[i][k], _mm256_mul_ps(_mm256_cvtepi32_ps(isum[i][k]), _mm256_mul_ps(d[i][k], xs)));
        }
    }
    for (int i = 0; i < tiles; i++)
        for (int k = 0; k < 4; k++) _mm256_storeu_ps(out + Q1_TILE * i + 8 * k, acc[i][k]);
}

static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *tables, const float *xscale, float *out) {
    if (Q1_TILES > 1 && tiles == Q1_TILES) tiles_product(tile, K, Q1_TILES, tables, xscale, out);
    else tiles_product(tile, K, 1, tables, xscale, out);
}
#elif defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define Q1_TILES 1

/* 16 rows per 128-bit half of a step; each half's lookups widen to int32 lanes in byte
 * position order, so the scales are taken in that order too. */
static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *tables, const float *xscale, float *out) {
    float32x4_t acc[8];
    for (int k = 0; k < 8; k++) acc[k] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / 128; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES, *bits = block + 2 * Q1_TILE;
        prefetch_block(block, BLOCK_BYTES, Q1_AHEAD);
        float d[Q1_TILE];
        neon_scales(block, lane_row, d);
        for (int g = 0; g < 4; g++) {
            int32x4_t isum[8];
            for (int k = 0; k < 8; k++) isum[k] = vdupq_n_s32(0);
            for (int h = 0; h < 2; h++) { /* 2 steps, 4 lookups per row, summed in int16 */
                int16x8_t sum16[4] = {vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0)};
                for (int s = 4 * g + 2 * h; s < 4 * g + 2 * h + 2; s++) {
                    const uint8_t *t = tables + (b * 32 + 2 * s) * QUAD_BYTES;
                    neon_step(bits + 32 * s, vld1q_u8(t), vld1q_u8(t + 16), vld1q_u8(t + 32), vld1q_u8(t + 48), sum16);
                }
                neon_widen(sum16, isum);
            }
            neon_accumulate(acc, isum, d, xscale[b * 4 + g]);
        }
    }
    neon_store(acc, lane_row, out);
}
#else
#define Q1_TILES 1
static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *tables, const float *xscale, float *out) {
    for (int r = 0; r < Q1_TILE; r++) {
        int p = row_lane[r];
        float acc = 0.0f;
        for (int64_t b = 0; b < K / 128; b++) {
            const uint8_t *block = tile + b * BLOCK_BYTES, *bits = block + 2 * Q1_TILE;
            prefetch_block(block, BLOCK_BYTES, Q1_AHEAD);
            float d = fp16_to_float((uint16_t)(block[2 * r] | block[2 * r + 1] << 8));
            for (int g = 0; g < 4; g++) {
                int32_t isum = 0;
                for (int s = 4 * g; s < 4 * g + 4; s++) {
                    const uint8_t *t = tables + (b * 32 + 2 * s) * QUAD_BYTES;
                    uint8_t byte = bits[32 * s + p];
                    isum += table_lookup(t, t + 16, byte & 15) + table_lookup(t + QUAD_BYTES, t + QUAD_BYTES + 16, byte >> 4);
                }
                acc = acc + (float)isum * (d * xscale[b * 4 + g]);
            }
        }
        out[r] = acc;
    }
}
#endif

int q1_tiles_at_once(void) { return Q1_TILES; }

void q1_tile_rows(const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, int count, const uint8_t *tables,
                  const float *xscale, float *out) {
    float result[Q1_TILES * Q1_TILE];
    tile_product(tiles + tile * (K / 128) * BLOCK_BYTES, K, count, tables, xscale, result);
    int64_t r0 = tile * Q1_TILE, n = rows - r0 < count * Q1_TILE ? rows - r0 : count * Q1_TILE;
    memcpy(out + r0, result, sizeof(float) * (size_t)n);
}

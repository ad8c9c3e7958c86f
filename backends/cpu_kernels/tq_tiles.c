/* TQ1_0 and TQ2_0 (ternary) products by table lookup, as q1_tiles.c multiplies Q1_0.
 *
 * Weights. At load, a ternary matrix is regrouped (tq_tile_matrix) into tiles of
 * Q1_TILE = 32 rows, the last one padded with zero rows. Each weight is the code c = w + 1,
 * two bits (0, 1, 2; TQ2_0's unused code 3 is kept, and means w = 2 as gguf-py reads it).
 * For each block of 256 columns a tile holds the 32 rows' fp16 scales d in row order
 * (64 bytes), then 64 steps of one byte per row: step s of a row holds the codes of weights
 * 4s .. 4s + 3 as c0 | c1 << 2 | c2 << 4 | c3 << 6. Where the steps' bytes lie (code_offset)
 * depends on the kernel that reads them:
 *   - by step (the scalar, AVX2 and NEON kernels): step s is 32 bytes, the byte at position
 *     p belonging to row lane_row[p] (tile_lanes, tiles.h);
 *   - by row (AVX-512 with VBMI): 4 steps are 128 bytes, rows 0-15 then rows 16-31, each row
 *     its 4 steps' bytes in a row, so that one VNNI lane sums one row's 4 lookups.
 * A tile row takes 66 bytes per block, as a TQ2_0 block: TQ2_0 keeps its size, TQ1_0
 * (54 bytes) grows by a fifth.
 *
 * Activations. Each token is quantized to 11-bit codes (|q| <= 1023) in groups of 32, one
 * float scale per group, and for every pair of codes a table of the 16 sums
 * T[n] = (n % 4 - 1) q0 + (n / 4 - 1) q1 is built, as int16 split into 16 low bytes and 16
 * high bytes. A chunk of 16 columns (8 pairs, 4 steps) keeps its tables in 256 bytes: the
 * low bytes of pairs 0, 2, 4, 6 (indexed by the steps' low nibbles), their high bytes, then
 * the same for pairs 1, 3, 5, 7 (the high nibbles): each 64 bytes is one 64-entry table for
 * VBMI's byte permutation, and each 16 bytes one table for a 16-entry shuffle.
 *
 * Product. Each nibble of a step indexes its pair's table: one vector shuffle looks up 32
 * rows at once (64 lookups, 16 rows times 4 steps, with VBMI). A group's 16 lookups per row
 * are summed exactly in integers (AVX2, NEON: four steps in int16, |sum| <= 8 * 2 * 2 * 1023
 * = 32736, then int32; VBMI: the low and the high bytes apart, in int32 by VNNI), and each
 * row's float accumulator takes
 *     acc += (float)isum * (d_row * xscale_group)
 * group after group, in the same order in every tier: every tier gives the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"
#include "tiles.h"

#define BLOCK 256                                  /* weights per block: a TQ block */
#define STEPS (BLOCK / 4)                          /* bytes of codes per row and block */
#define BLOCK_BYTES (Q1_TILE * 2 + STEPS * Q1_TILE) /* scales, then the steps */
#define PAIR_BYTES 32                              /* a pair's table: 16 low bytes, 16 high bytes */
#define CHUNK_BYTES (8 * PAIR_BYTES)               /* the tables of 16 columns: 8 pairs */
#define GROUP_STEPS (GROUP / 4)
#define CODE_MAX 1023.0f
#define PREFETCH_AHEAD 4096 /* bytes: the codes a decode step streams from memory, asked for early */

static int lane_row[Q1_TILE]; /* byte position in a step -> row of the tile (by step) */
static int row_lane[Q1_TILE];
static int by_row; /* the steps lie by row: the AVX-512 VBMI kernel runs */

/* Where the low-byte table of pair `pair` of a run of chunks lies; its high bytes follow
 * 64 bytes later. */
static inline int64_t pair_table(int64_t pair) { return pair / 8 * CHUNK_BYTES + pair % 2 * 128 + pair % 8 / 2 * 16; }

/* Where step s of row r of a tile's block lies, from the block's first step. */
static inline int64_t code_offset(int r, int s) {
    return by_row ? s / 4 * 128 + r / 16 * 64 + r % 16 * 4 + s % 4 : (int64_t)Q1_TILE * s + row_lane[r];
}

void tq_tiles_init(void) {
    tile_lanes(lane_row, row_lane);
#if defined(__AVX512VNNI__)
    by_row = __builtin_cpu_supports("avx512vbmi");
#endif
}

const char *tq_kernel(void) { return by_row ? "avx512vbmi" : SPRIG_TIER; }

int64_t tq_table_bytes(int64_t K) { return K / 2 * PAIR_BYTES; }

int64_t tq_tiled_bytes(int64_t rows, int64_t K) { return (rows + Q1_TILE - 1) / Q1_TILE * (K / BLOCK) * BLOCK_BYTES; }

/* Step s of a TQ2_0 block's 64 bytes of 2-bit fields (unpack_tq2_0): the codes c = w + 1 of
 * weights 4s .. 4s + 3, the file's own fields: bits 2j of qs[32n + 4 (s % 8) + i], i < 4, for
 * n = s / 32, j = s % 32 / 8 */
static inline uint8_t tq2_step(const uint8_t *qs, int s) {
    uint32_t fields;
    memcpy(&fields, qs + 32 * (s / 32) + 4 * (s % 8), sizeof fields);
    fields = fields >> (2 * (s % 32 / 8)) & 0x03030303u; /* a code at the bottom of each byte (little-endian) */
    return (uint8_t)(fields | fields >> 6 | fields >> 12 | fields >> 18);
}

int tq_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles) {
    int weights, bytes;
    if ((type != T_TQ1_0 && type != T_TQ2_0) || !type_block(type, &weights, &bytes) || K % BLOCK) return -1;
    const int64_t n_blocks = K / BLOCK, row_bytes = n_blocks * bytes, r1 = rows < t1 * Q1_TILE ? rows : t1 * Q1_TILE;
    RowBuffer buf = {NULL, NULL, NULL, NULL}; /* TQ1_0's codes w, unpacked a row at a time */
    if (type == T_TQ1_0) {
        buf.q = malloc((size_t)K);
        buf.scale = malloc(sizeof(float) * (size_t)(K / GROUP * HALVES));
        buf.min = malloc(sizeof(float) * (size_t)(K / GROUP));
        if (!buf.q || !buf.scale || !buf.min) {
            free(buf.q), free(buf.scale), free(buf.min);
            return -1;
        }
    }
    memset(tiles + t0 * n_blocks * BLOCK_BYTES, 0, (size_t)((t1 - t0) * n_blocks * BLOCK_BYTES));
    for (int64_t r = t0 * Q1_TILE; r < r1; r++) {
        const int64_t tile = r / Q1_TILE, in_tile = r % Q1_TILE;
        const uint8_t *row = raw + r * row_bytes;
        int64_t at[STEPS]; /* where the row's steps lie in a tile block */
        for (int s = 0; s < STEPS; s++) at[s] = 2 * Q1_TILE + code_offset((int)in_tile, s);
        if (buf.q) unpack_row(type, row, K, &buf);
        for (int64_t b = 0; b < n_blocks; b++) {
            uint8_t *block = tiles + (tile * n_blocks + b) * BLOCK_BYTES;
            const uint8_t *qs = row + b * bytes;
            const int8_t *w = buf.q + b * BLOCK;
            memcpy(block + 2 * in_tile, qs + bytes - 2, 2); /* d: the block's last two bytes */
            if (!buf.q)
                for (int s = 0; s < STEPS; s++) block[at[s]] = tq2_step(qs, s);
            else
                for (int s = 0; s < STEPS; s++) {
                    uint8_t byte = 0;
                    for (int i = 0; i < 4; i++) byte |= (uint8_t)((w[4 * s + i] + 1) << (2 * i));
                    block[at[s]] = byte;
                }
        }
    }
    free(buf.q), free(buf.scale), free(buf.min);
    return 0;
}

/* The weights w = c - 1 of the two codes that table entry n stands for: c = n % 4, n / 4. */
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
static const i16x16 first_weight = {-1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2, -1, 0, 1, 2};
static const i16x16 second_weight = {-1, -1, -1, -1, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};

void tq_tables(const float *x, int64_t K, uint8_t *tables, float *xscale) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        uint8_t *t = tables + g * (GROUP / 2) * PAIR_BYTES;
        float inverse;
        if (!group_codes(xg, CODE_MAX, &inverse, xscale + g)) {
            memset(t, 0, (GROUP / 2) * PAIR_BYTES);
            continue;
        }
        int16_t q[GROUP];
        for (int i = 0; i < GROUP; i++) q[i] = (int16_t)nearbyintf(xg[i] * inverse);
        for (int pair = 0; pair < GROUP / 2; pair++) { /* the 16 entries at once */
            i16x16 entry = first_weight * q[2 * pair] + second_weight * q[2 * pair + 1];
            u8x16 low = __builtin_convertvector(entry, u8x16), high = __builtin_convertvector((u16x16)entry >> 8, u8x16);
            memcpy(t + pair_table(pair), &low, 16);
            memcpy(t + pair_table(pair) + 64, &high, 16);
        }
    }
}

/* One tile (32 rows, K columns) times n tokens' tables (token j's at tables[j], xscale[j]):
 * out[32 j + row]. The codes of a step are split into nibbles once for all the tokens. */
#if defined(__AVX2__)
#include <immintrin.h>

#if defined(__AVX512VNNI__)
/* Steps by row. A 64-byte vector is 16 rows times 4 steps; a step's byte at position k of its
 * row's 4, with 16 k added to its nibble, indexes the 64-byte table of its chunk (pairs 2k or
 * 2k + 1 of the chunk). The looked-up low bytes (unsigned) and high bytes (signed) are summed
 * apart, 4 to an int32 lane by VNNI, and joined per group: isum = low + 256 high. `tiles`
 * consecutive tiles go at once, into out[32 (tiles j + i) + row] for tile i: 1, or BY_ROW_TILES
 * for 1 or 2 tokens, each table vector then loaded once for both. The tables (16 bytes a column:
 * 40 KB at K = 2560) do not stay in L1, so tile after tile read them again from L2: with two
 * tiles a pass, one token's product from memory went 67-85 -> 84-92 G/s at K = 2560, 69-76 ->
 * 88-106 at 9728 (2 tokens 120-128 -> 124-141; 3 tiles were no faster than 2). */
#define BY_ROW_TILES 2
_Static_assert(BY_ROW_TILES * 2 <= TQ_TOKENS, "two tokens of BY_ROW_TILES tiles fit tq_tile_rows's result");
static inline __attribute__((always_inline, target("avx512vbmi"))) void by_row_product(
    const uint8_t *tile, int64_t K, const int tiles, const uint8_t *const *tables, const float *const *xscale, const int n,
    float *out) {
    const __m512i low4 = _mm512_set1_epi8(0x0f), which = _mm512_set1_epi32(0x30201000), ones = _mm512_set1_epi8(1);
    const int64_t tile_bytes = K / BLOCK * BLOCK_BYTES;
    const int H = 2 * tiles; /* 16-row halves */
    __m512 acc[TQ_TOKENS][2 * BY_ROW_TILES];
    for (int j = 0; j < n; j++)
        for (int h = 0; h < H; h++) acc[j][h] = _mm512_setzero_ps();
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES;
        __m512 d[2 * BY_ROW_TILES];
        for (int h = 0; h < H; h++)
            d[h] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + h / 2 * tile_bytes + 32 * (h % 2))));
        for (int g = 0; g < BLOCK / GROUP; g++) {
            __m512i lo_index[2][2 * BY_ROW_TILES], hi_index[2][2 * BY_ROW_TILES]; /* [chunk][half]: (nibble | 16 k) */
            for (int c = 0; c < 2; c++)
                for (int h = 0; h < H; h++) {
                    const uint8_t *at = block + h / 2 * tile_bytes + 2 * Q1_TILE + (2 * g + c) * 128 + 64 * (h % 2);
                    _mm_prefetch((const char *)(at + PREFETCH_AHEAD), _MM_HINT_T0);
                    __m512i w = _mm512_loadu_si512((const void *)at);
                    lo_index[c][h] = _mm512_ternarylogic_epi32(w, low4, which, 0xEA); /* (w & low4) | which */
                    hi_index[c][h] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(w, 4), low4, which, 0xEA);
                }
            for (int j = 0; j < n; j++) {
                const uint8_t *t = tables[j] + (b * (BLOCK / 2) + g * (GROUP / 2)) * PAIR_BYTES;
                __m512i low[2 * BY_ROW_TILES], high[2 * BY_ROW_TILES];
                for (int h = 0; h < H; h++) low[h] = high[h] = _mm512_setzero_si512();
                for (int c = 0; c < 2; c++, t += CHUNK_BYTES) {
                    __m512i tl0 = _mm512_loadu_si512((const void *)t), th0 = _mm512_loadu_si512((const void *)(t + 64));
                    __m512i tl1 = _mm512_loadu_si512((const void *)(t + 128)), th1 = _mm512_loadu_si512((const void *)(t + 192));
                    for (int h = 0; h < H; h++) {
                        low[h] = _mm512_dpbusd_epi32(low[h], _mm512_permutexvar_epi8(lo_index[c][h], tl0), ones);
                        high[h] = _mm512_dpbusd_epi32(high[h], ones, _mm512_permutexvar_epi8(lo_index[c][h], th0));
                        low[h] = _mm512_dpbusd_epi32(low[h], _mm512_permutexvar_epi8(hi_index[c][h], tl1), ones);
                        high[h] = _mm512_dpbusd_epi32(high[h], ones, _mm512_permutexvar_epi8(hi_index[c][h], th1));
                    }
                }
                __m512 xs = _mm512_set1_ps(xscale[j][b * (BLOCK / GROUP) + g]);
                for (int h = 0; h < H; h++) {
                    __m512i isum = _mm512_add_epi32(low[h], _mm512_slli_epi32(high[h], 8));
                    acc[j][h] = _mm512_add_ps(acc[j][h], _mm512_mul_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d[h], xs)));
                }
            }
        }
    }
    for (int j = 0; j < n; j++)
        for (int h = 0; h < H; h++) _mm512_storeu_ps(out + Q1_TILE * tiles * j + 16 * h, acc[j][h]);
}

__attribute__((target("avx512vbmi"))) static void tile_product_by_row(const uint8_t *tile, int64_t K, int tiles,
                                                                      const uint8_t *const *tables,
                                                                      const float *const *xscale, int n, float *out) {
    if (tiles == 1) by_row_product(tile, K, 1, tables, xscale, n, out);
    else if (n == 1) by_row_product(tile, K, BY_ROW_TILES, tables, xscale, 1, out);
    else by_row_product(tile, K, BY_ROW_TILES, tables, xscale, 2, out);
}
#endif

static inline __m256i table_half(const uint8_t *t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t)); }

/* the 8 lookups of 4 steps (pairs 2s, 2s + 1 of each, from `pair` on) of one token, summed
 * in int16: even and odd byte positions of each 128-bit half, as unpacklo / unpackhi give them */
static inline void four_steps(const __m256i *n, const uint8_t *tables, int pair, __m256i *lo16, __m256i *hi16) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int i = 0; i < 8; i++) {
        const uint8_t *t = tables + pair_table(pair + i);
        __m256i l = _mm256_shuffle_epi8(table_half(t), n[i]), h = _mm256_shuffle_epi8(table_half(t + 64), n[i]);
        lo = _mm256_add_epi16(lo, _mm256_unpacklo_epi8(l, h));
        hi = _mm256_add_epi16(hi, _mm256_unpackhi_epi8(l, h));
    }
    *lo16 = lo;
    *hi16 = hi;
}

static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *const *tables, const float *const *xscale,
                         int n, float *out) {
#if defined(__AVX512VNNI__)
    if (by_row) {
        tile_product_by_row(tile, K, tiles, tables, xscale, n, out);
        return;
    }
#endif
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
                    four_steps(nib[h], t, 8 * h, &lo16, &hi16);
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
static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *const *tables, const float *const *xscale,
                         int n, float *out) {
    (void)tiles; /* one tile at a time */
    float32x4_t acc[TQ_TOKENS][8];
    for (int j = 0; j < n; j++)
        for (int k = 0; k < 8; k++) acc[j][k] = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < K / BLOCK; b++) {
        const uint8_t *block = tile + b * BLOCK_BYTES, *codes = block + 2 * Q1_TILE;
        float d[Q1_TILE];
        neon_scales(block, lane_row, d);
        for (int g = 0; g < BLOCK / GROUP; g++) {
            for (int j = 0; j < n; j++) {
                const uint8_t *tg = tables[j] + (b * (BLOCK / 2) + g * (GROUP / 2)) * PAIR_BYTES;
                int32x4_t isum[8];
                for (int k = 0; k < 8; k++) isum[k] = vdupq_n_s32(0);
                for (int h = 0; h < 2; h++) { /* 4 steps, 8 lookups per row, summed in int16 */
                    int16x8_t sum16[4] = {vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0), vdupq_n_s16(0)};
                    for (int s = GROUP_STEPS * g + 4 * h; s < GROUP_STEPS * g + 4 * h + 4; s++) {
                        const uint8_t *t0 = tg + pair_table(2 * (s - GROUP_STEPS * g));
                        const uint8_t *t1 = tg + pair_table(2 * (s - GROUP_STEPS * g) + 1);
                        neon_step(codes + 32 * s, vld1q_u8(t0), vld1q_u8(t0 + 64), vld1q_u8(t1), vld1q_u8(t1 + 64), sum16);
                    }
                    neon_widen(sum16, isum);
                }
                neon_accumulate(acc[j], isum, d, xscale[j][b * (BLOCK / GROUP) + g]);
            }
        }
    }
    for (int j = 0; j < n; j++) neon_store(acc[j], lane_row, out + Q1_TILE * j);
}
#else
static void tile_product(const uint8_t *tile, int64_t K, int tiles, const uint8_t *const *tables, const float *const *xscale,
                         int n, float *out) {
    (void)tiles;
    for (int j = 0; j < n; j++)
        for (int r = 0; r < Q1_TILE; r++) {
            float acc = 0.0f;
            for (int64_t b = 0; b < K / BLOCK; b++) {
                const uint8_t *block = tile + b * BLOCK_BYTES, *codes = block + 2 * Q1_TILE;
                float d = fp16_to_float((uint16_t)(block[2 * r] | block[2 * r + 1] << 8));
                for (int g = 0; g < BLOCK / GROUP; g++) {
                    const uint8_t *tg = tables[j] + (b * (BLOCK / 2) + g * (GROUP / 2)) * PAIR_BYTES;
                    int32_t isum = 0;
                    for (int s = 0; s < GROUP_STEPS; s++) {
                        const uint8_t *t0 = tg + pair_table(2 * s), *t1 = tg + pair_table(2 * s + 1);
                        uint8_t byte = codes[code_offset(r, GROUP_STEPS * g + s)];
                        isum += table_lookup(t0, t0 + 64, byte & 15) + table_lookup(t1, t1 + 64, byte >> 4);
                    }
                    acc = acc + (float)isum * (d * xscale[j][b * (BLOCK / GROUP) + g]);
                }
            }
            out[Q1_TILE * j + r] = acc;
        }
}
#endif

int tq_tiles_at_once(int n) {
#if defined(__AVX512VNNI__)
    if (by_row && n <= 2) return BY_ROW_TILES; /* (their results fit tq_tile_rows's TQ_TOKENS tiles) */
#endif
    (void)n;
    return 1;
}

void tq_tile_rows(const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, int count, const uint8_t *const *tables,
                  const float *const *xscale, int n, float *const *out) {
    float result[TQ_TOKENS * Q1_TILE];
    tile_product(tiles + tile * (K / BLOCK) * BLOCK_BYTES, K, count, tables, xscale, n, result);
    int64_t r0 = tile * Q1_TILE, size = count * Q1_TILE, left = rows - r0 < size ? rows - r0 : size;
    for (int j = 0; j < n; j++) memcpy(out[j] + r0, result + size * j, sizeof(float) * (size_t)left);
}

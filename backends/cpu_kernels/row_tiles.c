/* The types on int16 codes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4; Q4_K, Q6_K), and Q2_K on
 * its 8-bit codes, multiplied from tiles of ROW_TILE = 8 rows, each row in a lane of the vectors.
 * (Q5_K is not: its fifth bits made the tiles no faster than int16_panels.c's rows, 0.9-1.0x at
 * 1 to 4 tokens. Nor Q3_K: 1.25x its rows at one token, but 0.8x its byte panels at 64.)
 *
 * Why. dot_row_tokens (quants.c) sums a row's group of 32 in 8 int32 lanes, then converts them,
 * multiplies them by the group's scales and adds them, per group and token: with a few tokens
 * those float steps set the pace, not the memory (checking 4 tokens cost 1.8-2.0 one-token
 * products of Q8_0). Here one int32 lane holds one row's whole group, so each float step
 * serves 8 rows. The 256-weight K types multiplied their rows as int16 weights sc * code
 * (int16_panels.c: an integer multiply per 16 weights); here a sub-block's scale is one float
 * step for 8 rows.
 *
 * Weights. At load a matrix is regrouped (row_tile_matrix) into tiles of 8 rows, the last
 * padded with zero rows. Nothing is dequantized: a tile row takes the type's own bytes per
 * block (32 weights; 256 for the K types). For each block a tile holds
 *   - the 8 rows' scales as the file has them: fp16 d (16 bytes), then for Q4_1, Q5_1, Q4_K and
 *     Q2_K their fp16 m or dmin (16 bytes); for MXFP4 the E8M0 bytes (8);
 *   - Q4_K: the 6-bit sub-block scales sc and mins m (96 bytes, as the file's 12 a row):
 *     byte 8q + r of the first 32 holds row r's sc[q] in its low nibble and sc[q + 4] in its
 *     high one, of the next 32 the same of m, of the last 32 the top 2 bits of sc[q], sc[q + 4],
 *     m[q], m[q + 4], from bit 0 up; Q6_K: the int8 scales of its 16-weight sub-blocks, byte
 *     8s + r row r's s-th (128 bytes); Q2_K the same of its scale bytes (scale | min << 4);
 *   - for each group of 32 columns (8 in a K block):
 *     - Q5_0, Q5_1: the fifth bits, a 16-bit word per pair vector, bit k for word k
 *       (32 bytes);
 *     - Q6_K: the top 2 bits of each code, flipped (xor 2: with the low 4 bits, the code minus
 *       32 in 6-bit two's complement), 16 bytes per 4 pair vectors 4q .. 4q + 3: byte k holds
 *       word k of pair vector 4q + i at bits 2i, 2i + 1 (64 bytes);
 *     - the codes as 16 pair vectors of 16 words: word k of pair vector p is weight 2p + k % 2
 *       of row k / 2. Q8_0 keeps 16 int8 per pair vector (256 bytes); the others keep the
 *       file's nibbles (Q6_K its low 4 bits), 16 bytes per pair vectors 2c and 2c + 1: byte k
 *       holds word k of the first in its low nibble and of the second in its high one (128
 *       bytes). Q2_K's 2-bit codes as quads instead (4 columns of a row in 4 bytes, an int32
 *       lane): byte 32h + 4r + i holds row r's columns 16h + 4k + i at bits 2k (64 bytes).
 * A word's value is the code unpack_row gives the weight: Q4_0 nibble - 8, Q4_1 and Q4_K
 * nibble, Q5_0 (nibble | bit << 4) - 16, Q5_1 nibble | bit << 4, IQ4_NL
 * kvalues_iq4nl[nibble], MXFP4 kvalues_mxfp4[nibble], Q8_0 the byte; but Q6_K's is 4 times its
 * code minus 32 (the 6 bits at the top of a byte, sign and all: nibble << 2 | top << 6), and its
 * scales a quarter of d * sc (exact).
 * The K types' regions follow each other in this order, all the groups' fifth bits (or top
 * bits) before all their codes.
 *
 * Product. A token's activations are quantize_row's int16 codes with a scale xd per block (per
 * group of 32; per 256 for the K types) and a sum xs per group. Pair vector p times the token's
 * codes 2p and 2p + 1 (one int32 broadcast to every lane) in pair sums (madd; dpwssd with VNNI)
 * adds each row's two products to its int32 lane; the 16 pair vectors sum a group exactly
 * (|isum| <= 32 * 128 * 32767 < 2^31; Q6_K's 8 of them a 16-weight sub-block). Then, per row
 * and token, block after block, and within a block sub-block after sub-block:
 *     acc = fma(float(isum), s * xd, acc)          (s * xd rounded first)
 *     macc = fma(m, xs, macc)                       (the min terms: per group)
 * where s is d (d * sc, exact, for the K types) and m the min (-(dmin * m), exact, for Q4_K);
 * the result is acc + macc.
 * Q2_K takes quantize_row8's 8-bit codes (Codes8: a scale xd and the codes' sums per 16, per
 * group of 32), as its rows as the file has them do. Each 2-bit plane of a quad vector is an
 * unsigned byte per column; one dpbusd (AVX2: maddubs and madd, which do not saturate at
 * 3 * 127) adds a row's 4 products with the token's 4 codes (broadcast) to its lane, and 4
 * planes sum a 16-weight sub-block exactly. A group's two sub-blocks then meet in integers
 * (tile_product8) before two float multiply-adds per token.
 * The integers are exact and the float steps the same C in every tier, so every tier gives the
 * same bits, and a token's are the same whatever tokens are multiplied beside it (decode, a
 * batch, a prefill). */
#include <string.h>

#include "bytes.h"    /* u16, u32, k_scale_bytes */
#include "iq_grids.h" /* kvalues_iq4nl */
#include "kernels.h"
#include "simd.h"

#define PAIRS 16                                  /* pair vectors per group */
/* Tiles asked for ahead, from 2 tokens on (one token's product, left to the hardware prefetcher,
 * streamed faster: Zen 4, from memory, Q4_1 66 against 52-57 G/s; four tokens' slower, Q8_0 52
 * against 83; Q4_K's 4 tokens 81 against 107), and for Q6_K from one token on (its codes and top
 * bits two streams a block: from memory 17 against 40 G/s): into L1, ROW_TILE_AHEAD bytes on; but where a Q8_0 tile (272 bytes a block) and
 * the tokens' codes, 8 KB or more, would not both stay in L1, into L2 only, Q8_0_AHEAD_BLOCKS
 * blocks on (K = 2560: 4 tokens 82 -> 87-101 G/s, 2 tokens 46 -> 61-65; K = 640 and 4 tokens
 * lost 10% that way, the 4-bit types at K = 2560 2-9%) */
#define ROW_TILE_AHEAD 4096
#define Q8_0_AHEAD_BLOCKS 32
#define L2_CODES_BYTES 8192
#define TILE_TOKENS_MAX ROW_TILE_TOKENS

/* The types in row tiles (X-macro): each case below, one per type */
#define ROW_TILED(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(MXFP4) X(Q4_K) X(Q6_K) X(Q2_K)

int row_tiled_type(int type) {
#define IS_CASE(name) case T_##name:
    switch (type) {
        ROW_TILED(IS_CASE) return 1;
    default: return 0;
    }
#undef IS_CASE
}

/* The tile block's geometry: groups of 32 per block, sub-blocks per group (a scale each) */
static inline int k_type(int type) { return type == T_Q4_K || type == T_Q6_K || type == T_Q2_K; }
static inline int groups_of(int type) { return k_type(type) ? WIDE / GROUP : 1; }
static inline int halves_of(int type) { return type == T_Q6_K ? 2 : 1; }
int row_tile_span(int type) { return GROUP * groups_of(type); }
/* The types on 8-bit activation codes (Codes8), as the OWN8 types' rows: Q2_K */
static inline int takes_codes8(int type) { return type == T_Q2_K; }
int row_tile_codes8(int type) { return takes_codes8(type); }

int64_t row_tiled_bytes(int type, int64_t rows, int64_t K) {
    return (rows + ROW_TILE - 1) / ROW_TILE * (K / row_tile_span(type)) * ROW_TILE * type_bytes(type);
}

/* Where a tile block's parts lie (module comment; -1: none): the mins, the sub-block scales, the
 * fifth (or top) bits, the codes; the scales d are at 0. */
static inline int scale_bytes(int type) { return type == T_MXFP4 ? 1 : 2; }
static inline int has_mins(int type) { return type == T_Q4_1 || type == T_Q5_1 || type == T_Q4_K || type == T_Q2_K; }
static inline int mins_at(int type) { return has_mins(type) ? ROW_TILE * 2 : -1; }
static inline int sub_scales_at(int type) { return k_type(type) ? ROW_TILE * 2 * (has_mins(type) ? 2 : 1) : -1; }
static inline int sub_scale_bytes(int type) { return type == T_Q6_K || type == T_Q2_K ? 128 : k_type(type) ? 96 : 0; }
static inline int bits_per_group(int type) {
    return type == T_Q6_K ? 64 : type == T_Q5_0 || type == T_Q5_1 ? 32 : 0;
}
static inline int bits_at(int type) {
    return bits_per_group(type) ? ROW_TILE * scale_bytes(type) + (has_mins(type) ? ROW_TILE * 2 : 0) + sub_scale_bytes(type) : -1;
}
static inline int codes_per_group(int type) { return type == T_Q8_0 ? 256 : type == T_Q2_K ? 64 : 128; }
static inline int codes_at(int type) {
    return ROW_TILE * scale_bytes(type) + (has_mins(type) ? ROW_TILE * 2 : 0) + sub_scale_bytes(type) +
           groups_of(type) * bits_per_group(type);
}

/* Group j's codes, and its fifth (or top) bits, in a tile block */
static inline uint8_t *group_codes(int type, const uint8_t *block, int j) {
    return (uint8_t *)block + codes_at(type) + codes_per_group(type) * j;
}
static inline uint8_t *group_bits(int type, const uint8_t *block, int j) {
    return (uint8_t *)block + (bits_at(type) < 0 ? 0 : bits_at(type) + bits_per_group(type) * j);
}

static inline void copy(int to_tile, uint8_t *file, uint8_t *tile, size_t n) {
    if (to_tile) memcpy(tile, file, n);
    else memcpy(file, tile, n);
}
static inline uint16_t load16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}
static inline void store16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
/* Two adjacent bytes' fields (`mask`, each byte its own: the same in either byte order) moved
 * from bit file_shift of the file's to bit tile_shift of the tile's, or back, xor `flip`; the
 * destination's fields start at zero. */
static inline void move_fields(int to_tile, uint8_t *file, int file_shift, uint8_t *tile, int tile_shift, uint16_t mask,
                               uint16_t flip) {
    if (to_tile) store16(tile, (uint16_t)(load16(tile) | (((load16(file) >> file_shift) & mask) ^ flip) << tile_shift));
    else store16(file, (uint16_t)(load16(file) | (((load16(tile) >> tile_shift) & mask) ^ flip) << file_shift));
}

/* Where a 32-weight file block's parts lie: its m (Q4_1, Q5_1), its fifth bits (Q5_0, Q5_1),
 * its codes; its scale is at 0, an fp16 d but for MXFP4's E8M0 byte. */
static inline int file_mins_at(int type) { return type == T_Q4_1 || type == T_Q5_1 ? 2 : -1; }
static inline int file_fifth_at(int type) { return type == T_Q5_0 ? 2 : type == T_Q5_1 ? 4 : -1; }
static inline int file_codes_at(int type) {
    switch (type) {
    case T_MXFP4: return 1;
    case T_Q4_1: return 4;
    case T_Q5_0: return 6;
    case T_Q5_1: return 8;
    default: return 2; /* Q4_0, Q8_0, IQ4_NL */
    }
}

/* A row's 32-weight file block moved to its lane of a tile block, or back (to_tile 0): the one
 * map between the two layouts (module comment), a pair of weights 2p, 2p + 1 at a time (their
 * word k is 2 lane and 2 lane + 1; 4-bit types: adjacent bytes of both blocks, each at one
 * nibble). The destination's codes and bits start at zero. */
static inline __attribute__((always_inline)) void move_block(const int type, uint8_t *file, uint8_t *block, int lane,
                                                             const int to_tile) {
    uint8_t *qs = file + file_codes_at(type), *codes = block + codes_at(type);
    copy(to_tile, file, block + scale_bytes(type) * lane, (size_t)scale_bytes(type));
    if (mins_at(type) >= 0) copy(to_tile, file + file_mins_at(type), block + mins_at(type) + 2 * lane, 2);
    uint32_t qh = to_tile && bits_at(type) >= 0 ? u32(file + file_fifth_at(type)) : 0;
    for (int p = 0; p < PAIRS; p++) {
        if (type == T_Q8_0) {
            copy(to_tile, qs + 2 * p, codes + 16 * p + 2 * lane, 2);
            continue;
        }
        /* weight 2p is in the high nibbles from 16 */
        move_fields(to_tile, qs + 2 * p % 16, 4 * (p / 8), codes + 16 * (p / 2) + 2 * lane, 4 * (p % 2), 0x0f0f, 0);
        if (bits_at(type) < 0) continue;
        uint8_t *bits = block + bits_at(type) + 2 * p; /* bits 2 lane, 2 lane + 1 of word p (LSB first): qh's 2p, 2p + 1 */
        const uint16_t word = (uint16_t)(u16(bits) | (to_tile ? ((qh >> 2 * p) & 3) << 2 * lane : 0));
        if (to_tile) bits[0] = (uint8_t)word, bits[1] = (uint8_t)(word >> 8);
        else qh |= (uint32_t)((word >> 2 * lane) & 3) << 2 * p;
    }
    if (!to_tile && bits_at(type) >= 0)
        for (int i = 0; i < 4; i++) file[file_fifth_at(type) + i] = (uint8_t)(qh >> (8 * i));
}

/* Q4_K's 6-bit scales and mins of a row (sc[j], m[j], j < 8) to their tile bytes
 * (module comment), or back into the file's 12 bytes at b + 4 (the inverse of k_scale_bytes). */
static inline void move_k_scales(int to_tile, uint8_t *b, uint8_t *scales, int lane) {
    uint8_t sc[8], m[8];
    if (to_tile) {
        uint64_t s, n;
        k_scale_bytes(b, &s, &n);
        for (int j = 0; j < 8; j++) sc[j] = (uint8_t)(s >> 8 * j), m[j] = (uint8_t)(n >> 8 * j);
        for (int q = 0; q < 4; q++) {
            scales[8 * q + lane] = (uint8_t)((sc[q] & 15) | (sc[q + 4] & 15) << 4);
            scales[32 + 8 * q + lane] = (uint8_t)((m[q] & 15) | (m[q + 4] & 15) << 4);
            scales[64 + 8 * q + lane] = (uint8_t)(sc[q] >> 4 | (sc[q + 4] >> 4) << 2 | (m[q] >> 4) << 4 | (m[q + 4] >> 4) << 6);
        }
        return;
    }
    for (int q = 0; q < 4; q++) {
        const int low = scales[8 * q + lane], low_m = scales[32 + 8 * q + lane], top = scales[64 + 8 * q + lane];
        sc[q] = (uint8_t)((low & 15) | (top & 3) << 4), sc[q + 4] = (uint8_t)((low >> 4) | ((top >> 2) & 3) << 4);
        m[q] = (uint8_t)((low_m & 15) | ((top >> 4) & 3) << 4), m[q + 4] = (uint8_t)((low_m >> 4) | (top >> 6) << 4);
    }
    for (int q = 0; q < 4; q++) {
        b[4 + q] = (uint8_t)(sc[q] | (sc[q + 4] >> 4) << 6);
        b[8 + q] = (uint8_t)(m[q] | (m[q + 4] >> 4) << 6);
        b[12 + q] = (uint8_t)((sc[q + 4] & 15) | (m[q + 4] & 15) << 4);
    }
}

/* A row's K file block (Q4_K: | d | dmin | scales 12 | qs 128 |; Q6_K: | ql 128 | qh 64 |
 * scales 16 | d |) moved to its lane of a tile block, or back, as move_block: weight t of group j
 * is at byte 32 (j / 2) + t of qs, nibble j % 2; Q6_K's low 4 bits at byte 64 (j / 4) +
 * 32 (j % 2) + t of ql, nibble (j % 4) / 2, its top 2 at bits 2 (j % 4) of qh[32 (j / 4) + t]. */
static inline __attribute__((always_inline)) void move_k_block(const int type, uint8_t *file, uint8_t *block, int lane,
                                                               const int to_tile) {
    const int q6 = type == T_Q6_K;
    copy(to_tile, file + (q6 ? 208 : 0), block + 2 * lane, 2);
    if (q6) {
        for (int s = 0; s < 16; s++) copy(to_tile, file + 192 + s, block + sub_scales_at(type) + 8 * s + lane, 1);
    } else {
        copy(to_tile, file + 2, block + mins_at(type) + 2 * lane, 2);
        move_k_scales(to_tile, file, block + sub_scales_at(type), lane);
    }
    uint8_t *qs = file + (q6 ? 0 : 16), *qh = file + 128;
    for (int j = 0; j < WIDE / GROUP; j++) {
        uint8_t *codes = group_codes(type, block, j), *bits = group_bits(type, block, j);
        for (int p = 0; p < PAIRS; p++) {
            uint8_t *tile_pair = codes + 16 * (p / 2) + 2 * lane;
            if (q6) {
                move_fields(to_tile, qs + 64 * (j / 4) + 32 * (j % 2) + 2 * p, 4 * (j % 4 / 2), tile_pair, 4 * (p % 2), 0x0f0f, 0);
                move_fields(to_tile, qh + 32 * (j / 4) + 2 * p, 2 * (j % 4), bits + 16 * (p / 4) + 2 * lane, 2 * (p % 4), 0x0303,
                            0x0202);
                continue;
            }
            move_fields(to_tile, qs + 32 * (j / 2) + 2 * p, 4 * (j % 2), tile_pair, 4 * (p % 2), 0x0f0f, 0);
        }
    }
}

/* A row's Q2_K file block (| scales 16 | qs 64 | d | dmin |) moved to its lane of a tile block, or
 * back, as move_block: weight c of group j is at bits 2 (j % 4) of qs[32 (j / 4) + c]; in the tile
 * at bits 2 (c % 16 / 4) of byte 32 (c / 16) + 4 lane + c % 4 of the group's codes. */
static inline __attribute__((always_inline)) void move_q2_k_block(uint8_t *file, uint8_t *block, int lane, const int to_tile) {
    copy(to_tile, file + 80, block + 2 * lane, 2);
    copy(to_tile, file + 82, block + mins_at(T_Q2_K) + 2 * lane, 2);
    for (int s = 0; s < 16; s++) copy(to_tile, file + s, block + sub_scales_at(T_Q2_K) + 8 * s + lane, 1);
    for (int j = 0; j < WIDE / GROUP; j++)
        for (int p = 0; p < PAIRS; p++) /* columns 2p, 2p + 1 */
            move_fields(to_tile, file + 16 + 32 * (j / 4) + 2 * p, 2 * (j % 4),
                        group_codes(T_Q2_K, block, j) + 32 * (p / 8) + 4 * lane + 2 * p % 4, 2 * (p % 8 / 2), 0x0303, 0);
}

static inline __attribute__((always_inline)) void move(const int type, uint8_t *file, uint8_t *block, int lane, const int to_tile) {
    if (type == T_Q2_K) move_q2_k_block(file, block, lane, to_tile);
    else if (k_type(type)) move_k_block(type, file, block, lane, to_tile);
    else move_block(type, file, block, lane, to_tile);
}

/* row_tile_matrix for a constant type */
static inline __attribute__((always_inline)) void tile_matrix_as(const int type, const uint8_t *raw, int64_t rows, int64_t K,
                                                                 int64_t t0, int64_t t1, uint8_t *tiles) {
    const int bytes = type_bytes(type);
    const int64_t n_blocks = K / row_tile_span(type), r1 = t1 * ROW_TILE < rows ? t1 * ROW_TILE : rows;
    memset(tiles + t0 * n_blocks * ROW_TILE * bytes, 0, (size_t)((t1 - t0) * n_blocks * ROW_TILE * bytes));
    for (int64_t r = t0 * ROW_TILE; r < r1; r++)
        for (int64_t b = 0; b < n_blocks; b++) /* (the file block is only read) */
            move(type, (uint8_t *)raw + (r * n_blocks + b) * bytes, tiles + ((r / ROW_TILE) * n_blocks + b) * ROW_TILE * bytes,
                 (int)(r % ROW_TILE), 1);
}

int row_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles) {
#define TILING_CASE(name) \
    case T_##name: tile_matrix_as(T_##name, raw, rows, K, t0, t1, tiles); return 0;
    switch (type) {
        ROW_TILED(TILING_CASE)
    default: return -1;
    }
#undef TILING_CASE
}

void row_tile_row(int type, const uint8_t *tiles, int64_t K, int64_t row, uint8_t *out) {
    const int bytes = type_bytes(type);
    const int64_t n_blocks = K / row_tile_span(type);
    memset(out, 0, (size_t)(n_blocks * bytes));
    for (int64_t b = 0; b < n_blocks; b++)
        move(type, out + b * bytes, (uint8_t *)tiles + ((row / ROW_TILE) * n_blocks + b) * ROW_TILE * bytes,
             (int)(row % ROW_TILE), 0);
}

/* The 8 rows' fp16 values at h */
static inline v8f half8(const uint8_t *h) {
#if defined(__AVX2__)
    return widen_half8(h);
#else
    v8f out;
    for (int r = 0; r < ROW_TILE; r++) out[r] = fp16_to_float(u16(h + 2 * r));
    return out;
#endif
}

/* A tile block's float scales, for its 8 rows: s[i] of sub-block i (d; the K types' d * sc, exact)
 * and m[j] of group j's min terms (Q4_1, Q5_1: m; Q4_K: -(dmin * m), exact). */
static inline __attribute__((always_inline)) void block_scales(const int type, const uint8_t *block, v8f *s, v8f *m) {
    if (type == T_MXFP4) {
        v8f d;
        for (int r = 0; r < ROW_TILE; r++) d[r] = e8m0_halves[block[r]];
        s[0] = d;
        return;
    }
    const v8f d = half8(block);
    if (type == T_Q6_K) {
        for (int i = 0; i < 16; i++) s[i] = d * widen8((const int8_t *)block + sub_scales_at(type) + 8 * i) * splat8(0.25f);
        return;
    }
    if (!k_type(type)) {
        s[0] = d;
        if (has_mins(type)) m[0] = half8(block + mins_at(type));
        return;
    }
    typedef uint8_t u8x32 __attribute__((vector_size(32)));
    u8x32 low, low_m, top;
    memcpy(&low, block + sub_scales_at(type), 32);
    memcpy(&low_m, block + sub_scales_at(type) + 32, 32);
    memcpy(&top, block + sub_scales_at(type) + 64, 32);
    const u8x32 sc[2] = {(low & 15) | (top & 3) << 4, low >> 4 | (top & 12) << 2};
    const u8x32 mn[2] = {(low_m & 15) | (top & 48), low_m >> 4 | (top >> 2 & 48)};
    const v8f dmin = -half8(block + mins_at(type));
    for (int j = 0; j < WIDE / GROUP; j++) {
        uint64_t sc8, m8;
        memcpy(&sc8, (const uint8_t *)&sc[j / 4] + 8 * (j % 4), 8);
        memcpy(&m8, (const uint8_t *)&mn[j / 4] + 8 * (j % 4), 8);
        s[j] = d * widen8u(sc8);
        m[j] = dmin * widen8u(m8);
    }
}


#if defined(__AVX2__)
#include <immintrin.h>

/* 16 fifth bits as words of 16 where set */
static inline __m256i fifth_words(const uint8_t *bits) {
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    return _mm256_maskz_mov_epi16((__mmask16)u16(bits), _mm256_set1_epi16(16));
#else
    const __m256i order = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
                                            (short)0x8000);
    const __m256i set = _mm256_and_si256(_mm256_set1_epi16((short)u16(bits)), order);
    return _mm256_and_si256(_mm256_cmpeq_epi16(set, order), _mm256_set1_epi16(16));
#endif
}

/* 16 nibbles (bytes 0 .. 15) as the type's 16 codes, in words */
static inline __m256i nibble_words(const int type, __m128i nibbles) {
    switch (type) {
    case T_Q4_0: return _mm256_cvtepi8_epi16(_mm_sub_epi8(nibbles, _mm_set1_epi8(8)));
    case T_IQ4_NL: return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)kvalues_iq4nl), nibbles));
    case T_MXFP4: return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)kvalues_mxfp4), nibbles));
    default: return _mm256_cvtepu8_epi16(nibbles); /* Q4_1, Q5_0, Q5_1 (their fifth bits below), Q4_K */
    }
}

/* Q6_K's 16 low nibbles at bits 2-5 of `nibbles` with their flipped top 2 bits (at bits `shift` of
 * the bytes `top`) above them, as words: 4 times the code minus 32 */
static inline __m256i q6_words(__m128i nibbles, __m128i top, const int shift) {
    const __m128i high = _mm_and_si128(_mm_slli_epi16(top, 6 - shift), _mm_set1_epi8((char)0xc0));
    return _mm256_cvtepi8_epi16(_mm_or_si128(_mm_and_si128(nibbles, _mm_set1_epi8(0x3c)), high));
}

/* Pair vectors 2c and 2c + 1 of group j of a tile block */
static inline __attribute__((always_inline)) void chunk_words(const int type, const uint8_t *block, const int j, const int c,
                                                              __m256i *first, __m256i *second) {
    const uint8_t *codes = group_codes(type, block, j), *bits = group_bits(type, block, j);
    if (type == T_Q8_0) {
        *first = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * c)));
        *second = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * c + 16)));
        return;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)(codes + 16 * c)), low4 = _mm_set1_epi8(15);
    if (type == T_Q6_K) {
        const __m128i top = _mm_loadu_si128((const __m128i *)(bits + 16 * (c / 2)));
        *first = q6_words(_mm_slli_epi16(v, 2), top, 4 * (c % 2));
        *second = q6_words(_mm_srli_epi16(v, 2), top, 4 * (c % 2) + 2);
        return;
    }
    *first = nibble_words(type, _mm_and_si128(v, low4));
    *second = nibble_words(type, _mm_and_si128(_mm_srli_epi16(v, 4), low4));
    if (bits_at(type) >= 0) {
        *first = _mm256_or_si256(*first, fifth_words(bits + 4 * c));
        *second = _mm256_or_si256(*second, fifth_words(bits + 4 * c + 2));
        if (type == T_Q5_0) {
            *first = _mm256_sub_epi16(*first, _mm256_set1_epi16(16));
            *second = _mm256_sub_epi16(*second, _mm256_set1_epi16(16));
        }
    }
}

/* acc's int32 lanes plus the products of w and the 4 bytes at x (in every lane): as pairs of
 * int16 (dpwssd; madd), or (`bytes`) as w's 4 unsigned bytes times x's 4 signed ones (dpbusd;
 * maddubs and madd, whose int16 pairs do not saturate here: |each product| <= 3 * 127) */
static inline __m256i lane_dot(__m256i acc, __m256i w, const void *x, const int bytes) {
    int32_t word;
    memcpy(&word, x, sizeof word);
    const __m256i xs = _mm256_set1_epi32(word);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return bytes ? _mm256_dpbusd_epi32(acc, w, xs) : _mm256_dpwssd_epi32(acc, w, xs);
#else
    return _mm256_add_epi32(acc, bytes ? _mm256_madd_epi16(_mm256_maddubs_epi16(w, xs), _mm256_set1_epi16(1))
                                       : _mm256_madd_epi16(w, xs));
#endif
}

/* Exact sums of pair vectors 2 c0 .. 2 c1 - 1 of group j of a tile block for N tokens (their
 * codes at xq + t * K, the group's first; K here the codes' stride): isum[t] lane r is row r's. A token's sums go in
 * CHAINS(N) chains of multiply-adds, chunk c into chain c mod CHAINS, added at the end (exact
 * integers: the same sums), so that few tokens do not wait on one chain's latency. */
#if defined(__AVX512VL__) /* 32 registers: 8 chains for 2 tokens. (Two a token for 3-4 tokens: at K = 2560 Q4_K's 3 tokens */
#define CHAINS(N) ((N) <= 2 ? 4 : 1) /* 91 -> 97 G/s, 4 105 -> 107; but SmolLM2's pass over 4 tokens 10.6 -> 11.4 ms) */
#else
#define CHAINS(N) ((N) == 1 ? 4 : (N) == 2 ? 2 : 1)
#endif
static inline __attribute__((always_inline)) void span_sums(const int type, const uint8_t *block, const int j, const int c0,
                                                            const int c1, const int16_t *xq, int64_t K, const int N,
                                                            v8i *isum) {
    __m256i s[TILE_TOKENS_MAX][4];
    for (int t = 0; t < N; t++)
        for (int a = 0; a < CHAINS(N); a++) s[t][a] = _mm256_setzero_si256();
#define CHUNK_STEP(c)                                                                                               \
    do {                                                                                                           \
        __m256i first, second;                                                                                     \
        chunk_words(type, block, j, c, &first, &second);                                                           \
        for (int t = 0; t < N; t++) {                                                                              \
            __m256i *chain = &s[t][(c) % CHAINS(N)];                                                               \
            *chain = lane_dot(lane_dot(*chain, first, xq + t * K + 4 * (c), 0), second, xq + t * K + 4 * (c) + 2, 0); \
        }                                                                                                          \
    } while (0)
    if (CHAINS(N) > 1) { /* unrolled, so that each chunk's chain is a register (for 8 tokens, slower: 144 -> 96 G/s) */
#pragma GCC unroll 8
        for (int c = c0; c < c1; c++) CHUNK_STEP(c);
    } else {
        for (int c = c0; c < c1; c++) CHUNK_STEP(c);
    }
#undef CHUNK_STEP
    for (int t = 0; t < N; t++) {
        __m256i total = s[t][0];
        for (int a = 1; a < CHAINS(N) && a < c1 - c0; a++) total = _mm256_add_epi32(total, s[t][a]);
        isum[t] = (v8i)total;
    }
}
#undef CHAINS

/* Lane r of a and b as two int16 each: a's low times b's low plus their highs, in int32 */
static inline v8i pair_madd(v8i a, v8i b) { return (v8i)_mm256_madd_epi16((__m256i)a, (__m256i)b); }
/* 8 bytes at p, zero-extended, a lane each */
static inline v8i bytes8(const uint8_t *p) { return (v8i)_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)); }
/* lo's lanes in the low 16 bits, hi's in the high ones (each fits in int16) */
static inline v8i pack_pair(v8i lo, v8i hi) { return (v8i)_mm256_blend_epi16((__m256i)lo, _mm256_slli_epi32((__m256i)hi, 16), 0xAA); }

/* Exact sums of a group of a Q2_K tile block (its codes at `codes`) for N tokens' 8-bit codes
 * (token t's of the group at x[t * ldx]): isum[2t + h] lane r is row r's over sub-block h (16
 * columns). Vector h of the group holds them: its bits 2k, 2k + 1 are the quad of columns
 * 16h + 4k .. 16h + 4k + 3. A sub-block's products go in QUAD_CHAINS(N) chains, added at the
 * end, as span_sums's chunks. */
#define QUAD_CHAINS(N) ((N) == 1 ? 2 : 1)
static inline __attribute__((always_inline)) void quad_sums(const uint8_t *codes, const int8_t *x, int64_t ldx, const int N,
                                                            v8i *isum) {
    const __m256i crumb = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        __m256i s[TILE_TOKENS_MAX][2];
        for (int t = 0; t < N; t++)
            for (int a = 0; a < QUAD_CHAINS(N); a++) s[t][a] = _mm256_setzero_si256();
        const __m256i w = _mm256_loadu_si256((const __m256i *)(codes + 32 * h));
        for (int k = 0; k < 4; k++) {
            const __m256i quad = _mm256_and_si256(_mm256_srli_epi16(w, 2 * k), crumb);
            for (int t = 0; t < N; t++)
                s[t][k % QUAD_CHAINS(N)] = lane_dot(s[t][k % QUAD_CHAINS(N)], quad, x + t * ldx + 16 * h + 4 * k, 1);
        }
        for (int t = 0; t < N; t++) {
            __m256i total = s[t][0];
            for (int a = 1; a < QUAD_CHAINS(N); a++) total = _mm256_add_epi32(total, s[t][a]);
            isum[2 * t + h] = (v8i)total;
        }
    }
}
#undef QUAD_CHAINS
#else

/* The code of word k of pair vector p of group j of a tile block */
static inline int tile_code(const int type, const uint8_t *block, int j, int p, int k) {
    const uint8_t *codes = group_codes(type, block, j), *bits = group_bits(type, block, j);
    if (type == T_Q8_0) return (int8_t)codes[16 * p + k];
    const int nibble = (codes[16 * (p / 2) + k] >> (4 * (p % 2))) & 15;
    if (type == T_Q6_K) return 4 * ((nibble | (((bits[16 * (p / 4) + k] >> (2 * (p % 4))) & 3) ^ 2) << 4) - 32);
    const int fifth = bits_at(type) >= 0 ? (u16(bits + 2 * p) >> k) & 1 : 0;
    switch (type) {
    case T_Q4_0: return nibble - 8;
    case T_Q5_0: return (nibble | fifth << 4) - 16;
    case T_IQ4_NL: return kvalues_iq4nl[nibble];
    case T_MXFP4: return kvalues_mxfp4[nibble];
    default: return nibble | fifth << 4; /* Q4_1, Q5_1, Q4_K */
    }
}

static inline __attribute__((always_inline)) void span_sums(const int type, const uint8_t *block, const int j, const int c0,
                                                            const int c1, const int16_t *xq, int64_t K, const int N,
                                                            v8i *isum) {
    int16_t w[PAIRS][16];
    for (int p = 2 * c0; p < 2 * c1; p++)
        for (int k = 0; k < 16; k++) w[p][k] = (int16_t)tile_code(type, block, j, p, k);
    for (int t = 0; t < N; t++) {
        const int16_t *x = xq + t * K;
        v8i s = {0};
        for (int p = 2 * c0; p < 2 * c1; p++)
            for (int r = 0; r < ROW_TILE; r++) s[r] += w[p][2 * r] * x[2 * p] + w[p][2 * r + 1] * x[2 * p + 1];
        isum[t] = s;
    }
}

static inline v8i bytes8(const uint8_t *p) {
    v8i out;
    for (int r = 0; r < ROW_TILE; r++) out[r] = p[r];
    return out;
}
static inline v8i pair_madd(v8i a, v8i b) {
    v8i out;
    for (int r = 0; r < ROW_TILE; r++) out[r] = (int16_t)a[r] * (int16_t)b[r] + (a[r] >> 16) * (b[r] >> 16);
    return out;
}
static inline v8i pack_pair(v8i lo, v8i hi) {
    typedef uint32_t v8u __attribute__((vector_size(32)));
    return (v8i)(((v8u)lo & 0xffff) | (v8u)hi << 16);
}

static inline __attribute__((always_inline)) void quad_sums(const uint8_t *codes, const int8_t *x, int64_t ldx, const int N,
                                                            v8i *isum) {
    for (int t = 0; t < N; t++)
        for (int h = 0; h < 2; h++)
            for (int r = 0; r < ROW_TILE; r++) {
                int32_t s = 0;
                for (int c = 0; c < 16; c++) s += ((codes[32 * h + 4 * r + c % 4] >> (2 * (c / 4))) & 3) * x[t * ldx + 16 * h + c];
                isum[2 * t + h][r] = s;
            }
}
#endif

/* One tile (8 rows, K columns) times N tokens: out[t], lane r the row's result. Token t's codes
 * at xq + t * ldx, its block scales at xd + t * K / span, its group sums at xs + t * K / GROUP. */
static inline __attribute__((always_inline)) void tile_product(const int type, const uint8_t *tile, int64_t K,
                                                               const int16_t *xq, int64_t ldx, const float *xd,
                                                               const float *xs, const int N, v8f *out) {
    const int span = row_tile_span(type), halves = halves_of(type), chunks = PAIRS / 2 / halves;
    const int64_t B = K / span, G = K / GROUP, block_bytes = ROW_TILE * type_bytes(type);
    v8f acc[TILE_TOKENS_MAX] = {{0}}, macc[TILE_TOKENS_MAX] = {{0}};
    for (int64_t b = 0; b < B; b++) {
        const uint8_t *block = tile + b * block_bytes;
        if (N > 1 && type == T_Q8_0 && N * ldx * (int64_t)sizeof(int16_t) >= L2_CODES_BYTES)
            for (int64_t at = 0; at < block_bytes; at += 64) __builtin_prefetch(block + Q8_0_AHEAD_BLOCKS * block_bytes + at, 0, 2);
        else if (N > 1 || type == T_Q6_K)
            prefetch_block(block, (size_t)block_bytes, ROW_TILE_AHEAD);
        v8f s[WIDE / 16], m[WIDE / GROUP];
        block_scales(type, block, s, m);
        for (int j = 0; j < groups_of(type); j++) {
#pragma GCC unroll 2
            for (int h = 0; h < halves; h++) { /* (unrolled: each half's chunks constants, its chains registers) */
                v8i isum[TILE_TOKENS_MAX];
                span_sums(type, block, j, h * chunks, (h + 1) * chunks, xq + b * span + GROUP * j, ldx, N, isum);
                for (int t = 0; t < N; t++)
                    acc[t] = fma8(__builtin_convertvector(isum[t], v8f), s[halves * j + h] * splat8(xd[t * B + b]), acc[t]);
            }
            if (has_mins(type))
                for (int t = 0; t < N; t++) macc[t] = fma8(m[j], splat8(xs[t * G + b * groups_of(type) + j]), macc[t]);
        }
    }
    for (int t = 0; t < N; t++) out[t] = has_mins(type) ? acc[t] + macc[t] : acc[t];
}

/* tile_product for the types on 8-bit codes (Q2_K): token t's Codes8 blocks at x8 + t *
 * codes8_blocks(K), a scale xd and the codes' sums per 16 q0, q1 per group. A group's two
 * sub-blocks' sums isum0, isum1 and scales sc0, sc1, mins m0, m1 meet in integers (pair_madd:
 * |isum| <= 16 * 3 * 127, |q| <= 16 * 127, all in int16), so that per group and token
 *     acc = fma(float(isum0 sc0 + isum1 sc1), d * xd, acc), macc = fma(float(m0 q0 + m1 q1), -dmin * xd, macc) */
static inline __attribute__((always_inline)) void tile_product8(const int type, const uint8_t *tile, int64_t K,
                                                                const Codes8 *x8, const int N, v8f *out) {
    const int per = BLOCK8 / GROUP; /* groups of a Codes8 block */
    const int64_t B = K / WIDE, ldb = codes8_blocks(K), block_bytes = ROW_TILE * type_bytes(type);
    const int64_t ldx = ldb * (int64_t)sizeof(Codes8); /* bytes from a token's codes to the next's */
    v8f acc[TILE_TOKENS_MAX] = {{0}}, macc[TILE_TOKENS_MAX] = {{0}};
    for (int64_t b = 0; b < B; b++) {
        const uint8_t *block = tile + b * block_bytes;
        if (N > 1) prefetch_block(block, (size_t)block_bytes, ROW_TILE_AHEAD);
        const v8f d = half8(block), dmin = -half8(block + mins_at(type));
        v8i sc[WIDE / GROUP], mn[WIDE / GROUP]; /* per group, the pairs (sc0, sc1) and (m0, m1) of each row */
        for (int j = 0; j < WIDE / GROUP; j++) {
            /* a sub-block's scale in the low nibble, its min in the high one */
            const v8i lo = bytes8(block + sub_scales_at(type) + 16 * j), hi = bytes8(block + sub_scales_at(type) + 16 * j + 8);
            sc[j] = pack_pair(lo & 15, hi & 15);
            mn[j] = pack_pair(lo >> 4, hi >> 4);
        }
        for (int j = 0; j < WIDE / GROUP; j++) {
            const int64_t g = b * (WIDE / GROUP) + j; /* the group's number in the row */
            const Codes8 *x = x8 + g / per;
            const int k = (int)(g % per);
            v8i isum[2 * TILE_TOKENS_MAX];
            quad_sums(group_codes(type, block, j), x->q + GROUP * k, ldx, N, isum);
            for (int t = 0; t < N; t++) {
                const Codes8 *xt = x + t * ldb;
                int32_t sums;
                memcpy(&sums, xt->sums + 2 * k, sizeof sums);
                const v8f xd = splat8(xt->d[k]);
                const v8i q = pair_madd(pack_pair(isum[2 * t], isum[2 * t + 1]), sc[j]), mq = pair_madd(mn[j], (v8i){0} + sums);
                acc[t] = fma8(__builtin_convertvector(q, v8f), d * xd, acc[t]);
                macc[t] = fma8(__builtin_convertvector(mq, v8f), dmin * xd, macc[t]);
            }
        }
    }
    for (int t = 0; t < N; t++) out[t] = acc[t] + macc[t];
}

/* one function per type, one body per count of tokens */
#define TILE_PRODUCT(name, n)                                                                                       \
    (takes_codes8(T_##name) ? tile_product8(T_##name, tile, K, x8, n, out)                                         \
                            : tile_product(T_##name, tile, K, xq, ldx, xd, xs, n, out))
#define TILE_FUNCTION(name)                                                                                         \
    static __attribute__((noinline)) void tile_##name(const uint8_t *tile, int64_t K, const int16_t *xq,          \
                                                       int64_t ldx, const float *xd, const float *xs,              \
                                                       const Codes8 *x8, int n, v8f *out) {                        \
        switch (n) {                                                                                               \
        case 1: TILE_PRODUCT(name, 1); break;                                                                      \
        case 2: TILE_PRODUCT(name, 2); break;                                                                      \
        case 3: TILE_PRODUCT(name, 3); break;                                                                      \
        case 4: TILE_PRODUCT(name, 4); break;                                                                      \
        default: TILE_PRODUCT(name, TILE_TOKENS_MAX); break;                                                       \
        }                                                                                                          \
    }
ROW_TILED(TILE_FUNCTION)
#undef TILE_FUNCTION
#undef TILE_PRODUCT

void row_tile_rows(int type, const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, const int16_t *xq, int64_t ldx,
                   const float *xd, const float *xs, const Codes8 *x8, int n, float *out, int64_t stride) {
    const uint8_t *at = tiles + tile * row_tiled_bytes(type, ROW_TILE, K);
    v8f result[TILE_TOKENS_MAX];
#define PRODUCT_CASE(name) \
    case T_##name: tile_##name(at, K, xq, ldx, xd, xs, x8, n, result); break;
    switch (type) {
        ROW_TILED(PRODUCT_CASE)
    default: return;
    }
#undef PRODUCT_CASE
    const int64_t r0 = tile * ROW_TILE, count = rows - r0 < ROW_TILE ? rows - r0 : ROW_TILE;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < count; r++) out[t * stride + r0 + r] = result[t][r];
}

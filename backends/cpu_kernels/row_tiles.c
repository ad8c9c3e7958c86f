/* The 32-weight types on int16 codes (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4) multiplied
 * from tiles of ROW_TILE = 8 rows, each row in a lane of the vectors.
 *
 * Why. dot_row_tokens (quants.c) sums a row's group of 32 in 8 int32 lanes, then converts them,
 * multiplies them by the group's scales and adds them, per group and token: with a few tokens
 * those float steps set the pace, not the memory (checking 4 tokens cost 1.8-2.0 one-token
 * products of Q8_0). Here one int32 lane holds one row's whole group, so each float step
 * serves 8 rows.
 *
 * Weights. At load a matrix is regrouped (row_tile_matrix) into tiles of 8 rows, the last
 * padded with zero rows. Nothing is dequantized: a tile row takes the type's own bytes per
 * block. For each block of 32 columns a tile holds
 *   - the 8 rows' scales as the file has them: fp16 d (16 bytes), then for Q4_1 and Q5_1
 *     their fp16 m (16 bytes); for MXFP4 the E8M0 bytes (8);
 *   - for Q5_0 and Q5_1 the fifth bits: a 16-bit word per pair vector, bit k for word k
 *     (32 bytes);
 *   - the codes as 16 pair vectors of 16 words: word k of pair vector p is weight 2p + k % 2
 *     of row k / 2. Q8_0 keeps 16 int8 per pair vector (256 bytes); the 4-bit types keep the
 *     file's nibbles, 16 bytes per pair vectors 2c and 2c + 1: byte k holds word k of the
 *     first in its low nibble and of the second in its high one (128 bytes).
 * A word's value is the code unpack_row gives the weight: Q4_0 nibble - 8, Q4_1 nibble, Q5_0
 * (nibble | bit << 4) - 16, Q5_1 nibble | bit << 4, IQ4_NL kvalues_iq4nl[nibble], MXFP4
 * kvalues_mxfp4[nibble], Q8_0 the byte.
 *
 * Product. A token's activations are quantize_row's int16 codes per group of 32, with a scale
 * xd and a sum xs per group. Pair vector p times the token's codes 2p and 2p + 1 (one int32
 * broadcast to every lane) in pair sums (madd; dpwssd with VNNI) adds each row's two products
 * to its int32 lane; the 16 pair vectors sum the group exactly (|isum| <= 32 * 128 * 32767 <
 * 2^31). Then, per row and token, block after block:
 *     acc = fma(float(isum), d * xd, acc)        (d * xd rounded first)
 *     macc = fma(m, xs, macc)                     (Q4_1, Q5_1: the min terms)
 * and the result is acc + macc. The integers are exact and the float steps the same C in every
 * tier, so every tier gives the same bits, and a token's are the same whatever tokens are
 * multiplied beside it (decode, a batch, a prefill). */
#include <string.h>

#include "bytes.h"    /* u16, u32 */
#include "iq_grids.h" /* kvalues_iq4nl */
#include "kernels.h"
#include "simd.h"

#define PAIRS 16                                  /* pair vectors per block */
/* Tiles asked for ahead, from 2 tokens on (one token's product, left to the hardware prefetcher,
 * streamed faster: Zen 4, from memory, Q4_1 66 against 52-57 G/s; four tokens' slower, Q8_0 52
 * against 83): into L1, ROW_TILE_AHEAD bytes on; but where a Q8_0 tile (272 bytes a block) and
 * the tokens' codes, 8 KB or more, would not both stay in L1, into L2 only, Q8_0_AHEAD_BLOCKS
 * blocks on (K = 2560: 4 tokens 82 -> 87-101 G/s, 2 tokens 46 -> 61-65; K = 640 and 4 tokens
 * lost 10% that way, the 4-bit types at K = 2560 2-9%) */
#define ROW_TILE_AHEAD 4096
#define Q8_0_AHEAD_BLOCKS 32
#define L2_CODES_BYTES 8192
#define TILE_TOKENS_MAX ROW_TILE_TOKENS

/* Where a file block's parts lie: its m (Q4_1, Q5_1), its fifth bits (Q5_0, Q5_1), its codes
 * (-1: none); its scale is at 0, an fp16 d but for MXFP4's E8M0 byte. */
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
/* and in a tile block, after the 8 rows' scales: the mins, the fifth bits, the codes */
static inline int scale_bytes(int type) { return type == T_MXFP4 ? 1 : 2; }
static inline int mins_at(int type) { return file_mins_at(type) < 0 ? -1 : ROW_TILE * 2; }
static inline int fifth_at(int type) { return file_fifth_at(type) < 0 ? -1 : ROW_TILE * 2 * (mins_at(type) < 0 ? 1 : 2); }
static inline int codes_at(int type) {
    return ROW_TILE * scale_bytes(type) + (mins_at(type) < 0 ? 0 : ROW_TILE * 2) + (fifth_at(type) < 0 ? 0 : PAIRS * 2);
}

/* The types in row tiles (X-macro): each case below, one per type */
#define ROW_TILED(X) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(IQ4_NL) X(MXFP4)

int row_tiled_type(int type) {
#define IS_CASE(name) case T_##name:
    switch (type) {
        ROW_TILED(IS_CASE) return 1;
    default: return 0;
    }
#undef IS_CASE
}

int64_t row_tiled_bytes(int type, int64_t rows, int64_t K) {
    return (rows + ROW_TILE - 1) / ROW_TILE * (K / GROUP) * ROW_TILE * type_bytes(type);
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

/* A row's file block moved to its lane of a tile block, or back (to_tile 0): the one map between
 * the two layouts (module comment), a pair of weights 2p, 2p + 1 at a time (their word k is
 * 2 lane and 2 lane + 1; 4-bit types: adjacent bytes of both blocks, each at one nibble). The
 * destination's codes and bits start at zero. */
static inline __attribute__((always_inline)) void move_block(const int type, uint8_t *file, uint8_t *block, int lane,
                                                             const int to_tile) {
    uint8_t *qs = file + file_codes_at(type), *codes = block + codes_at(type);
    copy(to_tile, file, block + scale_bytes(type) * lane, (size_t)scale_bytes(type));
    if (mins_at(type) >= 0) copy(to_tile, file + file_mins_at(type), block + mins_at(type) + 2 * lane, 2);
    uint32_t qh = to_tile && fifth_at(type) >= 0 ? u32(file + file_fifth_at(type)) : 0;
    for (int p = 0; p < PAIRS; p++) {
        if (type == T_Q8_0) {
            copy(to_tile, qs + 2 * p, codes + 16 * p + 2 * lane, 2);
            continue;
        }
        uint8_t *in_tile = codes + 16 * (p / 2) + 2 * lane, *in_file = qs + 2 * p % 16;
        const int tile_shift = 4 * (p % 2), file_shift = 4 * (p / 8); /* weight 2p is in the high nibbles from 16 */
        /* two bytes at once, each its own nibble: the same in either byte order */
        if (to_tile) store16(in_tile, (uint16_t)(load16(in_tile) | ((load16(in_file) >> file_shift) & 0x0f0f) << tile_shift));
        else store16(in_file, (uint16_t)(load16(in_file) | ((load16(in_tile) >> tile_shift) & 0x0f0f) << file_shift));
        if (fifth_at(type) < 0) continue;
        uint8_t *bits = block + fifth_at(type) + 2 * p; /* bits 2 lane, 2 lane + 1 of word p (LSB first): qh's 2p, 2p + 1 */
        const uint16_t word = (uint16_t)(u16(bits) | (to_tile ? ((qh >> 2 * p) & 3) << 2 * lane : 0));
        if (to_tile) bits[0] = (uint8_t)word, bits[1] = (uint8_t)(word >> 8);
        else qh |= (uint32_t)((word >> 2 * lane) & 3) << 2 * p;
    }
    if (!to_tile && fifth_at(type) >= 0)
        for (int i = 0; i < 4; i++) file[file_fifth_at(type) + i] = (uint8_t)(qh >> (8 * i));
}

/* row_tile_matrix for a constant type */
static inline __attribute__((always_inline)) void tile_matrix_as(const int type, const uint8_t *raw, int64_t rows, int64_t K,
                                                                 int64_t t0, int64_t t1, uint8_t *tiles) {
    const int bytes = type_bytes(type);
    const int64_t n_blocks = K / GROUP, r1 = t1 * ROW_TILE < rows ? t1 * ROW_TILE : rows;
    memset(tiles + t0 * n_blocks * ROW_TILE * bytes, 0, (size_t)((t1 - t0) * n_blocks * ROW_TILE * bytes));
    for (int64_t r = t0 * ROW_TILE; r < r1; r++)
        for (int64_t b = 0; b < n_blocks; b++) /* (the file block is only read) */
            move_block(type, (uint8_t *)raw + (r * n_blocks + b) * bytes,
                       tiles + ((r / ROW_TILE) * n_blocks + b) * ROW_TILE * bytes, (int)(r % ROW_TILE), 1);
}

void row_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles) {
#define TILING_CASE(name) \
    case T_##name: tile_matrix_as(T_##name, raw, rows, K, t0, t1, tiles); break;
    switch (type) {
        ROW_TILED(TILING_CASE)
    }
#undef TILING_CASE
}

void row_tile_row(int type, const uint8_t *tiles, int64_t K, int64_t row, uint8_t *out) {
    const int bytes = type_bytes(type);
    const int64_t n_blocks = K / GROUP;
    memset(out, 0, (size_t)(n_blocks * bytes));
    for (int64_t b = 0; b < n_blocks; b++)
        move_block(type, out + b * bytes, (uint8_t *)tiles + ((row / ROW_TILE) * n_blocks + b) * ROW_TILE * bytes,
                   (int)(row % ROW_TILE), 0);
}

/* The 8 rows' scales d of a tile block, and their mins m (Q4_1, Q5_1) */
static inline v8f half8(const uint8_t *h) {
#if defined(__AVX2__)
    return widen_half8(h);
#else
    v8f out;
    for (int r = 0; r < ROW_TILE; r++) out[r] = fp16_to_float(u16(h + 2 * r));
    return out;
#endif
}
static inline v8f tile_scales(const int type, const uint8_t *block) {
    if (type != T_MXFP4) return half8(block);
    v8f d;
    for (int r = 0; r < ROW_TILE; r++) d[r] = e8m0_halves[block[r]];
    return d;
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
    default: return _mm256_cvtepu8_epi16(nibbles); /* Q4_1, Q5_0, Q5_1 (their fifth bits below) */
    }
}

/* Pair vectors 2c and 2c + 1 of a tile block */
static inline __attribute__((always_inline)) void chunk_words(const int type, const uint8_t *block, const int c,
                                                              __m256i *first, __m256i *second) {
    const uint8_t *codes = block + codes_at(type);
    if (type == T_Q8_0) {
        *first = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * c)));
        *second = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(codes + 32 * c + 16)));
        return;
    }
    const __m128i v = _mm_loadu_si128((const __m128i *)(codes + 16 * c)), low4 = _mm_set1_epi8(15);
    *first = nibble_words(type, _mm_and_si128(v, low4));
    *second = nibble_words(type, _mm_and_si128(_mm_srli_epi16(v, 4), low4));
    if (fifth_at(type) >= 0) {
        const uint8_t *bits = block + fifth_at(type) + 4 * c;
        *first = _mm256_or_si256(*first, fifth_words(bits));
        *second = _mm256_or_si256(*second, fifth_words(bits + 2));
        if (type == T_Q5_0) {
            *first = _mm256_sub_epi16(*first, _mm256_set1_epi16(16));
            *second = _mm256_sub_epi16(*second, _mm256_set1_epi16(16));
        }
    }
}

/* acc's int32 lanes plus the pair sums of w and the int16 pair at x, in every lane */
static inline __m256i pair_dot(__m256i acc, __m256i w, const int16_t *x) {
    int32_t pair;
    memcpy(&pair, x, sizeof pair);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpwssd_epi32(acc, w, _mm256_set1_epi32(pair));
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(pair)));
#endif
}

/* A tile block's exact group sums for N tokens: isum[t] lane r is row r's. A token's sums go in
 * CHAINS(N) chains of multiply-adds, chunk c into chain c mod CHAINS, added at the end (exact
 * integers: the same sums), so that few tokens do not wait on one chain's latency. */
#define CHAINS(N) ((N) == 1 ? 4 : (N) == 2 ? 2 : 1)
static inline __attribute__((always_inline)) void block_sums(const int type, const uint8_t *block, const int16_t *xq,
                                                             int64_t K, const int N, v8i *isum) {
    __m256i s[TILE_TOKENS_MAX][4];
    for (int t = 0; t < N; t++)
        for (int a = 0; a < CHAINS(N); a++) s[t][a] = _mm256_setzero_si256();
    for (int c = 0; c < PAIRS / 2; c++) {
        __m256i first, second;
        chunk_words(type, block, c, &first, &second);
        for (int t = 0; t < N; t++) {
            __m256i *chain = &s[t][c % CHAINS(N)];
            *chain = pair_dot(pair_dot(*chain, first, xq + t * K + 4 * c), second, xq + t * K + 4 * c + 2);
        }
    }
    for (int t = 0; t < N; t++) {
        __m256i total = s[t][0];
        for (int a = 1; a < CHAINS(N); a++) total = _mm256_add_epi32(total, s[t][a]);
        isum[t] = (v8i)total;
    }
}
#undef CHAINS
#else

/* The code of word k of pair vector p of a tile block */
static inline int tile_code(const int type, const uint8_t *block, int p, int k) {
    const uint8_t *codes = block + codes_at(type);
    if (type == T_Q8_0) return (int8_t)codes[16 * p + k];
    const int nibble = (codes[16 * (p / 2) + k] >> (4 * (p % 2))) & 15;
    const int fifth = fifth_at(type) >= 0 ? (u16(block + fifth_at(type) + 2 * p) >> k) & 1 : 0;
    switch (type) {
    case T_Q4_0: return nibble - 8;
    case T_Q5_0: return (nibble | fifth << 4) - 16;
    case T_IQ4_NL: return kvalues_iq4nl[nibble];
    case T_MXFP4: return kvalues_mxfp4[nibble];
    default: return nibble | fifth << 4; /* Q4_1, Q5_1 */
    }
}

static inline __attribute__((always_inline)) void block_sums(const int type, const uint8_t *block, const int16_t *xq,
                                                             int64_t K, const int N, v8i *isum) {
    int16_t w[PAIRS][16];
    for (int p = 0; p < PAIRS; p++)
        for (int k = 0; k < 16; k++) w[p][k] = (int16_t)tile_code(type, block, p, k);
    for (int t = 0; t < N; t++) {
        const int16_t *x = xq + t * K;
        v8i s = {0};
        for (int p = 0; p < PAIRS; p++)
            for (int r = 0; r < ROW_TILE; r++) s[r] += w[p][2 * r] * x[2 * p] + w[p][2 * r + 1] * x[2 * p + 1];
        isum[t] = s;
    }
}
#endif

/* One tile (8 rows, K columns) times N tokens: out[t], lane r the row's result. Token t's codes
 * at xq + t * K, its group scales and sums at xd, xs + t * K / GROUP. */
static inline __attribute__((always_inline)) void tile_product(const int type, const uint8_t *tile, int64_t K,
                                                               const int16_t *xq, const float *xd, const float *xs,
                                                               const int N, v8f *out) {
    const int64_t G = K / GROUP, block_bytes = ROW_TILE * type_bytes(type);
    v8f acc[TILE_TOKENS_MAX] = {{0}}, macc[TILE_TOKENS_MAX] = {{0}};
    for (int64_t b = 0; b < G; b++) {
        const uint8_t *block = tile + b * block_bytes;
        if (N > 1 && type == T_Q8_0 && N * K * (int64_t)sizeof(int16_t) >= L2_CODES_BYTES)
            for (int64_t at = 0; at < block_bytes; at += 64) __builtin_prefetch(block + Q8_0_AHEAD_BLOCKS * block_bytes + at, 0, 2);
        else if (N > 1)
            prefetch_block(block, (size_t)block_bytes, ROW_TILE_AHEAD);
        v8i isum[TILE_TOKENS_MAX];
        block_sums(type, block, xq + b * GROUP, K, N, isum);
        const v8f d = tile_scales(type, block);
        for (int t = 0; t < N; t++) acc[t] = fma8(__builtin_convertvector(isum[t], v8f), d * splat8(xd[t * G + b]), acc[t]);
        if (mins_at(type) >= 0) {
            const v8f m = half8(block + mins_at(type));
            for (int t = 0; t < N; t++) macc[t] = fma8(m, splat8(xs[t * G + b]), macc[t]);
        }
    }
    for (int t = 0; t < N; t++) out[t] = mins_at(type) >= 0 ? acc[t] + macc[t] : acc[t];
}

/* one function per type, one body per count of tokens */
#define TILE_FUNCTION(name)                                                                                         \
    static __attribute__((noinline)) void tile_##name(const uint8_t *tile, int64_t K, const int16_t *xq,          \
                                                       const float *xd, const float *xs, int n, v8f *out) {        \
        switch (n) {                                                                                               \
        case 1: tile_product(T_##name, tile, K, xq, xd, xs, 1, out); break;                                         \
        case 2: tile_product(T_##name, tile, K, xq, xd, xs, 2, out); break;                                         \
        case 3: tile_product(T_##name, tile, K, xq, xd, xs, 3, out); break;                                         \
        default: tile_product(T_##name, tile, K, xq, xd, xs, TILE_TOKENS_MAX, out); break;                          \
        }                                                                                                          \
    }
ROW_TILED(TILE_FUNCTION)
#undef TILE_FUNCTION

void row_tile_rows(int type, const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, const int16_t *xq,
                   const float *xd, const float *xs, int n, float *out, int64_t stride) {
    const uint8_t *at = tiles + tile * (K / GROUP) * ROW_TILE * type_bytes(type);
    v8f result[TILE_TOKENS_MAX];
#define PRODUCT_CASE(name) \
    case T_##name: tile_##name(at, K, xq, xd, xs, n, result); break;
    switch (type) {
        ROW_TILED(PRODUCT_CASE)
    default: return;
    }
#undef PRODUCT_CASE
    const int64_t r0 = tile * ROW_TILE, count = rows - r0 < ROW_TILE ? rows - r0 : ROW_TILE;
    for (int t = 0; t < n; t++)
        for (int64_t r = 0; r < count; r++) out[t * stride + r0 + r] = result[t][r];
}

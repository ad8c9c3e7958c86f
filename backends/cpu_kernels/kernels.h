/* Sprig's native CPU kernels: shared declarations.
 *
 * The same sources are compiled once per instruction-set tier (scalar, AVX2, AVX-512 VNNI,
 * NEON); the Python side picks the best tier the CPU supports at run time. Only the integer
 * dot product of one 32-weight group differs between tiers (simd.h; and iq_dots.c); every float operation
 * is shared C, compiled with -ffp-contract=off, so all tiers give the same results bit for bit.
 *
 * A matrix product quantizes each activation row to int16 in groups of 32 (one float scale
 * per group: 15 bits, where llama.cpp's Q8 activations keep 7, so the products stay within
 * float32 rounding of the reference), unpacks each block of a weight row into int8 codes plus
 * the scales of each half group, in registers and on the stack, and dots it with up to
 * ROW_TOKENS tokens before the next block (dot_row_tokens). Within a group the products are
 * summed exactly in 8 int32 lanes, lane l of each half taking weights 2l and 2l + 1, and each
 * lane keeps its own float accumulator:
 *     acc[l] += (float)(isum_lo[l] + isum_hi[l]) * (wscale * xscale)
 * (these CODES types have one scale per group; `split` below serves the OWN8 types).
 * The row's result is reduce8(acc) + the min terms, wmin[g] * xsum[g], summed in lanes g mod 8.
 * AVX-512 takes two groups at a time in 16 lanes (pair_terms in quants.c) and adds their terms
 * to acc one after the other, the same operations; its avx512_ymm build (SPRIG_YMM, for cores
 * that run 512-bit operations in halves) takes one at a time, as AVX2.
 * Q4_K, Q5_K and Q6_K (form INT16 below) take int16 weights and codes per 256 instead, below.
 * Q2_K, Q3_K and the IQ types but IQ4_NL (form OWN8) take 8-bit activation
 * codes instead, in the same groups of 32 (Codes8), which the AVX2 byte products (maddubs)
 * multiply at twice the int16 ones' width (codes8_dots.c). That costs accuracy (logits ~1.5e-2 of the range, perplexity
 * under 0.6%: docs/benchmarks.md), small beside their 2- to 4-bit weights' own; Q4_K to Q6_K
 * failed the end-to-end Gemma test with it and keep int16 codes.
 * A product over FLOAT_TOKENS or more tokens (prefill) of the 256-weight types with integer
 * sub-block scales unpacks a panel of rows to integers once and multiplies them with activation
 * codes (panels.h): Q4_K, Q5_K and Q6_K as int16 weights against int16 codes with one scale per
 * WIDE values (int16_panels.c), the OWN8 types as 8-bit codes and scales per 16 weights against
 * decode's 8-bit codes, a scale per group (byte_panels.c: twice the products per instruction).
 * Q4_K, Q5_K and Q6_K (type_decodes_int16) take the int16 arithmetic for any count of tokens
 * in a mixture's experts (the rows as the file has them): a token's products are the same bits
 * in decode, in a batch and in a prefill. Their decode unpacks
 * the blocks straight from the bytes into registers and multiplies them there (AVX2 and
 * AVX-512, int16_direct_product), one float multiply-add per block where the per-group codes
 * took one per group, and asks for the rows ahead block by block as it goes.
 * The backend gives the linear op the 32-weight CODES types (Q4_0 to Q8_0, IQ4_NL, MXFP4),
 * Q4_K, Q6_K and Q2_K (on its 8-bit codes) as row tiles (T_ROW_TILES + the type; row_tiles.c):
 * tiles of ROW_TILE rows whose int32 lanes each hold a row, so that one float step serves 8
 * rows (a K type's: one per sub-block), for any count of tokens; a mixture's stacks of these types too, their tiles made
 * expert by expert as the experts op first chooses each (Matrix.source). The 32-weight types'
 * rows as the file lays them out (a stack whose experts are not whole tiles) serve a mixture's
 * experts otherwise: dot_row_tokens for a few tokens, and
 * for FLOAT_TOKENS or more a panel of rows dequantized (float_panel_rows) to float once for all
 * its tokens, which takes the float activations as they are, FLOAT_ROWS rows at a time, summing
 * with fused multiply-adds in 8 lanes (fma8, the same rounding in every tier; float_product in
 * quants.c; AVX-512 but its avx512_ymm build holds two tokens' 8 lanes in one register).
 * On AVX2 and AVX-512 the IQ types have dequantization, and those on int16 codes products, of
 * their own, unpacked in registers (iq_dots.c), with the bits of the form above.
 * The float types take the float activations as they are. Q1_0 is multiplied by table
 * lookup, its rows regrouped at load into tiles of 32 (q1_tiles.c); so are TQ1_0 and TQ2_0
 * (tq_tiles.c).
 */
#ifndef SPRIG_KERNELS_H
#define SPRIG_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Every type the kernels read, one row each (X-macro): from it come the T_ enum, block
 * sizes (type_block, type_bytes), the unpacking switch, each CODES type's own product function
 * (dot_<name>, which dot_row_tokens calls) and the scale check (quants.c), and the module's
 * NATIVE_TYPES (module.c). A new block format is its unpack
 * function in quants.c (its bit layout drawn above it) and one row here.
 *
 *   X(name, GGML number, weights per block, bytes per block, form, unpack function,
 *     mins, split, check, byte offsets of the values checked...)
 *
 * form     FLOAT: rows of floats, taken as they are (F32, F16, BF16: unpack_row converts them);
 *          CODES: int8 codes and half-group scales (`unpack`), multiplied with int16
 *          activation codes; INT16: int16 weights sc * code against int16 codes with a scale
 *          per WIDE values, for any count of tokens (int16_panels.c), `unpack` serving
 *          dequantization only; OWN8: 8-bit activation codes (Codes8), multiplied by a product
 *          function of the type's own (dot_<name>, codes8_dots.c), `unpack` serving
 *          dequantization only; TILED: unpacked for embeddings, multiplied from tiles (Q1_0:
 *          q1_tiles.c), never by dot_row_tokens.
 * mins     min terms per group of 32, each times the activation sum of the weights it covers:
 *          0 none; 1 one per group (Q4_1, Q5_1, Q4_K, Q5_K); 2 one per half, weights 0-15
 *          and 16-31 (Q2_K, whose 16-weight sub-blocks have mins of their own).
 * split    the two halves of a group have scales of their own (Q6_K, Q2_K, Q3_K, IQ2_XS,
 *          IQ2_S, IQ1_M: 16-weight sub-blocks).
 * check    the format of the values that must be finite, at the offsets that follow, in each
 *          block: FP16 scales (d, and m or dmin where there is one), the float itself,
 *          IQ1M: IQ1_M's fp16 d, spread over the top 4 bits of its 4 scale words, or NONE
 *          where every value is finite (MXFP4's E8M0 scale byte, as gguf-py reads it). */
#define QUANT_TYPES(X)                                            \
    X(F32, 0, 1, 4, FLOAT, NONE, 0, 0, F32, 0)                    \
    X(F16, 1, 1, 2, FLOAT, NONE, 0, 0, FP16, 0)                   \
    X(BF16, 30, 1, 2, FLOAT, NONE, 0, 0, BF16, 0)                 \
    X(Q4_0, 2, 32, 18, CODES, unpack_q4_0, 0, 0, FP16, 0)         \
    X(Q4_1, 3, 32, 20, CODES, unpack_q4_1, 1, 0, FP16, 0, 2)      \
    X(Q5_0, 6, 32, 22, CODES, unpack_q5_0, 0, 0, FP16, 0)         \
    X(Q5_1, 7, 32, 24, CODES, unpack_q5_1, 1, 0, FP16, 0, 2)      \
    X(Q8_0, 8, 32, 34, CODES, unpack_q8_0, 0, 0, FP16, 0)         \
    X(Q1_0, 41, 128, 18, TILED, unpack_q1_0, 0, 0, FP16, 0)       \
    X(Q4_K, 12, 256, 144, INT16, unpack_q4_k, 1, 0, FP16, 0, 2)   \
    X(Q5_K, 13, 256, 176, INT16, unpack_q5_k, 1, 0, FP16, 0, 2)   \
    X(Q6_K, 14, 256, 210, INT16, unpack_q6_k, 0, 1, FP16, 208)    \
    X(MXFP4, 39, 32, 17, CODES, unpack_mxfp4, 0, 0, NONE, 0)      \
    X(Q2_K, 10, 256, 84, OWN8, unpack_q2_k, 2, 1, FP16, 80, 82)    \
    X(Q3_K, 11, 256, 110, OWN8, unpack_q3_k, 0, 1, FP16, 108)      \
    X(TQ2_0, 35, 256, 66, CODES, unpack_tq2_0, 0, 0, FP16, 64)    \
    X(TQ1_0, 34, 256, 54, CODES, unpack_tq1_0, 0, 0, FP16, 52)    \
    X(IQ4_NL, 20, 32, 18, CODES, unpack_iq4_nl, 0, 0, FP16, 0)    \
    X(IQ4_XS, 23, 256, 136, OWN8, unpack_iq4_xs, 0, 0, FP16, 0)  \
    X(IQ3_XXS, 18, 256, 98, OWN8, unpack_iq3_xxs, 0, 0, FP16, 0) \
    X(IQ3_S, 21, 256, 110, OWN8, unpack_iq3_s, 0, 0, FP16, 0)    \
    X(IQ2_XXS, 16, 256, 66, OWN8, unpack_iq2_xxs, 0, 0, FP16, 0) \
    X(IQ2_XS, 17, 256, 74, OWN8, unpack_iq2_xs, 0, 1, FP16, 0)   \
    X(IQ2_S, 22, 256, 82, OWN8, unpack_iq2_s, 0, 1, FP16, 0)     \
    X(IQ1_S, 19, 256, 50, OWN8, unpack_iq1_s, 0, 0, FP16, 0)     \
    X(IQ1_M, 29, 256, 56, OWN8, unpack_iq1_m, 0, 1, IQ1M, 48)

#define TYPE_ENUM(name, number, ...) T_##name = number,
enum {
    QUANT_TYPES(TYPE_ENUM)
    T_Q1_0_TILES = 1041, /* Sprig's own: Q1_0 regrouped in tiles of Q1_TILE rows (q1_tiles.c) */
    T_TQ_TILES = 1042,   /* Sprig's own: TQ1_0 or TQ2_0 as 2-bit codes in tiles of Q1_TILE rows (tq_tiles.c) */
    T_ROW_TILES = 1100,  /* Sprig's own, plus a row-tiled type's number: that type in tiles of ROW_TILE rows (row_tiles.c) */
};
/* The type of a matrix in row tiles (T_ROW_TILES + its number), else -1 */
static inline int row_tiles_of(int type) { return type > T_ROW_TILES && type < T_ROW_TILES + 64 ? type - T_ROW_TILES : -1; }
#undef TYPE_ENUM

enum { FORM_FLOAT, FORM_CODES, FORM_INT16, FORM_OWN8, FORM_TILED };

/* The form of a type of the table (-1 for others: T_Q1_0_TILES). */
static inline int type_form(int type) {
#define FORM_CASE(name, number, weights, bytes, form, ...) \
    case number: return FORM_##form;
    switch (type) {
        QUANT_TYPES(FORM_CASE)
    default: return -1;
    }
#undef FORM_CASE
}

/* Its bytes per block, its `mins` and its `split` (0 for types not in the table); constants where the type is. */
static inline int type_bytes(int type) {
#define BYTES_CASE(name, number, weights, bytes, ...) \
    case number: return bytes;
    switch (type) {
        QUANT_TYPES(BYTES_CASE)
    default: return 0;
    }
#undef BYTES_CASE
}
static inline int type_mins(int type) {
#define MINS_CASE(name, number, weights, bytes, form, unpack, mins, ...) \
    case number: return mins;
    switch (type) {
        QUANT_TYPES(MINS_CASE)
    default: return 0;
    }
#undef MINS_CASE
}
static inline int type_split(int type) {
#define SPLIT_CASE(name, number, weights, bytes, form, unpack, mins, split, ...) \
    case number: return split;
    switch (type) {
        QUANT_TYPES(SPLIT_CASE)
    default: return 0;
    }
#undef SPLIT_CASE
}

#define GROUP 32 /* weights per quantization group of the activations */
#define LANES 8  /* float accumulators per row product */
#define HALVES 2 /* scales per group of 32 weights: weights 0-15, 16-31 */
#define MIN_SLOTS(mins) ((mins) > 1 ? (mins) : 1) /* RowBuffer.min entries per group of a type */
#define Q1_TILE 32 /* rows of a Q1_0 tile */
#define FLOAT_TOKENS 32 /* products over this many tokens or more use float weights (quants.c) */
#if defined(__AVX512F__)
#define FLOAT_ROWS 6    /* rows dequantized together for them (AVX-512: more registers) */
#else
#define FLOAT_ROWS 3
#endif
#define FLOAT_BLOCK 4   /* tokens register-blocked with those rows */
#define FLOAT_PANEL_BYTES 196608 /* float weights dequantized at once, for all the tokens (ops.c) */
#define FLOAT_TILE_BYTES 262144 /* activations per tile of tokens that meets a panel (ops.c, int16_panels.c) */
/* Rows of K columns in a panel: whole groups of FLOAT_ROWS, at least one; they take at most
 * float_panel_floats(K) floats, for any K up to `cols` (a RowBuffer's f). */
static inline int64_t float_panel_rows(int64_t K) {
    int64_t rows = FLOAT_PANEL_BYTES / (int64_t)sizeof(float) / K / FLOAT_ROWS * FLOAT_ROWS;
    return rows > FLOAT_ROWS ? rows : FLOAT_ROWS;
}
static inline int64_t float_panel_floats(int64_t cols) {
    int64_t least = FLOAT_PANEL_BYTES / (int64_t)sizeof(float);
    return FLOAT_ROWS * cols > least ? FLOAT_ROWS * cols : least;
}

/* A decode product reads each row once, in order: as it reads a block it asks for the one
 * PREFETCH_ROWS rows ahead (`ahead` bytes on, prefetch_ahead), so that memory works while the
 * core computes, at an even pace (rows of 9728 columns asked for whole, in bursts, streamed at
 * 25-30 GB/s on a machine that gives 40-58; a block at a time, 45-55). Asking past the matrix
 * is harmless (a prefetch never faults). */
#define PREFETCH_ROWS 8
static inline size_t prefetch_ahead(size_t row_bytes) { return PREFETCH_ROWS * row_bytes; }
static inline void prefetch_block(const uint8_t *block, size_t bytes, size_t ahead) {
    for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(block + ahead + at);
}

/* A weight matrix as it lies in the model file: `rows` rows of `row_bytes` bytes. A mixture's
 * stack in row tiles made expert by expert as the experts op first uses each (ops.c) has its
 * blocks as the file lays them out at `source` (file_backed: in a mapped file) and a flag per
 * expert, `ready`, set once its tiles are made. */
typedef struct {
    const uint8_t *data;
    int type;
    int64_t rows, cols;
    size_t row_bytes;
    const uint8_t *source;
    uint8_t *ready;
    int64_t ready_len;
    int file_backed;
} Matrix;

/* module.c: blocks a process no longer reads let go (a mapped file's: unmapped, kept in the
 * page cache; others' paged out) */
void page_out(const uint8_t *ptr, int64_t size, int file_backed);

/* One weight row unpacked: int8 codes, the scales of each group's two halves, and the min
 * terms (the factors of activation sums): one per group, or one per half for the types whose
 * row says mins = 2 (kernels' MIN_SLOTS: 1 or 2 entries per group; zeros where none). */
typedef struct {
    int8_t *q;
    float *scale;
    float *min;
    float *f; /* float weights (F32/F16/BF16 rows), or a panel of rows dequantized (float_panel_rows) */
} RowBuffer;

static inline int type_is_float(int type) { return type_form(type) == FORM_FLOAT; }
/* multiplied with activation codes (the rest take float activations, or Q1_0's tables) */
static inline int type_takes_codes(int type) {
    return type_form(type) == FORM_CODES || type_form(type) == FORM_INT16 || type_form(type) == FORM_OWN8;
}
/* of those, the ones whose codes are 8-bit (Codes8), and the ones whose codes are int16 per group
 * (dot_row_tokens; the INT16 types' are per WIDE values: type_decodes_int16) */
static inline int type_takes_codes8(int type) { return type_form(type) == FORM_OWN8; }
static inline int type_takes_codes16(int type) { return type_form(type) == FORM_CODES; }

/* Prefill (FLOAT_TOKENS or more tokens) in integers (panels.h): the 256-weight types with
 * integer sub-block scales; Q4_K, Q5_K and Q6_K as int16 weights and codes per WIDE values
 * (int16_panels.c: Q5_K, and Q4_K and Q6_K where not in row tiles), the OWN8 types as 8-bit
 * ones per group (byte_panels.c). The others (32-weight blocks: a float scale per group) take
 * row tiles, or dequantize (experts). */
#define WIDE 256
static inline int type_takes_byte_panels(int type) { return type_form(type) == FORM_OWN8; }
/* the int16 ones take it for fewer tokens too (decode, batches, verification) */
static inline int type_decodes_int16(int type) { return type_form(type) == FORM_INT16; }
void int16_panel_row(int type, const uint8_t *row, int64_t K, int16_t *w, float *D, float *mins);
int int16_direct_product(const Matrix *w, int64_t r0, int64_t r1, const int16_t *xq, const float *xd, const float *xm,
                         int64_t T, float *out, int64_t stride, float *scratch);

/* 8-bit activation codes of a block of BLOCK8 values (the OWN8 types' form), in groups of 32:
 * the value at i is d[i / 32] * q[i], |q[i]| <= 127, d[g] = amax / 127 of group g (as
 * llama.cpp's Q8_0 activations); sums[j] = q[16j] + ... + q[16j + 15]. */
#define BLOCK8 256
typedef struct {
    float d[BLOCK8 / GROUP];
    int16_t sums[BLOCK8 / 16];
    int8_t q[BLOCK8];
} Codes8;

/* quants.c */
int type_block(int type, int *weights, int *bytes); /* 0 if the type is not native (T_Q1_0_TILES is) */
float fp16_to_float(uint16_t h);
void unpack_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf);
void dequantize_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf, float *out);
/* codes q with a scale d per `span` values (GROUP, or WIDE for int16 panels); per group of 32
 * the sum xsum of its values as the codes give them, per half group xhalf */
void quantize_row(const float *x, int64_t K, int span, int16_t *q, float *d, float *xsum, float *xhalf);
/* Codes8 blocks of a row of K values (K a multiple of BLOCK8) */
static inline int64_t codes8_blocks(int64_t K) { return K / BLOCK8; }
void quantize_row8(const float *x, int64_t K, Codes8 *out); /* codes8_blocks(K) blocks */
/* codes8_dots.c: an OWN8 type's block of 256 as unpack_row gives it: codes, scales per half group, mins */
void codes8_block(int type, const uint8_t *b, int8_t *c, float *scale, float *min);
#define ROW_TOKENS 4 /* tokens one pass over a packed row serves (dot_row_tokens) */
/* n (1 .. ROW_TOKENS) tokens times one packed row: out[k * stride] for token k, whose codes
 * start at xq + k * K, group scales and sums at xd + k * K / GROUP, xs + k * K / GROUP and
 * half-group sums at xh + k * HALVES * K / GROUP, its 8-bit codes (OWN8 types) at
 * x8 + k * codes8_blocks(K); `mins` is scratch of HALVES * K / GROUP */
void dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, const float *xs,
                    const float *xh, const Codes8 *x8, float *mins, int n, float *out, int64_t stride);
void dot_tokens(const RowBuffer *w, const float *x, int64_t K, int64_t t0, int64_t t1, float *out, int64_t stride);
int64_t count_bad_scales(int type, const uint8_t *data, int64_t n_blocks);
void float_product(const float *w, int n, int64_t K, const float *x, int64_t t0, int64_t t1, float *out,
                   int64_t stride);

/* iq_dots.c: IQ4_NL's product on the AVX2 and AVX-512 tiers, the same bits as
 * dot_row_tokens' generic form; 0 (nothing done) for other types and tiers */
int iq_dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, int n, float *out,
                      int64_t stride);
int iq_dequantize_row(int type, const uint8_t *row, int64_t K, float *out); /* the IQ types' dequantize_row */

/* The OWN8 types' product functions (codes8_dots.c: Q2_K, Q3_K and the IQ types but IQ4_NL),
 * dot_<name>, which dot_row_tokens calls as it calls the CODES types' */
#define OWN_DOT(name, number, weights, bytes, form, ...) OWN_DOT_##form(name)
#define OWN_DOT_FLOAT(name)
#define OWN_DOT_CODES(name)
#define OWN_DOT_INT16(name)
#define OWN_DOT_TILED(name)
#define OWN_DOT_OWN8(name) void dot_##name(const uint8_t *row, int64_t K, const Codes8 *x8, int n, float *out, int64_t stride);
QUANT_TYPES(OWN_DOT)
#undef OWN_DOT_OWN8
#undef OWN_DOT_TILED
#undef OWN_DOT_INT16
#undef OWN_DOT_CODES
#undef OWN_DOT_FLOAT
#undef OWN_DOT

/* q1_tiles.c */
void q1_tiles_init(void);
int64_t q1_tiled_bytes(int64_t rows, int64_t K);
/* Tiles t0 .. t1 - 1 of a matrix of `rows` rows made from its blocks (q1_tile_matrix,
 * tq_tile_matrix, row_tile_matrix), the last padded with zero rows: 0, or -1 where the type is not
 * the function's, or memory ran out */
typedef int (*tile_fn)(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles);
int q1_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles);
int64_t q1_table_bytes(int64_t K); /* one token's tables */
void q1_tables(const float *x, int64_t K, uint8_t *tables, float *xscale);
int q1_tiles_at_once(void); /* tiles one pass may take (q1_tile_rows's count) */
/* rows of tiles tile .. tile + count - 1 (count: 1 .. q1_tiles_at_once()) of a tiled matrix times one
 * token's tables, into out[row] */
void q1_tile_rows(const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, int count, const uint8_t *tables,
                  const float *xscale, float *out);

/* tq_tiles.c: TQ1_0 and TQ2_0 by table lookup, in tiles of Q1_TILE rows of 66 bytes per 256 weights */
#define TQ_TOKENS 4 /* tokens one pass over a tile serves */
void tq_tiles_init(void);
const char *tq_kernel(void); /* which kernel multiplies the tiles: "avx512vbmi" (steps laid by row) or the tier's */
int64_t tq_tiled_bytes(int64_t rows, int64_t K);
int tq_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles);
int64_t tq_table_bytes(int64_t K); /* one token's tables */
void tq_tables(const float *x, int64_t K, uint8_t *tables, float *xscale);
int tq_tiles_at_once(int n); /* tiles one pass over n tokens may take (tq_tile_rows's count) */
/* rows of tiles tile .. tile + count - 1 of a tiled matrix (count: 1, or up to tq_tiles_at_once(n)) times n
 * (1 .. TQ_TOKENS) tokens' tables, token j into out[j][row] */
void tq_tile_rows(const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, int count, const uint8_t *const *tables,
                  const float *const *xscale, int n, float *const *out);

/* row_tiles.c: the types on int16 codes in tiles of ROW_TILE rows, a row per lane */
#define ROW_TILE 8        /* rows of a tile */
#if defined(__AVX512VL__) /* tokens one pass over a tile serves: 32 registers hold 8 tokens' sums (Zen 4, 64 tokens: */
#define ROW_TILE_TOKENS 8 /* Q4_K 110 -> 143 G/s, Q4_0 119 -> 151 against 4 a pass) */
#else
#define ROW_TILE_TOKENS 4
#endif
int row_tiled_type(int type); /* whether matrices of `type` are multiplied from row tiles */
int row_tile_span(int type);  /* values per activation scale its int16 codes take: GROUP, or WIDE for Q4_K, Q6_K */
int row_tile_codes8(int type); /* whether its product takes 8-bit codes (Codes8) instead: Q2_K (a block of WIDE) */
int64_t row_tiled_bytes(int type, int64_t rows, int64_t K);
/* tiles t0 .. t1 - 1 of a matrix's row tiles (tiles: the whole matrix's) */
int row_tile_matrix(int type, const uint8_t *raw, int64_t rows, int64_t K, int64_t t0, int64_t t1, uint8_t *tiles);
void row_tile_row(int type, const uint8_t *tiles, int64_t K, int64_t row, uint8_t *out); /* row `row` as the file has it */
/* rows of tile `tile` of a matrix of `type` in row tiles times n (1 .. ROW_TILE_TOKENS) tokens:
 * token j's int16 codes at xq + j * ldx, its scales at xd + j * K / row_tile_span(type), its
 * group sums at xs + j * K / GROUP (or, where row_tile_codes8, its 8-bit codes at
 * x8 + j * codes8_blocks(K)), its results at out[j * stride + row] */
void row_tile_rows(int type, const uint8_t *tiles, int64_t rows, int64_t K, int64_t tile, const int16_t *xq, int64_t ldx,
                   const float *xd, const float *xs, const Codes8 *x8, int n, float *out, int64_t stride);
extern const int8_t kvalues_mxfp4[16]; /* quants.c: MXFP4's codes, twice their E2M1 values */
extern float e8m0_halves[256];         /* quants.c: half of 2^(e - 127) for each E8M0 byte e */

/* pool.c */
/* A task's chunk `chunk` of `chunks`, run by thread `thread` (which owns scratch slot `thread`). */
typedef void (*task_fn)(void *ctx, int chunk, int chunks, int thread);
#define MAX_POOL_THREADS 256 /* the caller included */
void pool_set_threads(int n);
int pool_threads(void);
void pool_run(task_fn fn, void *ctx);
void split_range(int64_t n, int part, int parts, int64_t *lo, int64_t *hi); /* part of [0, n) */

/* scratch.c: per-thread buffers, grown before a parallel call (never inside one) */
int scratch_reserve(int64_t cols, int64_t floats);
RowBuffer *scratch_row(int ith);
float *scratch_floats(int ith);

#endif

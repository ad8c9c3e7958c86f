/* Prefill products of the 256-weight types with integer sub-block scales (type_takes_int16_panels
 * in kernels.h: Q2_K to Q6_K and the IQ types but IQ4_NL), in integers.
 *
 * Each of these types' blocks is one float D times integer sub-block scales sc times integer
 * codes c (codes8_dots.c draws them), plus, for Q2_K, Q4_K and Q5_K, min terms. A row is unpacked
 * once per product into int16 weights w = sc * c (int16_panel_row): the generic unpacking's
 * float scale of each half group is D * sc exactly (an fp16 times an integer of at most 8 bits,
 * or that times a power of two), so sc = scale / D is exact, and |w| <= 4096 (Q6_K's 128 * 32;
 * IQ4_XS's 32 * 127 = 4064). The tokens' activations are int16 codes with one scale per block of
 * 256 (quantize_row with span WIDE: amax / 32767, as llama.cpp's Q8_K keeps one per block, with
 * 15 bits where it keeps 7). Then, for a row and a token, block by block, in 16 int32 lanes,
 * lane l < 8 taking weights 32m + 2l and 32m + 2l + 1 of the block's chunks m = 0 .. 7, lane
 * l >= 8 weights 32m + 16 + 2(l - 8) and the next:
 *     isum[l] = sum of w x over its 16 weights      (|isum| <= 16 * 4096 * 32767 < 2^31: exact)
 *     y[l] = fma(float(isum[l]), D * d, y[l])       (D * d rounded once; y from 0, blocks in order)
 * then the min terms, the row's (as the generic unpacking makes them, M of them) times the
 * token's group or half-group sums (xsum, xhalf: the codes' exact integer sums times the
 * block's scale), each product rounded, then added:
 *     y[i mod 16] += mins[i] * xm[i]                (i = 0 .. M - 1 in order)
 * and the result is reduce8(y[0..7] + y[8..15]). The integer sums are exact in every tier
 * and the float operations the same C, so every tier gives the same bits. Two multiply-adds of
 * 16-bit pairs (AVX-512 VNNI's dpwssd, AVX2's madd) take 64 weights where float weights take four
 * fused multiply-adds: the float form's prefill did a quarter of this one's work per instruction
 * and, held by one float per group and token, the 8-bit codes of decode no better. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "kernels.h"
#include "simd.h"

typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));

/* Row `row` as int16 weights w[K], its blocks' D[K / WIDE] and its min terms (as unpack_row
 * makes them: MIN_SLOTS per group) at mins; buf is the unpacking's scratch. A block's codes come
 * from the generic unpacking, sc = scale / D per half group; where this tier dequantizes the IQ
 * types in registers (iq_dots.c), from those floats instead: D * sc * code exactly, so
 * round(weight * (1 / D)) is sc * code (off by at most 4096 * 2^-23 before rounding). */
void int16_panel_row(int type, const uint8_t *row, int64_t K, RowBuffer *buf, int16_t *w, float *D, float *mins) {
    const int in_registers = iq_dequantize_row(type, row, 0, NULL); /* whether this tier has it for the type */
    if (!in_registers) {
        unpack_row(type, row, K, buf);
        memcpy(mins, buf->min, sizeof(float) * (size_t)(K / GROUP * MIN_SLOTS(type_mins(type))));
    }
    for (int64_t blk = 0; blk < K / WIDE; blk++) {
        const float d = block_scale(type, row + blk * type_bytes(type));
        int16_t *wb = w + blk * WIDE;
        D[blk] = d;
        if (in_registers) {
            float weights[WIDE];
            iq_dequantize_row(type, row + blk * type_bytes(type), WIDE, weights);
            const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
            for (int i = 0; i < WIDE; i += 8) {
                v8f v;
                memcpy(&v, weights + i, sizeof v);
                i16x8 codes = __builtin_convertvector(round8(v * inverse), i16x8);
                memcpy(wb + i, &codes, sizeof codes);
            }
            continue;
        }
        for (int h = 0; h < WIDE / 16; h++) {
            const int64_t at = blk * WIDE + 16 * h;
            const int16_t sc = d != 0.0f ? (int16_t)lrintf(buf->scale[at / 16] / d) : 0; /* exact (module comment) */
            i8x16 codes;
            memcpy(&codes, buf->q + at, sizeof codes);
            const i16x16 weights16 = __builtin_convertvector(codes, i16x16) * sc;
            memcpy(wb + 16 * h, &weights16, sizeof weights16);
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define TILE_ROWS 4
#define TILE_TOKENS 3

/* R rows by N tokens over blocks b0 .. b1 - 1 (rows and tokens of K): the module comment's
 * lanes, y[r * TILE_TOKENS + t] carried in and out, in one register per (row, token) between. */
static inline __attribute__((always_inline)) void tile(const int16_t *w, const float *D, int64_t K, const int16_t *xq,
                                                       const float *xd, int64_t b0, int64_t b1, const int R, const int N,
                                                       v8f y[][2]) {
    const int64_t B = K / WIDE;
    __m512 acc[TILE_ROWS][TILE_TOKENS];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) memcpy(&acc[r][t], y[r * TILE_TOKENS + t], sizeof acc[r][t]);
    for (int64_t b = b0; b < b1; b++) {
        __m512i sums[TILE_ROWS][TILE_TOKENS];
        for (int r = 0; r < R; r++)
            for (int t = 0; t < N; t++) sums[r][t] = _mm512_setzero_si512();
        for (int m = 0; m < WIDE / 32; m++) {
            __m512i x[TILE_TOKENS];
            for (int t = 0; t < N; t++) x[t] = _mm512_loadu_si512((const void *)(xq + t * K + b * WIDE + 32 * m));
            for (int r = 0; r < R; r++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(w + r * K + b * WIDE + 32 * m));
                for (int t = 0; t < N; t++) sums[r][t] = _mm512_dpwssd_epi32(sums[r][t], wv, x[t]);
            }
        }
        for (int r = 0; r < R; r++)
            for (int t = 0; t < N; t++)
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][t]), _mm512_set1_ps(D[r * B + b] * xd[t * B + b]),
                                            acc[r][t]);
    }
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) memcpy(y[r * TILE_TOKENS + t], &acc[r][t], sizeof acc[r][t]);
}

#else
#define TILE_ROWS 2
#define TILE_TOKENS 2

/* 8 lanes of the module comment's: 16 weights' pair sums (lane l: weights 2l, 2l + 1) */
static inline v8i pair_sums16(const int16_t *w, const int16_t *x) {
#if defined(__AVX2__)
    return (v8i)_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)w), _mm256_loadu_si256((const __m256i *)x));
#else
    v8i out;
    for (int l = 0; l < 8; l++) out[l] = w[2 * l] * x[2 * l] + w[2 * l + 1] * x[2 * l + 1];
    return out;
#endif
}

static inline __attribute__((always_inline)) void tile(const int16_t *w, const float *D, int64_t K, const int16_t *xq,
                                                       const float *xd, int64_t b0, int64_t b1, const int R, const int N,
                                                       v8f y[][2]) {
    const int64_t B = K / WIDE;
    for (int64_t b = b0; b < b1; b++) {
        v8i sums[TILE_ROWS][TILE_TOKENS][2] = {{{{0}}}};
        for (int m = 0; m < WIDE / 32; m++)
            for (int r = 0; r < R; r++)
                for (int t = 0; t < N; t++)
                    for (int h = 0; h < 2; h++)
                        sums[r][t][h] += pair_sums16(w + r * K + b * WIDE + 32 * m + 16 * h, xq + t * K + b * WIDE + 32 * m + 16 * h);
        for (int r = 0; r < R; r++)
            for (int t = 0; t < N; t++) {
                const float s = D[r * B + b] * xd[t * B + b];
                const v8f sv = {s, s, s, s, s, s, s, s};
                for (int h = 0; h < 2; h++)
                    y[r * TILE_TOKENS + t][h] = fma8(__builtin_convertvector(sums[r][t][h], v8f), sv, y[r * TILE_TOKENS + t][h]);
            }
    }
}
#endif

#define RUN_TILES 16 /* tiles of tokens in a run at most (their y stay on the stack between K segments) */
#define SEGMENT_BLOCKS 8 /* blocks of K at most per pass of a row tile: 4 rows' 16 KB stay in L1 */

/* A whole tile, TILE_ROWS by TILE_TOKENS, over blocks b0 .. b1 - 1, in a function of its own: its
 * loops unroll, and its registers are not shared with the edges' code. */
static __attribute__((noinline)) void full_tile(const int16_t *w, const float *D, int64_t K, const int16_t *xq,
                                                const float *xd, int64_t b0, int64_t b1, v8f y[][2]) {
    tile(w, D, K, xq, xd, b0, b1, TILE_ROWS, TILE_TOKENS, y);
}

/* The min terms of R rows (mins, M each) and N tokens (their sums xm, M each) into their lanes:
 * y[i mod 16] += mins[i] * xm[i], i ascending (module comment), 8 at a time. */
static inline __attribute__((always_inline)) void min_terms(const float *mins, const float *xm, int64_t M, const int R,
                                                            const int N, v8f y[][2]) {
    for (int64_t i = 0; i < M; i += 8)
        for (int r = 0; r < R; r++) {
            v8f m;
            memcpy(&m, mins + r * M + i, sizeof m);
            for (int t = 0; t < N; t++) {
                v8f x;
                memcpy(&x, xm + t * M + i, sizeof x);
                y[r * TILE_TOKENS + t][(i / 8) % 2] += m * x;
            }
        }
}
static __attribute__((noinline)) void full_min_terms(const float *mins, const float *xm, int64_t M, v8f y[][2]) {
    min_terms(mins, xm, M, TILE_ROWS, TILE_TOKENS, y);
}

/* Rows of K int16 weights in a panel, whole tiles of TILE_ROWS (at least one): they, their
 * block scales and their min terms take at most float_panel_floats(K) floats (ops.c). */
int64_t int16_panel_rows(int64_t K) {
    int64_t bytes = float_panel_floats(K) * (int64_t)sizeof(float), row = 2 * K + 4 * (K / WIDE) + 4 * (K / GROUP) * HALVES;
    int64_t rows = bytes / row / TILE_ROWS * TILE_ROWS;
    return rows > TILE_ROWS ? rows : TILE_ROWS;
}

/* n rows of the panel (int16 weights w, rows of K; D and mins as int16_panel_row makes them)
 * times tokens 0 .. T - 1 (codes xq, block scales xd, and the sums of `slots` per group xm: 0
 * for types without min terms, 1 xsum, 2 xhalf), into out[t * stride + r]. The tokens go in
 * runs whose codes a core's L2 holds beside the panel; in a run, a tile of TILE_ROWS rows meets
 * every whole tile of TILE_TOKENS tokens a segment of K at a time (its rows' segment held in L1),
 * the lanes kept between segments; the edges take a row and a token at a time. Each (row,
 * token) sees its blocks in order, whatever the tiling: the same bits. */
void int16_product(const int16_t *w, const float *D, const float *mins, int slots, int n, int64_t K, const int16_t *xq,
                   const float *xd, const float *xm, int64_t T, float *out, int64_t stride) {
    const int64_t B = K / WIDE, M = K / GROUP * slots, segments = (B + SEGMENT_BLOCKS - 1) / SEGMENT_BLOCKS;
    const int64_t segment = (B + segments - 1) / segments;
    int64_t run = FLOAT_TILE_BYTES / (2 * K) / TILE_TOKENS * TILE_TOKENS;
    run = run < TILE_TOKENS ? TILE_TOKENS : run > RUN_TILES * TILE_TOKENS ? RUN_TILES * TILE_TOKENS : run;
    v8f y[RUN_TILES][TILE_ROWS * TILE_TOKENS][2];
    for (int64_t t0 = 0; t0 < T; t0 += run) {
        const int64_t t1 = t0 + run < T ? t0 + run : T;
        for (int r = 0; r < n; r += TILE_ROWS) {
            const int R = n - r < TILE_ROWS ? n - r : TILE_ROWS;
            const int64_t whole = R == TILE_ROWS ? (t1 - t0) / TILE_TOKENS : 0; /* token tiles taken whole */
            memset(y, 0, sizeof y);
            for (int64_t b0 = 0; b0 < B; b0 += segment)
                for (int64_t j = 0; j < whole; j++)
                    full_tile(w + r * K, D + r * B, K, xq + (t0 + j * TILE_TOKENS) * K, xd + (t0 + j * TILE_TOKENS) * B, b0,
                              b0 + segment < B ? b0 + segment : B, y[j]);
            for (int64_t j = 0; j < whole; j++) {
                if (M) full_min_terms(mins + r * M, xm + (t0 + j * TILE_TOKENS) * M, M, y[j]);
                for (int i = 0; i < TILE_ROWS; i++)
                    for (int k = 0; k < TILE_TOKENS; k++)
                        out[(t0 + j * TILE_TOKENS + k) * stride + r + i] =
                            reduce8(y[j][i * TILE_TOKENS + k][0] + y[j][i * TILE_TOKENS + k][1]);
            }
            for (int i = 0; i < R; i++) /* the edges */
                for (int64_t t = t0 + whole * TILE_TOKENS; t < t1; t++) {
                    v8f one[1][2] = {{{0}}};
                    tile(w + (r + i) * K, D + (r + i) * B, K, xq + t * K, xd + t * B, 0, B, 1, 1, one);
                    min_terms(mins + (r + i) * M, xm + t * M, M, 1, 1, one);
                    out[t * stride + r + i] = reduce8(one[0][0] + one[0][1]);
                }
        }
    }
}

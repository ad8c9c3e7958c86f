/* Products of Q4_K, Q5_K and Q6_K in int16 (type_decodes_int16 in kernels.h), for any count of
 * tokens, on their rows as the file has them (Q5_K; Q4_K and Q6_K where not in row tiles,
 * row_tiles.c: a stack whose experts are not whole tiles); and the walk of every prefill panel over its rows and tokens (panels.h:
 * panel_product).
 *
 * Each of these types' blocks is one float D times integer sub-block scales sc times integer
 * codes c, plus, for Q4_K and Q5_K, min terms. A row is unpacked once per product into int16
 * weights w = sc * c (int16_panel_row), |w| <= 4096 (Q6_K's 128 * 32). The tokens' activations
 * are int16 codes with one scale per block of 256 (quantize_row with span WIDE: amax / 32767, as
 * llama.cpp's Q8_K keeps one per block, with 15 bits where it keeps 7). Then, for a row and a
 * token, block by block, in 16 int32 lanes, lane l < 8 taking weights 32m + 2l and 32m + 2l + 1
 * of the block's chunks m = 0 .. 7, lane l >= 8 weights 32m + 16 + 2(l - 8) and the next:
 *     isum[l] = sum of w x over its 16 weights      (|isum| <= 16 * 4096 * 32767 < 2^31: exact)
 *     y[l] = fma(float(isum[l]), D * d, y[l])       (D * d rounded once; y from 0, blocks in order)
 * then the min terms, the row's (M of them) times the token's group or half-group sums (xsum,
 * xhalf: the codes' exact integer sums times the block's scale), each product rounded, then added:
 *     y[i mod 16] += mins[i] * xm[i]                (i = 0 .. M - 1 in order)
 * and the result is reduce8(y[0..7] + y[8..15]). The integer sums are exact in every tier
 * and the float operations the same C, so every tier gives the same bits. Two multiply-adds of
 * 16-bit pairs (AVX-512 VNNI's dpwssd, AVX2's madd) take 64 weights where float weights take four
 * fused multiply-adds.
 * The blocks give their integers straight (k_block_int16, q6_k_block_int16); for up to
 * DIRECT_TOKENS tokens the x86 tiers multiply them in registers, never writing the weights out
 * (k_direct), in the same lanes: every path gives the same bits. */
#include <math.h>
#include <string.h>

#include "bytes.h"
#include "int16_words.h"
#include "panels.h"

typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef int16_t i16x16 __attribute__((vector_size(32)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));

/* A Q4_K or Q5_K block's 8 sub-block scales, each in both words of an int32 (vw_times), 0 where
 * d is (as sc = scale / D makes it), and its min terms -(dmin * m) per group, the bits k_scales
 * gives. */
static inline void k_block_scales(const uint8_t *b, int32_t *pairs, float *mins) {
    uint64_t sc, m;
    k_scale_bytes(b, &sc, &m);
    const v8f min_terms = -(f16(b + 2) * widen8u(m));
    memcpy(mins, &min_terms, sizeof min_terms);
    if (f16(b) == 0.0f) sc = 0;
#if defined(__AVX2__)
    _mm256_storeu_si256((__m256i *)pairs, _mm256_mullo_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)sc)),
                                                            _mm256_set1_epi32(0x10001)));
#else
    for (int j = 0; j < 8; j++) pairs[j] = (int32_t)((sc >> 8 * j) & 255) * 0x10001;
#endif
}

#if defined(VW_WORDS)
/* Words VW_WORDS * h .. of groups 2c and 2c + 1 of a Q4_K block (Q5_K's: `fifth`, its qh bytes
 * of those words as words in `high`) as int16 weights sc * code, lo and hi: the 32 bytes c of
 * qs hold group 2c in their low nibbles, 2c + 1 in their high; the fifth bits are bits 2c and
 * 2c + 1 of qh. */
static inline __attribute__((always_inline)) void k_pair(const uint8_t *b, const int fifth, vw high, const int c,
                                                         const int h, const int32_t *pairs, vw *lo, vw *hi) {
    const vw codes = vw_u8(b + (fifth ? 48 : 16) + 32 * c + VW_WORDS * h);
    vw l = vw_low4(codes), u = vw_srli(codes, 4);
    if (fifth) { /* bit 2c (2c + 1) of each qh byte to bit 4 */
        l = vw_bit4(l, 2 * c <= 4 ? vw_slli(high, 4 - 2 * c) : vw_srli(high, 2 * c - 4));
        u = vw_bit4(u, 2 * c + 1 <= 4 ? vw_slli(high, 3 - 2 * c) : vw_srli(high, 2 * c - 3));
    }
    *lo = vw_times(l, pairs[2 * c]);
    *hi = vw_times(u, pairs[2 * c + 1]);
}
#endif

/* A Q4_K block (Q5_K's with its fifth bits, `fifth`) as int16 weights sc * code in w[256], in
 * unpack_q4_k's and unpack_q5_k's order, and its min terms (k_block_scales): the integers
 * straight from the bytes, without the generic unpacking's floats. */
static inline void k_block_int16(const uint8_t *b, int fifth, int16_t *w, float *mins) {
    int32_t pairs[8];
    k_block_scales(b, pairs, mins);
#if defined(VW_WORDS)
    for (int h = 0; h < 32 / VW_WORDS; h++) {
        const vw high = fifth ? vw_u8(b + 16 + VW_WORDS * h) : vw_zero();
        for (int c = 0; c < 4; c++) {
            vw lo, hi;
            k_pair(b, fifth, high, c, h, pairs, &lo, &hi);
            vw_store(w + 64 * c + VW_WORDS * h, lo);
            vw_store(w + 64 * c + 32 + VW_WORDS * h, hi);
        }
    }
#else
    const uint8_t *qh = b + 16, *qs = fifth ? b + 48 : b + 16;
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++) {
            u8x16 packed, high;
            memcpy(&packed, qs + 32 * c + 16 * h, sizeof packed);
            i16x16 codes = __builtin_convertvector(packed, i16x16), lo = codes & 15, hi = codes >> 4;
            if (fifth) {
                memcpy(&high, qh + 16 * h, sizeof high);
                i16x16 bits = __builtin_convertvector(high, i16x16);
                lo |= ((bits >> (2 * c)) & 1) << 4;
                hi |= ((bits >> (2 * c + 1)) & 1) << 4;
            }
            lo *= (int16_t)pairs[2 * c];
            hi *= (int16_t)pairs[2 * c + 1];
            memcpy(w + 64 * c + 16 * h, &lo, sizeof lo);
            memcpy(w + 64 * c + 32 + 16 * h, &hi, sizeof hi);
        }
#endif
}

/* A Q6_K block as int16 weights sc * (q - 32) in w[256], in unpack_q6_k's order (group 4n + j
 * of half n: its low 4 bits from ql bytes 64n .. 64n + 31 (j even) or 64n + 32 .. (j odd), their
 * high nibble for j >= 2, its top 2 bits from bits 2j of qh bytes 128 + 32n ..; sub-block scales
 * int8 at 192, one per 16 weights). */
static inline void q6_k_block_int16(const uint8_t *b, int16_t *w) {
#if defined(VW_WORDS)
    const Q6Scales sc = q6_k_block_scales(b);
    for (int g = 0; g < WIDE / GROUP; g++)
        for (int h = 0; h < 32 / VW_WORDS; h++) vw_store(w + 32 * g + VW_WORDS * h, q6_k_group(b, g, h, &sc));
#else
    for (int g = 0; g < WIDE / GROUP; g++) {
        const int n = g / 4, j = g % 4;
        for (int h = 0; h < 2; h++) {
            u8x16 low, high;
            memcpy(&low, b + 64 * n + 32 * (j & 1) + 16 * h, sizeof low);
            memcpy(&high, b + 128 + 32 * n + 16 * h, sizeof high);
            const u8x16 code = ((low >> (4 * (j >> 1))) & 15) | (((high >> (2 * j)) & 3) << 4);
            i16x16 weights = (__builtin_convertvector(code, i16x16) - 32) * (int16_t)(int8_t)b[192 + 2 * g + h];
            memcpy(w + 32 * g + 16 * h, &weights, sizeof weights);
        }
    }
#endif
}

/* Row `row` (Q4_K, Q5_K or Q6_K) as int16 weights w[K], its blocks' D[K / WIDE] and, for Q4_K
 * and Q5_K, its min terms (as unpack_row makes them: one per group) at mins. */
void int16_panel_row(int type, const uint8_t *row, int64_t K, int16_t *w, float *D, float *mins) {
    for (int64_t blk = 0; blk < K / WIDE; blk++) { /* the integers straight from the bytes */
        const uint8_t *b = row + blk * type_bytes(type);
        D[blk] = block_scale(type, b);
        if (type == T_Q6_K) q6_k_block_int16(b, w + blk * WIDE);
        else k_block_int16(b, type == T_Q5_K, w + blk * WIDE, mins + blk * (WIDE / GROUP));
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

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
#define SEGMENT_BLOCKS 8 /* blocks of K at most per pass of a row tile, int16 (bytes: twice as many): 4 rows' 16 KB stay in L1 */

/* A tile of TILE_ROWS rows by N tokens (N <= TILE_TOKENS) over blocks b0 .. b1 - 1, in a function of
 * its own: its loops unroll, and its registers are not shared with the edges' code. */
static __attribute__((noinline)) void row_tile(const int16_t *w, const float *D, int64_t K, const int16_t *xq,
                                               const float *xd, int64_t b0, int64_t b1, int N, v8f y[][2]) {
    if (N == TILE_TOKENS) tile(w, D, K, xq, xd, b0, b1, TILE_ROWS, TILE_TOKENS, y);
    else if (N == 1) tile(w, D, K, xq, xd, b0, b1, TILE_ROWS, 1, y);
    else if (N == 2 || TILE_TOKENS <= 3) tile(w, D, K, xq, xd, b0, b1, TILE_ROWS, 2, y); /* (tiles of 3: 2 left) */
    else tile(w, D, K, xq, xd, b0, b1, TILE_ROWS, 3, y);                                  /* (tiles of 4: 3 left) */
}

/* panels.h's PanelTile for int16 panels */
void int16_tile(const Panel *p, int64_t r, int R, const PanelCodes *x, int64_t t, int N, int64_t b0, int64_t b1,
                v8f y[][2]) {
    const int64_t K = p->K, B = K / WIDE;
    const int16_t *w = (const int16_t *)p->w + r * K, *xq = (const int16_t *)x->q + t * K;
    const float *D = p->scale + r * B, *xd = x->d + t * B;
    if (R == 1) tile(w, D, K, xq, xd, b0, b1, 1, 1, y);
    else row_tile(w, D, K, xq, xd, b0, b1, N, y);
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
static __attribute__((noinline)) void row_min_terms(const float *mins, const float *xm, int64_t M, int N, v8f y[][2]) {
    if (N == TILE_TOKENS) min_terms(mins, xm, M, TILE_ROWS, TILE_TOKENS, y);
    else if (N == 1) min_terms(mins, xm, M, TILE_ROWS, 1, y);
    else if (N == 2 || TILE_TOKENS <= 3) min_terms(mins, xm, M, TILE_ROWS, 2, y);
    else min_terms(mins, xm, M, TILE_ROWS, 3, y);
}

/* Bytes a row of K columns takes in a panel: weights, scales, offsets, min terms (Panel) */
static inline int64_t panel_row_bytes(int64_t K, int bytes) {
    return bytes ? K + 8 * (K / 16) + 4 * (K / GROUP) * HALVES : 2 * K + 4 * (K / WIDE) + 4 * (K / GROUP) * HALVES;
}

/* Rows of K columns in a panel for T tokens, whole tiles of TILE_ROWS (at least one): one tile
 * for fewer than FLOAT_TOKENS tokens (decode: the tile's rows stay in L1 between their
 * unpacking and their products), else as many as take at most float_panel_floats(K) floats (ops.c). */
int64_t panel_rows(int64_t K, int64_t T, int bytes) {
    int64_t rows = float_panel_floats(K) * (int64_t)sizeof(float) / panel_row_bytes(K, bytes) / TILE_ROWS * TILE_ROWS;
    return rows > TILE_ROWS && T >= FLOAT_TOKENS ? rows : TILE_ROWS;
}

/* The panel's n rows times tokens 0 .. T - 1, into out[t * stride + r]. The tokens go in runs
 * whose codes a core's L2 holds beside the panel; in a run, a tile of TILE_ROWS rows meets every
 * whole tile of TILE_TOKENS tokens a segment of K at a time (its rows' segment held in L1), the
 * lanes kept between segments; the edges take a row and a token at a time. Each (row, token)
 * sees its blocks in order, whatever the tiling: the same bits. */
void panel_product(const Panel *p, const PanelCodes *x, int64_t T, float *out, int64_t stride) {
    PanelTile *const tiled = p->bytes ? byte_tile : int16_tile;
    const int64_t K = p->K, B = K / WIDE, M = K / GROUP * p->slots, width = p->bytes ? 1 : 2;
    const int64_t most = SEGMENT_BLOCKS * 2 / width, segments = (B + most - 1) / most;
    const int64_t segment = (B + segments - 1) / segments;
    int64_t run = FLOAT_TILE_BYTES / (width * K) / TILE_TOKENS * TILE_TOKENS;
    run = run < TILE_TOKENS ? TILE_TOKENS : run > RUN_TILES * TILE_TOKENS ? RUN_TILES * TILE_TOKENS : run;
    v8f y[RUN_TILES][TILE_ROWS * TILE_TOKENS][2];
    for (int64_t t0 = 0; t0 < T; t0 += run) {
        const int64_t t1 = t0 + run < T ? t0 + run : T;
        for (int r = 0; r < p->n; r += TILE_ROWS) {
            if (p->n - r < TILE_ROWS) { /* the edge rows, a token at a time */
                for (int i = r; i < p->n; i++)
                    for (int64_t t = t0; t < t1; t++) {
                        v8f one[1][2] = {{{0}}};
                        tiled(p, i, 1, x, t, 1, 0, B, one);
                        min_terms(p->mins + i * M, x->m + t * M, M, 1, 1, one);
                        out[t * stride + i] = reduce8(one[0][0] + one[0][1]);
                    }
                break;
            }
            const int64_t tiles = (t1 - t0 + TILE_TOKENS - 1) / TILE_TOKENS; /* the last one maybe partial */
            memset(y, 0, (size_t)tiles * sizeof y[0]);
            for (int64_t b0 = 0; b0 < B; b0 += segment)
                for (int64_t j = 0; j < tiles; j++) {
                    const int64_t t = t0 + j * TILE_TOKENS;
                    tiled(p, r, TILE_ROWS, x, t, (int)(t1 - t < TILE_TOKENS ? t1 - t : TILE_TOKENS), b0,
                          b0 + segment < B ? b0 + segment : B, y[j]);
                }
            for (int64_t j = 0; j < tiles; j++) {
                const int64_t t = t0 + j * TILE_TOKENS;
                const int N = (int)(t1 - t < TILE_TOKENS ? t1 - t : TILE_TOKENS);
                if (M) row_min_terms(p->mins + r * M, x->m + t * M, M, N, y[j]);
                for (int i = 0; i < TILE_ROWS; i++)
                    for (int k = 0; k < N; k++)
                        out[(t + k) * stride + r + i] = reduce8(y[j][i * TILE_TOKENS + k][0] + y[j][i * TILE_TOKENS + k][1]);
            }
        }
    }
}

#if defined(VW_WORDS)
#define VECS (32 / VW_WORDS) /* vectors per group of 32 weights */
#define DIRECT_TOKENS 4     /* tokens k_direct takes at most: up to 2 with DIRECT_ROWS rows, more with one */
/* rows ahead that k_direct asks for, block by block, measured (2 threads, from memory): Q4_K the
 * next tile of 4 (75-82 G/s, where 8 rows gave 59-71 and 16 63-75), Q6_K 8 (58 G/s, 4: 48-50) */
#define DIRECT_AHEAD_ROWS(type) ((type) == T_Q6_K ? 8 : 4)
#define DIRECT_CODES_BYTES 24576 /* the most tokens' codes that one row meets at once (half a 48 KB L1) */
#if VW_WORDS == 32
#define DIRECT_ROWS TILE_ROWS /* AVX-512's 32 registers hold 4 rows' sums and lanes */
#else
#define DIRECT_ROWS 1 /* AVX2's 16 do not hold two rows' (measured: two rows 0.9x one) */
#endif
/* The rows k_direct takes at once for `type`: DIRECT_ROWS, but Q6_K one at a time where a core
 * runs 512-bit operations in halves (SPRIG_YMM; Zen 4, 2 threads, from memory: one row against
 * four 1.6x at 151936 x 2048, 1.15-1.2x at 9728 x 2560 and 2560 x 9728, 1.2x at 2 tokens and
 * 1.6x at 3-4 tokens of 9728 columns; two rows 0.75-1.0x of one). Q4_K and Q5_K keep four (one
 * row: 0.85-0.9x). */
#if defined(SPRIG_YMM)
#define TYPE_DIRECT_ROWS(type) ((type) == T_Q6_K ? 1 : DIRECT_ROWS)
#else
#define TYPE_DIRECT_ROWS(type) DIRECT_ROWS
#endif

/* R rows of a Q4_K, Q5_K or Q6_K matrix (`type`, a constant) at `rows`, row_bytes apart, times
 * N tokens, every block, straight from the bytes (k_pair, q6_k_group: in registers), in tile's
 * arithmetic (the same lanes, int32 sums, one fma per block), into y, and the rows' min terms
 * (Q4_K, Q5_K) into mins (K / GROUP a row). For a few tokens a row's int16 weights would be
 * written out and read back for next to nothing: here they never leave the registers. */
static inline __attribute__((always_inline)) void k_direct(const uint8_t *rows, size_t row_bytes, size_t ahead, const int type,
                                                           int64_t K, const int16_t *xq, const float *xd, const int R,
                                                           const int N, v8f y[][2], float *mins) {
    const int64_t B = K / WIDE, G = K / GROUP;
    const int fifth = type == T_Q5_K;
    const size_t bytes = type == T_Q6_K ? 210 : fifth ? 176 : 144;
    vf acc[DIRECT_ROWS][DIRECT_TOKENS][VECS];
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++)
            for (int h = 0; h < VECS; h++) acc[r][t][h] = vf_zero();
    for (int64_t b = 0; b < B; b++) {
        int32_t pairs[DIRECT_ROWS][8];
        Q6Scales q6[DIRECT_ROWS];
        vw sums[DIRECT_ROWS][DIRECT_TOKENS][VECS];
        for (int r = 0; r < R; r++) {
            const uint8_t *blk = rows + r * row_bytes + b * bytes;
            prefetch_block(blk, bytes, ahead);
            if (type == T_Q6_K) q6[r] = q6_k_block_scales(blk);
            else k_block_scales(blk, pairs[r], mins + r * G + 8 * b);
            for (int t = 0; t < N; t++)
                for (int h = 0; h < VECS; h++) sums[r][t][h] = vw_zero();
        }
        for (int h = 0; h < VECS; h++) {
            vw high[DIRECT_ROWS];
            for (int r = 0; r < R; r++) high[r] = fifth ? vw_u8(rows + r * row_bytes + b * bytes + 16 + VW_WORDS * h) : vw_zero();
            for (int c = 0; c < 4; c++) {
                vw x_lo[DIRECT_TOKENS], x_hi[DIRECT_TOKENS];
                for (int t = 0; t < N; t++) {
                    x_lo[t] = vw_load(xq + t * K + b * WIDE + 64 * c + VW_WORDS * h);
                    x_hi[t] = vw_load(xq + t * K + b * WIDE + 64 * c + 32 + VW_WORDS * h);
                }
                for (int r = 0; r < R; r++) {
                    const uint8_t *blk = rows + r * row_bytes + b * bytes;
                    vw lo, hi;
                    if (type == T_Q6_K) {
                        lo = q6_k_group(blk, 2 * c, h, &q6[r]);
                        hi = q6_k_group(blk, 2 * c + 1, h, &q6[r]);
                    } else {
                        k_pair(blk, fifth, high[r], c, h, pairs[r], &lo, &hi);
                    }
                    for (int t = 0; t < N; t++) sums[r][t][h] = vw_dot(vw_dot(sums[r][t][h], lo, x_lo[t]), hi, x_hi[t]);
                }
            }
        }
        for (int r = 0; r < R; r++) {
            const float d = block_scale(type, rows + r * row_bytes + b * bytes);
            for (int t = 0; t < N; t++)
                for (int h = 0; h < VECS; h++) acc[r][t][h] = vf_fma(acc[r][t][h], sums[r][t][h], d * xd[t * B + b]);
        }
    }
    for (int r = 0; r < R; r++) /* lanes 0-15 of a (row, token): y[..][0] then y[..][1] */
        for (int t = 0; t < N; t++)
            for (int h = 0; h < VECS; h++) memcpy((float *)y[r * TILE_TOKENS + t] + 16 / VECS * h, &acc[r][t][h], sizeof acc[r][t][h]);
}

#define K_DIRECT(type, R, N) k_direct(rows, row_bytes, DIRECT_AHEAD_ROWS(type) * row_bytes, type, K, xq, xd, R, N, y, mins)
#define K_DIRECT_ANY(type)                                                                              \
    do {                                                                                                \
        if (R > 1) N == 1 ? K_DIRECT(type, TYPE_DIRECT_ROWS(type), 1) : K_DIRECT(type, TYPE_DIRECT_ROWS(type), 2); \
        else if (N <= 2) N == 1 ? K_DIRECT(type, 1, 1) : K_DIRECT(type, 1, 2);                          \
        else N == 3 ? K_DIRECT(type, 1, 3) : K_DIRECT(type, 1, 4);                                      \
    } while (0)
/* R rows (TYPE_DIRECT_ROWS, with up to 2 tokens; or 1) times N tokens */
static __attribute__((noinline)) void k_direct_tile(int type, const uint8_t *rows, size_t row_bytes, int64_t K,
                                                    const int16_t *xq, const float *xd, int R, int N, v8f y[][2],
                                                    float *mins) {
    if (type == T_Q4_K) K_DIRECT_ANY(T_Q4_K);
    else if (type == T_Q5_K) K_DIRECT_ANY(T_Q5_K);
    else K_DIRECT_ANY(T_Q6_K);
}
#undef K_DIRECT_ANY
#undef K_DIRECT
#endif

/* Rows r0 .. r1 - 1 of w times T tokens (panel_product's codes, scales and sums), into
 * out[t * stride + r], with panel_product's bits, where this tier multiplies the type's rows
 * straight from their bytes (k_direct: Q4_K, Q5_K and Q6_K, up to DIRECT_TOKENS tokens, AVX-512 and
 * AVX2); `scratch` holds DIRECT_ROWS * K / GROUP floats. 0, and nothing done, elsewhere. */
int int16_direct_product(const Matrix *w, int64_t r0, int64_t r1, const int16_t *xq, const float *xd, const float *xm,
                         int64_t T, float *out, int64_t stride, float *scratch) {
#if defined(VW_WORDS)
    if (!type_decodes_int16(w->type) || T > DIRECT_TOKENS) return 0;
    const int64_t K = w->cols, M = w->type == T_Q6_K ? 0 : K / GROUP; /* min terms: Q4_K, Q5_K */
    for (int64_t r = r0; r < r1;) {
        /* DIRECT_ROWS rows take up to two tokens a pass, and more tokens in passes of two (their
         * rows' blocks still in L1 for the next two) where one row with them all would read more
         * codes than L1 keeps beside the row: at K = 9728, 4 tokens' are 78 KB, each streamed
         * from L2 per row (measured, 4 tokens from memory: K = 9728, 92 -> 124 G/s; K = 2560, one
         * row with them all 178, passes of two 121) */
        const int pairs = T > 2 && T * K * (int64_t)sizeof(int16_t) > DIRECT_CODES_BYTES;
        const int rows = TYPE_DIRECT_ROWS(w->type);
        const int R = r1 - r >= rows && (T <= 2 || pairs) ? rows : 1, per = R > 1 ? 2 : (int)T;
        for (int64_t t = 0; t < T; t += per) {
            const int n = T - t < per ? (int)(T - t) : per;
            v8f y[TILE_ROWS * DIRECT_TOKENS][2];
            k_direct_tile(w->type, w->data + r * w->row_bytes, w->row_bytes, K, xq + t * K, xd + t * (K / WIDE), R, n, y,
                          scratch);
            if (M && R == TILE_ROWS) row_min_terms(scratch, xm + t * M, M, n, y); /* (AVX-512's DIRECT_ROWS) */
            else if (M) min_terms(scratch, xm + t * M, M, 1, n, y);
            for (int i = 0; i < R; i++)
                for (int k = 0; k < n; k++)
                    out[(t + k) * stride + r + i] = reduce8(y[i * TILE_TOKENS + k][0] + y[i * TILE_TOKENS + k][1]);
        }
        r += R;
    }
    return 1;
#else
    return 0;
#endif
}

/* Prefill panels: a panel of weight rows unpacked once into integers and multiplied with every
 * token of a product, in tiles of TILE_ROWS rows by TILE_TOKENS tokens (panel_product).
 *
 * Two forms of panel share that walk over rows, tokens and blocks:
 *   int16 (int16_panels.c): int16 weights sc * c with one float scale per block of WIDE
 *     weights, times int16 activation codes per WIDE (Q4_K, Q5_K and Q6_K);
 *   bytes (byte_panels.c): 8-bit codes c with one float scale per sub-block of 16 weights,
 *     times 8-bit activation codes per GROUP (Q2_K, Q3_K and the IQ types but IQ4_NL), two
 *     times as many products per instruction (AVX-512 VNNI's dpbusd against dpwssd).
 * Either way a (row, token) pair keeps 16 float lanes (as two v8f), which see the blocks in
 * order whatever the tiling, then the min terms, then reduce8(lanes 0-7 + lanes 8-15). */
#ifndef SPRIG_PANELS_H
#define SPRIG_PANELS_H

#include "kernels.h"
#include "simd.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define TILE_ROWS 4
#if defined(SPRIG_YMM) /* Zen 4, 64 tokens, 2 threads: the byte panels 1.18-1.25x 4 x 3, int16 1.0-1.1x; 4 x 5 and 5 x 4 less */
#define TILE_TOKENS 4
#else
#define TILE_TOKENS 3
#endif
#else
#define TILE_ROWS 2
#define TILE_TOKENS 2
#endif

/* n rows of K columns unpacked (rows of K weights, of K / WIDE or K / 16 scales, of M mins) */
typedef struct {
    int bytes;             /* 8-bit codes laid out in lanes (byte_panels.c), else int16 weights */
    const void *w;         /* int16_t or int8_t */
    const float *scale;    /* int16: D per block; bytes: D * sc per sub-block of 16 */
    const int32_t *offset; /* bytes: -128 * the sum of each sub-block's codes (AVX-512's unsigned tokens) */
    const float *mins;     /* the min terms' factors, `slots` per group (0: none) */
    int slots, n;
    int64_t K;
} Panel;

/* the tokens' codes, rows of K (int16_t or uint8_t), their scales (int16: per WIDE; bytes: per
 * 16, a group's twice), and the sums the min terms take (per group or per half group, as the
 * panel's slots) */
typedef struct {
    const void *q;
    const float *d, *m;
} PanelCodes;

/* A tile: R (TILE_ROWS or 1) rows of the panel from r times N (<= TILE_TOKENS) tokens from t,
 * over blocks b0 .. b1 - 1, the lanes y[i * TILE_TOKENS + k] of row r + i and token t + k
 * carried in and out. */
typedef void PanelTile(const Panel *p, int64_t r, int R, const PanelCodes *x, int64_t t, int N, int64_t b0,
                       int64_t b1, v8f y[][2]);

/* int16_panels.c: the panel times tokens 0 .. T - 1, into out[t * stride + r] */
void panel_product(const Panel *p, const PanelCodes *x, int64_t T, float *out, int64_t stride);
/* rows of a panel of K columns for T tokens, whole tiles (int16_panels.c) */
int64_t panel_rows(int64_t K, int64_t T, int bytes);
PanelTile int16_tile;

/* byte_panels.c */
PanelTile byte_tile;
/* a row's blocks as 8-bit codes in lanes, scales and offsets per 16 and min terms (Panel) */
void byte_panel_row(int type, const uint8_t *row, int64_t K, int8_t *w, float *scale, int32_t *offset, float *mins);
/* a token's 8-bit codes per group (quantize_row8's), plus 128, in lanes; scale per 16; sums per group and half */
void quantize_row_bytes(const float *x, int64_t K, uint8_t *u, float *d, float *xsum, float *xhalf);

#endif

/* Prints the native kernels' results on fixed pseudo-random inputs, one hex float per line.
 *
 * tools/checks/neon_check/run.sh builds it twice from the same sources: for this x86-64 machine
 * without vector flags (the portable C path) and for arm64 (the NEON path), runs the second
 * under qemu, and compares the two outputs: the tiers promise the same bits. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../../backends/cpu_kernels/kernels.h"
#include "../../../backends/cpu_kernels/panels.h"
#include "../../../backends/cpu_kernels/simd.h"

static uint64_t state = 0x9e3779b97f4a7c15ull;

static uint32_t next(void) { /* xorshift64* */
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return (uint32_t)((state * 0x2545f4914f6cdd1dull) >> 32);
}

static float uniform(void) { return (float)(next() >> 8) / 16777216.0f * 4.0f - 2.0f; } /* [-2, 2) */

static void put_scale(uint8_t *at) { /* a finite fp16 of modest size, either sign */
    uint16_t h = (uint16_t)((next() & 0x83ff) | ((8 + next() % 8) << 10));
    memcpy(at, &h, 2);
}

static void put_iq1m_scale(uint8_t *at) { /* the same, in the top 4 bits of IQ1_M's 4 scale words */
    uint8_t h[2];
    put_scale(h);
    uint16_t d = (uint16_t)(h[0] | h[1] << 8);
    for (int i = 0; i < 4; i++) {
        uint16_t w = (uint16_t)((at[2 * i] | at[2 * i + 1] << 8) & 0x0fff) | (uint16_t)(((d >> (4 * i)) & 15) << 12);
        at[2 * i] = (uint8_t)w;
        at[2 * i + 1] = (uint8_t)(w >> 8);
    }
}

static void print(const float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &v[i], 4);
        printf("%08x\n", bits);
    }
}

/* TQ1_0 and TQ2_0 by table lookup (tq_tiles.c): 45 rows of K columns, T tokens in passes
 * of TQ_TOKENS and the rest. */
static void probe_tq_tiles(const float *x, int64_t K, int T) {
    enum { ROWS = 45 };
    static const int types[2][3] = {{T_TQ1_0, 54, 52}, {T_TQ2_0, 66, 64}}; /* type, bytes per block, d at */
    uint8_t *tables = malloc((size_t)(tq_table_bytes(K) * T)), *tiles = malloc((size_t)tq_tiled_bytes(ROWS, K));
    float *xscale = malloc(sizeof(float) * (size_t)(K / GROUP * T)), *out = malloc(sizeof(float) * (size_t)(ROWS * T));
    for (int t = 0; t < T; t++) tq_tables(x + t * K, K, tables + t * tq_table_bytes(K), xscale + t * (K / GROUP));
    for (int k = 0; k < 2; k++) {
        int64_t n_blocks = ROWS * K / 256;
        uint8_t *raw = malloc((size_t)(n_blocks * types[k][1]));
        for (int64_t i = 0; i < n_blocks * types[k][1]; i++) raw[i] = (uint8_t)next();
        for (int64_t b = 0; b < n_blocks; b++) put_scale(raw + b * types[k][1] + types[k][2]);
        tq_tile_matrix(types[k][0], raw, ROWS, K, 0, (ROWS + Q1_TILE - 1) / Q1_TILE, tiles);
        for (int64_t tile = 0; tile * Q1_TILE < ROWS; tile++)
            for (int t = 0; t < T; t += TQ_TOKENS) {
                const uint8_t *tab[TQ_TOKENS];
                const float *xs[TQ_TOKENS];
                float *outs[TQ_TOKENS];
                int n = T - t < TQ_TOKENS ? T - t : TQ_TOKENS;
                for (int j = 0; j < n; j++) {
                    tab[j] = tables + (t + j) * tq_table_bytes(K);
                    xs[j] = xscale + (t + j) * (K / GROUP);
                    outs[j] = out + (t + j) * ROWS;
                }
                tq_tile_rows(tiles, ROWS, K, tile, 1, tab, xs, n, outs);
            }
        print(out, ROWS * T);
        free(raw);
    }
    free(tables), free(tiles), free(xscale), free(out);
}

int main(void) {
    enum { K = 512, ROWS = 45, T = 5 };
    static float x[T * K];
    for (int i = 0; i < T * K; i++) x[i] = uniform();
    for (int i = 0; i < 32; i++) x[i] *= 1000.0f; /* one group with a large scale */

    q1_tiles_init();
    static uint8_t raw[ROWS * K / 128 * 18];
    for (size_t i = 0; i < sizeof raw; i++) raw[i] = (uint8_t)next();
    for (int b = 0; b < ROWS * K / 128; b++) put_scale(raw + 18 * b);
    uint8_t *tiles = malloc((size_t)q1_tiled_bytes(ROWS, K)), *tables = malloc((size_t)q1_table_bytes(K));
    float xscale[K / GROUP], out[ROWS];
    q1_tile_matrix(T_Q1_0, raw, ROWS, K, 0, (ROWS + Q1_TILE - 1) / Q1_TILE, tiles);
    for (int t = 0; t < T; t++) {
        q1_tables(x + t * K, K, tables, xscale);
        for (int64_t tile = 0; tile * Q1_TILE < ROWS; tile++) q1_tile_rows(tiles, ROWS, K, tile, 1, tables, xscale, out);
        print(out, ROWS);
    }

    /* the types of the table that take activation codes, with their blocks' fp16 scales */
#define PROBE_ROW(name, number, weights, bytes, form, unpack, has_min, split, check, ...) \
    PROBE_##form(number, check, __VA_ARGS__)
#define PROBE_CODES(number, check, ...) \
    {number, IQ1M_##check, {__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int)},
#define IQ1M_FP16 0 /* the check formats: 1 where the scale is IQ1_M's, spread over 4 words */
#define IQ1M_IQ1M 1
#define IQ1M_NONE 0 /* MXFP4: its E8M0 byte (any value is finite) given an fp16 scale's low byte, as the others */
#define PROBE_INT16 PROBE_CODES
#define PROBE_OWN8 PROBE_CODES
#define PROBE_FLOAT(...)
#define PROBE_TILED(...)
    static const struct { int type, iq1m, offsets[2], n_offsets; } types[] = {QUANT_TYPES(PROBE_ROW)};
    static int16_t xq[T * K];
    static float xd[T * K / GROUP], xs[T * K / GROUP], xh[T * K / GROUP * HALVES], mins[K / GROUP * HALVES];
    static Codes8 x8[T * K / BLOCK8];
    static int16_t xw[T * K]; /* the prefill panels' codes, a scale per WIDE: int16, and 8-bit */
    static float xwd[T * K / WIDE], xws[T * K / GROUP], xwh[T * K / GROUP * HALVES];
    static uint8_t xb[T * K];
    static float xbd[T * K / 16], xbs[T * K / GROUP], xbh[T * K / GROUP * HALVES];
    for (int t = 0; t < T; t++) {
        quantize_row(x + t * K, K, GROUP, xq + t * K, xd + t * (K / GROUP), xs + t * (K / GROUP), xh + t * (K / GROUP * HALVES));
        quantize_row(x + t * K, K, WIDE, xw + t * K, xwd + t * (K / WIDE), xws + t * (K / GROUP), xwh + t * (K / GROUP * HALVES));
        quantize_row8(x + t * K, K, x8 + t * codes8_blocks(K));
        quantize_row_bytes(x + t * K, K, xb + t * K, xbd + t * (K / 16), xbs + t * (K / GROUP), xbh + t * (K / GROUP * HALVES));
    }
    static int8_t q[K];
    static float scale[K / GROUP * HALVES], min[K / GROUP * HALVES], f[K];
    RowBuffer buf = {q, scale, min, f};
    static float dequantized[4 * K], prefill[T * 4];
    static int16_t w16[4 * K]; /* 4 rows for the prefill panels (int16 weights, or 8-bit codes) */
    static float w16_scale[4 * K / 16], w16_min[4 * K / GROUP * HALVES];
    static int32_t w8_offset[4 * K / 16];
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        int weights, bytes;
        type_block(types[k].type, &weights, &bytes);
        int64_t row_bytes = K / weights * bytes;
        uint8_t *rows = malloc((size_t)(4 * row_bytes));
        for (int r = 0; r < 4; r++) {
            uint8_t *row = rows + r * row_bytes;
            for (int64_t i = 0; i < row_bytes; i++) row[i] = (uint8_t)next();
            for (int b = 0; b < K / weights; b++)
                for (int j = 0; j < types[k].n_offsets; j++)
                    (types[k].iq1m ? put_iq1m_scale : put_scale)(row + b * bytes + types[k].offsets[j]);
            float several[T];
            if (!type_decodes_int16(types[k].type)) { /* (those: the panels, below) */
                for (int t = 0; t < T; t += ROW_TOKENS) /* blocks of ROW_TOKENS tokens, and the rest */
                    dot_row_tokens(types[k].type, row, K, xq + t * K, xd + t * (K / GROUP), xs + t * (K / GROUP),
                                   xh + t * (K / GROUP * HALVES), x8 + t * codes8_blocks(K), mins,
                                   T - t < ROW_TOKENS ? T - t : ROW_TOKENS, several + t, 1);
                print(several, T);
            }
            dequantize_row(types[k].type, row, K, &buf, dequantized + r * K);
            print(dequantized + r * K, K);
            float *mins_r = w16_min + r * (K / GROUP) * MIN_SLOTS(type_mins(types[k].type));
            if (type_decodes_int16(types[k].type))
                int16_panel_row(types[k].type, row, K, w16 + r * K, w16_scale + r * (K / WIDE), mins_r);
            if (type_takes_byte_panels(types[k].type))
                byte_panel_row(types[k].type, row, K, (int8_t *)w16 + r * K, w16_scale + r * (K / 16), w8_offset + r * (K / 16),
                               mins_r);
        }
        const int in_bytes = type_takes_byte_panels(types[k].type);
        if (in_bytes || type_decodes_int16(types[k].type)) { /* 4 rows by 5 tokens: whole tiles and edges */
            int slots = type_mins(types[k].type) ? MIN_SLOTS(type_mins(types[k].type)) : 0;
            const Panel p = {.bytes = in_bytes, .w = w16, .scale = w16_scale, .offset = w8_offset, .mins = w16_min,
                             .slots = slots, .n = 4, .K = K};
            const PanelCodes codes = in_bytes ? (PanelCodes){xb, xbd, slots == 2 ? xbh : xbs} : (PanelCodes){xw, xwd, slots == 2 ? xwh : xws};
            panel_product(&p, &codes, T, prefill, 4);
            print(prefill, T * 4);
        }
        if (row_tiled_type(types[k].type)) { /* the 4 rows in a row tile (padded), passes of ROW_TILE_TOKENS tokens */
            uint8_t *tiles = malloc((size_t)row_tiled_bytes(types[k].type, 4, K));
            const int wide = row_tile_span(types[k].type) == WIDE; /* codes per 256 (Q4_K, Q6_K; Q2_K takes x8) */
            const int64_t S = K / row_tile_span(types[k].type);
            row_tile_matrix(types[k].type, rows, 4, K, 0, 1, tiles);
            for (int t = 0; t < T; t += ROW_TILE_TOKENS)
                row_tile_rows(types[k].type, tiles, 4, K, 0, (wide ? xw : xq) + t * K, K, (wide ? xwd : xd) + t * S,
                              (wide ? xws : xs) + t * (K / GROUP), x8 + t * codes8_blocks(K),
                              T - t < ROW_TILE_TOKENS ? T - t : ROW_TILE_TOKENS, prefill + t * 4, 4);
            print(prefill, T * 4);
            free(tiles);
        }
        /* the prefill product: a block of 3 rows and one more, blocks of 4 tokens and one more */
        float_product(dequantized, 3, K, x, 0, T, prefill, 4);
        float_product(dequantized + 3 * K, 1, K, x, 0, T, prefill + 3, 4);
        print(prefill, T * 4);
        free(rows);
    }
    /* the float helper of attention and the activations: exp8 over [-110, 90) and the specials */
    static float e[1024 + 8];
    for (int i = 0; i < 1024; i++) e[i] = uniform() * 50.0f - 10.0f;
    const float specials[8] = {0.0f, -INFINITY, INFINITY, NAN, -100.0f, 88.7f, -87.5f, 1e-30f};
    memcpy(e + 1024, specials, sizeof specials);
    for (int i = 0; i < 1024 + 8; i += 8) exp_floats(e + i, e + i, 8);
    print(e, 1024 + 8);
    tq_tiles_init();
    probe_tq_tiles(x, K, T);
    free(tiles);
    free(tables);
    return 0;
}

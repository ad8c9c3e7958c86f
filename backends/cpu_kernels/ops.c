/* The ops of a forward pass on float32 activations: quantized matrix products, norms,
 * rotary embedding, attention over the KV cache, gated activations. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "panels.h"

#define TOKEN_TILE 32  /* tokens dotted with one unpacked weight row before the next row */
#define PARALLEL_ELEMENTS 65536

/* -- activations quantized once per product, shared by every matrix of a fused op ------ */

/* activation codes (int16, or 8-bit plus 128: byte_panels.c) with their scales, and the sums
 * of each group and half group */
typedef struct {
    void *q;
    float *d, *xsum, *xhalf;
    int64_t capacity;
} Codes;

typedef struct {
    Codes group, wide, bytes; /* int16 codes per GROUP (dot_row_tokens), per WIDE (int16 panels); 8-bit (byte panels) */
    Codes8 *q8; /* 8-bit codes, for the OWN8 types */
    int64_t capacity8; /* Codes8 blocks */
    uint8_t *tables; /* Q1_0's lookup tables, and their groups' scales */
    float *tscale;
    int64_t table_capacity;
    uint8_t *tq_tables; /* TQ1_0 / TQ2_0's pair tables, and their groups' scales */
    float *tq_scale;
    int64_t tq_capacity;
} Acts;

/* Where a product's activations are quantized. A prefill's, once, by all the threads together,
 * into `shared`; a few tokens' (LOCAL_TOKENS or fewer), by every thread for itself, into its own
 * `local` buffers: written on one core and read on another, they cost more than quantizing
 * them twice (Zen 4, 2 threads, one token: TQ2_0's tables, 16 bytes a column, 46 cycles a pair
 * of columns where one core writes what the other read before, 9 where it reads them itself;
 * a 64 x 9728 TQ2_0 product 105 -> 24 us). */
#define LOCAL_TOKENS 4
static Acts shared;
static struct {
    Acts acts;
    int64_t serial; /* the product whose activations acts holds */
} local[MAX_POOL_THREADS];
static int64_t products; /* serial of the last product */

/* A buffer of at least `bytes` in place of *p (its contents not kept), on a cache line: the
 * prefill kernels load whole lines of it (int16_panels.c). */
static int grow(void **p, size_t bytes) {
    void *q = aligned_alloc(64, (bytes / 64 + 1) * 64); /* a whole number of lines, never 0 */
    if (!q) return -1;
    free(*p);
    *p = q;
    return 0;
}

/* codes of code_bytes each, with a scale per GROUP values at most (bytes: per 16, HALVES a group) */
static int reserve_codes(Codes *c, int64_t elements, size_t code_bytes, int scales_per_group) {
    size_t groups = (size_t)(elements / GROUP + 1);
    if (elements <= c->capacity) return 0;
    if (grow(&c->q, code_bytes * (size_t)elements) || grow((void **)&c->d, sizeof(float) * (size_t)scales_per_group * groups) ||
        grow((void **)&c->xsum, sizeof(float) * groups) || grow((void **)&c->xhalf, sizeof(float) * HALVES * groups))
        return -1;
    c->capacity = elements;
    return 0;
}

/* The buffers of T tokens of K activations, in the forms asked for */
static int reserve_acts(Acts *a, int64_t T, int64_t K, int codes, int wide, int bytes, int codes8, int tables, int tq_tables) {
    const int64_t elements = T * K, blocks8 = T * codes8_blocks(K);
    size_t groups = (size_t)(elements / GROUP + 1);
    if ((codes && reserve_codes(&a->group, elements, sizeof(int16_t), 1)) ||
        (wide && reserve_codes(&a->wide, elements, sizeof(int16_t), 1)) || (bytes && reserve_codes(&a->bytes, elements, 1, HALVES)))
        return -1;
    if (codes8 && blocks8 > a->capacity8) {
        if (grow((void **)&a->q8, sizeof(Codes8) * (size_t)blocks8)) return -1;
        a->capacity8 = blocks8;
    }
    if (tables && elements > a->table_capacity) {
        if (grow((void **)&a->tables, (size_t)q1_table_bytes(elements)) || grow((void **)&a->tscale, sizeof(float) * groups))
            return -1;
        a->table_capacity = elements;
    }
    if (tq_tables && elements > a->tq_capacity) {
        if (grow((void **)&a->tq_tables, (size_t)tq_table_bytes(elements)) || grow((void **)&a->tq_scale, sizeof(float) * groups))
            return -1;
        a->tq_capacity = elements;
    }
    return 0;
}

typedef struct {
    const Op *op;
    int64_t T, K, total_rows;
    int codes, codes8, tables, tq_tables; /* which forms of the activations the matrices take */
    int wide;          /* int16 codes with a scale per WIDE values (int16 panels), in Acts.wide */
    int bytes;         /* 8-bit codes, a scale per 16 values (byte panels), in Acts.bytes */
    int tq_only;       /* every matrix is ternary tiles: one pass takes all the tokens (tq_tiles_product) */
    int row_tiles;     /* some matrix is in row tiles on int16 codes (row_tiles_product: its threads' scratch_floats) */
    int prefill;       /* FLOAT_TOKENS or more tokens: the OWN8 types take byte panels */
    int local;         /* each thread quantizes the tokens for itself (LOCAL_TOKENS) */
    int64_t serial;    /* this product's number */
} LinearCtx;

/* Whether a matrix of `type` takes 8-bit codes in this product (byte panels); Q4_K-Q6_K
 * (type_decodes_int16) take int16 ones for any count of tokens (int16 panels, or
 * int16_direct_product). */
static inline int byte_rows(const LinearCtx *c, int type) { return c->prefill && type_takes_byte_panels(type); }

/* Tokens lo .. hi - 1 of the product's activations, in each form its matrices take, into a. */
static void quantize_tokens(const LinearCtx *c, Acts *a, int64_t lo, int64_t hi) {
    const int64_t K = c->K, G = K / GROUP;
    for (int64_t t = lo; t < hi; t++) {
        const float *x = c->op->a + t * K;
        if (c->codes) quantize_row(x, K, GROUP, (int16_t *)a->group.q + t * K, a->group.d + t * G, a->group.xsum + t * G,
                                   a->group.xhalf + t * HALVES * G);
        if (c->wide) quantize_row(x, K, WIDE, (int16_t *)a->wide.q + t * K, a->wide.d + t * (K / WIDE), a->wide.xsum + t * G,
                                  a->wide.xhalf + t * HALVES * G);
        if (c->bytes) quantize_row_bytes(x, K, (uint8_t *)a->bytes.q + t * K, a->bytes.d + t * (K / 16),
                                         a->bytes.xsum + t * G, a->bytes.xhalf + t * HALVES * G);
        if (c->codes8) quantize_row8(x, K, a->q8 + t * codes8_blocks(K));
        if (c->tables) q1_tables(x, K, a->tables + t * q1_table_bytes(K), a->tscale + t * G);
        if (c->tq_tables) tq_tables(x, K, a->tq_tables + t * tq_table_bytes(K), a->tq_scale + t * G);
    }
}

static void quantize_task(void *vctx, int chunk, int chunks, int thread) {
    const LinearCtx *c = vctx;
    int64_t lo, hi;
    split_range(c->T, chunk, chunks, &lo, &hi);
    quantize_tokens(c, &shared, lo, hi);
}

/* The activations a thread's part of the product reads: its own, quantized at its first chunk,
 * or the shared ones. */
static const Acts *thread_acts(const LinearCtx *c, int thread) {
    if (!c->local) return &shared;
    if (local[thread].serial != c->serial) {
        quantize_tokens(c, &local[thread].acts, 0, c->T);
        local[thread].serial = c->serial;
    }
    return &local[thread].acts;
}

/* The tiles of a Q1_0 matrix whose first row lies in [r0, r1), times tokens t0 .. t1 - 1. */
static void tiles_product(const Acts *a, const Matrix *w, int64_t K, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float *out) {
    const int64_t end = (r1 + Q1_TILE - 1) / Q1_TILE;
    for (int64_t tile = (r0 + Q1_TILE - 1) / Q1_TILE, count; tile < end; tile += count) {
        count = end - tile < q1_tiles_at_once() ? end - tile : q1_tiles_at_once();
        for (int64_t t = t0; t < t1; t++)
            q1_tile_rows(w->data, w->rows, K, tile, (int)count, a->tables + t * q1_table_bytes(K), a->tscale + t * (K / GROUP),
                         out + t * w->rows);
    }
}

/* The tiles of a ternary matrix whose first row lies in [r0, r1), times tokens t0 .. t1 - 1,
 * TQ_TOKENS tokens per pass over a tile. The tiles go in runs of about TQ_RUN_BYTES, each
 * run multiplied with every group of tokens before the next: the run's codes and a group's
 * tables stay in the core's L2, where tile after tile over all the tokens would stream every
 * token's tables (16 bytes a column) once per tile. */
#define TQ_RUN_BYTES 524288
static void tq_tiles_product(const Acts *a, const Matrix *w, int64_t K, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float *out) {
    const uint8_t *tables[TQ_TOKENS];
    const float *scales[TQ_TOKENS];
    float *outs[TQ_TOKENS];
    int64_t first = (r0 + Q1_TILE - 1) / Q1_TILE, end = (r1 + Q1_TILE - 1) / Q1_TILE;
    int64_t run = TQ_RUN_BYTES / tq_tiled_bytes(Q1_TILE, K);
    if (run < 1) run = 1;
    for (int64_t from = first; from < end; from += run)
        for (int64_t t = t0; t < t1; t += TQ_TOKENS) {
            int n = t1 - t < TQ_TOKENS ? (int)(t1 - t) : TQ_TOKENS;
            for (int j = 0; j < n; j++) {
                tables[j] = a->tq_tables + (t + j) * tq_table_bytes(K);
                scales[j] = a->tq_scale + (t + j) * (K / GROUP);
                outs[j] = out + (t + j) * w->rows;
            }
            const int64_t stop = end < from + run ? end : from + run;
            for (int64_t tile = from, count; tile < stop; tile += count) {
                count = stop - tile < tq_tiles_at_once(n) ? stop - tile : tq_tiles_at_once(n);
                tq_tile_rows(w->data, w->rows, K, tile, (int)count, tables, scales, n, outs);
            }
        }
}

/* The row tiles of a matrix (row_tiles.c) whose first row lies in [r0, r1), times all T tokens,
 * ROW_TILE_TOKENS tokens per pass over a tile; in a prefill the tiles go in runs of about
 * ROW_RUN_BYTES, each run (in the core's L2) multiplied with every group of tokens before the
 * next. */
#define ROW_RUN_BYTES 262144
/* Tokens' int16 codes whose rows lie a multiple of 4 KB apart fall in the same sets of L1, where a
 * pass over a tile reads several tokens' at once (Zen 4, 64 tokens: Q4_K at K = 2048 113 G/s,
 * at K = 2304 129, 2560 140; K = 4096 113, 3840 142): a thread copies them CODES_PAD values
 * further apart first (codes_stride), into its scratch_floats. */
#define CODES_PAD 32
static inline int64_t codes_stride(int64_t K, int64_t T) {
    return T > 1 && K * (int64_t)sizeof(int16_t) % 4096 == 0 ? K + CODES_PAD : K;
}

/* Tiles first .. end - 1 of a matrix of `type` in row tiles (`rows` rows) times T tokens (codes
 * at xq, ldx apart; scales and group sums at xd, xs; or 8-bit codes at x8, where the type takes
 * them), into out[t * stride + r], in runs */
static void tile_runs(int type, const uint8_t *tiles, int64_t rows, int64_t K, int64_t first, int64_t end, int64_t T,
                      const int16_t *xq, int64_t ldx, const float *xd, const float *xs, const Codes8 *x8, float *out,
                      int64_t stride) {
    const int64_t G = K / GROUP, S = K / row_tile_span(type), B8 = codes8_blocks(K);
    const int codes8 = row_tile_codes8(type);
    int64_t run = ROW_RUN_BYTES / row_tiled_bytes(type, ROW_TILE, K);
    if (run < 1) run = 1;
    for (int64_t from = first; from < end; from += run)
        for (int64_t t = 0; t < T; t += ROW_TILE_TOKENS) {
            const int n = T - t < ROW_TILE_TOKENS ? (int)(T - t) : ROW_TILE_TOKENS;
            for (int64_t tile = from; tile < end && tile < from + run; tile++)
                if (codes8) row_tile_rows(type, tiles, rows, K, tile, NULL, 0, NULL, NULL, x8 + t * B8, n, out + t * stride, stride);
                else row_tile_rows(type, tiles, rows, K, tile, xq + t * ldx, ldx, xd + t * S, xs + t * G, NULL, n, out + t * stride,
                                   stride);
        }
}

static void row_tiles_product(const Acts *a, const Matrix *w, int64_t K, int64_t r0, int64_t r1, int64_t T, float *out, int thread) {
    const int type = row_tiles_of(w->type);
    const Codes *codes = row_tile_span(type) == WIDE ? &a->wide : &a->group;
    const int64_t first = (r0 + ROW_TILE - 1) / ROW_TILE, end = (r1 + ROW_TILE - 1) / ROW_TILE, ldx = codes_stride(K, T);
    const int16_t *xq = (const int16_t *)codes->q;
    if (first >= end) return;
    if (row_tile_codes8(type)) {
        tile_runs(type, w->data, w->rows, K, first, end, T, NULL, 0, NULL, NULL, a->q8, out, w->rows);
        return;
    }
    if (ldx != K) {
        int16_t *spread = (int16_t *)scratch_floats(thread);
        for (int64_t t = 0; t < T; t++) memcpy(spread + t * ldx, xq + t * K, sizeof(int16_t) * (size_t)K);
        xq = spread;
    }
    tile_runs(type, w->data, w->rows, K, first, end, T, xq, ldx, codes->d, codes->xsum, NULL, out, w->rows);
}

/* Tokens of K float activations taken together in a prefill: FLOAT_TILE_BYTES of them (a
 * core's L2 holds them), at least TOKEN_TILE. */
static inline int64_t prefill_tile(int64_t K) {
    int64_t tile = FLOAT_TILE_BYTES / (int64_t)sizeof(float) / K;
    return tile > TOKEN_TILE ? tile : TOKEN_TILE;
}

/* Rows r0 .. r1 - 1 of a matrix (row r at data + r * row_bytes) times the float tokens
 * t0 .. t1 - 1 of x (rows of K), into out[t * stride + r], by dequantized rows: a panel of
 * rows (float_panel_rows) is dequantized once for all the tokens, which it then meets a tile of
 * FLOAT_TILE_BYTES of activations at a time, panel and tile both held in the core's L2. */
static void float_panels(const uint8_t *data, int type, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                         const float *x, int64_t t0, int64_t t1, RowBuffer *buf, float *out, int64_t stride) {
    int64_t panel = float_panel_rows(K), tile = prefill_tile(K);
    for (int64_t r = r0; r < r1; r += panel) {
        int64_t n = r1 - r < panel ? r1 - r : panel;
        for (int64_t i = 0; i < n; i++) dequantize_row(type, data + (r + i) * row_bytes, K, buf, buf->f + i * K);
        for (int64_t s = t0; s < t1; s += tile)
            for (int64_t i = 0; i < n; i += FLOAT_ROWS)
                float_product(buf->f + i * K, n - i < FLOAT_ROWS ? (int)(n - i) : FLOAT_ROWS, K, x, s,
                              s + tile < t1 ? s + tile : t1, out + r + i, stride);
    }
}

/* Rows r0 .. r1 - 1 of a matrix times all T tokens, into out[t * stride + r], in a prefill
 * panel's integers (panels.h): 8-bit codes (`bytes`, the OWN8 types) or int16 weights (Q4_K,
 * Q5_K, Q6_K) and the tokens' `codes` (rows of K; their scales and group sums). A panel of rows
 * (panel_rows) is unpacked once into the row buffer's float area, then multiplied with all the
 * tokens (panel_product); or, for a few int16 tokens where the tier has it, each row is
 * multiplied straight from its bytes (int16_direct_product). */
static void panels(const Matrix *w, int64_t K, int64_t r0, int64_t r1, int64_t T, int bytes, const Codes *codes,
                   RowBuffer *buf, float *out, int64_t stride) {
    const int64_t panel = panel_rows(K, T, bytes), G = K / GROUP, per_group = MIN_SLOTS(type_mins(w->type));
    const int64_t scales = bytes ? K / 16 : K / WIDE; /* per row */
    Panel p = {.bytes = bytes, .w = buf->f, .K = K, .slots = type_mins(w->type) ? (int)per_group : 0}; /* slots: 0 for none */
    const PanelCodes x = {codes->q, codes->d, p.slots == 2 ? codes->xhalf : codes->xsum};
    /* in the row buffer's float area: panel * K weights, then per row its scales, offsets and mins */
    float *scale = (float *)((uint8_t *)buf->f + panel * K * (bytes ? 1 : 2)), *mins = scale + panel * scales * (bytes ? 2 : 1);
    int32_t *offset = (int32_t *)(scale + panel * scales);
    p.scale = scale, p.offset = offset, p.mins = mins;
    if (!bytes && int16_direct_product(w, r0, r1, x.q, x.d, x.m, T, out, stride, buf->f)) return;
    for (int64_t r = r0; r < r1; r += panel) {
        p.n = (int)(r1 - r < panel ? r1 - r : panel);
        for (int64_t i = 0; i < p.n; i++) {
            const uint8_t *row = w->data + (r + i) * w->row_bytes;
            if (T < FLOAT_TOKENS && r + i + PREFETCH_ROWS < r1) prefetch_block(row, w->row_bytes, prefetch_ahead(w->row_bytes));
            if (bytes)
                byte_panel_row(w->type, row, K, (int8_t *)buf->f + i * K, scale + i * scales, offset + i * scales,
                               mins + i * G * per_group);
            else int16_panel_row(w->type, row, K, (int16_t *)buf->f + i * K, scale + i * scales, mins + i * G * per_group);
        }
        panel_product(&p, &x, T, out + r, stride);
    }
}

static void linear_task(void *vctx, int chunk, int chunks, int thread) {
    const LinearCtx *c = vctx;
    const Op *op = c->op;
    int64_t lo, hi, K = c->K, G = K / GROUP;
    split_range(c->total_rows, chunk, chunks, &lo, &hi);
    RowBuffer *buf = scratch_row(thread);
    const Acts *a = thread_acts(c, thread);
    /* tokens per pass of the matrices not dequantized (Q1_0 and ternary tiles, float rows, codes):
     * in prefill, as many as keep their activations in a core's L2 */
    int64_t tile = c->tq_only ? c->T : c->prefill ? prefill_tile(K) : TOKEN_TILE;
    for (int64_t t0 = 0; t0 < c->T; t0 += tile) {
        int64_t t1 = t0 + tile < c->T ? t0 + tile : c->T;
        int64_t base = 0;
        for (int m = 0; m < op->n_mats; base += op->mats[m].rows, m++) {
            const Matrix *w = &op->mats[m];
            int64_t r0 = lo > base ? lo - base : 0, r1 = hi - base < w->rows ? hi - base : w->rows;
            if (w->type == T_Q1_0_TILES) {
                tiles_product(a, w, K, r0, r1, t0, t1, op->outs[m]);
            } else if (row_tiles_of(w->type) >= 0) { /* all the tokens at once */
                if (t0 == 0) row_tiles_product(a, w, K, r0, r1, c->T, op->outs[m], thread);
            } else if (w->type == T_TQ_TILES) {
                tq_tiles_product(a, w, K, r0, r1, t0, t1, op->outs[m]);
            } else if (byte_rows(c, w->type) || type_decodes_int16(w->type)) { /* all the tokens at once, in tiles */
                int bytes = byte_rows(c, w->type);
                if (t0 == 0) panels(w, K, r0, r1, c->T, bytes, bytes ? &a->bytes : &a->wide, buf, op->outs[m], w->rows);
            } else if (type_takes_codes(w->type)) { /* each row read once, no row buffer (the backend gives the
                                                      * CODES types in row tiles: rows as the file has them, these) */
                for (int64_t r = r0; r < r1; r++) {
                    const uint8_t *row = w->data + r * w->row_bytes;
                    for (int64_t t = t0; t < t1; t += ROW_TOKENS) {
                        int n = t1 - t < ROW_TOKENS ? (int)(t1 - t) : ROW_TOKENS;
                        dot_row_tokens(w->type, row, K, (int16_t *)a->group.q + t * K, a->group.d + t * G, a->group.xsum + t * G,
                                       a->group.xhalf + t * HALVES * G, a->q8 + t * codes8_blocks(K), buf->min, n,
                                       op->outs[m] + t * w->rows + r, w->rows);
                    }
                }
            } else { /* float rows */
                for (int64_t r = r0; r < r1; r++) {
                    unpack_row(w->type, w->data + r * w->row_bytes, K, buf);
                    dot_tokens(buf, op->a, K, t0, t1, op->outs[m] + r, w->rows);
                }
            }
        }
    }
}

/* The span of a matrix's int16 activation codes where it is in row tiles on them (row_tile_span),
 * else 0 */
static inline int tiled_span(int type) {
    const int tiled = row_tiles_of(type);
    return tiled >= 0 && !row_tile_codes8(tiled) ? row_tile_span(tiled) : 0;
}
/* Whether a matrix is in row tiles on 8-bit codes (row_tile_codes8) */
static inline int tiled8(int type) { return row_tiles_of(type) >= 0 && row_tile_codes8(row_tiles_of(type)); }

static int linear(const Op *op, const char **error) {
    LinearCtx c = {.op = op, .T = op->ints.linear.tokens, .K = op->mats[0].cols,
                   .prefill = op->ints.linear.tokens >= FLOAT_TOKENS, .tq_only = 1};
    for (int m = 0; m < op->n_mats; m++) {
        c.tq_only &= op->mats[m].type == T_TQ_TILES;
        c.total_rows += op->mats[m].rows;
        const int span = tiled_span(op->mats[m].type);
        c.row_tiles |= span != 0;
        c.codes |= type_takes_codes16(op->mats[m].type) || span == GROUP;
        c.codes8 |= (type_takes_codes8(op->mats[m].type) && !c.prefill) || tiled8(op->mats[m].type);
        c.wide |= type_decodes_int16(op->mats[m].type) || span == WIDE;
        c.bytes |= byte_rows(&c, op->mats[m].type);
        c.tables |= op->mats[m].type == T_Q1_0_TILES;
        c.tq_tables |= op->mats[m].type == T_TQ_TILES;
    }
    const int quantized = c.codes || c.codes8 || c.wide || c.bytes || c.tables || c.tq_tables;
    c.local = quantized && c.T <= LOCAL_TOKENS && pool_threads() > 1;
    c.serial = ++products;
    const int64_t ldx = codes_stride(c.K, c.T), spread = c.row_tiles && ldx != c.K ? c.T * ldx / 2 + 1 : 0; /* floats */
    int failed = scratch_reserve(c.K, spread) != 0;
    for (int i = 0; i < (c.local ? pool_threads() : 1) && !failed; i++)
        failed = reserve_acts(c.local ? &local[i].acts : &shared, c.T, c.K, c.codes, c.wide, c.bytes, c.codes8, c.tables,
                              c.tq_tables) != 0;
    if (failed) {
        *error = "out of memory for the matrix product's buffers";
        return -1;
    }
    if (quantized && !c.local) {
        if (c.T > 1) pool_run(quantize_task, &c);
        else quantize_task(&c, 0, 1, 0);
    }
    pool_run(linear_task, &c);
    for (int m = 0; m < op->n_mats; m++) {
        if (!op->bias[m]) continue;
        for (int64_t t = 0; t < c.T; t++)
            for (int64_t r = 0; r < op->mats[m].rows; r++) op->outs[m][t * op->mats[m].rows + r] += op->bias[m][r];
    }
    return 0;
}

/* -- embedding ----------------------------------------------------------------------- */

static int embed(const Op *op, const char **error) {
    const Matrix *w = &op->mats[0];
    if (scratch_reserve(w->cols, 0) != 0) {
        *error = "out of memory for the embedding buffers";
        return -1;
    }
    for (int64_t t = 0; t < op->ints.embed.tokens; t++) {
        int64_t id = op->ids[t];
        if (id < 0 || id >= w->rows) {
            *error = "a token id is outside the model's vocabulary";
            return -1;
        }
        float *out = op->out + t * w->cols;
        RowBuffer *buf = scratch_row(0);
        if (row_tiles_of(w->type) >= 0) { /* the row's file blocks, put back together in the float area */
            row_tile_row(row_tiles_of(w->type), w->data, w->cols, id, (uint8_t *)buf->f);
            dequantize_row(row_tiles_of(w->type), (const uint8_t *)buf->f, w->cols, buf, out);
        } else {
            dequantize_row(w->type, w->data + id * w->row_bytes, w->cols, buf, out);
        }
        if (op->floats.embed.scale != 1.0f)
            for (int64_t i = 0; i < w->cols; i++) out[i] *= op->floats.embed.scale;
    }
    return 0;
}

/* -- norms, rotary embedding, elementwise ------------------------------------------------ */

static void rms_norm(const Op *op) {
    int64_t rows = op->ints.rms_norm.rows, dim = op->ints.rms_norm.dim;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = op->a + r * dim;
        double squares = 0.0;
        for (int64_t i = 0; i < dim; i++) squares += (double)x[i] * x[i];
        float root = sqrtf((float)(squares / (double)dim) + op->floats.rms_norm.eps);
        float *out = op->out + r * dim;
        for (int64_t i = 0; i < dim; i++) out[i] = (x[i] / root) * op->b[i];
    }
}

/* LayerNorm: mean and variance summed in double, as rms_norm sums its squares. */
static void layer_norm(const Op *op) {
    int64_t rows = op->ints.layer_norm.rows, dim = op->ints.layer_norm.dim;
    for (int64_t r = 0; r < rows; r++) {
        const float *x = op->a + r * dim;
        double sum = 0.0, squares = 0.0;
        for (int64_t i = 0; i < dim; i++) sum += x[i];
        float mean = (float)(sum / (double)dim);
        for (int64_t i = 0; i < dim; i++) squares += (double)(x[i] - mean) * (x[i] - mean);
        float root = sqrtf((float)(squares / (double)dim) + op->floats.layer_norm.eps);
        float *out = op->out + r * dim;
        for (int64_t i = 0; i < dim; i++) out[i] = ((x[i] - mean) / root) * op->b[i] + (op->c ? op->c[i] : 0.0f);
    }
}

/* The cos/sin of the positions of the last pass rotated (q and k of a layer, and every layer,
 * share them). Keyed by the table's values, not its address: a freed table's address comes back. */
static struct {
    double table[4096];
    float mscale;
    int64_t half, count, positions, angles; /* in use, and room for: positions, positions x half */
    int64_t *pos;
    float *cos, *sin; /* (count, half) */
} rope_cache;

/* Fills the cache for the T positions of this pass unless it holds them already. */
static int rope_angles(const Op *op, int64_t T, int64_t half) {
    float mscale = op->floats.rope.mscale;
    int fresh = rope_cache.half == half && rope_cache.count == T && rope_cache.mscale == mscale &&
                memcmp(rope_cache.table, op->table, sizeof(double) * (size_t)half) == 0;
    for (int64_t t = 0; fresh && t < T; t++) fresh = rope_cache.pos[t] == (op->ints.rope.per_row ? op->pos[t] : *op->pos + t);
    if (fresh) return 0;
    rope_cache.count = 0;
    if (T > rope_cache.positions) {
        if (grow((void **)&rope_cache.pos, sizeof(int64_t) * (size_t)T) != 0) return -1;
        rope_cache.positions = T;
    }
    if (T * half > rope_cache.angles) {
        if (grow((void **)&rope_cache.cos, sizeof(float) * (size_t)(T * half)) != 0 ||
            grow((void **)&rope_cache.sin, sizeof(float) * (size_t)(T * half)) != 0)
            return -1;
        rope_cache.angles = T * half;
    }
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = op->ints.rope.per_row ? op->pos[t] : *op->pos + t;
        for (int64_t i = 0; i < half; i++) {
            double angle = (double)pos * op->table[i];
            rope_cache.cos[t * half + i] = (float)(cos(angle) * mscale);
            rope_cache.sin[t * half + i] = (float)(sin(angle) * mscale);
        }
        rope_cache.pos[t] = pos;
    }
    memcpy(rope_cache.table, op->table, sizeof(double) * (size_t)half);
    rope_cache.mscale = mscale;
    rope_cache.half = half;
    rope_cache.count = T;
    return 0;
}

static int rope(const Op *op, const char **error) {
    int64_t T = op->ints.rope.tokens, heads = op->ints.rope.heads, dim = op->ints.rope.dim;
    int64_t half = op->ints.rope.rope_dim / 2;
    int neox = (int)op->ints.rope.neox;
    if (rope_angles(op, T, half) != 0) {
        *error = "out of memory for the RoPE angles";
        return -1;
    }
    if (op->out != op->a) memcpy(op->out, op->a, sizeof(float) * (size_t)(T * heads * dim));
    for (int64_t t = 0; t < T; t++) {
        const float *cosines = rope_cache.cos + t * half, *sines = rope_cache.sin + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *x = op->out + (t * heads + h) * dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
                float a = x[ia], b = x[ib], c = cosines[i], s = sines[i];
                x[ia] = a * c - b * s;
                x[ib] = a * s + b * c;
            }
        }
    }
    return 0;
}

typedef struct {
    const Op *op;
    int64_t n; /* elements (GATED, ADD, SOFTCAP) */
} ElementCtx;

/* silu(a) * b (act 0), gelu_tanh(a) * b (act 1) or swiglu_oai(a, b) (act 2: gpt-oss's clamped
 * form, g = min(a, 7), u = clamp(b, -7, 7), g * sigmoid(1.702 g) * (u + 1)) of n (1 .. 8)
 * elements, with exp8 (tanh(u) = 1 - 2 / (exp(2u) + 1)); lanes past n are padding */
#define SWIGLU_ALPHA 1.702f
#define SWIGLU_LIMIT 7.0f
static void gated8(const float *a, const float *b, float *out, int64_t n, int act) {
    v8f g = {0}, other = {1, 1, 1, 1, 1, 1, 1, 1}, result;
    memcpy(&g, a, sizeof(float) * (size_t)n);
    if (b) memcpy(&other, b, sizeof(float) * (size_t)n); /* no b: act(a) times ones */
    if (act == 0) {
        result = g / (1.0f + exp8(-g)) * other;
    } else if (act == 1) {
        const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
        v8f inner = k * g * (1.0f + 0.044715f * g * g);
        v8f tanh_inner = 1.0f - 2.0f / (exp8(2.0f * inner) + 1.0f);
        result = 0.5f * g * (1.0f + tanh_inner) * other;
    } else { /* min and clamp that keep a nan, as NumPy's */
        const v8f limit = {SWIGLU_LIMIT, SWIGLU_LIMIT, SWIGLU_LIMIT, SWIGLU_LIMIT,
                           SWIGLU_LIMIT, SWIGLU_LIMIT, SWIGLU_LIMIT, SWIGLU_LIMIT};
        v8i above = g > limit;
        g = (v8f)(((v8i)g & ~above) | ((v8i)limit & above));
        v8i high = other > limit, low = other < -limit;
        other = (v8f)(((v8i)other & ~(high | low)) | ((v8i)limit & high) | ((v8i)(-limit) & low));
        result = g / (1.0f + exp8(-SWIGLU_ALPHA * g)) * (other + 1.0f);
    }
    memcpy(out, &result, sizeof(float) * (size_t)n);
}

static void elementwise_task(void *vctx, int chunk, int chunks, int thread) {
    const ElementCtx *c = vctx;
    const Op *op = c->op;
    int64_t lo, hi;
    split_range(c->n, chunk, chunks, &lo, &hi);
    const float *a = op->a, *b = op->b;
    float *out = op->out;
    switch (op->code) {
    case OP_ADD:
        for (int64_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
        break;
    case OP_SOFTCAP:
        for (int64_t i = lo; i < hi; i++) out[i] = op->floats.softcap.cap * tanhf(a[i] / op->floats.softcap.cap);
        break;
    case OP_GATED:
        for (int64_t i = lo; i < hi; i += 8)
            gated8(a + i, b ? b + i : NULL, out + i, hi - i < 8 ? hi - i : 8, (int)op->ints.gated.activation);
        break;
    case OP_SCALE:
        for (int64_t i = lo; i < hi; i++) out[i] = a[i] * op->floats.scale.factor;
        break;
    case OP_GATE: {
        int64_t dim = op->ints.sigmoid_gate.dim, per_row = op->ints.sigmoid_gate.gate_dim == 1;
        for (int64_t i = lo; i < hi; i += 8) { /* 8 at a time, through exp8 */
            int64_t n = hi - i < 8 ? hi - i : 8;
            v8f gate = {0}, x = {0};
            for (int64_t l = 0; l < n; l++) {
                gate[l] = a[per_row ? (i + l) / dim : i + l];
                x[l] = b[i + l];
            }
            v8f gated = x / (1.0f + exp8(-gate));
            memcpy(out + i, &gated, sizeof(float) * (size_t)n);
        }
        break;
    }
    }
}

static void elementwise(const Op *op, int64_t elements) {
    ElementCtx c = {op, elements};
    if (elements >= PARALLEL_ELEMENTS) pool_run(elementwise_task, &c);
    else elementwise_task(&c, 0, 1, 0);
}

/* -- attention: attention.c ------------------------------------------------------------ */

/* -- mixture of experts: routing ----------------------------------------------------------
 * Each token's `used` experts from its router logits (one per expert): the largest logits, in
 * falling order, ties to the lower expert number (a logit replaces a kept one only when
 * strictly larger). Their weights, order 0 (Qwen3-MoE): a softmax over all the logits, then
 * the chosen ones' probabilities, divided by their sum with `normalize`; order 1 (gpt-oss): a
 * softmax over the chosen logits only. Where b (one per expert) is given, each weight is then
 * multiplied by its expert's b. out (tokens, 2 * used): the experts' numbers (exact as
 * floats), then their weights. exp is exp8, sums in double: the same bits in every tier. */

static struct {
    int64_t *index;
    float *exps;
    int64_t capacity;
} routing;

static int route(const Op *op, const char **error) {
    int64_t T = op->ints.route.tokens, E = op->ints.route.experts, k = op->ints.route.used;
    if (E > routing.capacity) {
        if (grow((void **)&routing.index, sizeof(int64_t) * (size_t)E) || grow((void **)&routing.exps, sizeof(float) * (size_t)E)) {
            *error = "out of memory for the routing buffers";
            return -1;
        }
        routing.capacity = E;
    }
    int64_t *index = routing.index;
    float *exps = routing.exps;
    for (int64_t t = 0; t < T; t++) {
        const float *logits = op->a + t * E;
        float *out = op->out + t * 2 * k;
        int64_t kept = 0;
        for (int64_t e = 0; e < E; e++) { /* insertion into the kept ones, largest first */
            float v = logits[e] == logits[e] ? logits[e] : -INFINITY; /* a nan is never preferred */
#define KEY(i) (logits[index[i]] == logits[index[i]] ? logits[index[i]] : -INFINITY)
            if (kept == k && !(v > KEY(k - 1))) continue;
            int64_t at = kept < k ? kept++ : k - 1;
            for (; at > 0 && v > KEY(at - 1); at--) index[at] = index[at - 1];
            index[at] = e;
#undef KEY
        }
        double total = 0.0;
        if (op->ints.route.order == 1) { /* top k, then a softmax over them */
            float top = logits[index[0]];
            for (int64_t j = 0; j < k; j++) {
                float shifted = logits[index[j]] - top;
                exp_floats(&shifted, &exps[j], 1);
                total += exps[j];
            }
            for (int64_t j = 0; j < k; j++) out[k + j] = exps[j] / (float)total;
        } else { /* a softmax over every expert, then the top k's shares */
            float top = -INFINITY;
            for (int64_t e = 0; e < E; e++) top = logits[e] > top ? logits[e] : top;
            for (int64_t e = 0; e < E; e += 8) {
                int64_t n = E - e < 8 ? E - e : 8;
                float shifted[8];
                for (int64_t l = 0; l < n; l++) shifted[l] = logits[e + l] - top;
                exp_floats(shifted, exps + e, n);
                for (int64_t l = 0; l < n; l++) total += exps[e + l];
            }
            double chosen = 0.0;
            for (int64_t j = 0; j < k; j++) {
                out[k + j] = exps[index[j]] / (float)total;
                chosen += out[k + j];
            }
            if (op->ints.route.normalize)
                for (int64_t j = 0; j < k; j++) out[k + j] /= (float)chosen;
        }
        if (op->b)
            for (int64_t j = 0; j < k; j++) out[k + j] *= op->b[index[j]];
        for (int64_t j = 0; j < k; j++) out[j] = (float)index[j];
    }
    return 0;
}

/* -- mixture of experts: the experts' products ----------------------------------------------
 * x (T, D) through each token's chosen experts (b, from ROUTE in the same pass: the choice is
 * made here, per call, so a recorded pass replays it). Each token's k choices are gathered by
 * expert: row i of the gathered buffers is one (token, choice), the rows of one expert
 * consecutive, its tokens in order. Then, with the pool sharing (expert, row) units:
 *   1. gate and up: each row of the expert's two matrices read once for all its tokens, their
 *      codes (quantized once per token, copied to each of its gathered rows) dotted by
 *      dot_row_tokens, or, FLOAT_TOKENS tokens or more, the rows dequantized and multiplied
 *      with the float activations (float_product); Q4_K, Q5_K and Q6_K
 *      (type_decodes_int16) in int16 for any count of tokens (panels), as a LINEAR op does,
 *      from codes with a scale per WIDE values;
 *   2. per gathered row: the biases added, h = act(gate, up) (gated8), h quantized;
 *   3. down, as 1, from h: y (rows, D);
 *   4. per token: out = sum over its choices j, in order, of w_j * (y + down bias).
 * A stack of a row-tiled type (Matrix.source) is multiplied from its row tiles (row_tiles.c), made
 * expert by expert as each is first chosen, the expert's file blocks then let go (page_out).
 * An expert no token chose is not read. A token's arithmetic does not depend on the tokens
 * beside it while its experts' groups are under FLOAT_TOKENS (decode, batches, verification),
 * for the int16 types and row tiles at any count, nor on the thread count. */

static struct {
    int64_t *count, *start, *fill, *active; /* per expert; active: the chosen ones, ascending */
    int64_t *cost;                          /* per chosen one: the row costs (tokens + 2) before it */
    int64_t *token;                         /* gathered row -> token */
    int64_t *row_of;                        /* t * used + j -> gathered row */
    int16_t *xq, *hq;                       /* codes of the gathered x (rows, D) and h (rows, F) */
    float *xd, *xs, *hd, *hs;               /* their group scales and sums */
    float *xh, *hh;                         /* and their half-group sums (types with a min per half) */
    Codes8 *x8, *h8;                        /* their 8-bit codes (OWN8 types) */
    Codes xw, hw;                           /* their int16 codes per WIDE (type_decodes_int16) */
    float *xf;                              /* the gathered float x, where a product takes it */
    float *gate, *up, *y;                   /* (rows, F), (rows, F), (rows, D); gate becomes h */
    int64_t *fresh;                         /* the chosen experts of a stack whose tiles are not made yet */
} moe;
static int64_t moe_capacity[22];

static int moe_grow(int i, void **p, size_t bytes) {
    if ((int64_t)bytes <= moe_capacity[i]) return 0;
    if (grow(p, bytes) != 0) return -1;
    moe_capacity[i] = (int64_t)bytes;
    return 0;
}

typedef struct {
    const Op *op;
    int64_t T, D, F, E, k, rows, n_active;
    int wide; /* gate or up takes int16 codes per WIDE (moe.xw) */
} ExpertsCtx;

/* Rows r0 .. r1 - 1 of expert e's matrix in the stack `w` (R rows each, K columns) times its
 * n gathered rows from s: codes xq/xd/xs/xh, x8 or xw, or floats xf (rows of K), into out
 * (rows, R); from its row tiles (made: tile_chosen_experts) where the stack has them. */
static void expert_rows(const Matrix *w, int64_t e, int64_t R, int64_t r0, int64_t r1, int64_t s, int64_t n,
                        const int16_t *xq, const float *xd, const float *xs, const float *xh, const Codes8 *x8,
                        const Codes *xw, const float *xf, float *out, RowBuffer *buf) {
    int64_t K = w->cols, G = K / GROUP;
    const uint8_t *base = w->data + (size_t)(e * R) * w->row_bytes;
    out += s * R;
    if (tiled8(w->type)) { /* rows r0 .. r1 - 1: whole tiles (chunk_rows) */
        const int type = row_tiles_of(w->type);
        tile_runs(type, w->data + e * row_tiled_bytes(type, R, K), R, K, r0 / ROW_TILE, (r1 + ROW_TILE - 1) / ROW_TILE, n,
                  NULL, 0, NULL, NULL, x8 + s * codes8_blocks(K), out, R);
    } else if (tiled_span(w->type)) {
        const int type = row_tiles_of(w->type), wide = row_tile_span(type) == WIDE;
        const int16_t *q = wide ? (const int16_t *)xw->q : xq;
        const float *d = wide ? xw->d : xd, *sums = wide ? xw->xsum : xs;
        tile_runs(type, w->data + e * row_tiled_bytes(type, R, K), R, K, r0 / ROW_TILE, (r1 + ROW_TILE - 1) / ROW_TILE, n,
                  q + s * K, K, d + s * (K / row_tile_span(type)), sums + s * G, NULL, out, R);
    } else if (type_decodes_int16(w->type)) {
        const Matrix expert = {base, w->type, R, K, w->row_bytes};
        const Codes codes = {(int16_t *)xw->q + s * K, xw->d + s * (K / WIDE), xw->xsum + s * G, NULL, 0};
        panels(&expert, K, r0, r1, n, 0, &codes, buf, out, R);
    } else if (type_is_float(w->type)) {
        for (int64_t r = r0; r < r1; r++) {
            unpack_row(w->type, base + r * w->row_bytes, K, buf);
            dot_tokens(buf, xf + s * K, K, 0, n, out + r, R);
        }
    } else if (n >= FLOAT_TOKENS) { /* rows dequantized, float activations */
        float_panels(base, w->type, w->row_bytes, K, r0, r1, xf + s * K, 0, n, buf, out, R);
    } else { /* each row read once for the expert's few tokens */
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = base + r * w->row_bytes;
            for (int64_t t = 0; t < n; t += ROW_TOKENS) {
                int m = n - t < ROW_TOKENS ? (int)(n - t) : ROW_TOKENS;
                dot_row_tokens(w->type, row, K, xq + (s + t) * K, xd + (s + t) * G, xs + (s + t) * G,
                               xh + (s + t) * HALVES * G, x8 + (s + t) * codes8_blocks(K), buf->min, m, out + t * R + r, R);
            }
        }
    }
}

/* The rows r0 .. r1 - 1 of the i-th chosen expert (R rows) that chunk `chunk` of `chunks`
 * takes. The (expert, row) units are split by cost, a row costing its expert's tokens + 2 (its
 * read), so that the crowded experts of a prefill spread over the threads; which thread takes
 * a row changes nothing in its arithmetic. Where R is whole tiles the units are tiles of
 * ROW_TILE rows (row tiles are multiplied whole). */
static void chunk_rows(const ExpertsCtx *c, int64_t i, int64_t R, int chunk, int chunks, int64_t *r0, int64_t *r1) {
    const int64_t unit = R % ROW_TILE ? 1 : ROW_TILE, U = R / unit;
    int64_t lo, hi, w = moe.count[moe.active[i]] + 2, at = U * moe.cost[i];
    split_range(U * moe.cost[c->n_active], chunk, chunks, &lo, &hi);
    *r0 = lo <= at ? 0 : (lo - at + w - 1) / w; /* the units whose cost starts in [lo, hi) */
    *r1 = hi <= at ? 0 : (hi - at + w - 1) / w;
    *r0 = (*r0 < U ? *r0 : U) * unit;
    *r1 = (*r1 < U ? *r1 : U) * unit;
}

#define FOR_EXPERT_ROWS(c, R, chunk, chunks)                                         \
    for (int64_t i_ = 0, e, r0, r1; i_ < (c)->n_active; i_++)                       \
        if (e = moe.active[i_], chunk_rows(c, i_, R, chunk, chunks, &r0, &r1), r0 < r1)

static void gate_up_task(void *vctx, int chunk, int chunks, int thread) {
    const ExpertsCtx *c = vctx;
    const Op *op = c->op;
    RowBuffer *buf = scratch_row(thread);
    FOR_EXPERT_ROWS(c, c->F, chunk, chunks) {
        int64_t s = moe.start[e], n = moe.count[e];
        expert_rows(&op->mats[0], e, c->F, r0, r1, s, n, moe.xq, moe.xd, moe.xs, moe.xh, moe.x8, &moe.xw, moe.xf, moe.gate,
                    buf);
        expert_rows(&op->mats[1], e, c->F, r0, r1, s, n, moe.xq, moe.xd, moe.xs, moe.xh, moe.x8, &moe.xw, moe.xf, moe.up,
                    buf);
    }
}

static void down_task(void *vctx, int chunk, int chunks, int thread) {
    const ExpertsCtx *c = vctx;
    const Op *op = c->op;
    RowBuffer *buf = scratch_row(thread);
    FOR_EXPERT_ROWS(c, c->D, chunk, chunks) {
        int64_t s = moe.start[e], n = moe.count[e];
        expert_rows(&op->mats[2], e, c->D, r0, r1, s, n, moe.hq, moe.hd, moe.hs, moe.hh, moe.h8, &moe.hw, moe.gate, moe.y,
                    buf);
    }
}

/* gathered rows: the biases, the activation, h's codes where the down product takes them */
static void activation_task(void *vctx, int chunk, int chunks, int thread) {
    const ExpertsCtx *c = vctx;
    const Op *op = c->op;
    int64_t lo, hi, F = c->F, G = F / GROUP;
    split_range(c->rows, chunk, chunks, &lo, &hi);
    const int t2 = op->mats[2].type, codes8 = type_takes_codes8(t2), codes = type_takes_codes16(t2), tiled_codes8 = tiled8(t2);
    const int tiled = tiled_span(t2) == GROUP, wide = type_decodes_int16(t2) || tiled_span(t2) == WIDE;
    for (int64_t i = lo; i < hi; i++) {
        int64_t e = (int64_t)op->b[moe.token[i] * 2 * c->k + moe.token[c->rows + i]]; /* its expert */
        float *g = moe.gate + i * F, *u = moe.up + i * F;
        if (op->bias[0])
            for (int64_t r = 0; r < F; r++) g[r] += op->bias[0][e * F + r];
        if (op->bias[1])
            for (int64_t r = 0; r < F; r++) u[r] += op->bias[1][e * F + r];
        for (int64_t r = 0; r < F; r += 8) gated8(g + r, u + r, g + r, F - r < 8 ? F - r : 8, (int)op->ints.experts.activation);
        if ((codes && moe.count[e] < FLOAT_TOKENS) || tiled)
            quantize_row(g, F, GROUP, moe.hq + i * F, moe.hd + i * G, moe.hs + i * G, moe.hh + i * HALVES * G);
        if ((codes8 && moe.count[e] < FLOAT_TOKENS) || tiled_codes8) quantize_row8(g, F, moe.h8 + i * codes8_blocks(F));
        if (wide)
            quantize_row(g, F, WIDE, (int16_t *)moe.hw.q + i * F, moe.hw.d + i * (F / WIDE), moe.hw.xsum + i * G,
                         moe.hw.xhalf + i * HALVES * G);
    }
}

static void combine_task(void *vctx, int chunk, int chunks, int thread) {
    const ExpertsCtx *c = vctx;
    const Op *op = c->op;
    int64_t lo, hi, D = c->D, k = c->k;
    split_range(c->T, chunk, chunks, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        float *out = op->out + t * D;
        memset(out, 0, sizeof(float) * (size_t)D);
        for (int64_t j = 0; j < k; j++) {
            int64_t e = (int64_t)op->b[t * 2 * k + j], i = moe.row_of[t * k + j];
            float w = op->b[t * 2 * k + k + j];
            const float *y = moe.y + i * D, *bias = op->bias[2] ? op->bias[2] + e * D : NULL;
            if (bias)
                for (int64_t d = 0; d < D; d++) out[d] += w * (y[d] + bias[d]);
            else
                for (int64_t d = 0; d < D; d++) out[d] += w * y[d];
        }
    }
}

/* the gathered x of chunk `chunk`: codes and floats copied from each row's token */
static void gather_task(void *vctx, int chunk, int chunks, int thread) {
    const ExpertsCtx *c = vctx;
    int64_t lo, hi, D = c->D, G = D / GROUP;
    split_range(c->rows, chunk, chunks, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        int64_t t = moe.token[i];
        if (moe.xq) {
            memcpy(moe.xq + i * D, (int16_t *)shared.group.q + t * D, sizeof(int16_t) * (size_t)D);
            memcpy(moe.xd + i * G, shared.group.d + t * G, sizeof(float) * (size_t)G);
            memcpy(moe.xs + i * G, shared.group.xsum + t * G, sizeof(float) * (size_t)G);
            memcpy(moe.xh + i * HALVES * G, shared.group.xhalf + t * HALVES * G, sizeof(float) * (size_t)(HALVES * G));
        }
        if (moe.x8) memcpy(moe.x8 + i * codes8_blocks(D), shared.q8 + t * codes8_blocks(D), sizeof(Codes8) * (size_t)codes8_blocks(D));
        if (c->wide) {
            memcpy((int16_t *)moe.xw.q + i * D, (int16_t *)shared.wide.q + t * D, sizeof(int16_t) * (size_t)D);
            memcpy(moe.xw.d + i * (D / WIDE), shared.wide.d + t * (D / WIDE), sizeof(float) * (size_t)(D / WIDE));
            memcpy(moe.xw.xsum + i * G, shared.wide.xsum + t * G, sizeof(float) * (size_t)G);
        }
        if (moe.xf) memcpy(moe.xf + i * D, c->op->a + t * D, sizeof(float) * (size_t)D);
    }
}

/* The chosen experts of a stack tiled expert by expert (Matrix.source) whose tiles are not made
 * yet (moe.fresh, n of them, R rows each): a chunk's share of their tiles */
typedef struct {
    const Matrix *w;
    int64_t R, n;
} StackTiling;

static void stack_tiling_task(void *vctx, int chunk, int chunks, int thread) {
    const StackTiling *c = vctx;
    const int type = row_tiles_of(c->w->type);
    const int64_t per = c->R / ROW_TILE, K = c->w->cols, bytes = row_tiled_bytes(type, c->R, K);
    int64_t lo, hi;
    (void)thread;
    split_range(c->n * per, chunk, chunks, &lo, &hi);
    for (int64_t u = lo; u < hi;) { /* tiles u .. of the list's experts in turn */
        const int64_t i = u / per, e = moe.fresh[i], t1 = hi - i * per < per ? hi - i * per : per;
        row_tile_matrix(type, c->w->source + (size_t)(e * c->R) * c->w->row_bytes, c->R, K, u - i * per, t1,
                        (uint8_t *)c->w->data + e * bytes);
        u = i * per + t1;
    }
}

/* A stack's chosen experts get their tiles where they have none yet (made by the pool), and
 * their file blocks are let go: nothing reads them again. */
static void tile_chosen_experts(const Matrix *w, int64_t R, const ExpertsCtx *c) {
    StackTiling tiling = {w, R, 0};
    for (int64_t i = 0; i < c->n_active; i++)
        if (!w->ready[moe.active[i]]) moe.fresh[tiling.n++] = moe.active[i];
    if (!tiling.n) return;
    pool_run(stack_tiling_task, &tiling);
    for (int64_t i = 0; i < tiling.n; i++) {
        w->ready[moe.fresh[i]] = 1;
        page_out(w->source + (size_t)(moe.fresh[i] * R) * w->row_bytes, R * (int64_t)w->row_bytes, w->file_backed);
    }
}

static int experts(const Op *op, const char **error) {
    ExpertsCtx c = {op, op->ints.experts.tokens, op->mats[0].cols, op->ints.experts.ffn, op->ints.experts.experts,
                    op->ints.experts.used, 0, 0, 0};
    int64_t T = c.T, D = c.D, F = c.F, E = c.E, k = c.k, rows = T * k;
    c.rows = rows;
    size_t i64 = sizeof(int64_t);
    if (moe_grow(0, (void **)&moe.count, i64 * (size_t)E) || moe_grow(1, (void **)&moe.start, i64 * (size_t)E) ||
        moe_grow(2, (void **)&moe.fill, i64 * (size_t)E) || moe_grow(3, (void **)&moe.active, i64 * (size_t)E) ||
        moe_grow(4, (void **)&moe.token, 2 * i64 * (size_t)rows) || moe_grow(5, (void **)&moe.row_of, i64 * (size_t)rows) ||
        moe_grow(6, (void **)&moe.gate, sizeof(float) * (size_t)(rows * F)) ||
        moe_grow(7, (void **)&moe.up, sizeof(float) * (size_t)(rows * F)) ||
        moe_grow(8, (void **)&moe.y, sizeof(float) * (size_t)(rows * D)) ||
        moe_grow(16, (void **)&moe.cost, i64 * (size_t)(E + 1)) || moe_grow(21, (void **)&moe.fresh, i64 * (size_t)E))
        goto out_of_memory;
    /* the choices, counted by expert */
    memset(moe.count, 0, i64 * (size_t)E);
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            float f = op->b[t * 2 * k + j];
            if (!(f >= 0.0f && f < (float)E) || f != (float)(int64_t)f) {
                *error = "an expert's number is not one of the layer's experts";
                return -1;
            }
            moe.count[(int64_t)f]++;
        }
    int big = 0, small = 0;
    moe.cost[0] = 0;
    for (int64_t e = 0, at = 0; e < E; e++) {
        moe.start[e] = at;
        moe.fill[e] = 0;
        at += moe.count[e];
        if (moe.count[e]) {
            moe.cost[c.n_active + 1] = (c.n_active ? moe.cost[c.n_active] : 0) + moe.count[e] + 2;
            moe.active[c.n_active++] = e;
        }
        big |= moe.count[e] >= FLOAT_TOKENS;
        small |= moe.count[e] > 0 && moe.count[e] < FLOAT_TOKENS;
    }
    /* gathered rows: token[i] its token, token[rows + i] its choice j */
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = (int64_t)op->b[t * 2 * k + j], i = moe.start[e] + moe.fill[e]++;
            moe.token[i] = t;
            moe.token[rows + i] = j;
            moe.row_of[t * k + j] = i;
        }
    for (int m = 0; m < 3; m++)
        if (op->mats[m].source) tile_chosen_experts(&op->mats[m], m == 2 ? D : F, &c);
    const int t0 = op->mats[0].type, t1 = op->mats[1].type, t2 = op->mats[2].type;
    int up_codes8 = type_takes_codes8(t0) || type_takes_codes8(t1);
    int up_codes16 = type_takes_codes16(t0) || type_takes_codes16(t1);
    int up_floats = type_is_float(t0) || type_is_float(t1);
    int codes = (up_codes16 && small) || tiled_span(t0) == GROUP || tiled_span(t1) == GROUP;
    int codes8 = (up_codes8 && small) || tiled8(t0) || tiled8(t1);
    int floats = up_floats || ((up_codes16 || up_codes8) && big);
    c.wide = type_decodes_int16(t0) || type_decodes_int16(t1) || tiled_span(t0) == WIDE || tiled_span(t1) == WIDE;
    int64_t G = D / GROUP, H = F / GROUP;
    if (codes && (moe_grow(9, (void **)&moe.xq, sizeof(int16_t) * (size_t)(rows * D)) ||
                  moe_grow(10, (void **)&moe.xd, sizeof(float) * (size_t)(rows * G + 1)) ||
                  moe_grow(11, (void **)&moe.xs, sizeof(float) * (size_t)(rows * G + 1)) ||
                  moe_grow(17, (void **)&moe.xh, sizeof(float) * (size_t)(rows * HALVES * G + 1))))
        goto out_of_memory;
    if (codes8 && moe_grow(19, (void **)&moe.x8, sizeof(Codes8) * (size_t)(rows * codes8_blocks(D) + 1))) goto out_of_memory;
    if (c.wide && reserve_codes(&moe.xw, rows * D, sizeof(int16_t), 1)) goto out_of_memory;
    if ((type_decodes_int16(t2) || tiled_span(t2) == WIDE) && reserve_codes(&moe.hw, rows * F, sizeof(int16_t), 1))
        goto out_of_memory;
    if (floats && moe_grow(12, (void **)&moe.xf, sizeof(float) * (size_t)(rows * D))) goto out_of_memory;
    if ((type_takes_codes16(t2) || tiled_span(t2) == GROUP) &&
        (moe_grow(13, (void **)&moe.hq, sizeof(int16_t) * (size_t)(rows * F)) ||
         moe_grow(14, (void **)&moe.hd, sizeof(float) * (size_t)(rows * H + 1)) ||
         moe_grow(15, (void **)&moe.hs, sizeof(float) * (size_t)(rows * H + 1)) ||
         moe_grow(18, (void **)&moe.hh, sizeof(float) * (size_t)(rows * HALVES * H + 1))))
        goto out_of_memory;
    if ((type_takes_codes8(t2) || tiled8(t2)) && moe_grow(20, (void **)&moe.h8, sizeof(Codes8) * (size_t)(rows * codes8_blocks(F) + 1)))
        goto out_of_memory;
    if (scratch_reserve(D > F ? D : F, 0) != 0 || reserve_acts(&shared, T, D, codes, c.wide, 0, codes8, 0, 0) != 0) goto out_of_memory;
    /* x quantized once per token, then gathered */
    LinearCtx q = {.op = op, .T = T, .K = D, .codes = codes, .codes8 = codes8, .wide = c.wide};
    if (codes || codes8 || c.wide) {
        if (T > 1) pool_run(quantize_task, &q);
        else quantize_task(&q, 0, 1, 0);
    }
    int16_t *xq = moe.xq;
    Codes8 *x8 = moe.x8;
    float *xf = moe.xf;
    if (!codes) moe.xq = NULL; /* gather_task copies what is asked */
    if (!codes8) moe.x8 = NULL;
    if (!floats) moe.xf = NULL;
    if (rows > 16) pool_run(gather_task, &c);
    else gather_task(&c, 0, 1, 0);
    pool_run(gate_up_task, &c);
    if (rows * F >= PARALLEL_ELEMENTS) pool_run(activation_task, &c);
    else activation_task(&c, 0, 1, 0);
    pool_run(down_task, &c);
    if (T * D >= PARALLEL_ELEMENTS) pool_run(combine_task, &c);
    else combine_task(&c, 0, 1, 0);
    moe.x8 = x8;
    moe.xq = xq;
    moe.xf = xf;
    return 0;
out_of_memory:
    *error = "out of memory for the experts' buffers";
    return -1;
}

/* -- columns: a part of each row (Gemma 4's per-layer inputs, cut from one product) -------- */

static void columns(const Op *op) {
    int64_t rows = op->ints.columns.rows, cols = op->ints.columns.cols;
    int64_t start = op->ints.columns.start, count = op->ints.columns.count;
    for (int64_t r = 0; r < rows; r++) memcpy(op->out + r * count, op->a + r * cols + start, sizeof(float) * (size_t)count);
}

int exec_op(const Op *op, const char **error) {
    switch (op->code) {
    case OP_EMBED: return embed(op, error);
    case OP_LINEAR: return linear(op, error);
    case OP_RMSNORM: rms_norm(op); return 0;
    case OP_LAYERNORM: layer_norm(op); return 0;
    case OP_SCALE: elementwise(op, op->ints.scale.elements); return 0;
    case OP_ROPE:
        if (op->ints.rope.rope_dim / 2 > 4096) {
            *error = "the RoPE dimension is too large";
            return -1;
        }
        return rope(op, error);
    case OP_ATTN: return attention(op, error);
    case OP_GATED: elementwise(op, op->ints.gated.elements); return 0;
    case OP_ADD: elementwise(op, op->ints.add.elements); return 0;
    case OP_SOFTCAP: elementwise(op, op->ints.softcap.elements); return 0;
    case OP_ROUTE: return route(op, error);
    case OP_EXPERTS: return experts(op, error);
    case OP_COLUMNS: columns(op); return 0;
    case OP_SHORTCONV: return short_conv(op, error);
    case OP_DELTANET: return delta_net(op, error);
    case OP_GATE: elementwise(op, op->ints.sigmoid_gate.rows * op->ints.sigmoid_gate.dim); return 0;
    default: *error = "unknown op"; return -1;
    }
}

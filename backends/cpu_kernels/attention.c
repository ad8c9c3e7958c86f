/* Attention over the KV cache, stored as float32, float16 or Q8_0 (backends/kv_types.py),
 * blocked over positions with an online softmax (as flash attention), so that the scratch
 * memory does not grow with the context.
 *
 * q (T, H, Dh), k (T, Hkv, Dh), v (T, Hkv, Dv) at positions pos .. pos+T-1 (T tokens, H
 * heads, Hkv kv_heads, Dh head_dim, Dv value_dim; window 0: none; softcap 0: none). Keys and
 * values are written into the layer's cache first, rounded to its type; each (token, head)
 * then attends to positions max(0, p - window + 1) .. p, or, not causal (an embedding model's
 * bidirectional attention, never on a ring), to every position of the pass and before within
 * the window on either side, max(0, p - window + 1) .. min(pos + T - 1, p + window - 1); with
 * sinks (d, one logit per query head) each softmax has one more term in its denominator.
 *
 * A full layer's cache holds position p at row p of each KV head: keys (Hkv, slots) rows of
 * kv_row_bytes(Dh) bytes. A ring (a sliding-window layer that keeps only its window) is
 * mirrored: (Hkv, 2 * slots) rows, position p at rows p % slots and p % slots + slots, so
 * that any `slots` consecutive positions lie in consecutive rows:
 *
 *     row:      0 1 2 3 4 | 5 6 7 8 9          slots = 5, after positions 0 .. 11
 *     position: 10 11 7 8 9 | 10 11 7 8 9     positions 7 .. 11 are rows 2 .. 6
 *
 * Positions lo .. hi of a pass (lo the first that its first query reads) then lie at rows
 * from lo - base on, base = lo - lo % slots (0 for a full layer). A pass may not write more
 * than slots - window + 1 positions: its first query's window would be overwritten.
 *
 * The numbers. Positions are cut into blocks of KV_BLOCK and spans of KV_SPAN, both counted
 * from position 0, so where a row's sums are cut depends only on its own positions, never
 * on the other rows of its pass, the ring or the thread count. A score is q . k in fused
 * multiply-adds in order of the dimension, from 0. Within a span, block by block, a row
 * keeps the running maximum m of its scores, the sum l of exp(s - m) and the sum a of
 * exp(s - m) v, rescaled by exp(m_old - m_new) when a block raises the maximum: a in fused
 * multiply-adds in position order; l plus each block's terms, those summed in 8 lanes (lane
 * e: the row's positions first + e, first + 8 + e, ... of the block) and then reduce8.
 * Spans are then merged in order: (M, L, A) with (m, l, a) gives max(M, m), L e^(M - top) +
 * l e^(m - top) and A e^(M - top) + a e^(m - top). The result is A / L (a sink joins as one
 * more term of L). A block's keys and values are widened to float32 in the thread's scratch
 * (float16 and Q8_0 values are exact in float32; float32 keys are copied): the keys as
 * columns (Dh, KV_BLOCK), the values as rows (KV_BLOCK, Dv). Only fma8, fmaf, exp8 and plain
 * C touch the floats, so every tier gives the same bits.
 *
 * The work. The query rows are ordered (KV head, token, head of the group) and taken
 * ATTN_ROWS of one KV head at a time (a row group: each block of keys is widened once for
 * all of them). Within a block, the rows that see some of it go TILE_ROWS at a time: their
 * scores as a register tile of TILE_ROWS rows x 16 keys (each query value broadcast against
 * two vectors of a key column row), then their sums a as tiles of TILE_ROWS rows x 16 value
 * dimensions (each weight broadcast against two vectors of a value row) over the positions
 * all of the tile's rows see, the positions before and after those one row at a time: every
 * row does what it would do alone. Threads take row groups; when there are too few of them
 * to keep the threads busy (decoding), they take (row group, span) pairs instead, each
 * writing its span's (m, l, a) for a second pass to merge in order: the same operations, so
 * the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytes.h"
#include "ops.h"
#include "simd.h"

#define ATTN_ROWS 32
#define KV_BLOCK 64                /* positions widened and scored at once */
#define KV_SPAN (16 * KV_BLOCK)    /* positions of one partial softmax */
#define TILE_ROWS 4                /* query rows of a register tile */
#define Q8_VALUES 32
#define Q8_BYTES 34                /* a float16 scale, then 32 int8 codes (GGUF's Q8_0) */
#define SPLIT_FLOATS (16 << 20)    /* the most partial results a split pass keeps */

/* -- the KV types ------------------------------------------------------------------------ */

int64_t kv_row_bytes(int64_t type, int64_t dim) {
    return type == KV_F32 ? 4 * dim : type == KV_F16 ? 2 * dim : dim / Q8_VALUES * Q8_BYTES;
}

static inline uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* float32 to float16, rounded to nearest even, with no subnormal float32 on the way (so a
 * flush-to-zero mode cannot change it): the FP16 library's method, as ggml's fallback. */
static uint16_t half_of(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = bits_of(f), shl1_w = w + w, sign = w & 0x80000000u, bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = float_of((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = bits_of(base), nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

#if !defined(__F16C__)
typedef uint32_t v8u __attribute__((vector_size(32)));

/* 8 float16 values as float32 (exact, as F16C's widen_half8; no subnormal float32 on the way) */
static inline v8f widen_half8(const unsigned char *src) {
    uint16_t h[8];
    memcpy(h, src, sizeof h);
    v8u w = {h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]};
    w <<= 16;
    v8u two_w = w + w, sign = w & 0x80000000u;
    v8f normal = (v8f)((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    v8f subnormal = (v8f)((two_w >> 17) | (126u << 23)) - 0.5f;
    v8u small = (v8u)(two_w < (1u << 27));
    return (v8f)(sign | (((v8u)subnormal & small) | ((v8u)normal & ~small)));
}
#endif

/* one row of dim floats into the cache as `type` (Q8_0: as llama.cpp's quantize_row_q8_0_ref) */
static void store_row(int64_t type, const float *x, int64_t dim, unsigned char *dst) {
    if (type == KV_F32) {
        memcpy(dst, x, sizeof(float) * (size_t)dim);
        return;
    }
    if (type == KV_F16) {
        for (int64_t i = 0; i < dim; i++) {
            uint16_t h = half_of(x[i]);
            memcpy(dst + 2 * i, &h, sizeof h);
        }
        return;
    }
    for (int64_t b = 0; b < dim / Q8_VALUES; b++) {
        const float *xb = x + b * Q8_VALUES;
        unsigned char *block = dst + b * Q8_BYTES;
        float amax = 0.0f;
        for (int j = 0; j < Q8_VALUES; j++) amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t h = half_of(d);
        memcpy(block, &h, sizeof h);
        for (int j = 0; j < Q8_VALUES; j++) block[2 + j] = (unsigned char)(int8_t)roundf(xb[j] * id);
    }
}

/* 8 values of a cached row from value d on (d + 8 <= dim; Q8_0 rows: whole blocks), as float32 (exact) */
static inline v8f row8(int64_t type, const unsigned char *row, int64_t d) {
    v8f x;
    if (type == KV_F16) return widen_half8(row + 2 * d);
    if (type == KV_Q8_0) { /* code times scale, exact (8 + 11 bits) */
        const unsigned char *block = row + d / Q8_VALUES * Q8_BYTES;
        return widen8((const int8_t *)block + 2 + d % Q8_VALUES) * f16(block);
    }
    memcpy(&x, row + 4 * d, sizeof x);
    return x;
}

/* value d of a cached float32 or float16 row (the last dim % 8; Q8_0 rows are whole blocks) */
static inline float row1(int64_t type, const unsigned char *row, int64_t d) {
    float x;
    if (type == KV_F16) return f16(row + 2 * d);
    memcpy(&x, row + 4 * d, sizeof x);
    return x;
}

/* n rows of dim values stored as `type` from src, as float32 rows into dst (exact) */
static inline __attribute__((always_inline)) void widen_rows_as(int64_t type, const unsigned char *src, int64_t n, int64_t dim,
                                                                float *dst) {
    int64_t row_bytes = kv_row_bytes(type, dim);
    for (int64_t j = 0; j < n; j++) {
        int64_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            v8f x = row8(type, src + j * row_bytes, d);
            memcpy(dst + j * dim + d, &x, sizeof x);
        }
        for (; d < dim; d++) dst[j * dim + d] = row1(type, src + j * row_bytes, d);
    }
}

/* x[i][k] <-> x[k][i]: an 8 x 8 block transposed (moves only) */
static inline void transpose8(v8f x[8]) {
    v8f t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = __builtin_shufflevector(x[i], x[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
        t[i + 1] = __builtin_shufflevector(x[i], x[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int i = 0; i < 8; i += 4)
        for (int h = 0; h < 2; h++) {
            u[i + 2 * h] = __builtin_shufflevector(t[i + h], t[i + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            u[i + 2 * h + 1] = __builtin_shufflevector(t[i + h], t[i + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    for (int k = 0; k < 4; k++) {
        x[k] = __builtin_shufflevector(u[k], u[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
        x[k + 4] = __builtin_shufflevector(u[k], u[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    }
}

/* n rows of dim values stored as `type` from src, as float32 columns of dst (dim, KV_BLOCK):
 * dst[d * KV_BLOCK + j] is value d of row j (exact); columns n .. up to a multiple of 16 are 0 */
static inline __attribute__((always_inline)) void widen_columns_as(int64_t type, const unsigned char *src, int64_t n,
                                                                   int64_t dim, float *dst) {
    int64_t row_bytes = kv_row_bytes(type, dim), cols = (n + 15) / 16 * 16;
    for (int64_t j0 = 0; j0 < cols; j0 += 8) {
        int64_t d = 0;
        for (; d + 8 <= dim; d += 8) {
            v8f x[8];
            for (int i = 0; i < 8; i++) x[i] = j0 + i < n ? row8(type, src + (j0 + i) * row_bytes, d) : (v8f){0};
            transpose8(x);
            for (int k = 0; k < 8; k++) memcpy(dst + (d + k) * KV_BLOCK + j0, &x[k], sizeof x[k]);
        }
        for (; d < dim; d++)
            for (int i = 0; i < 8; i++) dst[d * KV_BLOCK + j0 + i] = j0 + i < n ? row1(type, src + (j0 + i) * row_bytes, d) : 0.0f;
    }
}

/* widen_rows_as and widen_columns_as, each type its own copy */
static void widen_rows(int64_t type, const unsigned char *src, int64_t n, int64_t dim, float *dst) {
    if (type == KV_F16) widen_rows_as(KV_F16, src, n, dim, dst);
    else widen_rows_as(KV_Q8_0, src, n, dim, dst);
}

static void widen_columns(int64_t type, const unsigned char *src, int64_t n, int64_t dim, float *dst) {
    if (type == KV_F16) widen_columns_as(KV_F16, src, n, dim, dst);
    else if (type == KV_Q8_0) widen_columns_as(KV_Q8_0, src, n, dim, dst);
    else widen_columns_as(KV_F32, src, n, dim, dst);
}

/* -- one row group over one span ----------------------------------------------------------- */

typedef struct {
    const float *q, *sink; /* the head's sink logit, or NULL */
    float *out;
    int64_t first, last; /* the first and last position the query sees */
} AttnRow;

typedef struct {
    const Op *op;
    int64_t T, H, Hkv, Dh, Dv, N, base, per_kv, groups_per_kv, groups, span_lo, spans;
    float *partials; /* split passes: per (group, span, row) m, l and a (Dv) */
} AttnCtx;

/* The rows of row group g (at most ATTN_ROWS), their KV head and how many. */
static int group_rows(const AttnCtx *c, int64_t g, AttnRow *rows, int64_t *kv) {
    const Op *op = c->op;
    int64_t window = op->ints.attention.window, group = c->H / c->Hkv;
    *kv = g / c->groups_per_kv;
    int64_t lo = (g % c->groups_per_kv) * ATTN_ROWS, hi = lo + ATTN_ROWS < c->per_kv ? lo + ATTN_ROWS : c->per_kv;
    for (int64_t item = lo; item < hi; item++) {
        int64_t t = item / group, h = *kv * group + item % group, p = *op->pos + t;
        AttnRow *row = &rows[item - lo];
        row->q = op->a + (t * c->H + h) * c->Dh;
        row->sink = op->d ? op->d + h : NULL;
        row->out = op->out + (t * c->H + h) * c->Dv;
        row->first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        row->last = p;
        if (!op->ints.attention.causal) { /* every position of the pass, within the window on either side */
            row->last = *op->pos + c->T - 1;
            if (window > 0 && p + window - 1 < row->last) row->last = p + window - 1;
        }
    }
    return (int)(hi - lo);
}

/* Scores of R rows (R <= TILE_ROWS; their queries q[r]) with the 16 keys of columns j0 ..
 * j0 + 15 of keys (Dh, KV_BLOCK): s[r][j] = q[r] . key j, fused multiply-adds in order of d. */
static inline __attribute__((always_inline)) void score_tile(const float *const *q, int R, const float *keys, int64_t Dh,
                                                             int64_t j0, float *const *s) {
    v8f acc[TILE_ROWS][2] = {{{0}}};
    for (int64_t d = 0; d < Dh; d++) {
        v8f k[2];
        for (int c = 0; c < 2; c++) memcpy(&k[c], keys + d * KV_BLOCK + j0 + 8 * c, sizeof k[c]);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < 2; c++) acc[r][c] = fma8(splat8(q[r][d]), k[c], acc[r][c]);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < 2; c++) memcpy(s[r] + j0 + 8 * c, &acc[r][c], sizeof acc[r][c]);
}

/* a[r][d] += w[r][j] * values[j][d] for R rows (R <= TILE_ROWS), j = j0 .. j1 in order, fused,
 * value dimensions d0 .. d0 + 8 C - 1 (values: rows of Dv) */
static inline __attribute__((always_inline)) void value_tile(float *const *a, const float *const *w, int R, int C, int64_t j0,
                                                             int64_t j1, const float *values, int64_t Dv, int64_t d0) {
    v8f acc[TILE_ROWS][2];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) memcpy(&acc[r][c], a[r] + d0 + 8 * c, sizeof acc[r][c]);
    for (int64_t j = j0; j <= j1; j++) {
        v8f v[2];
        for (int c = 0; c < C; c++) memcpy(&v[c], values + j * Dv + d0 + 8 * c, sizeof v[c]);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) acc[r][c] = fma8(splat8(w[r][j]), v[c], acc[r][c]);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) memcpy(a[r] + d0 + 8 * c, &acc[r][c], sizeof acc[r][c]);
}

/* value_tile over all Dv value dimensions (the last Dv % 8 one fmaf at a time, as fma8 rounds) */
static inline __attribute__((always_inline)) void value_rows(float *const *a, const float *const *w, int R, int64_t j0,
                                                             int64_t j1, const float *values, int64_t Dv) {
    int64_t d = 0;
    for (; d + 16 <= Dv; d += 16) value_tile(a, w, R, 2, j0, j1, values, Dv, d);
    for (; d + 8 <= Dv; d += 8) value_tile(a, w, R, 1, j0, j1, values, Dv, d);
    for (; d < Dv; d++)
        for (int r = 0; r < R; r++)
            for (int64_t j = j0; j <= j1; j++) a[r][d] = fmaf(w[r][j], values[j * Dv + d], a[r][d]);
}

/* The tiles above for R = 1 .. TILE_ROWS rows, each R its own unrolled copy. */
static void scores_of(const float *const *q, int R, const float *keys, int64_t Dh, int64_t j0, float *const *s) {
    switch (R) {
    case 1: score_tile(q, 1, keys, Dh, j0, s); break;
    case 2: score_tile(q, 2, keys, Dh, j0, s); break;
    case 3: score_tile(q, 3, keys, Dh, j0, s); break;
    default: score_tile(q, TILE_ROWS, keys, Dh, j0, s);
    }
}

static void values_of(float *const *a, const float *const *w, int R, int64_t j0, int64_t j1, const float *values, int64_t Dv) {
    if (j0 > j1) return;
    switch (R) {
    case 1: value_rows(a, w, 1, j0, j1, values, Dv); break;
    case 2: value_rows(a, w, 2, j0, j1, values, Dv); break;
    case 3: value_rows(a, w, 3, j0, j1, values, Dv); break;
    default: value_rows(a, w, TILE_ROWS, j0, j1, values, Dv);
    }
}

/* Rows `rows` (n, of KV head kv) over their positions in span `span`: each row's (m, l, a)
 * into m[r], l[r] and a + r * Dv (l 0: the row sees none of the span). */
static void attend_span(const AttnCtx *c, const AttnRow *rows, int n, int64_t kv, int64_t span, int thread, float *m,
                        float *l, float *a) {
    const Op *op = c->op;
    int64_t Dh = c->Dh, Dv = c->Dv, type = op->ints.attention.kv_type;
    int64_t key_bytes = kv_row_bytes(type, Dh), value_bytes = kv_row_bytes(type, Dv);
    float scale = op->floats.attention.scale, cap = op->floats.attention.softcap;
    float *keys = scratch_floats(thread), *values_buf = keys + KV_BLOCK * Dh;
    float *scores = values_buf + KV_BLOCK * Dv; /* (ATTN_ROWS, KV_BLOCK) */
    const unsigned char *kcache = op->kcache + kv * c->N * key_bytes, *vcache = op->vcache + kv * c->N * value_bytes;
    int64_t lo = span * KV_SPAN, hi = lo + KV_SPAN - 1, from = hi + 1, to = lo - 1;
    for (int r = 0; r < n; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(a + r * Dv, 0, sizeof(float) * (size_t)Dv);
        from = rows[r].first < from ? rows[r].first : from;
        to = rows[r].last > to ? rows[r].last : to;
    }
    from = from > lo ? from : lo;
    to = to < hi ? to : hi;
    for (int64_t block = from - from % KV_BLOCK; block <= to; block += KV_BLOCK) {
        int64_t b0 = block > from ? block : from, b1 = block + KV_BLOCK - 1 < to ? block + KV_BLOCK - 1 : to;
        int64_t count = b1 - b0 + 1, row0 = b0 - c->base;
        int64_t first[ATTN_ROWS], last[ATTN_ROWS]; /* the columns (from b0) each row sees */
        const float *q[ATTN_ROWS], *w[ATTN_ROWS];
        float *s[ATTN_ROWS], *acc[ATTN_ROWS];
        int seen = 0, row[ATTN_ROWS]; /* the rows that see some of the block, in order */
        for (int r = 0; r < n; r++) {
            first[seen] = (rows[r].first > b0 ? rows[r].first : b0) - b0;
            last[seen] = (rows[r].last < b1 ? rows[r].last : b1) - b0;
            if (first[seen] > last[seen]) continue;
            row[seen] = r;
            q[seen] = rows[r].q;
            w[seen] = s[seen] = scores + r * KV_BLOCK;
            acc[seen++] = a + r * Dv;
        }
        if (!seen) continue;
        const float *values = (const float *)(vcache + row0 * value_bytes);
        widen_columns(type, kcache + row0 * key_bytes, count, Dh, keys);
        if (type != KV_F32) {
            widen_rows(type, vcache + row0 * value_bytes, count, Dv, values_buf);
            values = values_buf;
        }
        for (int t = 0; t < seen; t += TILE_ROWS) { /* the scores, in tiles of rows x 16 keys */
            int R = seen - t < TILE_ROWS ? seen - t : TILE_ROWS;
            int64_t j0 = first[t], j1 = last[t];
            for (int r = t + 1; r < t + R; r++) {
                j0 = first[r] < j0 ? first[r] : j0;
                j1 = last[r] > j1 ? last[r] : j1;
            }
            for (int64_t j = j0 - j0 % 16; j <= j1; j += 16) scores_of(q + t, R, keys, Dh, j, s + t);
        }
        const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
        for (int i = 0; i < seen; i++) { /* each row's terms, 8 columns at a time from its first */
            int r = row[i];
            v8f top8 = splat8(-INFINITY), sum = {0};
            for (int64_t j = first[i]; j <= last[i]; j += 8) {
                int64_t k = last[i] - j + 1 < 8 ? last[i] - j + 1 : 8;
                v8f x = splat8(-INFINITY);
                memcpy(&x, s[i] + j, sizeof(float) * (size_t)k);
                x *= scale;
                for (int e = 0; cap > 0.0f && e < k; e++) x[e] = cap * tanhf(x[e] / cap);
                memcpy(s[i] + j, &x, sizeof(float) * (size_t)k);
                v8i above = x > top8;
                top8 = (v8f)(((v8i)x & above) | ((v8i)top8 & ~above));
            }
            float top = -INFINITY;
            for (int e = 0; e < 8; e++) top = top8[e] > top ? top8[e] : top;
            if (top > m[r]) { /* a larger maximum: what is summed so far shrinks by e^(m_old - m_new) */
                float shift = m[r] - top, factor;
                exp_floats(&shift, &factor, 1);
                l[r] *= factor;
                for (int64_t d = 0; d < Dv; d++) acc[i][d] *= factor;
                m[r] = top;
            }
            for (int64_t j = first[i]; j <= last[i]; j += 8) {
                int64_t k = last[i] - j + 1 < 8 ? last[i] - j + 1 : 8;
                v8f x = {0};
                memcpy(&x, s[i] + j, sizeof(float) * (size_t)k);
                x = (v8f)((v8i)exp8(x - m[r]) & (lane < (int)k));
                memcpy(s[i] + j, &x, sizeof(float) * (size_t)k);
                sum += x;
            }
            l[r] += reduce8(sum);
        }
        /* the values, in tiles of rows x 16 value dimensions over the columns all of a tile's
         * rows see; each row's columns before and after those alone, so that every row sums its
         * own columns in order whatever its neighbours */
        for (int t = 0; t < seen; t += TILE_ROWS) {
            int R = seen - t < TILE_ROWS ? seen - t : TILE_ROWS;
            int64_t j0 = first[t], j1 = last[t];
            for (int r = t + 1; r < t + R; r++) {
                j0 = first[r] > j0 ? first[r] : j0;
                j1 = last[r] < j1 ? last[r] : j1;
            }
            j1 = j1 > j0 - 1 ? j1 : j0 - 1; /* none in common: the row's columns before j0, then after */
            for (int r = t; r < t + R; r++)
                values_of(acc + r, w + r, 1, first[r], last[r] < j0 - 1 ? last[r] : j0 - 1, values, Dv);
            values_of(acc + t, w + t, R, j0, j1, values, Dv);
            for (int r = t; r < t + R; r++)
                values_of(acc + r, w + r, 1, first[r] > j1 + 1 ? first[r] : j1 + 1, last[r], values, Dv);
        }
    }
}

/* (M, L, A) merged with a span's (m, l, a), in span order (see the top of the file) */
static void merge_span(float *M, float *L, float *A, float m, float l, const float *a, int64_t Dv) {
    if (l == 0.0f) return; /* the row sees none of the span */
    float top = m > *M ? m : *M, shifts[2] = {*M - top, m - top}, factors[2];
    exp_floats(shifts, factors, 2);
    *L = *L * factors[0] + l * factors[1];
    for (int64_t d = 0; d < Dv; d++) A[d] = A[d] * factors[0] + a[d] * factors[1];
    *M = top;
}

/* A row's output from its merged (M, L, A): A / L, a sink as one more term of L. */
static void finish_row(const AttnRow *row, float M, float L, const float *A, int64_t Dv) {
    float keep = 1.0f;
    if (row->sink) {
        float top = *row->sink > M ? *row->sink : M, shifts[2] = {M - top, *row->sink - top}, factors[2];
        exp_floats(shifts, factors, 2);
        keep = factors[0];
        L = L * factors[0] + factors[1];
    }
    for (int64_t d = 0; d < Dv; d++) row->out[d] = A[d] * keep / L;
}

/* The spans a row group's positions touch: first .. last. */
static void group_spans(const AttnRow *rows, int n, int64_t *first, int64_t *last) {
    *first = rows[0].first / KV_SPAN;
    *last = rows[0].last / KV_SPAN;
    for (int r = 1; r < n; r++) {
        *first = rows[r].first / KV_SPAN < *first ? rows[r].first / KV_SPAN : *first;
        *last = rows[r].last / KV_SPAN > *last ? rows[r].last / KV_SPAN : *last;
    }
}

/* Whole row groups: every span of each, merged as it goes. */
static void groups_task(void *vctx, int chunk, int chunks, int thread) {
    const AttnCtx *c = vctx;
    int64_t Dv = c->Dv, lo, hi;
    split_range(c->groups, chunk, chunks, &lo, &hi);
    float *work = scratch_floats(thread) + KV_BLOCK * (c->Dh + c->Dv + ATTN_ROWS);
    float *span_a = work, *A = work + ATTN_ROWS * Dv;
    for (int64_t g = lo; g < hi; g++) {
        AttnRow rows[ATTN_ROWS];
        float m[ATTN_ROWS], l[ATTN_ROWS], M[ATTN_ROWS], L[ATTN_ROWS];
        int64_t kv, first, last;
        int n = group_rows(c, g, rows, &kv);
        for (int r = 0; r < n; r++) {
            M[r] = -INFINITY;
            L[r] = 0.0f;
            memset(A + r * Dv, 0, sizeof(float) * (size_t)Dv);
        }
        group_spans(rows, n, &first, &last);
        for (int64_t span = first; span <= last; span++) {
            attend_span(c, rows, n, kv, span, thread, m, l, span_a);
            for (int r = 0; r < n; r++) merge_span(&M[r], &L[r], A + r * Dv, m[r], l[r], span_a + r * Dv, Dv);
        }
        for (int r = 0; r < n; r++) finish_row(&rows[r], M[r], L[r], A + r * Dv, Dv);
    }
}

/* A split pass's partial results of (group g, span s): m and l of each row, then a (Dv) each. */
static float *partials_of(const AttnCtx *c, int64_t g, int64_t s) {
    return c->partials + (g * c->spans + s) * ATTN_ROWS * (c->Dv + 2);
}

/* Split pass, first half: one (row group, span) pair at a time, its (m, l, a) kept. */
static void spans_task(void *vctx, int chunk, int chunks, int thread) {
    const AttnCtx *c = vctx;
    int64_t lo, hi;
    split_range(c->groups * c->spans, chunk, chunks, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        AttnRow rows[ATTN_ROWS];
        int64_t g = item / c->spans, s = item % c->spans, kv;
        int n = group_rows(c, g, rows, &kv);
        float *part = partials_of(c, g, s);
        attend_span(c, rows, n, kv, c->span_lo + s, thread, part, part + ATTN_ROWS, part + 2 * ATTN_ROWS);
    }
}

/* Split pass, second half: each row group's spans merged in order. */
static void merge_task(void *vctx, int chunk, int chunks, int thread) {
    const AttnCtx *c = vctx;
    int64_t Dv = c->Dv, lo, hi;
    split_range(c->groups, chunk, chunks, &lo, &hi);
    float *A = scratch_floats(thread) + KV_BLOCK * (c->Dh + c->Dv + ATTN_ROWS);
    for (int64_t g = lo; g < hi; g++) {
        AttnRow rows[ATTN_ROWS];
        int64_t kv;
        int n = group_rows(c, g, rows, &kv);
        for (int r = 0; r < n; r++) {
            float M = -INFINITY, L = 0.0f;
            memset(A, 0, sizeof(float) * (size_t)Dv);
            for (int64_t s = 0; s < c->spans; s++) {
                const float *part = partials_of(c, g, s);
                merge_span(&M, &L, A, part[r], part[ATTN_ROWS + r], part + 2 * ATTN_ROWS + r * Dv, Dv);
            }
            finish_row(&rows[r], M, L, A, Dv);
        }
    }
}

/* The first cache row of the positions a pass reads (see above): 0 for a full layer. */
static int64_t ring_base(const Op *op) {
    int64_t slots = op->ints.attention.slots, window = op->ints.attention.window;
    int64_t lo = window > 0 && *op->pos - window + 1 > 0 ? *op->pos - window + 1 : 0;
    return op->ints.attention.ring ? lo - lo % slots : 0;
}

static float *split_buffer;
static int64_t split_reserved;

int attention(const Op *op, const char **error) {
    int64_t T = op->ints.attention.tokens, H = op->ints.attention.heads, Hkv = op->ints.attention.kv_heads;
    int64_t Dh = op->ints.attention.head_dim, Dv = op->ints.attention.value_dim, slots = op->ints.attention.slots;
    int64_t window = op->ints.attention.window, ring = op->ints.attention.ring, start = *op->pos;
    int64_t type = op->ints.attention.kv_type, N = (ring ? 2 : 1) * slots;
    if (start < 0 || (!ring && start + T > slots)) {
        *error = "the KV cache has no room for these positions";
        return -1;
    }
    if (ring && window <= 0) {
        *error = "a windowed layer's ring was given no window";
        return -1;
    }
    if (ring && window + T - 1 > slots) {
        *error = "a pass over a windowed layer's ring may write at most slots - window + 1 positions: split it";
        return -1;
    }
    if (type < KV_F32 || type > KV_Q8_0 || (type == KV_Q8_0 && (Dh % Q8_VALUES || Dv % Q8_VALUES))) {
        *error = "unknown KV type, or Q8_0 rows that are not whole blocks of 32";
        return -1;
    }
    if (scratch_reserve(0, KV_BLOCK * (Dh + Dv + ATTN_ROWS) + 2 * ATTN_ROWS * Dv) != 0) {
        *error = "out of memory for attention";
        return -1;
    }
    int64_t key_bytes = kv_row_bytes(type, Dh), value_bytes = kv_row_bytes(type, Dv);
    for (int64_t t = 0; t < T; t++) {
        int64_t row = (start + t) % slots;
        for (int64_t kv = 0; kv < Hkv; kv++) {
            unsigned char *key = op->kcache + (kv * N + row) * key_bytes, *value = op->vcache + (kv * N + row) * value_bytes;
            store_row(type, op->b + (t * Hkv + kv) * Dh, Dh, key);
            store_row(type, op->c + (t * Hkv + kv) * Dv, Dv, value);
            if (ring) { /* the mirror */
                memcpy(key + slots * key_bytes, key, (size_t)key_bytes);
                memcpy(value + slots * value_bytes, value, (size_t)value_bytes);
            }
        }
    }
    int64_t per_kv = T * (H / Hkv), groups_per_kv = (per_kv + ATTN_ROWS - 1) / ATTN_ROWS;
    int64_t lo = window > 0 && start - window + 1 > 0 ? start - window + 1 : 0;
    AttnCtx c = {op, T, H, Hkv, Dh, Dv, N, ring_base(op), per_kv, groups_per_kv, Hkv * groups_per_kv,
                 lo / KV_SPAN, (start + T - 1) / KV_SPAN - lo / KV_SPAN + 1, NULL};
    int64_t split_floats = c.groups * c.spans * ATTN_ROWS * (Dv + 2);
    if (c.spans > 1 && c.groups < 2 * pool_threads() && split_floats <= SPLIT_FLOATS) {
        if (split_floats > split_reserved) {
            float *grown = realloc(split_buffer, sizeof(float) * (size_t)split_floats);
            if (!grown) {
                *error = "out of memory for attention";
                return -1;
            }
            split_buffer = grown;
            split_reserved = split_floats;
        }
        c.partials = split_buffer;
        pool_run(spans_task, &c);
        pool_run(merge_task, &c);
    } else {
        pool_run(groups_task, &c);
    }
    return 0;
}

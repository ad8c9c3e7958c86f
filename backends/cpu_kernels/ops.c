/* The ops of a forward pass on float32 activations: quantized matrix products, norms,
 * rotary embedding, attention over the KV cache, gated activations. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "simd.h"

#define TOKEN_TILE 32  /* tokens dotted with one unpacked weight row before the next row */
#define FLOAT_TILE_BYTES 262144 /* float activations per tile of tokens, when rows are dequantized */
#define PARALLEL_ELEMENTS 65536

/* -- activations quantized once per product, shared by every matrix of a fused op ------ */

static struct {
    int16_t *q;
    float *d, *xsum;
    int64_t capacity;
    uint8_t *tables; /* Q1_0's lookup tables, and their groups' scales */
    float *tscale;
    int64_t table_capacity;
} acts;

static int grow(void **p, size_t bytes) {
    void *q = realloc(*p, bytes);
    if (q) *p = q;
    return q ? 0 : -1;
}

static int reserve_acts(int64_t elements, int codes, int tables) {
    size_t groups = (size_t)(elements / GROUP + 1);
    if (codes && elements > acts.capacity) {
        if (grow((void **)&acts.q, sizeof(int16_t) * (size_t)elements) || grow((void **)&acts.d, sizeof(float) * groups) ||
            grow((void **)&acts.xsum, sizeof(float) * groups))
            return -1;
        acts.capacity = elements;
    }
    if (tables && elements > acts.table_capacity) {
        if (grow((void **)&acts.tables, (size_t)q1_table_bytes(elements)) || grow((void **)&acts.tscale, sizeof(float) * groups))
            return -1;
        acts.table_capacity = elements;
    }
    return 0;
}

typedef struct {
    const Op *op;
    int64_t T, K, total_rows;
    int codes, tables; /* which forms of the activations the matrices take */
    int dequantize;    /* quantized rows to float for FLOAT_TOKENS or more tokens */
} LinearCtx;

static void quantize_task(void *vctx, int chunk, int chunks, int thread) {
    const LinearCtx *c = vctx;
    int64_t lo, hi, K = c->K, G = K / GROUP;
    split_range(c->T, chunk, chunks, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const float *x = c->op->a + t * K;
        if (c->codes) quantize_row(x, K, acts.q + t * K, acts.d + t * G, acts.xsum + t * G);
        if (c->tables) q1_tables(x, K, acts.tables + t * q1_table_bytes(K), acts.tscale + t * G);
    }
}

/* The tiles of a Q1_0 matrix whose first row lies in [r0, r1), times tokens t0 .. t1 - 1. */
static void tiles_product(const Matrix *w, int64_t K, int64_t r0, int64_t r1, int64_t t0, int64_t t1, float *out) {
    for (int64_t tile = (r0 + Q1_TILE - 1) / Q1_TILE; tile * Q1_TILE < r1; tile++)
        for (int64_t t = t0; t < t1; t++)
            q1_tile_rows(w->data, w->rows, K, tile, acts.tables + t * q1_table_bytes(K), acts.tscale + t * (K / GROUP),
                         out + t * w->rows);
}

/* One token reads each row once, in order: ask for a row a few rows ahead of the one being
 * multiplied, so that memory works while the core computes. */
#define PREFETCH_ROWS 4
static inline void prefetch_row(const uint8_t *row, size_t bytes) {
    for (size_t at = 0; at < bytes; at += 64) __builtin_prefetch(row + at);
}

static void linear_task(void *vctx, int chunk, int chunks, int thread) {
    const LinearCtx *c = vctx;
    const Op *op = c->op;
    int64_t lo, hi, K = c->K, G = K / GROUP;
    split_range(c->total_rows, chunk, chunks, &lo, &hi);
    RowBuffer *buf = scratch_row(thread);
    /* dequantized rows: as many tokens as keep their activations in a core's L2 */
    int64_t tile = c->dequantize ? FLOAT_TILE_BYTES / (int64_t)sizeof(float) / K : TOKEN_TILE;
    if (tile < TOKEN_TILE) tile = TOKEN_TILE;
    for (int64_t t0 = 0; t0 < c->T; t0 += tile) {
        int64_t t1 = t0 + tile < c->T ? t0 + tile : c->T;
        int64_t base = 0;
        for (int m = 0; m < op->n_mats; base += op->mats[m].rows, m++) {
            const Matrix *w = &op->mats[m];
            int64_t r0 = lo > base ? lo - base : 0, r1 = hi - base < w->rows ? hi - base : w->rows;
            if (w->type == T_Q1_0_TILES) {
                tiles_product(w, K, r0, r1, t0, t1, op->outs[m]);
            } else if (c->dequantize && type_takes_codes(w->type)) {
                for (int64_t r = r0; r < r1; r += FLOAT_ROWS) {
                    int n = r1 - r < FLOAT_ROWS ? (int)(r1 - r) : FLOAT_ROWS;
                    for (int i = 0; i < n; i++)
                        dequantize_row(w->type, w->data + (r + i) * w->row_bytes, K, buf, buf->f + i * K);
                    float_product(buf->f, n, K, op->a, t0, t1, op->outs[m] + r, w->rows);
                }
            } else if (type_takes_codes(w->type)) { /* a few tokens: each row read once, no row buffer */
                for (int64_t r = r0; r < r1; r++) {
                    const uint8_t *row = w->data + r * w->row_bytes;
                    if (r + PREFETCH_ROWS < r1) prefetch_row(row + PREFETCH_ROWS * w->row_bytes, w->row_bytes);
                    for (int64_t t = t0; t < t1; t += ROW_TOKENS) {
                        int n = t1 - t < ROW_TOKENS ? (int)(t1 - t) : ROW_TOKENS;
                        dot_row_tokens(w->type, row, K, acts.q + t * K, acts.d + t * G, acts.xsum + t * G, buf->min, n,
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

static int linear(const Op *op, const char **error) {
    LinearCtx c = {op, op->n[0], op->mats[0].cols, 0, 0, 0, op->n[0] >= FLOAT_TOKENS};
    for (int m = 0; m < op->n_mats; m++) {
        c.total_rows += op->mats[m].rows;
        c.codes |= type_takes_codes(op->mats[m].type) && !c.dequantize;
        c.tables |= op->mats[m].type == T_Q1_0_TILES;
    }
    if (scratch_reserve(c.K, 0) != 0 || reserve_acts(c.T * c.K, c.codes, c.tables) != 0) {
        *error = "out of memory for the matrix product's buffers";
        return -1;
    }
    if (c.codes || c.tables) {
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
    for (int64_t t = 0; t < op->n[0]; t++) {
        int64_t id = op->ids[t];
        if (id < 0 || id >= w->rows) {
            *error = "a token id is outside the model's vocabulary";
            return -1;
        }
        float *out = op->out + t * w->cols;
        dequantize_row(w->type, w->data + id * w->row_bytes, w->cols, scratch_row(0), out);
        if (op->f[0] != 1.0f)
            for (int64_t i = 0; i < w->cols; i++) out[i] *= op->f[0];
    }
    return 0;
}

/* -- norms, rotary embedding, elementwise ------------------------------------------------ */

static void rms_norm(const Op *op) {
    int64_t rows = op->n[0], dim = op->n[1];
    for (int64_t r = 0; r < rows; r++) {
        const float *x = op->a + r * dim;
        double squares = 0.0;
        for (int64_t i = 0; i < dim; i++) squares += (double)x[i] * x[i];
        float root = sqrtf((float)(squares / (double)dim) + op->f[0]);
        float *out = op->out + r * dim;
        for (int64_t i = 0; i < dim; i++) out[i] = (x[i] / root) * op->b[i];
    }
}

/* The cos/sin of the last position rotated (q and k of a layer, and most layers, share
 * them). Keyed by the table's values, not its address: a freed table's address comes back. */
static struct {
    double table[4096];
    int64_t pos, half;
    float cos[4096], sin[4096];
} rope_cache = {{0}, -1, 0, {0}, {0}};

static void rope(const Op *op) {
    int64_t T = op->n[0], heads = op->n[1], dim = op->n[2], rope_dim = op->n[3], half = rope_dim / 2;
    int neox = (int)op->n[4];
    if (op->out != op->a) memcpy(op->out, op->a, sizeof(float) * (size_t)(T * heads * dim));
    for (int64_t t = 0; t < T; t++) {
        int64_t pos = op->n[5] ? op->pos[t] : *op->pos + t;
        if (rope_cache.pos != pos || rope_cache.half != half ||
            memcmp(rope_cache.table, op->table, sizeof(double) * (size_t)half) != 0) {
            for (int64_t i = 0; i < half; i++) {
                double angle = (double)pos * op->table[i];
                rope_cache.cos[i] = (float)cos(angle);
                rope_cache.sin[i] = (float)sin(angle);
            }
            memcpy(rope_cache.table, op->table, sizeof(double) * (size_t)half);
            rope_cache.pos = pos;
            rope_cache.half = half;
        }
        for (int64_t h = 0; h < heads; h++) {
            float *x = op->out + (t * heads + h) * dim;
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
                float a = x[ia], b = x[ib], c = rope_cache.cos[i], s = rope_cache.sin[i];
                x[ia] = a * c - b * s;
                x[ib] = a * s + b * c;
            }
        }
    }
}

typedef struct {
    const Op *op;
} ElementCtx;

static void elementwise_task(void *vctx, int chunk, int chunks, int thread) {
    const Op *op = ((const ElementCtx *)vctx)->op;
    int64_t lo, hi;
    split_range(op->n[0], chunk, chunks, &lo, &hi);
    const float *a = op->a, *b = op->b;
    float *out = op->out;
    switch (op->code) {
    case OP_ADD:
        for (int64_t i = lo; i < hi; i++) out[i] = a[i] + b[i];
        break;
    case OP_SOFTCAP:
        for (int64_t i = lo; i < hi; i++) out[i] = op->f[0] * tanhf(a[i] / op->f[0]);
        break;
    case OP_GATED:
        if (op->n[1] == 0) {
            for (int64_t i = lo; i < hi; i++) out[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
        } else {
            const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
            for (int64_t i = lo; i < hi; i++) {
                float g = a[i], inner = k * g * (1.0f + 0.044715f * g * g);
                out[i] = 0.5f * g * (1.0f + tanhf(inner)) * b[i];
            }
        }
        break;
    }
}

static void elementwise(const Op *op) {
    ElementCtx c = {op};
    if (op->n[0] >= PARALLEL_ELEMENTS) pool_run(elementwise_task, &c);
    else elementwise_task(&c, 0, 1, 0);
}

/* -- attention ----------------------------------------------------------------------------
 * q (T, H, Dh), k (T, Hkv, Dh), v (T, Hkv, Dv) at positions pos .. pos+T-1; n = {T, H, Hkv,
 * Dh, Dv, N, window (0: none)}; f = {scale, softcap (0: none)}. Keys and values are written
 * into the cache first; each (token, head) then attends to positions max(0, p - window + 1) .. p. */

static void attention_task(void *vctx, int chunk, int chunks, int thread) {
    const Op *op = ((const ElementCtx *)vctx)->op;
    int64_t T = op->n[0], H = op->n[1], Hkv = op->n[2], Dh = op->n[3], Dv = op->n[4], N = op->n[5], window = op->n[6];
    int64_t group = H / Hkv, lo, hi;
    split_range(T * H, chunk, chunks, &lo, &hi);
    float *scores = scratch_floats(thread);
    for (int64_t task = lo; task < hi; task++) {
        int64_t t = task / H, h = task % H, kv = h / group, p = *op->pos + t;
        int64_t first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
        const float *q = op->a + (t * H + h) * Dh, *keys = op->kcache + kv * N * Dh, *values = op->vcache + kv * N * Dv;
        float best = -INFINITY;
        for (int64_t j = first; j <= p; j++) {
            float s = dot_float(q, keys + j * Dh, Dh) * op->f[0];
            if (op->f[1] > 0.0f) s = op->f[1] * tanhf(s / op->f[1]);
            scores[j - first] = s;
            best = s > best ? s : best;
        }
        float total = 0.0f;
        for (int64_t j = first; j <= p; j++) {
            scores[j - first] = expf(scores[j - first] - best);
            total += scores[j - first];
        }
        float *out = op->out + (t * H + h) * Dv;
        memset(out, 0, sizeof(float) * (size_t)Dv);
        for (int64_t j = first; j <= p; j++) {
            float w = scores[j - first] / total;
            const float *v = values + j * Dv;
            for (int64_t i = 0; i < Dv; i++) out[i] += w * v[i];
        }
    }
}

static int attention(const Op *op, const char **error) {
    int64_t T = op->n[0], Hkv = op->n[2], Dh = op->n[3], Dv = op->n[4], N = op->n[5], start = *op->pos;
    if (start < 0 || start + T > N) {
        *error = "the KV cache has no room for these positions";
        return -1;
    }
    if (scratch_reserve(0, N) != 0) {
        *error = "out of memory for the attention scores";
        return -1;
    }
    for (int64_t t = 0; t < T; t++) {
        for (int64_t kv = 0; kv < Hkv; kv++) {
            memcpy(op->kcache + (kv * N + start + t) * Dh, op->b + (t * Hkv + kv) * Dh, sizeof(float) * (size_t)Dh);
            memcpy(op->vcache + (kv * N + start + t) * Dv, op->c + (t * Hkv + kv) * Dv, sizeof(float) * (size_t)Dv);
        }
    }
    ElementCtx c = {op};
    pool_run(attention_task, &c);
    return 0;
}

int exec_op(const Op *op, const char **error) {
    switch (op->code) {
    case OP_EMBED: return embed(op, error);
    case OP_LINEAR: return linear(op, error);
    case OP_RMSNORM: rms_norm(op); return 0;
    case OP_ROPE:
        if (op->n[3] / 2 > 4096) {
            *error = "the RoPE dimension is too large";
            return -1;
        }
        rope(op);
        return 0;
    case OP_ATTN: return attention(op, error);
    case OP_GATED: case OP_ADD: case OP_SOFTCAP: elementwise(op); return 0;
    default: *error = "unknown op"; return -1;
    }
}

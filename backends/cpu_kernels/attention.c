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
 * on the other rows of its pass, the ring or the thread count. Within a span, block by
 * block, a row keeps the running maximum m of its scores, the sum l of exp(s - m) and the
 * sum a of exp(s - m) v (each summed in position order), rescaled by exp(m_old - m_new)
 * when a block raises the maximum. Spans are then merged in order: (M, L, A) with (m, l,
 * a) gives max(M, m), L e^(M - top) + l e^(m - top) and A e^(M - top) + a e^(m - top). The
 * result is A / L (a sink joins as one more term of L). A block's keys and values are
 * widened to float32 in the thread's scratch (float16 and Q8_0 values are exact in float32),
 * then scored with the same dot products as float32 keys, so every tier gives the same bits.
 *
 * The work. The query rows are ordered (KV head, token, head of the group) and taken
 * ATTN_ROWS of one KV head at a time (a row group: each block of keys is widened once for
 * all of them). Threads take row groups; when there are too few of them to keep the threads
 * busy (decoding), they take (row group, span) pairs instead, each writing its span's
 * (m, l, a) for a second pass to merge in order: the same operations, so the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "simd.h"

#define ATTN_ROWS 16
#define KV_BLOCK 64                /* positions widened and scored at once */
#define KV_SPAN (16 * KV_BLOCK)    /* positions of one partial softmax */
#define VALUE_BLOCK 64             /* value dimensions summed in registers (8 vectors) */
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

typedef uint32_t v8u __attribute__((vector_size(32)));

/* 8 float16 values as float32 (exact; no subnormal float32 on the way) */
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

static inline float widen_half(const unsigned char *src) {
    unsigned char h[16] = {0};
    memcpy(h, src, 2);
    return widen_half8(h)[0];
}

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

/* n rows of dim values stored as `type` from src, as float32 rows into dst (exact) */
static void widen_rows(int64_t type, const unsigned char *src, int64_t n, int64_t dim, float *dst) {
    int64_t count = n * dim, i = 0;
    if (type == KV_F16) {
        for (; i + 8 <= count; i += 8) {
            v8f x = widen_half8(src + 2 * i);
            memcpy(dst + i, &x, sizeof x);
        }
        for (; i < count; i++) dst[i] = widen_half(src + 2 * i);
        return;
    }
    for (int64_t b = 0; b < count / Q8_VALUES; b++) { /* Q8_0: code times scale, exact (8 + 11 bits) */
        const unsigned char *block = src + b * Q8_BYTES;
        v8f d = {0};
        d += widen_half(block);
        for (int j = 0; j < Q8_VALUES; j += 8) {
            v8f x = widen8((const int8_t *)block + 2 + j) * d;
            memcpy(dst + b * Q8_VALUES + j, &x, sizeof x);
        }
    }
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

/* acc (Dv) += sum over j = 0 .. n-1 of w[j] * values[j] (rows of Dv), each element in order */
static void add_weighted_values(const float *w, int64_t n, const float *values, int64_t Dv, float *acc) {
    int64_t d = 0;
    for (; d + VALUE_BLOCK <= Dv; d += VALUE_BLOCK) {
        v8f sum[VALUE_BLOCK / 8];
        memcpy(sum, acc + d, sizeof sum);
        for (int64_t j = 0; j < n; j++) {
            const float *v = values + j * Dv + d;
            for (int m = 0; m < VALUE_BLOCK / 8; m++) {
                v8f x;
                memcpy(&x, v + 8 * m, sizeof x);
                sum[m] += w[j] * x;
            }
        }
        memcpy(acc + d, sum, sizeof sum);
    }
    for (; d < Dv; d++) {
        float sum = acc[d];
        for (int64_t j = 0; j < n; j++) sum += w[j] * values[j * Dv + d];
        acc[d] = sum;
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
    float *keys_buf = scratch_floats(thread), *values_buf = keys_buf + KV_BLOCK * Dh;
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
        const float *keys = (const float *)(kcache + row0 * key_bytes), *values = (const float *)(vcache + row0 * value_bytes);
        if (type != KV_F32) {
            widen_rows(type, kcache + row0 * key_bytes, count, Dh, keys_buf);
            widen_rows(type, vcache + row0 * value_bytes, count, Dv, values_buf);
            keys = keys_buf;
            values = values_buf;
        }
        for (int r = 0; r < n; r++) {
            int64_t first = rows[r].first > b0 ? rows[r].first : b0, last = rows[r].last < b1 ? rows[r].last : b1;
            if (first > last) continue;
            float *s = scores + r * KV_BLOCK, top = -INFINITY;
            int64_t j = first - b0, end = last - b0;
            for (; j + 7 <= end; j += 8) {
                v8f x = dot_float8(rows[r].q, keys + j * Dh, Dh, Dh);
                memcpy(s + j, &x, sizeof x);
            }
            for (; j <= end; j++) s[j] = dot_float(rows[r].q, keys + j * Dh, Dh);
            for (j = first - b0; j <= end; j++) {
                float x = s[j] * scale;
                s[j] = cap > 0.0f ? cap * tanhf(x / cap) : x;
                top = s[j] > top ? s[j] : top;
            }
            if (top > m[r]) { /* a larger maximum: what is summed so far shrinks by e^(m_old - m_new) */
                float shift = m[r] - top, factor;
                exp_floats(&shift, &factor, 1);
                l[r] *= factor;
                for (int64_t d = 0; d < Dv; d++) a[r * Dv + d] *= factor;
                m[r] = top;
            }
            for (j = first - b0; j <= end; j += 8) {
                int64_t k = end - j + 1 < 8 ? end - j + 1 : 8;
                v8f x = {0};
                memcpy(&x, s + j, sizeof(float) * (size_t)k);
                x = exp8(x - m[r]);
                memcpy(s + j, &x, sizeof(float) * (size_t)k);
                for (int64_t e = 0; e < k; e++) l[r] += x[e];
            }
            add_weighted_values(s + (first - b0), end - (first - b0) + 1, values + (first - b0) * Dv, Dv, a + r * Dv);
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

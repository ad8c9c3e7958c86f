/* The Gated DeltaNet's ops (Qwen3.5's linear attention): the short causal convolution and
 * the gated delta rule, each threaded over channels or value heads. See backends/base.py
 * (short_conv, delta_net) for the arithmetic; backends/delta_rule.py is the NumPy reference.
 *
 * The delta rule runs in chunks of `chunk` tokens per head (transformers' chunked form, as
 * delta_rule.chunked): within a chunk of n rows with log decays cum (from the chunk's start),
 * write strengths beta, normalised keys K, queries Q and values V, and the state S (Dk, Dv)
 * at the chunk's start,
 *   A[i][j] = beta_i (k_i . k_j) exp(cum_i - cum_j), j < i              (strictly lower)
 *   U       = (I + A)^-1 (beta (V - exp(cum) K S))                    (forward substitution)
 *   out_i   = exp(cum_i) q_i S + sum_{j <= i} (q_i . k_j) exp(cum_i - cum_j) u_j
 *   S      <- exp(cum_n) S + sum_j exp(cum_n - cum_j) k_j^T u_j
 * so S is read three times a chunk, in small matrix products (gemm_acc), instead of twice a
 * token. A one-token pass is the same with n = 1. Every product is fma8 in 8 lanes, the same
 * roundings in every tier. */
#include <math.h>
#include <string.h>

#include "ops.h"
#include "simd.h"

typedef struct {
    const Op *op;
    int64_t rows; /* DELTANET: the longest chunk of this pass, which the scratch is laid out for */
} RecurrentCtx;

/* SHORTCONV for the channels of one part, 8 at a time: each tap's kernels held in a vector
 * across the tokens (the same additions, in the same order, as one channel at a time), silu
 * through exp8, then the new window. */
static void short_conv_task(void *vctx, int chunk, int chunks, int thread) {
    const Op *op = ((const RecurrentCtx *)vctx)->op;
    int64_t T = op->ints.short_conv.tokens, C = op->ints.short_conv.channels, K = op->ints.short_conv.kernel;
    int64_t lo, hi;
    split_range(C, chunk, chunks, &lo, &hi);
    const float *x = op->a, *w = op->b;
    float *window = (float *)op->kcache, *out = op->out; /* window (K - 1, C) */
    (void)thread;
    for (int64_t c0 = lo; c0 < hi; c0 += 8) {
        int64_t lanes = hi - c0 < 8 ? hi - c0 : 8;
        v8f taps[MAX_CONV_KERNEL] = {{0}};
        for (int64_t j = 0; j < K; j++)
            for (int64_t l = 0; l < lanes; l++) taps[j][l] = w[(c0 + l) * K + j];
        for (int64_t t = 0; t < T; t++) {
            v8f acc = {0}, in = {0};
            for (int64_t j = 0; j < K; j++) {
                int64_t i = t + j - (K - 1); /* input row; before 0 the window's */
                const float *src = i < 0 ? window + (K - 1 + i) * C : x + i * C;
                memcpy(&in, src + c0, sizeof(float) * (size_t)lanes);
                acc += taps[j] * in;
            }
            v8f silu = acc / (1.0f + exp8(-acc));
            memcpy(out + t * C + c0, &silu, sizeof(float) * (size_t)lanes);
        }
    }
    for (int64_t c = lo; c < hi; c++) {
        float tail[MAX_CONV_KERNEL];
        for (int64_t r = 0; r < K - 1; r++) {
            int64_t i = T - (K - 1) + r;
            tail[r] = i < 0 ? window[(K - 1 + i) * C + c] : x[i * C + c];
        }
        for (int64_t r = 0; r < K - 1; r++) window[r * C + c] = tail[r];
    }
}

int short_conv(const Op *op, const char **error) {
    (void)error;
    RecurrentCtx c = {op, 0};
    pool_run(short_conv_task, &c);
    return 0;
}

/* x (n,) divided by its L2 norm, times `scale`, into out. */
static void l2_normed(const float *x, float *out, int64_t n, float eps, float scale) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
    float inv = scale / sqrtf(sum + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * inv;
}

static inline v8f load8(const float *p) {
    v8f v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8f v) { memcpy(p, &v, sizeof v); }

/* y (n,) += s * x */
static void axpy(float *y, float s, const float *x, int64_t n) {
    v8f sv = {s, s, s, s, s, s, s, s};
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) store8(y + j, fma8(sv, load8(x + j), load8(y + j)));
    for (; j < n; j++) y[j] = fmaf(s, x[j], y[j]);
}

/* C (M, N) += A (M, K) B (K, N): A[m][k] at a[m * am + k * ak] (so A may be a transpose),
 * the rows of B and C contiguous, ldb and ldc apart. */
typedef struct {
    float *c;
    int64_t ldc;
    const float *a;
    int64_t am, ak;
    const float *b;
    int64_t ldb, K;
} Gemm;

#define GEMM_ROWS 4    /* rows of C a block keeps in registers */
#define GEMM_VECTORS 4 /* and vectors of 8 columns: a block is 4 x 32, one pass over its panel of B */

/* The block of C at rows m0 .. m0 + mr - 1, columns n0 .. n0 + 8 nv - 1 (mr, nv constants where
 * it counts, so that the accumulators stay in registers). */
static inline __attribute__((always_inline)) void gemm_block(const Gemm *g, int64_t m0, int64_t n0, const int mr,
                                                             const int nv) {
    v8f acc[GEMM_ROWS][GEMM_VECTORS];
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = load8(g->c + (m0 + r) * g->ldc + n0 + 8 * v);
    for (int64_t k = 0; k < g->K; k++) {
        v8f b[GEMM_VECTORS];
        for (int v = 0; v < nv; v++) b[v] = load8(g->b + k * g->ldb + n0 + 8 * v);
        for (int r = 0; r < mr; r++) {
            float s = g->a[(m0 + r) * g->am + k * g->ak];
            v8f sv = {s, s, s, s, s, s, s, s};
            for (int v = 0; v < nv; v++) acc[r][v] = fma8(sv, b[v], acc[r][v]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < nv; v++) store8(g->c + (m0 + r) * g->ldc + n0 + 8 * v, acc[r][v]);
}

static void gemm_acc(const Gemm *g, int64_t M, int64_t N) {
    int64_t vectors = N / 8;
    for (int64_t n0 = 0; n0 < 8 * vectors; n0 += 8 * GEMM_VECTORS) {
        int nv = vectors - n0 / 8 < GEMM_VECTORS ? (int)(vectors - n0 / 8) : GEMM_VECTORS;
        for (int64_t m0 = 0; m0 < M; m0 += GEMM_ROWS) {
            int mr = M - m0 < GEMM_ROWS ? (int)(M - m0) : GEMM_ROWS;
            if (nv == GEMM_VECTORS && mr == 4) gemm_block(g, m0, n0, 4, GEMM_VECTORS);
            else if (nv == GEMM_VECTORS && mr == 2) gemm_block(g, m0, n0, 2, GEMM_VECTORS);
            else if (nv == GEMM_VECTORS && mr == 1) gemm_block(g, m0, n0, 1, GEMM_VECTORS);
            else gemm_block(g, m0, n0, mr, nv);
        }
    }
    for (int64_t m = 0; m < M; m++) /* the last N % 8 columns */
        for (int64_t n = 8 * vectors; n < N; n++) {
            float acc = g->c[m * g->ldc + n];
            for (int64_t k = 0; k < g->K; k++) acc = fmaf(g->a[m * g->am + k * g->ak], g->b[k * g->ldb + n], acc);
            g->c[m * g->ldc + n] = acc;
        }
}

/* exp(log_decay), or 0 below exp(-DECAY_FLOOR) (2e-22: nothing beside a row's own term, which
 * decays by 1): a strongly decaying head would otherwise fill the products with subnormal
 * floats, each many times slower than a normal one. */
#define DECAY_FLOOR 50.0f
static inline float decay_of(float log_decay) { return log_decay < -DECAY_FLOOR ? 0.0f : expf(log_decay); }

/* One chunk of n rows, from row t0, of value head h: its outputs, and the state S moved past
 * it. work: the scratch of a chunk of `rows` rows (delta_net_floats). */
static void delta_chunk(const Op *op, int64_t h, int64_t t0, int64_t n, int64_t rows, float *S, float *work) {
    int64_t Hk = op->ints.delta_net.k_heads, Hv = op->ints.delta_net.v_heads, D = op->ints.delta_net.head_dim;
    int64_t C = (2 * Hk + Hv) * D, kh = h % Hk; /* value head h reads key head h % Hk (llama.cpp's tiled order) */
    float eps = op->floats.delta_net.eps, q_scale = 1.0f / sqrtf((float)D), a = op->d[h], dt_bias = op->d[Hv + h];
    float *keys = work, *queries = keys + n * D;        /* (n, D) each, one after the other */
    float *ks = work + 2 * rows * D, *qs = ks + n * D;  /* K S and Q S: (n, D) each */
    float *u = work + 4 * rows * D, *kd = u + rows * D; /* U (n, D); the keys decayed to the chunk's end (n, D) */
    float *lower = kd + rows * D, *scores = lower + rows * rows; /* A and the queries' scores (n, n) */
    float *cum = scores + rows * rows, *beta = cum + rows;       /* (n,) each */
    float run = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float *row = op->a + (t0 + i) * C;
        l2_normed(row + kh * D, queries + i * D, D, eps, q_scale);
        l2_normed(row + Hk * D + kh * D, keys + i * D, D, eps, 1.0f);
        float z = op->b[(t0 + i) * Hv + h] + dt_bias;
        run += a * (z > 20.0f ? z : log1pf(expf(z)));
        cum[i] = run;
        beta[i] = 1.0f / (1.0f + expf(-op->c[(t0 + i) * Hv + h]));
    }
    memset(ks, 0, sizeof(float) * (size_t)(2 * n * D));
    gemm_acc(&(Gemm){ks, D, keys, D, 1, S, D, D}, 2 * n, D); /* [K; Q] S */
    for (int64_t i = 0; i < n; i++) { /* beta (V - exp(cum) K S) */
        const float *v = op->a + (t0 + i) * C + 2 * Hk * D + h * D;
        float e = decay_of(cum[i]);
        for (int64_t j = 0; j < D; j++) u[i * D + j] = beta[i] * (v[j] - e * ks[i * D + j]);
    }
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) {
            float decay = j <= i ? decay_of(cum[i] - cum[j]) : 0.0f;
            scores[i * n + j] = j <= i ? dot_float(queries + i * D, keys + j * D, D) * decay : 0.0f;
            lower[i * n + j] = j < i ? beta[i] * dot_float(keys + i * D, keys + j * D, D) * decay : 0.0f;
        }
    for (int64_t i = 1; i < n; i++) /* U = (I + A)^-1 U, row by row */
        for (int64_t j = 0; j < i; j++) axpy(u + i * D, -lower[i * n + j], u + j * D, D);
    float *out = op->out + (t0 * Hv + h) * D; /* row i at out + i Hv D */
    for (int64_t i = 0; i < n; i++) {
        float e = decay_of(cum[i]);
        for (int64_t j = 0; j < D; j++) out[i * Hv * D + j] = e * qs[i * D + j];
    }
    gemm_acc(&(Gemm){out, Hv * D, scores, n, 1, u, D, n}, n, D);
    float last = cum[n - 1], e = decay_of(last);
    for (int64_t i = 0; i < n; i++) {
        float w = decay_of(last - cum[i]);
        for (int64_t j = 0; j < D; j++) kd[i * D + j] = keys[i * D + j] * w;
    }
    for (int64_t j = 0; j < D * D; j++) S[j] *= e;
    gemm_acc(&(Gemm){S, D, kd, 1, D, u, D, n}, D, D); /* S += (decayed K)^T U */
}

/* The scratch floats of a chunk of `rows` rows at head size D. */
static int64_t delta_net_floats(int64_t rows, int64_t D) { return 6 * rows * D + 2 * rows * rows + 2 * rows; }

/* DELTANET for the value heads of one part, chunk by chunk. */
static void delta_net_task(void *vctx, int part, int parts, int thread) {
    const RecurrentCtx *c = vctx;
    const Op *op = c->op;
    int64_t T = op->ints.delta_net.tokens, D = op->ints.delta_net.head_dim, L = op->ints.delta_net.chunk;
    int64_t lo, hi;
    split_range(op->ints.delta_net.v_heads, part, parts, &lo, &hi);
    for (int64_t h = lo; h < hi; h++)
        for (int64_t t0 = 0; t0 < T; t0 += L)
            delta_chunk(op, h, t0, T - t0 < L ? T - t0 : L, c->rows, (float *)op->kcache + h * D * D,
                        scratch_floats(thread));
}

int delta_net(const Op *op, const char **error) {
    int64_t T = op->ints.delta_net.tokens, L = op->ints.delta_net.chunk;
    RecurrentCtx c = {op, T < L ? T : L};
    if (scratch_reserve(0, delta_net_floats(c.rows, op->ints.delta_net.head_dim)) != 0) {
        *error = "out of memory for the delta rule";
        return -1;
    }
    pool_run(delta_net_task, &c);
    return 0;
}

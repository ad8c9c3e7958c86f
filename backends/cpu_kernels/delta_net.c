/* The Gated DeltaNet's ops (Qwen3.5's linear attention): the short causal convolution and
 * the gated delta rule, each threaded over channels or value heads. See backends/base.py
 * (short_conv, delta_net) for the arithmetic; backends/delta_rule.py is the NumPy reference.
 *
 * The delta rule runs token by token within each head: a head's state (Dh x Dh floats, 64 KB
 * at Dh 128) stays in the core's cache for the whole pass, and a token costs 4 Dh^2 flops per
 * head, small beside the layer's matrix products, so a prefill needs no chunked form here. */
#include <math.h>
#include <string.h>

#include "ops.h"

typedef struct {
    const Op *op;
} RecurrentCtx;

/* SHORTCONV for the channels of one part: every token's output, then the new window. */
static void short_conv_task(void *vctx, int chunk, int chunks, int thread) {
    const Op *op = ((const RecurrentCtx *)vctx)->op;
    int64_t T = op->ints.short_conv.tokens, C = op->ints.short_conv.channels, K = op->ints.short_conv.kernel;
    int64_t lo, hi;
    split_range(C, chunk, chunks, &lo, &hi);
    const float *x = op->a, *w = op->b;
    float *window = (float *)op->kcache, *out = op->out; /* window (K - 1, C) */
    (void)thread;
    for (int64_t t = 0; t < T; t++) {
        for (int64_t c = lo; c < hi; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < K; j++) {
                int64_t i = t + j - (K - 1); /* input row; before 0 the window's */
                acc += w[c * K + j] * (i < 0 ? window[(K - 1 + i) * C + c] : x[i * C + c]);
            }
            out[t * C + c] = acc / (1.0f + expf(-acc));
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
    RecurrentCtx c = {op};
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

/* DELTANET for the value heads of one part, token by token. */
static void delta_net_task(void *vctx, int chunk, int chunks, int thread) {
    const Op *op = ((const RecurrentCtx *)vctx)->op;
    int64_t T = op->ints.delta_net.tokens, Hk = op->ints.delta_net.k_heads, Hv = op->ints.delta_net.v_heads;
    int64_t D = op->ints.delta_net.head_dim, C = (2 * Hk + Hv) * D;
    float eps = op->floats.delta_net.eps, q_scale = 1.0f / sqrtf((float)D);
    int64_t lo, hi;
    split_range(Hv, chunk, chunks, &lo, &hi);
    (void)thread;
    float q[MAX_DELTA_DIM], k[MAX_DELTA_DIM], delta[MAX_DELTA_DIM];
    for (int64_t h = lo; h < hi; h++) {
        int64_t kh = h % Hk; /* llama.cpp's tiled order of the value heads */
        float *S = (float *)op->kcache + h * D * D; /* (Dk, Dv) */
        float a = op->d[h], dt_bias = op->d[Hv + h];
        for (int64_t t = 0; t < T; t++) {
            const float *row = op->a + t * C;
            l2_normed(row + kh * D, q, D, eps, q_scale);
            l2_normed(row + Hk * D + kh * D, k, D, eps, 1.0f);
            const float *v = row + 2 * Hk * D + h * D;
            float z = op->b[t * Hv + h] + dt_bias;
            float softplus = z > 20.0f ? z : log1pf(expf(z));
            float decay = expf(a * softplus), beta = 1.0f / (1.0f + expf(-op->c[t * Hv + h]));
            for (int64_t j = 0; j < D; j++) delta[j] = 0.0f;
            for (int64_t i = 0; i < D; i++) { /* decay, and what the state predicts for k */
                float *s = S + i * D;
                for (int64_t j = 0; j < D; j++) {
                    s[j] *= decay;
                    delta[j] += k[i] * s[j];
                }
            }
            for (int64_t j = 0; j < D; j++) delta[j] = (v[j] - delta[j]) * beta;
            float *out = op->out + (t * Hv + h) * D;
            for (int64_t j = 0; j < D; j++) out[j] = 0.0f;
            for (int64_t i = 0; i < D; i++) { /* the rank-one update, and the read by q */
                float *s = S + i * D;
                for (int64_t j = 0; j < D; j++) {
                    s[j] += k[i] * delta[j];
                    out[j] += q[i] * s[j];
                }
            }
        }
    }
}

int delta_net(const Op *op, const char **error) {
    (void)error;
    RecurrentCtx c = {op};
    pool_run(delta_net_task, &c);
    return 0;
}

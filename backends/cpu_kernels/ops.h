/* The op set of a forward pass, as records that run eagerly or are replayed as a graph. */
#ifndef SPRIG_OPS_H
#define SPRIG_OPS_H

#include "kernels.h"

enum {
    OP_EMBED = 1,   /* rows ids of mats[0] times f[0]: out (T, cols) */
    OP_LINEAR = 2,  /* x (T, K) times each of mats[i] transposed (+ bias[i]): outs[i] (T, rows_i) */
    OP_RMSNORM = 3, /* a (n0 rows, n1) normalised, times b (n1): out */
    OP_ROPE = 4,    /* a (T=n0, heads=n1, Dh=n2), rotating the first n3 with neox=n4, table f64 (n3/2);
                     * positions pos[0] + t, or pos[t] with n5 (a batch of sequences) */
    OP_ATTN = 5,    /* q, k, v -> out (T, H*Dv) over the layer's cache (see ops.c) */
    OP_GATED = 6,   /* act(a) * b, n0 elements, act n1 (0 silu, 1 gelu_tanh) */
    OP_ADD = 7,     /* a + b, n0 elements */
    OP_SOFTCAP = 8, /* f0 * tanh(a / f0), n0 elements */
};

#define MAX_FUSED 4

typedef struct {
    int code;
    int64_t n[8];
    float f[4];
    const float *a, *b, *c;
    float *out;
    const int64_t *ids;  /* token ids (OP_EMBED) */
    const int64_t *pos;  /* position of the first token (OP_ROPE, OP_ATTN), or of each (OP_ROPE, n5) */
    const double *table; /* inverse frequencies (OP_ROPE) */
    float *kcache, *vcache; /* the layer's keys (Hkv, rows, Dh) and values (Hkv, rows, Dv) (OP_ATTN; ops.c) */
    int n_mats;
    Matrix mats[MAX_FUSED];
    float *outs[MAX_FUSED];
    const float *bias[MAX_FUSED];
} Op;

/* Runs one op with the pool; returns 0, or -1 with a static message in *error. */
int exec_op(const Op *op, const char **error);

#endif

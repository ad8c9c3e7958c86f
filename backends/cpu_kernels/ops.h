/* The op set of a forward pass, as records that run eagerly or are replayed as a graph. */
#ifndef SPRIG_OPS_H
#define SPRIG_OPS_H

#include "kernels.h"

/* Every op, one row each (X-macro): X(NAME, name, code, INTS(int slots...), FLOATS(float
 * slots...)). From it come the OP_ codes, the named slots of an Op (op->ints.rope.heads,
 * op->floats.attn.scale) and the module's OPS, from which the Python side builds each op
 * by keyword; an op arrives with its ints and floats in the order named here.
 *   EMBED    rows ids of mats[0] times `scale`: out (tokens, cols)
 *   LINEAR   x (tokens, K) times each of mats[i] transposed (+ bias[i]): outs[i] (tokens, rows_i)
 *   RMSNORM  a (rows, dim) normalised, times b (dim): out
 *   ROPE     a (tokens, heads, dim), rotating the first rope_dim (neox: halves, else pairs),
 *            inverse frequencies `table` f64 (rope_dim / 2); positions pos[0] + t, or pos[t]
 *            with per_row (a batch of sequences); the rotated features times mscale
 *   ATTN     q, k, v -> out (tokens, heads * value_dim) over the layer's cache, stored as
 *            kv_type (KV_F32, KV_F16, KV_Q8_0; see attention.c); d, when given, each head's
 *            sink logit (heads,), one more term of each softmax
 *   GATED    act(a) * b, `elements` of them, activation 0 silu, 1 gelu_tanh, 2 swiglu_oai; without
 *            b, act(a) alone (silu, gelu_tanh: an ungated MLP)
 *   LAYERNORM a (rows, dim) less its mean, over its standard deviation, times b (dim), plus c
 *            (dim) when given
 *   SCALE    a times `factor`
 *   ADD      a + b
 *   SOFTCAP  cap * tanh(a / cap)
 *   ROUTE    router logits a (tokens, experts) -> out (tokens, 2 * used): each token's `used`
 *            experts (their numbers as floats, then their weights); order 0 softmax then top k
 *            (divided by their sum with normalize), 1 top k then softmax (see ops.c); each
 *            weight then times b[expert] where b (experts,) is given (Gemma 4's per-expert scale)
 *   EXPERTS  x a (tokens, dim) through the experts b (tokens, 2 * used) names, from ROUTE in the
 *            same pass: mats gate, up (experts * ffn, dim) and down (experts * dim, ffn), each
 *            expert's rows contiguous, their biases (or none) in bias[]; out (tokens, dim)
 *   COLUMNS  a (rows, cols) -> out (rows, count): columns start .. start + count - 1 of each row
 *   SHORTCONV silu of the causal depthwise convolution of a (tokens, channels) with the kernels b
 *            (channels, kernel), after the inputs kcache (kernel - 1, channels), which then hold
 *            the last ones (delta_net.c): out (tokens, channels); vcache is kcache
 *   DELTANET the gated delta rule (backends/base.py delta_net) over a (tokens, (2 k_heads +
 *            v_heads) head_dim): queries, keys, values; b alpha and c beta (tokens, v_heads); d
 *            (2 v_heads): A, then dt_bias; kcache the states (v_heads, head_dim, head_dim), vcache
 *            the same; out (tokens, v_heads * head_dim); scanned in chunks of `chunk` tokens
 *   GATE     sigmoid(a) * b, b (rows, dim), a (rows, gate_dim) with gate_dim dim, or 1: a gate per row */
#define OPS(X)                                                                                                  \
    X(EMBED, embed, 1, INTS(tokens), FLOATS(scale))                                                             \
    X(LINEAR, linear, 2, INTS(tokens), FLOATS())                                                                \
    X(RMSNORM, rms_norm, 3, INTS(rows, dim), FLOATS(eps))                                                       \
    X(ROPE, rope, 4, INTS(tokens, heads, dim, rope_dim, neox, per_row), FLOATS(mscale))                         \
    X(ATTN, attention, 5, INTS(tokens, heads, kv_heads, head_dim, value_dim, slots, window, ring, kv_type, causal), \
      FLOATS(scale, softcap))                                                                                   \
    X(GATED, gated, 6, INTS(elements, activation), FLOATS())                                                    \
    X(ADD, add, 7, INTS(elements), FLOATS())                                                                    \
    X(SOFTCAP, softcap, 8, INTS(elements), FLOATS(cap))                                                         \
    X(ROUTE, route, 9, INTS(tokens, experts, used, order, normalize), FLOATS())                                 \
    X(EXPERTS, experts, 10, INTS(tokens, experts, used, ffn, activation), FLOATS())                            \
    X(LAYERNORM, layer_norm, 11, INTS(rows, dim), FLOATS(eps))                                                  \
    X(SCALE, scale, 12, INTS(elements), FLOATS(factor))                                                         \
    X(COLUMNS, columns, 13, INTS(rows, cols, start, count), FLOATS())                                           \
    X(SHORTCONV, short_conv, 14, INTS(tokens, channels, kernel), FLOATS())                                      \
    X(DELTANET, delta_net, 15, INTS(tokens, k_heads, v_heads, head_dim, chunk), FLOATS(eps))                    \
    X(GATE, sigmoid_gate, 16, INTS(rows, dim, gate_dim), FLOATS())
#define INTS(...) __VA_ARGS__
#define FLOATS(...) __VA_ARGS__

#define OP_CODE(NAME, name, code, ints, floats) OP_##NAME = code,
enum { OPS(OP_CODE) };
#undef OP_CODE

#define MAX_INTS 10
#define MAX_FLOATS 4
#define MAX_FUSED 4

/* An op's slots: int64 or float fields named as in OPS, one struct per op over n[] / f[]. */
#define SLOTS_OF(type, name, ...) __VA_OPT__(struct { type __VA_ARGS__; } name;)
#define INT_SLOTS(NAME, name, code, ints, floats) SLOTS_OF(int64_t, name, ints)
#define FLOAT_SLOTS(NAME, name, code, ints, floats) SLOTS_OF(float, name, floats)
typedef union {
    int64_t n[MAX_INTS];
    OPS(INT_SLOTS)
} OpInts;
typedef union {
    float f[MAX_FLOATS];
    OPS(FLOAT_SLOTS)
} OpFloats;
#undef INT_SLOTS
#undef FLOAT_SLOTS
#undef SLOTS_OF
_Static_assert(sizeof(OpInts) == MAX_INTS * sizeof(int64_t), "an op has more than MAX_INTS int slots");
_Static_assert(sizeof(OpFloats) == MAX_FLOATS * sizeof(float), "an op has more than MAX_FLOATS float slots");

typedef struct {
    int code;
    OpInts ints;
    OpFloats floats;
    const float *a, *b, *c;
    const float *d; /* a fourth input, or NULL: the sink logits (ATTN) */
    float *out;
    const int64_t *ids;  /* token ids (EMBED) */
    const int64_t *pos;  /* position of the first token (ROPE, ATTN), or of each (ROPE with per_row) */
    const double *table; /* inverse frequencies (ROPE) */
    unsigned char *kcache, *vcache; /* the layer's keys (Hkv, rows, Dh) and values (Hkv, rows, Dv) as kv_type (ATTN);
                                     * float32 states for SHORTCONV and DELTANET */
    int n_mats;
    Matrix mats[MAX_FUSED];
    float *outs[MAX_FUSED];
    const float *bias[MAX_FUSED];
} Op;

#define MAX_CONV_KERNEL 16 /* SHORTCONV's widest kernel */

/* The KV cache's number formats (backends/kv_types.py), and the bytes of one row of dim values. */
enum { KV_F32 = 0, KV_F16 = 1, KV_Q8_0 = 2 };
int64_t kv_row_bytes(int64_t type, int64_t dim);

/* attention.c: the ATTN op; returns 0, or -1 with a static message in *error. */
int attention(const Op *op, const char **error);

/* Runs one op with the pool; returns 0, or -1 with a static message in *error. */
int exec_op(const Op *op, const char **error);

/* The Gated DeltaNet's ops (delta_net.c). */
int short_conv(const Op *op, const char **error);
int delta_net(const Op *op, const char **error);

#endif

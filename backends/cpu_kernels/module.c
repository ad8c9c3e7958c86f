/* Python bindings: one module per instruction-set tier (_cpu_scalar, _cpu_avx2, ...), built
 * from the same sources. Ops arrive as tuples
 *     (code, (a, b, c, out, ids, pos, table, kcache, vcache, d), mats, ints, floats)
 * with ints and floats in the order OPS (ops.h) names them (the module exports the names as
 * OPS, from which the Python side builds each op by keyword), and mats a tuple of (raw uint8 array, ggml type, rows, cols, out array, bias array or None).
 * `run` executes one op now; `graph` parses a list of them once, and `graph_run` replays it,
 * one call per decode step. Every buffer's size is checked against what the op will touch. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "ops.h"
#include "simd.h"

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define STR_(a) #a
#define STR(a) STR_(a)

static pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;

#define MAX_BATCH 64 /* state arenas one recorded pass may bind */

typedef struct {
    void *ptr;
    Py_ssize_t len; /* bytes */
} Buf;

static int get_buf(PyObject *obj, int writable, Py_ssize_t itemsize, Buf *out, const char *what) {
    out->ptr = NULL;
    out->len = 0;
    if (obj == Py_None) return 0;
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) != 0)
        return -1;
    if (view.itemsize != itemsize) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes, got %zd", what, itemsize, view.itemsize);
        return -1;
    }
    out->ptr = view.buf;
    out->len = view.len;
    PyBuffer_Release(&view); /* the caller keeps the array alive */
    return 0;
}

static int need(const Buf *b, int64_t elements, Py_ssize_t itemsize, const char *what) {
    if (elements < 0 || b->ptr == NULL || b->len < elements * itemsize) {
        PyErr_Format(PyExc_ValueError, "%s is missing or smaller than the op needs (%lld elements)", what,
                     (long long)elements);
        return -1;
    }
    return 0;
}

/* (blocks, type, rows, cols, out, bias), and for a stack tiled expert by expert (Matrix.source)
 * its blocks as the file has them, its flags per expert and whether they lie in a mapped file */
static int parse_matrix(PyObject *item, Matrix *m, Buf *out, Buf *bias) {
    PyObject *raw, *out_obj, *bias_obj, *source_obj = Py_None, *ready_obj = Py_None;
    long long rows, cols;
    m->file_backed = 0;
    if (!PyArg_ParseTuple(item, "OiLLOO|OOp", &raw, &m->type, &rows, &cols, &out_obj, &bias_obj, &source_obj, &ready_obj,
                          &m->file_backed))
        return -1;
    int weights, bytes;
    if (!type_block(m->type, &weights, &bytes)) {
        PyErr_Format(PyExc_ValueError, "GGML type %d has no native kernel", m->type);
        return -1;
    }
    if (rows <= 0 || cols <= 0 || cols % weights) {
        PyErr_Format(PyExc_ValueError, "a %lld x %lld matrix cannot be made of blocks of %d weights", rows, cols,
                     weights);
        return -1;
    }
    Buf data;
    if (get_buf(raw, 0, 1, &data, "weight blocks") != 0) return -1;
    m->rows = rows;
    m->cols = cols;
    m->row_bytes = (size_t)(cols / weights * bytes);
    int tiled = m->type == T_Q1_0_TILES || m->type == T_TQ_TILES ? Q1_TILE : row_tiles_of(m->type) >= 0 ? ROW_TILE : 1;
    int64_t stored_rows = (rows + tiled - 1) / tiled * tiled;
    if (need(&data, stored_rows * (int64_t)m->row_bytes, 1, "weight blocks") != 0) return -1;
    m->data = data.ptr;
    if (get_buf(out_obj, 1, 4, out, "matrix output") != 0 || get_buf(bias_obj, 0, 4, bias, "bias") != 0) return -1;
    Buf source, ready;
    if (get_buf(source_obj, 0, 1, &source, "the stack's blocks") != 0 || get_buf(ready_obj, 1, 1, &ready, "the experts' flags") != 0)
        return -1;
    if ((source.ptr == NULL) != (ready.ptr == NULL) || (source.ptr && (row_tiles_of(m->type) < 0 || rows % ROW_TILE))) {
        PyErr_SetString(PyExc_ValueError, "blocks to tile expert by expert need a stack in row tiles and a flag per expert");
        return -1;
    }
    if (source.ptr && need(&source, rows * (int64_t)m->row_bytes, 1, "the stack's blocks") != 0) return -1;
    m->source = source.ptr;
    m->ready = ready.ptr;
    m->ready_len = ready.len;
    return 0;
}

/* The int and float slots of each op (OPS in ops.h), as their names joined by ", ". */
#define NAMES(...) #__VA_ARGS__
static const struct {
    int code;
    const char *name, *ints, *floats;
} op_table[] = {
#define OP_ROW(NAME, name, code, ints, floats) {code, #name, NAMES(ints), NAMES(floats)},
    OPS(OP_ROW)
#undef OP_ROW
};
#undef NAMES

/* How many names a ", "-joined list holds. */
static int count_names(const char *names) {
    if (!*names) return 0;
    int n = 1;
    for (const char *c = names; *c; c++) n += *c == ',';
    return n;
}

static int parse_op(PyObject *tuple, Op *op) {
    PyObject *bufs, *mats, *ints, *floats;
    memset(op, 0, sizeof *op);
    if (!PyArg_ParseTuple(tuple, "iO!O!O!O!", &op->code, &PyTuple_Type, &bufs, &PyTuple_Type, &mats, &PyTuple_Type,
                          &ints, &PyTuple_Type, &floats))
        return -1;
    size_t row = 0;
    while (row < sizeof op_table / sizeof op_table[0] && op_table[row].code != op->code) row++;
    if (row == sizeof op_table / sizeof op_table[0]) {
        PyErr_Format(PyExc_ValueError, "unknown op %d", op->code);
        return -1;
    }
    if (PyTuple_GET_SIZE(ints) != count_names(op_table[row].ints) ||
        PyTuple_GET_SIZE(floats) != count_names(op_table[row].floats)) {
        PyErr_Format(PyExc_ValueError, "op %s takes ints (%s) and floats (%s)", op_table[row].name, op_table[row].ints,
                     op_table[row].floats);
        return -1;
    }
    if (PyTuple_GET_SIZE(bufs) != 10 || PyTuple_GET_SIZE(mats) > MAX_FUSED) {
        PyErr_SetString(PyExc_ValueError, "malformed op");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ints); i++) {
        op->ints.n[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(ints, i));
        if (op->ints.n[i] == -1 && PyErr_Occurred()) return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(floats); i++) {
        op->floats.f[i] = (float)PyFloat_AsDouble(PyTuple_GET_ITEM(floats, i));
        if (PyErr_Occurred()) return -1;
    }
    Buf a, b, c, out, ids, pos, table, kc, vc, d;
    if (get_buf(PyTuple_GET_ITEM(bufs, 0), 0, 4, &a, "a") || get_buf(PyTuple_GET_ITEM(bufs, 1), 0, 4, &b, "b") ||
        get_buf(PyTuple_GET_ITEM(bufs, 2), 0, 4, &c, "c") || get_buf(PyTuple_GET_ITEM(bufs, 3), 1, 4, &out, "out") ||
        get_buf(PyTuple_GET_ITEM(bufs, 4), 0, 8, &ids, "ids") || get_buf(PyTuple_GET_ITEM(bufs, 5), 0, 8, &pos, "pos") ||
        get_buf(PyTuple_GET_ITEM(bufs, 6), 0, 8, &table, "table") ||
        get_buf(PyTuple_GET_ITEM(bufs, 7), 1, 4, &kc, "kcache") || get_buf(PyTuple_GET_ITEM(bufs, 8), 1, 4, &vc, "vcache") ||
        get_buf(PyTuple_GET_ITEM(bufs, 9), 0, 4, &d, "d"))
        return -1;
    op->a = a.ptr;
    op->b = b.ptr;
    op->c = c.ptr;
    op->out = out.ptr;
    op->ids = ids.ptr;
    op->pos = pos.ptr;
    op->table = table.ptr;
    op->kcache = kc.ptr;
    op->vcache = vc.ptr;
    op->d = d.ptr;
    op->n_mats = (int)PyTuple_GET_SIZE(mats);
    Buf outs[MAX_FUSED], biases[MAX_FUSED];
    for (int m = 0; m < op->n_mats; m++) {
        PyObject *item = PyTuple_GET_ITEM(mats, m);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "a matrix is a tuple");
            return -1;
        }
        if (parse_matrix(item, &op->mats[m], &outs[m], &biases[m]) != 0) return -1;
        op->outs[m] = outs[m].ptr;
        op->bias[m] = biases[m].ptr;
    }
    switch (op->code) {
    case OP_EMBED: {
        int64_t tokens = op->ints.embed.tokens;
        if (op->n_mats != 1 || op->mats[0].type == T_Q1_0_TILES || op->mats[0].type == T_TQ_TILES) break;
        return need(&ids, tokens, 8, "ids") || need(&out, tokens * op->mats[0].cols, 4, "out");
    }
    case OP_LINEAR: {
        int64_t tokens = op->ints.linear.tokens;
        if (op->n_mats < 1) break;
        if (need(&a, tokens * op->mats[0].cols, 4, "x")) return -1;
        for (int m = 0; m < op->n_mats; m++) {
            if (op->mats[m].cols != op->mats[0].cols || op->mats[m].type == T_Q1_0 || op->mats[m].source)
                goto inconsistent; /* Q1_0: tiled; a stack tiled expert by expert: experts only */
            if (need(&outs[m], tokens * op->mats[m].rows, 4, "matrix output")) return -1;
            if (op->bias[m] && need(&biases[m], op->mats[m].rows, 4, "bias")) return -1;
        }
        return 0;
    }
    case OP_RMSNORM: {
        int64_t rows = op->ints.rms_norm.rows, dim = op->ints.rms_norm.dim;
        return need(&a, rows * dim, 4, "x") || need(&out, rows * dim, 4, "out") || need(&b, dim, 4, "weight");
    }
    case OP_ROPE: {
        int64_t tokens = op->ints.rope.tokens, size = tokens * op->ints.rope.heads * op->ints.rope.dim;
        int64_t rope_dim = op->ints.rope.rope_dim;
        if (rope_dim > op->ints.rope.dim || rope_dim % 2) break;
        return need(&a, size, 4, "x") || need(&out, size, 4, "out") || need(&table, rope_dim / 2, 8, "table") ||
               need(&pos, op->ints.rope.per_row ? tokens : 1, 8, "pos");
    }
    case OP_ATTN: {
        int64_t T = op->ints.attention.tokens, H = op->ints.attention.heads, Hkv = op->ints.attention.kv_heads;
        int64_t Dh = op->ints.attention.head_dim, Dv = op->ints.attention.value_dim, slots = op->ints.attention.slots;
        if (H <= 0 || Hkv <= 0 || H % Hkv || slots <= 0) break;
        int64_t rows = op->ints.attention.ring ? 2 * slots : slots, type = op->ints.attention.kv_type; /* a ring is mirrored */
        if (type < KV_F32 || type > KV_Q8_0) break;
        int64_t key_floats = (Hkv * rows * kv_row_bytes(type, Dh) + 3) / 4, value_floats = (Hkv * rows * kv_row_bytes(type, Dv) + 3) / 4;
        return need(&a, T * H * Dh, 4, "q") || need(&b, T * Hkv * Dh, 4, "k") || need(&c, T * Hkv * Dv, 4, "v") ||
               need(&out, T * H * Dv, 4, "out") || need(&kc, key_floats, 4, "key cache") ||
               need(&vc, value_floats, 4, "value cache") || need(&pos, 1, 8, "pos") ||
               (op->d && need(&d, H, 4, "sinks"));
    }
    case OP_GATED: {
        int64_t n = op->ints.gated.elements;
        if (!op->b && op->ints.gated.activation == 2) break; /* swiglu_oai needs both halves */
        return need(&a, n, 4, "a") || (op->b && need(&b, n, 4, "b")) || need(&out, n, 4, "out");
    }
    case OP_LAYERNORM: {
        int64_t rows = op->ints.layer_norm.rows, dim = op->ints.layer_norm.dim;
        return need(&a, rows * dim, 4, "x") || need(&out, rows * dim, 4, "out") || need(&b, dim, 4, "weight") ||
               (op->c && need(&c, dim, 4, "bias"));
    }
    case OP_SCALE:
        return need(&a, op->ints.scale.elements, 4, "a") || need(&out, op->ints.scale.elements, 4, "out");
    case OP_ADD: {
        int64_t n = op->ints.add.elements;
        return need(&a, n, 4, "a") || need(&b, n, 4, "b") || need(&out, n, 4, "out");
    }
    case OP_SOFTCAP:
        if (op->floats.softcap.cap == 0.0f) break;
        return need(&a, op->ints.softcap.elements, 4, "a") || need(&out, op->ints.softcap.elements, 4, "out");
    case OP_ROUTE: {
        int64_t T = op->ints.route.tokens, E = op->ints.route.experts, k = op->ints.route.used;
        if (E <= 0 || k <= 0 || k > E || (op->ints.route.order != 0 && op->ints.route.order != 1)) break;
        return need(&a, T * E, 4, "router logits") || need(&out, T * 2 * k, 4, "out") ||
               (op->b && need(&b, E, 4, "expert scales"));
    }
    case OP_COLUMNS: {
        int64_t rows = op->ints.columns.rows, cols = op->ints.columns.cols;
        int64_t start = op->ints.columns.start, count = op->ints.columns.count;
        if (start < 0 || count <= 0 || start + count > cols) break;
        return need(&a, rows * cols, 4, "x") || need(&out, rows * count, 4, "out");
    }
    case OP_SHORTCONV: {
        int64_t T = op->ints.short_conv.tokens, C = op->ints.short_conv.channels, K = op->ints.short_conv.kernel;
        if (C <= 0 || K < 2 || K > MAX_CONV_KERNEL || op->kcache != op->vcache) break;
        return need(&a, T * C, 4, "x") || need(&b, C * K, 4, "kernels") || need(&out, T * C, 4, "out") ||
               need(&kc, (K - 1) * C, 4, "window");
    }
    case OP_DELTANET: {
        int64_t T = op->ints.delta_net.tokens, Hk = op->ints.delta_net.k_heads, Hv = op->ints.delta_net.v_heads;
        int64_t D = op->ints.delta_net.head_dim, L = op->ints.delta_net.chunk;
        if (Hk <= 0 || Hv <= 0 || Hv % Hk || D <= 0 || L <= 0 || op->kcache != op->vcache) break;
        return need(&a, T * (2 * Hk + Hv) * D, 4, "x") || need(&b, T * Hv, 4, "alpha") || need(&c, T * Hv, 4, "beta") ||
               need(&d, 2 * Hv, 4, "A and dt_bias") || need(&out, T * Hv * D, 4, "out") ||
               need(&kc, Hv * D * D, 4, "state");
    }
    case OP_GATE: {
        int64_t rows = op->ints.sigmoid_gate.rows, dim = op->ints.sigmoid_gate.dim;
        int64_t gate_dim = op->ints.sigmoid_gate.gate_dim;
        if (dim <= 0 || (gate_dim != 1 && gate_dim != dim)) break;
        return need(&a, rows * gate_dim, 4, "gate") || need(&b, rows * dim, 4, "b") || need(&out, rows * dim, 4, "out");
    }
    case OP_EXPERTS: {
        int64_t T = op->ints.experts.tokens, E = op->ints.experts.experts, k = op->ints.experts.used;
        int64_t F = op->ints.experts.ffn, act = op->ints.experts.activation;
        if (op->n_mats != 3 || E <= 0 || k <= 0 || F <= 0 || act < 0 || act > 2) break;
        int64_t D = op->mats[0].cols;
        const Matrix *m = op->mats;
        for (int i = 0; i < 3; i++) /* Q1_0: converted; row tiles only made expert by expert, a flag each */
            if (m[i].source ? m[i].ready_len < E : !type_takes_codes(m[i].type) && !type_is_float(m[i].type)) goto inconsistent;
        if (m[0].rows != E * F || m[1].rows != E * F || m[1].cols != D || m[2].rows != E * D || m[2].cols != F) break;
        if (outs[0].ptr || outs[1].ptr || outs[2].ptr) break;
        return need(&a, T * D, 4, "x") || need(&b, T * 2 * k, 4, "choice") || need(&out, T * D, 4, "out") ||
               (op->bias[0] && need(&biases[0], E * F, 4, "gate bias")) ||
               (op->bias[1] && need(&biases[1], E * F, 4, "up bias")) ||
               (op->bias[2] && need(&biases[2], E * D, 4, "down bias"));
    }
    }
inconsistent:
    PyErr_Format(PyExc_ValueError, "op %d has inconsistent arguments", op->code);
    return -1;
}

static int exec_ops(const Op *ops, Py_ssize_t n) {
    const char *error = NULL;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&exec_lock);
    for (Py_ssize_t i = 0; i < n && status == 0; i++) status = exec_op(&ops[i], &error);
    pthread_mutex_unlock(&exec_lock);
    Py_END_ALLOW_THREADS
    if (status != 0) PyErr_SetString(PyExc_RuntimeError, error);
    return status;
}

static PyObject *py_run(PyObject *self, PyObject *args) {
    PyObject *tuple;
    Op op;
    if (!PyArg_ParseTuple(args, "O!", &PyTuple_Type, &tuple) || parse_op(tuple, &op) != 0) return NULL;
    if (exec_ops(&op, 1) != 0) return NULL;
    Py_RETURN_NONE;
}

/* A parsed op list with what it reads and writes between calls: `state` (int64: the
 * positions and tokens of the pass) and `output` (its logits). Its attention ops are bound
 * at each call to the same place in the caller's state arenas (one float32 array per
 * sequence, holding every layer's keys and values) as in the arenas it was recorded on, so
 * one recording serves any arenas of the same size; it keeps no reference to those (the
 * caller may drop them from the op list once parsed). */
typedef struct {
    Py_ssize_t n;
    Op *ops;
    int64_t *state;
    Py_ssize_t state_len, output_len; /* elements */
    float *output;
    Py_ssize_t n_arenas;              /* one per sequence of a batch */
    Py_ssize_t *arena_bytes;          /* each arena's size */
    Py_ssize_t *arena_of;             /* per op: the arena its kcache and vcache lie in, or -1 */
    ptrdiff_t *k_at, *v_at;           /* per op: where in that arena, in bytes */
    PyObject *keep;                   /* the op list, state and output */
} Graph;

static void graph_release(Graph *g) {
    free(g->ops);
    free(g->arena_bytes);
    free(g->arena_of);
    free(g->k_at);
    free(g->v_at);
    Py_XDECREF(g->keep);
    free(g);
}

static void graph_free(PyObject *capsule) {
    Graph *g = PyCapsule_GetPointer(capsule, "sprig.graph");
    if (g) graph_release(g);
}

/* The arenas (float32 arrays, one per sequence) as buffers; `n` of them, the sizes checked
 * against `g` unless `g` is NULL. */
static int get_arenas(PyObject *arenas, Py_ssize_t n, const Graph *g, Buf *out) {
    if (!PyTuple_Check(arenas) || PyTuple_GET_SIZE(arenas) != n) {
        PyErr_Format(PyExc_ValueError, "expected a tuple of %zd state arenas", n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (get_buf(PyTuple_GET_ITEM(arenas, i), 1, 4, &out[i], "state arena")) return -1;
        if (g && out[i].len != g->arena_bytes[i]) {
            PyErr_SetString(PyExc_ValueError, "a state arena differs in size from the one the pass was recorded on");
            return -1;
        }
    }
    return 0;
}

static PyObject *py_graph(PyObject *self, PyObject *args) {
    PyObject *list, *state_obj, *output_obj, *arenas;
    if (!PyArg_ParseTuple(args, "O!OOO!", &PyList_Type, &list, &state_obj, &output_obj, &PyTuple_Type, &arenas))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(list), n_arenas = PyTuple_GET_SIZE(arenas);
    Buf state, output;
    if (get_buf(state_obj, 1, 8, &state, "state") || get_buf(output_obj, 1, 4, &output, "output")) return NULL;
    Buf *arena = calloc(n_arenas ? (size_t)n_arenas : 1, sizeof(Buf));
    Graph *g = calloc(1, sizeof *g);
    size_t slots = n ? (size_t)n : 1;
    if (g) {
        g->ops = calloc(slots, sizeof(Op));
        g->arena_of = calloc(slots, sizeof(Py_ssize_t));
        g->k_at = calloc(slots, sizeof(ptrdiff_t));
        g->v_at = calloc(slots, sizeof(ptrdiff_t));
        g->arena_bytes = calloc(n_arenas ? (size_t)n_arenas : 1, sizeof(Py_ssize_t));
    }
    if (!arena || !g || !g->ops || !g->arena_of || !g->k_at || !g->v_at || !g->arena_bytes) {
        free(arena);
        if (g) graph_release(g);
        return PyErr_NoMemory();
    }
    int failed = get_arenas(arenas, n_arenas, NULL, arena) != 0;
    for (Py_ssize_t i = 0; i < n_arenas && !failed; i++) g->arena_bytes[i] = arena[i].len;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyTuple_Check(item) || parse_op(item, &g->ops[i]) != 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "an op is a tuple");
            failed = 1;
            break;
        }
        g->arena_of[i] = -1;
        const char *kc = (const char *)g->ops[i].kcache, *vc = (const char *)g->ops[i].vcache;
        for (Py_ssize_t s = 0; kc && s < n_arenas; s++) {
            const char *a0 = arena[s].ptr, *a1 = a0 + arena[s].len;
            if (kc >= a0 && kc < a1 && vc >= a0 && vc < a1) {
                g->arena_of[i] = s;
                g->k_at[i] = kc - a0;
                g->v_at[i] = vc - a0;
            }
        }
        if (kc && g->arena_of[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "an attention op's cache lies in none of the pass's state arenas");
            failed = 1;
        }
    }
    free(arena);
    if (failed) {
        graph_release(g);
        return NULL;
    }
    g->n = n;
    g->n_arenas = n_arenas;
    g->state = state.ptr;
    g->state_len = state.len / 8;
    g->output = output.ptr;
    g->output_len = output.len / 4;
    g->keep = PyTuple_Pack(3, list, state_obj, output_obj);
    PyObject *capsule = g->keep ? PyCapsule_New(g, "sprig.graph", graph_free) : NULL;
    if (!capsule) graph_release(g);
    return capsule;
}

/* graph_run(graph, state, out, arenas): the pass with `state` (int64, as long as the
 * recorded one) on `arenas` (a float32 state arena per recorded one, each the same size),
 * its output copied into `out`; all three under the lock, so threads may share a graph. */
static PyObject *py_graph_run(PyObject *self, PyObject *args) {
    PyObject *capsule, *state_obj, *out_obj, *arenas;
    if (!PyArg_ParseTuple(args, "OOOO", &capsule, &state_obj, &out_obj, &arenas)) return NULL;
    Graph *g = PyCapsule_GetPointer(capsule, "sprig.graph");
    if (!g) return NULL;
    Buf state, out, arena[MAX_BATCH];
    if (g->n_arenas > MAX_BATCH) return PyErr_Format(PyExc_ValueError, "a pass over more than %d arenas", MAX_BATCH);
    if (get_buf(state_obj, 0, 8, &state, "state") || need(&state, g->state_len, 8, "state") ||
        get_buf(out_obj, 1, 4, &out, "output") || need(&out, g->output_len, 4, "output") ||
        get_arenas(arenas, g->n_arenas, g, arena))
        return NULL;
    const char *error = NULL;
    int status = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&exec_lock);
    memcpy(g->state, state.ptr, sizeof(int64_t) * (size_t)g->state_len);
    for (Py_ssize_t i = 0; i < g->n; i++) {
        if (g->arena_of[i] < 0) continue;
        g->ops[i].kcache = (unsigned char *)arena[g->arena_of[i]].ptr + g->k_at[i];
        g->ops[i].vcache = (unsigned char *)arena[g->arena_of[i]].ptr + g->v_at[i];
    }
    for (Py_ssize_t i = 0; i < g->n && status == 0; i++) status = exec_op(&g->ops[i], &error);
    if (status == 0) memcpy(out.ptr, g->output, sizeof(float) * (size_t)g->output_len);
    pthread_mutex_unlock(&exec_lock);
    Py_END_ALLOW_THREADS
    if (status != 0) {
        PyErr_SetString(PyExc_RuntimeError, error);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_set_threads(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&exec_lock);
    pool_set_threads(n);
    pthread_mutex_unlock(&exec_lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(pool_threads());
}

static PyObject *py_threads(PyObject *self, PyObject *noargs) { return PyLong_FromLong(pool_threads()); }

/* Units [0, n) of a job shared out among the kernels' threads: each chunk of the pool's task
 * calls fn(ctx, lo, hi) on its part, if not empty */
typedef struct {
    void (*fn)(void *ctx, int64_t lo, int64_t hi);
    void *ctx;
    int64_t n;
} Shares;

static void shares_task(void *vctx, int chunk, int chunks, int thread) {
    const Shares *c = vctx;
    int64_t lo, hi;
    (void)thread;
    split_range(c->n, chunk, chunks, &lo, &hi);
    if (lo < hi) c->fn(c->ctx, lo, hi);
}

/* fn over [0, n) on the kernels' threads, without the GIL, one job at a time as ops run */
static void run_shares(int64_t n, void (*fn)(void *ctx, int64_t lo, int64_t hi), void *ctx) {
    Shares shares = {fn, ctx, n};
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&exec_lock);
    pool_run(shares_task, &shares);
    pthread_mutex_unlock(&exec_lock);
    Py_END_ALLOW_THREADS
}

typedef struct {
    int type, bytes;
    const uint8_t *data;
    atomic_llong bad;
} ScaleCheck;

static void check_scales(void *vctx, int64_t lo, int64_t hi) {
    ScaleCheck *c = vctx;
    atomic_fetch_add(&c->bad, count_bad_scales(c->type, c->data + lo * c->bytes, hi - lo));
}

/* How many of n_blocks blocks have an inf or nan scale, counted by the kernels' threads (the
 * first read of a mapped file's pages: both cores take their faults) */
static PyObject *py_count_bad_scales(PyObject *self, PyObject *args) {
    PyObject *raw;
    int type;
    long long n_blocks;
    if (!PyArg_ParseTuple(args, "OiL", &raw, &type, &n_blocks)) return NULL;
    int weights, bytes;
    Buf data;
    if (!type_block(type, &weights, &bytes)) return PyErr_Format(PyExc_ValueError, "GGML type %d is not native", type);
    if (get_buf(raw, 0, 1, &data, "blocks") != 0 || need(&data, n_blocks * bytes, 1, "blocks") != 0) return NULL;
    ScaleCheck check = {type, bytes, data.ptr, 0};
    run_shares(n_blocks, check_scales, &check);
    return PyLong_FromLongLong(atomic_load(&check.bad));
}

/* A matrix's blocks once they are regrouped into tiles: products do not read them again, so
 * they leave the process's memory. Pages of a mapped file (`file_backed`) are only unmapped
 * (MADV_DONTNEED: the page cache keeps them, for the next load, and a read maps them again);
 * other memory the kernel may reclaim (MADV_PAGEOUT writes back or drops only what it can read
 * again: DONTNEED would zero private anonymous pages). */
void page_out(const uint8_t *ptr, int64_t size, int file_backed) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = ((uintptr_t)ptr + page - 1) / page * page,
              end = ((uintptr_t)ptr + (uintptr_t)size) / page * page;
    if (end <= start) return;
    if (file_backed) madvise((void *)start, end - start, MADV_DONTNEED);
#ifdef MADV_PAGEOUT
    else madvise((void *)start, end - start, MADV_PAGEOUT);
#endif
}

typedef struct {
    tile_fn tile;
    int type;
    const uint8_t *raw;
    int64_t rows, K;
    uint8_t *tiles;
    atomic_int failed;
} Tiling;

static void make_tiles(void *vctx, int64_t t0, int64_t t1) {
    Tiling *c = vctx;
    if (c->tile(c->type, c->raw, c->rows, c->K, t0, t1, c->tiles) != 0) atomic_store(&c->failed, 1);
}

/* A matrix's blocks (`raw`, rows x cols of `type`) regrouped into the tiles its product reads,
 * by the kernels' threads (as an op runs: one at a time), as a new bytes object; the blocks then
 * leave the process's memory (page_out; `file_backed`: they lie in a mapped file):
 *   - Q1_0: tiles of Q1_TILE rows for the table-lookup product (q1_tiles.c);
 *   - TQ1_0, TQ2_0: tiles of Q1_TILE rows of 2-bit codes, the same (tq_tiles.c);
 *   - the row-tiled types (row_tiled_type): tiles of ROW_TILE rows, a row per lane, of the
 *     blocks' size but for the padded rows (row_tiles.c). */
static PyObject *py_tile(PyObject *self, PyObject *args) {
    PyObject *raw;
    int type, file_backed, weights, block_bytes;
    long long rows, cols;
    Buf data;
    if (!PyArg_ParseTuple(args, "OiLLp", &raw, &type, &rows, &cols, &file_backed)) return NULL;
    const int table = type == T_Q1_0 || type == T_TQ1_0 || type == T_TQ2_0;
    if ((!table && !row_tiled_type(type)) || !type_block(type, &weights, &block_bytes) || rows <= 0 || cols <= 0 ||
        cols % weights)
        return PyErr_Format(PyExc_ValueError, "a %lld x %lld matrix of GGML type %d is not taken in tiles", rows, cols, type);
    const int64_t size = rows * (cols / weights) * block_bytes;
    if (get_buf(raw, 0, 1, &data, "blocks") != 0 || need(&data, size, 1, "blocks") != 0) return NULL;
    Tiling tiling = {type == T_Q1_0 ? q1_tile_matrix : table ? tq_tile_matrix : row_tile_matrix, type, data.ptr, rows, cols,
                     NULL, 0};
    const int64_t bytes = type == T_Q1_0 ? q1_tiled_bytes(rows, cols) : table ? tq_tiled_bytes(rows, cols)
                                                                              : row_tiled_bytes(type, rows, cols);
    PyObject *tiles = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bytes);
    if (!tiles) return NULL;
    tiling.tiles = (uint8_t *)PyBytes_AS_STRING(tiles);
    run_shares(table ? (rows + Q1_TILE - 1) / Q1_TILE : (rows + ROW_TILE - 1) / ROW_TILE, make_tiles, &tiling);
    if (!atomic_load(&tiling.failed)) page_out(data.ptr, size, file_backed);
    if (atomic_load(&tiling.failed)) {
        Py_DECREF(tiles);
        return PyErr_NoMemory();
    }
    return tiles;
}

#if defined(__x86_64__) || defined(__i386__)
/* Whether the cores run a 512-bit operation as two 256-bit halves: AMD's family 19h with AVX-512
 * (Zen 4; Zen 3 has none, Zen 5 is family 1Ah and runs them whole). */
static int avx512_halves(void) {
    unsigned eax, ebx, ecx, edx;
    if (!__builtin_cpu_supports("avx512f") || !__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return 0;
    const int amd = ebx == 0x68747541 && edx == 0x69746e65 && ecx == 0x444d4163; /* "AuthenticAMD" */
    if (!amd || !__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return 0;
    return ((eax >> 8) & 15) + ((eax >> 20) & 255) == 0x19; /* base family 0xF plus the extended one */
}
#endif

/* Whether this CPU has a feature; asked of the scalar module before loading a faster tier. */
static PyObject *py_cpu_has(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name)) return NULL;
    int has = 0;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!strcmp(name, "avx2")) has = __builtin_cpu_supports("avx2");
    else if (!strcmp(name, "fma")) has = __builtin_cpu_supports("fma");
    else if (!strcmp(name, "f16c")) has = __builtin_cpu_supports("f16c");
    else if (!strcmp(name, "avx512f")) has = __builtin_cpu_supports("avx512f");
    else if (!strcmp(name, "avx512bw")) has = __builtin_cpu_supports("avx512bw");
    else if (!strcmp(name, "avx512vl")) has = __builtin_cpu_supports("avx512vl");
    else if (!strcmp(name, "avx512vnni")) has = __builtin_cpu_supports("avx512vnni");
    else if (!strcmp(name, "avx512_halves")) has = avx512_halves();
#elif defined(__aarch64__)
    if (!strcmp(name, "neon")) has = 1;
#if defined(__linux__)
    else if (!strcmp(name, "dotprod")) has = (getauxval(AT_HWCAP) & (1UL << 20)) != 0; /* HWCAP_ASIMDDP */
#elif defined(__APPLE__)
    else if (!strcmp(name, "dotprod")) has = 1; /* every Apple silicon core has it */
#endif
#endif
    return PyBool_FromLong(has);
}

/* exp8 of a float32 buffer, as bytes: the softmax's and activations' exp, for its error test. */
static PyObject *py_exp(PyObject *self, PyObject *args) {
    PyObject *raw;
    if (!PyArg_ParseTuple(args, "O", &raw)) return NULL;
    Buf data;
    if (get_buf(raw, 0, sizeof(float), &data, "floats") != 0) return NULL;
    Py_ssize_t n = (Py_ssize_t)(data.len / (Py_ssize_t)sizeof(float));
    PyObject *result = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(float));
    if (!result) return NULL;
    float *out = (float *)PyBytes_AS_STRING(result);
    const float *x = (const float *)data.ptr;
    for (Py_ssize_t i = 0; i < n; i += 8) exp_floats(x + i, out + i, n - i < 8 ? n - i : 8);
    return result;
}

static PyMethodDef methods[] = {
    {"run", py_run, METH_VARARGS, "Run one op now (GIL released)."},
    {"graph", py_graph, METH_VARARGS, "Parse a list of ops (its state, output, state arenas) once; a handle for graph_run."},
    {"graph_run", py_graph_run, METH_VARARGS, "Replay a parsed op list on given state arenas (GIL released)."},
    {"set_threads", py_set_threads, METH_VARARGS, "Use n threads, the caller included; returns the count."},
    {"threads", py_threads, METH_NOARGS, "Threads in use, the caller included."},
    {"tile", py_tile, METH_VARARGS, "a matrix's blocks (type, rows, cols, file_backed) regrouped into the tiles its product reads, as bytes."},
    {"count_bad_scales", py_count_bad_scales, METH_VARARGS, "Blocks of a tensor with an inf or nan scale."},
    {"exp", py_exp, METH_VARARGS, "exp of float32 values (the kernels' vectorized exp), as bytes."},
    {"cpu_has", py_cpu_has, METH_VARARGS, "Whether the CPU has an instruction-set feature."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(SPRIG_MODULE), "Sprig's native CPU kernels.", -1,
                                    methods};

/* {GGML type number: name} of every type of QUANT_TYPES (kernels.h): the types the kernels
 * read in place. */
static PyObject *native_types(void) {
    PyObject *types = PyDict_New();
#define ADD_TYPE(name, number, ...)                                                                         \
    if (types) {                                                                                            \
        PyObject *key = PyLong_FromLong(number), *value = PyUnicode_FromString(#name);                     \
        if (!key || !value || PyDict_SetItem(types, key, value) != 0) Py_CLEAR(types);                     \
        Py_XDECREF(key);                                                                                    \
        Py_XDECREF(value);                                                                                  \
    }
    QUANT_TYPES(ADD_TYPE)
#undef ADD_TYPE
    return types;
}

/* A ", "-joined list of names as a tuple of str. */
static PyObject *names_tuple(const char *joined) {
    if (!*joined) return PyTuple_New(0);
    PyObject *text = PyUnicode_FromString(joined), *separator = PyUnicode_FromString(", ");
    PyObject *names = text && separator ? PyUnicode_Split(text, separator, -1) : NULL;
    PyObject *tuple = names ? PySequence_Tuple(names) : NULL;
    Py_XDECREF(text);
    Py_XDECREF(separator);
    Py_XDECREF(names);
    return tuple;
}

/* {name: (code, int slot names, float slot names)} of every op of OPS (ops.h). */
static PyObject *ops_dict(void) {
    PyObject *ops = PyDict_New();
    for (size_t i = 0; ops && i < sizeof op_table / sizeof op_table[0]; i++) {
        PyObject *ints = names_tuple(op_table[i].ints), *floats = names_tuple(op_table[i].floats);
        PyObject *entry = ints && floats ? Py_BuildValue("(iOO)", op_table[i].code, ints, floats) : NULL;
        if (!entry || PyDict_SetItemString(ops, op_table[i].name, entry) != 0) Py_CLEAR(ops);
        Py_XDECREF(entry);
        Py_XDECREF(ints);
        Py_XDECREF(floats);
    }
    return ops;
}

PyMODINIT_FUNC CAT(PyInit_, SPRIG_MODULE)(void) {
    q1_tiles_init();
    tq_tiles_init();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    PyObject *types = native_types(), *ops = ops_dict();
    if (!types || PyModule_AddObject(m, "NATIVE_TYPES", types) != 0) {
        Py_XDECREF(types);
        Py_XDECREF(ops);
        Py_DECREF(m);
        return NULL;
    }
    if (!ops || PyModule_AddObject(m, "OPS", ops) != 0) {
        Py_XDECREF(ops);
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddStringConstant(m, "TIER", SPRIG_TIER) != 0 || PyModule_AddIntConstant(m, "Q1_0_TILES", T_Q1_0_TILES) != 0 ||
        PyModule_AddIntConstant(m, "TQ_TILES", T_TQ_TILES) != 0 || PyModule_AddIntConstant(m, "ROW_TILES", T_ROW_TILES) != 0 ||
        PyModule_AddIntConstant(m, "ROW_TILE", ROW_TILE) != 0 || PyModule_AddStringConstant(m, "TQ_KERNEL", tq_kernel()) != 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

// Norms, rotary embedding and the elementwise ops of the backend contract (backends/base.py),
// over float32 row-major activations. Every kernel reads and writes each element once from
// global memory, in coalesced runs; reductions go through warp shuffles, then (for a whole
// block) through a few shared floats. The NumPy backend is the reference for every formula.

#define POINTWISE_THREADS 256
#define ROPE_THREADS 256
#define ROPE_MAX_HALF 256  // rope_dim / 2 at most (head dims up to 512)
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// The sum of v over a row group of G threads: G == 32 is one warp, G == POINTWISE_THREADS the
// whole block (every thread of the block must call it). Every thread of the group gets the sum.
template <int G>
__device__ __forceinline__ float group_sum(float v, float* scratch) {
    v = warp_sum(v);
    if (G == 32) return v;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // the previous call's readers are done with scratch
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < POINTWISE_THREADS / 32 ? scratch[lane] : 0.0f);
}

// RMS norm, rows of `dim` floats. Thread map: a row group of G threads per row (G = 32: one
// warp per row, 8 rows a block, for short rows such as per-head norms; G = 256: one block
// per row, for the model width); thread j of a group takes elements j, j + G, ... of its row.
// out may be x (every element is read before the group's reduction, and written after it).
template <int G>
__device__ __forceinline__ void rms_norm_rows(const float* x, int rows, int dim, const float* weight, float eps,
                                              float* out) {
    __shared__ float scratch[POINTWISE_THREADS / 32];
    const int row = blockIdx.x * (POINTWISE_THREADS / G) + threadIdx.x / G;
    const int j = threadIdx.x % G;
    if (G == 32 && row >= rows) return;  // a whole warp leaves: no barrier or shuffle waits for it
    const float* xr = x + (long long)row * dim;
    float* yr = out + (long long)row * dim;
    float squares = 0.0f;
    for (int i = j; i < dim; i += G) squares += xr[i] * xr[i];
    const float inv = 1.0f / sqrtf(group_sum<G>(squares, scratch) / (float)dim + eps);
    for (int i = j; i < dim; i += G) yr[i] = xr[i] * inv * weight[i];
}

extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS)
    rms_norm_warp(const float* x, int rows, int dim, const float* weight, float eps, float* out) {
    rms_norm_rows<32>(x, rows, dim, weight, eps, out);
}

extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS)
    rms_norm_block(const float* x, int rows, int dim, const float* weight, float eps, float* out) {
    rms_norm_rows<POINTWISE_THREADS>(x, rows, dim, weight, eps, out);
}

// LayerNorm, the same thread map as rms_norm: the mean, then the variance of the centred
// row (two reads of the row, the second from cache), then the write. bias may be null.
// out may be x.
template <int G>
__device__ __forceinline__ void layer_norm_rows(const float* x, int rows, int dim, const float* weight,
                                                const float* bias, float eps, float* out) {
    __shared__ float scratch[POINTWISE_THREADS / 32];
    const int row = blockIdx.x * (POINTWISE_THREADS / G) + threadIdx.x / G;
    const int j = threadIdx.x % G;
    if (G == 32 && row >= rows) return;
    const float* xr = x + (long long)row * dim;
    float* yr = out + (long long)row * dim;
    float sum = 0.0f;
    for (int i = j; i < dim; i += G) sum += xr[i];
    const float mean = group_sum<G>(sum, scratch) / (float)dim;
    float squares = 0.0f;
    for (int i = j; i < dim; i += G) squares += (xr[i] - mean) * (xr[i] - mean);
    const float inv = 1.0f / sqrtf(group_sum<G>(squares, scratch) / (float)dim + eps);
    for (int i = j; i < dim; i += G) yr[i] = (xr[i] - mean) * inv * weight[i] + (bias ? bias[i] : 0.0f);
}

extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS) layer_norm_warp(
    const float* x, int rows, int dim, const float* weight, const float* bias, float eps, float* out) {
    layer_norm_rows<32>(x, rows, dim, weight, bias, eps, out);
}

extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS) layer_norm_block(
    const float* x, int rows, int dim, const float* weight, const float* bias, float eps, float* out) {
    layer_norm_rows<POINTWISE_THREADS>(x, rows, dim, weight, bias, eps, out);
}

// -- elementwise ------------------------------------------------------------------------
// Thread map for all of them: a grid-stride loop, thread i of the grid takes elements i,
// i + gridDim.x * blockDim.x, ... (consecutive threads, consecutive floats). out may be any
// input that is read at the same index (see the Python docstrings).

#define OP_SCALE 0
#define OP_SOFTCAP 1
#define OP_SILU 2
#define OP_GELU_TANH 3
#define OP_SIGMOID 4
#define OP_SWIGLU_OAI 5

#define SWIGLU_ALPHA 1.702f
#define SWIGLU_LIMIT 7.0f

// act(gate) * up for the gated kinds (silu, gelu_tanh, sigmoid, swiglu_oai), as numpy_backend writes them.
__device__ __forceinline__ float gated_value(int kind, float g, float u) {
    switch (kind) {
        case OP_SILU:
            return g * (0.5f * (1.0f + tanhf(0.5f * g))) * u;
        case OP_GELU_TANH:
            return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * g * (1.0f + 0.044715f * g * g))) * u;
        case OP_SIGMOID:
            return u / (1.0f + expf(-g));
        default: {  // OP_SWIGLU_OAI
            const float gc = fminf(g, SWIGLU_LIMIT);
            const float uc = fminf(fmaxf(u, -SWIGLU_LIMIT), SWIGLU_LIMIT);
            return gc / (1.0f + expf(-SWIGLU_ALPHA * gc)) * (uc + 1.0f);
        }
    }
}

// x * factor (scale), factor * tanh(x / factor) (softcap), or an activation of x (silu, gelu_tanh).
extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS)
    unary(const float* x, int n, int op, float factor, float* out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float v = x[i];
        out[i] = op == OP_SCALE ? v * factor : op == OP_SOFTCAP ? factor * tanhf(v / factor) : gated_value(op, v, 1.0f);
    }
}

extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS)
    add(const float* a, const float* b, int n, float* out) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = a[i] + b[i];
}

// act(gate) * up over (rows, cols); gate is (rows, cols), or (rows, 1) when gate_cols is 1.
extern "C" __global__ void __launch_bounds__(POINTWISE_THREADS)
    gated(const float* gate, const float* up, int rows, int cols, int gate_cols, int kind, float* out) {
    const int n = rows * cols;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = gated_value(kind, gate[gate_cols == 1 ? i / cols : i], up[i]);
    }
}

// -- rotary embedding -------------------------------------------------------------------
// x (t, heads, head_dim). Thread map: one block per token. First each thread i < rope_dim / 2
// works out pair i's angle (in double: a float32 product of a long position and a frequency
// loses the angle), reduces it to [-pi, pi] and keeps mscale * cos and sin in shared memory;
// then the block's threads walk the token's heads * pairs, consecutive threads on consecutive
// pairs of one head (coalesced), and copy the unrotated tail when out is not x. out may be x.
extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
    rope(const float* x, int heads, int head_dim, const int* positions, float base_hi, float base_lo, int rope_dim,
         int neox, const float* freq_factors, float mscale, float* out) {
    __shared__ float cos_table[ROPE_MAX_HALF];
    __shared__ float sin_table[ROPE_MAX_HALF];
    const int half = rope_dim / 2;
    const double base = (double)base_hi + (double)base_lo;  // the host's double, as two floats
    const double position = (double)positions[blockIdx.x];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq = pow(base, -2.0 * i / rope_dim);
        if (freq_factors) inv_freq /= (double)freq_factors[i];
        const double angle = position * inv_freq;
        const double two_pi = 6.283185307179586;
        const float reduced = (float)(angle - two_pi * rint(angle / two_pi));
        float s, c;
        sincosf(reduced, &s, &c);
        cos_table[i] = c * mscale;
        sin_table[i] = s * mscale;
    }
    __syncthreads();
    const long long row0 = (long long)blockIdx.x * heads * head_dim;
    for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
        const int head = k / half, i = k % half;
        const long long at = row0 + (long long)head * head_dim;
        const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
        const float a = x[at + ia], b = x[at + ib];
        out[at + ia] = a * cos_table[i] - b * sin_table[i];
        out[at + ib] = a * sin_table[i] + b * cos_table[i];
    }
    const int tail = head_dim - rope_dim;
    if (out != x && tail > 0) {
        for (int k = threadIdx.x; k < heads * tail; k += blockDim.x) {
            const long long at = row0 + (long long)(k / tail) * head_dim + rope_dim + k % tail;
            out[at] = x[at];
        }
    }
}

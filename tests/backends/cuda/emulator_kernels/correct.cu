// Kernels that use the emulator's sync points, shuffles, votes, atomics and intrinsics
// correctly: tests/backends/cuda/test_emulator.py checks each against NumPy in every lane order.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FULL_MASK 0xffffffffu
#define REDUCE_THREADS 256

// out[b] = the sum of x[256 b .. 256 b + 255], by a shared-memory tree with barriers.
extern "C" __global__ void __launch_bounds__(REDUCE_THREADS) block_sum(const int* x, int* out) {
    __shared__ int partial[REDUCE_THREADS];
    const int t = threadIdx.x;
    partial[t] = x[blockIdx.x * REDUCE_THREADS + t];
    __syncthreads();
    for (int stride = REDUCE_THREADS / 2; stride > 0; stride >>= 1) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

// out[w] = the sum of the 32 values of warp w, by a butterfly of __shfl_xor_sync (every lane
// ends with the sum; lane 31 writes it, to show it is every lane's).
extern "C" __global__ void warp_sum(const int* x, int* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    int v = x[i];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if ((threadIdx.x & 31) == 31) out[i / 32] = v;
}

// For each thread i, four shuffles within segments of 16 lanes: down by 3, up by 3, from the
// segment's lane 5 (given as lane 21: taken modulo the width), and xor 9.
extern "C" __global__ void shuffles_width16(const int* x, int* down, int* up, int* idx, int* xr) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int v = x[i];
    down[i] = __shfl_down_sync(FULL_MASK, v, 3, 16);
    up[i] = __shfl_up_sync(FULL_MASK, v, 3, 16);
    idx[i] = __shfl_sync(FULL_MASK, v, 21, 16);
    xr[i] = __shfl_xor_sync(FULL_MASK, v, 9, 16);
}

// Per warp: which lanes see a positive value, whether any and whether all do.
extern "C" __global__ void votes(const int* x, unsigned* ballot, int* any, int* all) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const bool positive = x[i] > 0;
    const unsigned b = __ballot_sync(FULL_MASK, positive);
    const int a = __any_sync(FULL_MASK, positive), e = __all_sync(FULL_MASK, positive);
    if ((threadIdx.x & 31) == 0) {
        ballot[i / 32] = b;
        any[i / 32] = a;
        all[i / 32] = e;
    }
}

// Every thread of every block adds into the same few words.
extern "C" __global__ void atomics(const int* x, int n, int* sum, int* max_min, unsigned* bits, float* fsum,
                                   unsigned long long* wide) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    atomicAdd(sum, x[i]);
    atomicMax(&max_min[0], x[i]);
    atomicMin(&max_min[1], x[i]);
    atomicOr(bits, 1u << (x[i] & 31));
    atomicAdd(fsum, (float)x[i]);
    atomicAdd(wide, (unsigned long long)(unsigned)x[i] << 20);
    int old = atomicCAS(&max_min[2], 0, i + 1);  // the first thread to get here leaves its number
    (void)old;
}

extern "C" __global__ void dp4a(const int* a, const int* b, const int* c, int* signed_out, unsigned* unsigned_out,
                                int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    signed_out[i] = __dp4a(a[i], b[i], c[i]);
    unsigned_out[i] = __dp4a((unsigned)a[i], (unsigned)b[i], (unsigned)c[i]);
}

// Conversions of x both ways, and half arithmetic on (a, b, c).
extern "C" __global__ void halves(const float* x, const unsigned short* h, int n, unsigned short* to_half,
                                  float* from_half, unsigned short* to_bf16, float* from_bf16, unsigned short* hmul,
                                  unsigned short* hadd, unsigned short* hfma) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    to_half[i] = __half_as_ushort(__float2half_rn(x[i]));
    from_half[i] = __half2float(__ushort_as_half(h[i]));
    to_bf16[i] = __bfloat16_as_ushort(__float2bfloat16(x[i]));
    from_bf16[i] = __bfloat162float(__ushort_as_bfloat16(h[i]));
    const __half2 ab = __halves2half2(__ushort_as_half(h[i]), __ushort_as_half(h[(i + 1) % n]));
    const __half c = __ushort_as_half(h[(i + 2) % n]);
    hmul[i] = __half_as_ushort(__hmul(ab.x, ab.y));
    hadd[i] = __half_as_ushort(__hadd(__low2half(ab), __high2half(ab)));
    hfma[i] = __half_as_ushort(__hfma(ab.x, ab.y, c));
}

// y = W x for a Q8_0 matrix W (rows of 34-byte blocks: an f16 scale, then 32 int8 weights), one
// warp per row: lane l takes blocks l, l + 32, ...; the lanes' sums meet by __shfl_xor_sync.
extern "C" __global__ void __launch_bounds__(256)
    matvec_q8_0(const uint8_t* w, const float* x, int rows, int cols, float* y) {
    const int row = blockIdx.x * 8 + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;  // a whole warp leaves
    const int blocks = cols / 32;
    const uint8_t* wr = w + (size_t)row * blocks * 34;
    float sum = 0.0f;
    for (int b = lane; b < blocks; b += 32) {
        const uint8_t* blk = wr + b * 34;
        const float d = __half2float(*reinterpret_cast<const __half*>(blk));
        const int8_t* q = reinterpret_cast<const int8_t*>(blk + 2);
        const float* xb = x + b * 32;
        float part = 0.0f;
        for (int k = 0; k < 32; ++k) part += (float)q[k] * xb[k];
        sum += d * part;
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    if (lane == 0) y[row] = sum;
}

// out[i] += *value: what a recorded graph reads from device memory when it is replayed.
extern "C" __global__ void add_from_memory(const int* value, int* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] += *value;
}

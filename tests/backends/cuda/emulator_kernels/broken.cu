// Kernels with the bugs a GPU punishes (hangs, garbage, races), each of which the emulator
// must report: tests/backends/cuda/test_emulator.py checks the messages.
#include <assert.h>

#define FULL_MASK 0xffffffffu

// Lanes 0-15 return, then lanes 16-31 shuffle with the full mask.
extern "C" __global__ void shuffle_after_return(const float* x, float* out) {
    const int lane = threadIdx.x & 31;
    if (lane < 16) return;
    float v = x[threadIdx.x];
    v += __shfl_xor_sync(FULL_MASK, v, 1);
    out[threadIdx.x] = v;
}

// Only the first 16 threads take the branch with a barrier; the others go on to the next one.
extern "C" __global__ void barrier_in_branch(int* out) {
    if (threadIdx.x < 16) {
        out[threadIdx.x] = 1;
        __syncthreads();
    }
    __syncthreads();
    out[threadIdx.x] += 1;
}

// Thread 5 returns while the others wait at the barrier for it.
extern "C" __global__ void exit_at_barrier(int* out) {
    if (threadIdx.x == 5) return;
    out[threadIdx.x] = 1;
    __syncthreads();
}

// Every lane shuffles with a mask holding only lanes 0-15.
extern "C" __global__ void mask_without_caller(int* out) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, (int)threadIdx.x, 0);
}

// out[t] = x[(t + 1) % n] through shared memory; SYNC = false leaves out the barrier between
// the write and another thread's read.
template <bool SYNC>
__device__ void rotate(const int* x, int* out) {
    __shared__ int s[256];
    const int t = threadIdx.x, n = blockDim.x;
    s[t] = -1;
    __syncthreads();
    s[t] = x[t];
    if (SYNC) __syncthreads();
    out[t] = s[(t + 1) % n];
}

extern "C" __global__ void rotate_missing_sync(const int* x, int* out) { rotate<false>(x, out); }
extern "C" __global__ void rotate_fixed(const int* x, int* out) { rotate<true>(x, out); }

// A device-side assert() that fails for negative inputs.
extern "C" __global__ void assert_positive(const int* x) { assert(x[threadIdx.x] >= 0); }

// A small well-behaved kernel file: the compile tests' own case, beside the backend's kernels.
// Each block scales SAMPLE_THREADS halves through shared memory, read back shifted by one.
#include "sample.cuh"

__device__ __forceinline__ float twice(float x) { return 2.0f * x; }

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) scale_shifted(const __half* x, int n, float* y) {
    __shared__ float tile[SAMPLE_THREADS];
    const int i = blockIdx.x * SAMPLE_THREADS + threadIdx.x;
    tile[threadIdx.x] = i < n ? twice(__half2float(x[i])) : 0.0f;
    __syncthreads();
    if (i < n) y[i] = tile[(threadIdx.x + 1) % SAMPLE_THREADS];
}

extern "C" __global__ void __launch_bounds__(64, 4) fill(float* y, float value) { y[threadIdx.x] = value; }

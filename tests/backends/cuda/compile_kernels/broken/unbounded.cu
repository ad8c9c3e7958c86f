// Purpose-broken: no __launch_bounds__, so ptxas may give it up to 255 registers, and it keeps
// 96 loaded values live: more registers than a block of 1024 threads (any launch may use that
// many) can have.
extern "C" __global__ void unbounded(const float* x, float* y) {
    float v[96];
#pragma unroll
    for (int i = 0; i < 96; ++i) v[i] = x[threadIdx.x * 96 + i];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 96; ++i) acc += v[i] * v[95 - i] + v[(i * 7) % 96];
    y[threadIdx.x] = acc;
}

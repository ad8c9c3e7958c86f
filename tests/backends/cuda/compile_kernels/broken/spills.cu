// Purpose-broken: a kernel that spills. 1024 threads a block leave it 64 registers, and it
// keeps 192 loaded values live at once.
extern "C" __global__ void __launch_bounds__(1024) spills(const float* x, float* y) {
    float v[192];
#pragma unroll
    for (int i = 0; i < 192; ++i) v[i] = x[threadIdx.x * 192 + i];
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 192; ++i) acc += v[i] * v[191 - i] + v[(i * 7) % 192];
    y[threadIdx.x] = acc;
}

// Purpose-broken: a missing semicolon.
extern "C" __global__ void __launch_bounds__(32) syntax(float* y) { y[threadIdx.x] = 1.0f }

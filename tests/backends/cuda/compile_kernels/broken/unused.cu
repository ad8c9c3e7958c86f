// Purpose-broken: a variable set and never used, which both compilers warn about.
extern "C" __global__ void __launch_bounds__(32) unused(float* y) {
    int never_read = 3;
    y[threadIdx.x] = 1.0f;
}

// A kernel of the device interface's own tests (tests/backends/cuda/test_device_contract.py):
// y[i] += factor * x[i], with factor read from device memory at run time, so that a replayed
// graph shows the value written after it was recorded.
extern "C" __global__ void __launch_bounds__(256) scaled_add(float *y, const float *x, const int *factor, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] += (float)(*factor) * x[i];
    }
}

// A kernel that reads one element past its input (for the AddressSanitizer build).
extern "C" __global__ void read_past_end(const float* x, int n, float* out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i + 1];  // OUT OF BOUNDS: thread n - 1 reads x[n]
}

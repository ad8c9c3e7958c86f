// What several kernel files share: integer types, the GGUF block layouts, warp reductions,
// and fp16/bf16 loads. Compiles under nvcc, NVRTC (no libc headers) and the CPU emulator.
#pragma once

#ifdef __CUDACC_RTC__
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long long int64_t;
typedef unsigned long long uint64_t;
#else
#include <stdint.h>
#endif

#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu

// ---- GGUF block layouts (byte offsets within one block) ----------------------------------
// Blocks of the 18-, 22- and 34-byte formats are only 2-byte aligned inside a row: read them
// with load_u32_a2. Each format is decoded 32 weights (a "sub-block") at a time in products.cu.
//
// Q4_0  32 weights, 18 bytes: d:f16 | qs[16]                 w = d * (q - 8)
//       qs[i] = q[i] | q[i + 16] << 4
// Q4_1  32 weights, 20 bytes: d:f16 m:f16 | qs[16]          w = d * q + m          (qs as Q4_0)
// Q5_0  32 weights, 22 bytes: d:f16 | qh:u32 | qs[16]       w = d * (q - 16)
//       q[i] = nibble i of qs (as Q4_0) | ((qh >> i) & 1) << 4
// Q5_1  32 weights, 24 bytes: d:f16 m:f16 | qh:u32 | qs[16] w = d * q + m          (q as Q5_0)
// Q8_0  32 weights, 34 bytes: d:f16 | qs:i8[32]             w = d * qs[i]
// Q1_0 128 weights, 18 bytes: d:f16 | bits[16]              w = bit ? +d : -d
//       weight i is bit (i % 8) of bits[i / 8] (least significant bit first)
// Q4_K 256 weights, 144 bytes: d:f16 dmin:f16 | scales[12] | qs[128]
//       sub-block j (32 weights): w = d * sc[j] * q - dmin * mn[j],
//       q = (qs[32 * (j / 2) + l] >> 4 * (j % 2)) & 15;  6-bit sc/mn packed in scales as
//        0 EEAAAAAA   4 eeaaaaaa   8 eeeeEEEE      A..D = sc[0..3], a..d = mn[0..3]
//        1 FFBBBBBB   5 ffbbbbbb   9 ffffFFFF      E..H = sc[4..7], e..h = mn[4..7]
//        2 GGCCCCCC   6 ggcccccc  10 ggggGGGG      (low nibbles in bytes 8..11,
//        3 HHDDDDDD   7 hhdddddd  11 hhhhHHHH       high two bits on top of bytes 0..7)
// Q5_K 256 weights, 176 bytes: d:f16 dmin:f16 | scales[12] | qh[32] | qs[128]
//       as Q4_K with q |= ((qh[l] >> j) & 1) << 4
// Q6_K 256 weights, 210 bytes: ql[128] | qh[64] | scales:i8[16] | d:f16
//       sub-block j = 4h + s (h half, s 0..3): q = ((ql[64h + 32(s & 1) + l] >> 4(s >> 1)) & 15)
//       | ((qh[32h + l] >> 2s) & 3) << 4;  w = d * scales[16-weight group] * (q - 32)

enum GgmlType {
    GGML_F32 = 0,
    GGML_F16 = 1,
    GGML_Q4_0 = 2,
    GGML_Q4_1 = 3,
    GGML_Q5_0 = 6,
    GGML_Q5_1 = 7,
    GGML_Q8_0 = 8,
    GGML_Q4_K = 12,
    GGML_Q5_K = 13,
    GGML_Q6_K = 14,
    GGML_BF16 = 30,
    GGML_Q1_0 = 41,
};

// ---- loads -------------------------------------------------------------------------------

// A 32-bit little-endian word at an address that is only 2-byte aligned.
static __device__ __forceinline__ uint32_t load_u32_a2(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

// A 32-bit word at a 4-byte aligned address.
static __device__ __forceinline__ uint32_t load_u32_a4(const uint8_t* p) {
    return *reinterpret_cast<const uint32_t*>(p);
}

static __device__ __forceinline__ float load_f16(const uint8_t* p) {
    return __half2float(*reinterpret_cast<const __half*>(p));
}

// The fp16 value whose bits are the low 16 bits of `bits`.
static __device__ __forceinline__ float f16_bits_to_float(uint32_t bits) {
    __half_raw raw;
    raw.x = (unsigned short)bits;
    return __half2float(__half(raw));
}

// bf16 is the top half of a float32: widening is a shift, exact.
static __device__ __forceinline__ float bf16_bits_to_float(uint32_t bits) {
    return __uint_as_float(bits << 16);
}

// a * b rounded once, never fused into a following add (so dequantized values match
// NumPy's `d * q + m` bit for bit on the GPU as in the emulator, which never contracts).
static __device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

// ---- warp reductions (every lane of the warp must call them) -----------------------------

static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

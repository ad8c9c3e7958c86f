// The CUDA emulator's cuda_bf16.h: __nv_bfloat16 and __nv_bfloat162, bfloat16 being the top
// half of a float32. Conversion from float rounds to nearest even (NaN becomes 0x7fff, as on
// the GPU); arithmetic is done in float and rounded once.
#pragma once

#include "cuda_fp16.h"

namespace cuda_emu {

inline unsigned short float_to_bfloat16_bits(float f) {
    const uint32_t x = to_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float bfloat16_bits_to_float(unsigned short b) { return from_bits<float>(uint32_t(b) << 16); }

}  // namespace cuda_emu

struct __nv_bfloat16_raw {
    unsigned short x;
};

struct __attribute__((aligned(2))) __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(const __nv_bfloat16_raw& r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(cuda_emu::float_to_bfloat16_bits(f)) {}
    __nv_bfloat16(double d) : __x(cuda_emu::float_to_bfloat16_bits(float(d))) {}
    operator float() const { return cuda_emu::bfloat16_bits_to_float(__x); }
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};

struct __attribute__((aligned(4))) __nv_bfloat162 {
    __nv_bfloat16 x, y;
    __nv_bfloat162() = default;
    __nv_bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) : x(a), y(b) {}
};

static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return cuda_emu::bfloat16_bits_to_float(b.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162(__nv_bfloat16(a), __nv_bfloat16(b));
}
static inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b) { return __nv_bfloat162(a, b); }
static inline float __low2float(__nv_bfloat162 b) { return __bfloat162float(b.x); }
static inline float __high2float(__nv_bfloat162 b) { return __bfloat162float(b.y); }
static inline float2 __bfloat1622float2(__nv_bfloat162 b) {
    return make_float2(__bfloat162float(b.x), __bfloat162float(b.y));
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }

static inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(__bfloat162float(a) + __bfloat162float(b));
}
static inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(__bfloat162float(a) - __bfloat162float(b));
}
static inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
    return __nv_bfloat16(__bfloat162float(a) * __bfloat162float(b));
}
static inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __nv_bfloat16(fmaf(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c)));
}

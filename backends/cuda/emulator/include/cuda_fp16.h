// The CUDA emulator's cuda_fp16.h: __half and __half2 with the GPU's conversions, bit for bit
// (round to nearest even, subnormals, infinities; NaN becomes the canonical 0x7fff as on the
// GPU). Arithmetic is done in float and rounded once, as CUDA's host code does.
#pragma once

#include "../cuda_emu.h"

namespace cuda_emu {

inline unsigned short float_to_half_bits(float f) {
    const uint32_t x = to_bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fffu;              // NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;      // halfway above 65504 or more: infinity
    if (ax <= 0x33000000u) return sign;                // 2^-25 or less: zero (2^-25 ties to even)
    if (ax < 0x38800000u) {                            // below 2^-14: a subnormal half, m * 2^-24
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const int shift = 126 - int(ax >> 23);         // 14..24
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) ++q;
        return sign | q;
    }
    uint32_t h = ((((ax >> 23) - 112u)) << 10) | ((ax & 0x7fffffu) >> 13);
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) ++h;  // a carry into the exponent is right
    return sign | h;
}

inline float half_bits_to_float(unsigned short h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) return from_bits<float>(sign | to_bits(float(m) * 5.9604644775390625e-8f));  // m * 2^-24, exact
    if (e == 31) return from_bits<float>(sign | 0x7f800000u | (m << 13));
    return from_bits<float>(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace cuda_emu

struct __half_raw {
    unsigned short x;
};

struct __attribute__((aligned(2))) __half {
    unsigned short __x;
    __half() = default;
    __half(const __half_raw& r) : __x(r.x) {}
    __half(float f) : __x(cuda_emu::float_to_half_bits(f)) {}
    __half(double d) : __x(cuda_emu::float_to_half_bits(float(d))) {}
    operator float() const { return cuda_emu::half_bits_to_float(__x); }
    operator __half_raw() const { return __half_raw{__x}; }
};

struct __attribute__((aligned(4))) __half2 {
    __half x, y;
    __half2() = default;
    __half2(__half a, __half b) : x(a), y(b) {}
};

typedef __half half;
typedef __half2 half2;

static inline __half __float2half(float f) { return __half(f); }
static inline __half __float2half_rn(float f) { return __half(f); }
static inline float __half2float(__half h) { return cuda_emu::half_bits_to_float(h.__x); }
static inline __half2 __halves2half2(__half a, __half b) { return __half2(a, b); }
static inline __half2 __half2half2(__half a) { return __half2(a, a); }
static inline __half2 __float2half2_rn(float f) { return __half2(__half(f), __half(f)); }
static inline __half2 __floats2half2_rn(float a, float b) { return __half2(__half(a), __half(b)); }
static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline short __half_as_short(__half h) { return short(h.__x); }
static inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
static inline __half __short_as_half(short s) { return __half(__half_raw{(unsigned short)s}); }

static inline __half __hadd(__half a, __half b) { return __half(__half2float(a) + __half2float(b)); }
static inline __half __hsub(__half a, __half b) { return __half(__half2float(a) - __half2float(b)); }
static inline __half __hmul(__half a, __half b) { return __half(__half2float(a) * __half2float(b)); }
static inline __half __hdiv(__half a, __half b) { return __half(__half2float(a) / __half2float(b)); }
static inline __half __hfma(__half a, __half b, __half c) {
    return __half(fmaf(__half2float(a), __half2float(b), __half2float(c)));
}
static inline __half __hneg(__half a) { return __ushort_as_half(a.__x ^ 0x8000u); }
static inline __half2 __hadd2(__half2 a, __half2 b) { return __half2(__hadd(a.x, b.x), __hadd(a.y, b.y)); }
static inline __half2 __hmul2(__half2 a, __half2 b) { return __half2(__hmul(a.x, b.x), __hmul(a.y, b.y)); }
static inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __half2(__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y));
}

static inline __half operator+(__half a, __half b) { return __hadd(a, b); }
static inline __half operator-(__half a, __half b) { return __hsub(a, b); }
static inline __half operator*(__half a, __half b) { return __hmul(a, b); }
static inline __half operator/(__half a, __half b) { return __hdiv(a, b); }
static inline __half operator-(__half a) { return __hneg(a); }
static inline __half& operator+=(__half& a, __half b) { return a = __hadd(a, b); }
static inline __half& operator*=(__half& a, __half b) { return a = __hmul(a, b); }

// The CUDA emulator's view of CUDA C++: force-included (g++ -include cuda_emu.h) before a
// kernel file, so that the same `.cu` source compiles with the host compiler. Every CUDA
// thread of a block runs as a fiber of one OS thread (fibers.cpp); the intrinsics below that
// synchronize (barriers, warp shuffles and votes) switch back to that thread's scheduler,
// which releases them and computes their results.
//
// Not emulated: dynamic shared memory (`extern __shared__`, refused by build.py), the memory
// model between threads of a block (fibers interleave only at sync points), speed, occupancy,
// tensor cores, cp.async, and the GPU's approximate math (__expf is expf, __fdividef a / b).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#define SPRIG_CUDA_EMULATOR 1

// ---- declaration specifiers --------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __constant__
// Shared memory is per block. The blocks an OS thread runs go one after another and the
// block's fibers share that OS thread, so thread-local storage is exactly per block.
// (`extern __shared__`, dynamic shared memory, is refused by build.py with a clear message.)
#define __shared__ thread_local

// ---- vector types, with CUDA's alignment ---------------------------------------------------

#define EMU_VEC2(T, N, A) \
    struct __attribute__((aligned(A))) N { T x, y; }; \
    static inline N make_##N(T x, T y) { return N{x, y}; }
#define EMU_VEC3(T, N) \
    struct N { T x, y, z; }; \
    static inline N make_##N(T x, T y, T z) { return N{x, y, z}; }
#define EMU_VEC4(T, N, A) \
    struct __attribute__((aligned(A))) N { T x, y, z, w; }; \
    static inline N make_##N(T x, T y, T z, T w) { return N{x, y, z, w}; }

EMU_VEC2(signed char, char2, 2)
EMU_VEC4(signed char, char4, 4)
EMU_VEC2(unsigned char, uchar2, 2)
EMU_VEC4(unsigned char, uchar4, 4)
EMU_VEC2(short, short2, 4)
EMU_VEC4(short, short4, 8)
EMU_VEC2(unsigned short, ushort2, 4)
EMU_VEC4(unsigned short, ushort4, 8)
EMU_VEC2(int, int2, 8)
EMU_VEC3(int, int3)
EMU_VEC4(int, int4, 16)
EMU_VEC2(unsigned int, uint2, 8)
EMU_VEC3(unsigned int, uint3)
EMU_VEC4(unsigned int, uint4, 16)
EMU_VEC2(float, float2, 8)
EMU_VEC3(float, float3)
EMU_VEC4(float, float4, 16)
EMU_VEC2(long long, longlong2, 16)
EMU_VEC2(double, double2, 16)

#undef EMU_VEC2
#undef EMU_VEC3
#undef EMU_VEC4

struct dim3 {
    unsigned int x, y, z;
    constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{x, y, z}; }
};

// ---- the runtime's entry points (fibers.cpp) ----------------------------------------------

namespace cuda_emu {

// What one fiber (one CUDA thread) knows about itself.
struct ThreadContext {
    uint3 thread_idx;
};

// What the OS thread running a block knows about it.
struct BlockContext {
    uint3 block_idx;
    dim3 block_dim;
    dim3 grid_dim;
};

extern thread_local ThreadContext* current_thread;
extern thread_local BlockContext current_block;

enum WarpOp : int {
    OP_SHFL = 0,
    OP_SHFL_UP,
    OP_SHFL_DOWN,
    OP_SHFL_XOR,
    OP_BALLOT,
    OP_ANY,
    OP_ALL,
    OP_SYNCWARP,
};

// Wait at the block barrier (`site` names the call for error messages).
void syncthreads(const char* site);
// Wait at a warp operation with every lane of `mask`; `value` is this lane's contribution
// (its shuffled bits, or its vote predicate), `arg` the shuffle's lane argument, `width` its
// segment width. Returns the shuffled bits, or the vote's result.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* site);
// The lanes of the calling thread's warp that have not exited (the emulator does not track
// divergence: a lane in another branch counts as active).
unsigned active_mask();
// End the calling thread's block with a fault (the launch reports `what`).
[[noreturn]] void fault(const char* what, const char* site);

template <class T>
static inline uint64_t to_bits(T v) {
    static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8, "shuffles move values of up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    return bits;
}

template <class T>
static inline T from_bits(uint64_t bits) {
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
}

}  // namespace cuda_emu

#define EMU_STR2(x) #x
#define EMU_STR(x) EMU_STR2(x)
#define EMU_SITE __FILE__ ":" EMU_STR(__LINE__)

#define threadIdx (::cuda_emu::current_thread->thread_idx)
#define blockIdx (::cuda_emu::current_block.block_idx)
#define blockDim (::cuda_emu::current_block.block_dim)
#define gridDim (::cuda_emu::current_block.grid_dim)
#define warpSize 32

// ---- synchronization, shuffles and votes ----------------------------------------------------

#define __syncthreads() ::cuda_emu::syncthreads(EMU_SITE)
#define __syncwarp(...) ::cuda_emu::syncwarp_at(EMU_SITE __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::cuda_emu::shfl_at(::cuda_emu::OP_SHFL, EMU_SITE, __VA_ARGS__)
#define __shfl_up_sync(...) ::cuda_emu::shfl_at(::cuda_emu::OP_SHFL_UP, EMU_SITE, __VA_ARGS__)
#define __shfl_down_sync(...) ::cuda_emu::shfl_at(::cuda_emu::OP_SHFL_DOWN, EMU_SITE, __VA_ARGS__)
#define __shfl_xor_sync(...) ::cuda_emu::shfl_at(::cuda_emu::OP_SHFL_XOR, EMU_SITE, __VA_ARGS__)
#define __ballot_sync(mask, pred) \
    ((unsigned)::cuda_emu::warp_op(::cuda_emu::OP_BALLOT, (mask), (pred) ? 1 : 0, 0, 32, EMU_SITE))
#define __any_sync(mask, pred) ((int)::cuda_emu::warp_op(::cuda_emu::OP_ANY, (mask), (pred) ? 1 : 0, 0, 32, EMU_SITE))
#define __all_sync(mask, pred) ((int)::cuda_emu::warp_op(::cuda_emu::OP_ALL, (mask), (pred) ? 1 : 0, 0, 32, EMU_SITE))
#define __activemask() ::cuda_emu::active_mask()
#define __trap() ::cuda_emu::fault("__trap() called", EMU_SITE)

namespace cuda_emu {

static inline void syncwarp_at(const char* site, unsigned mask = 0xffffffffu) {
    warp_op(OP_SYNCWARP, mask, 0, 0, 32, site);
}

template <class T>
static inline T shfl_at(WarpOp op, const char* site, unsigned mask, T var, int arg, int width = 32) {
    return from_bits<T>(warp_op(op, mask, to_bits(var), arg, width, site));
}

}  // namespace cuda_emu

static inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
static inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

template <class T>
static inline T __ldg(const T* p) {
    return *p;
}

// ---- atomics (blocks of other OS threads run at the same time: real atomic operations) ------

#define EMU_ATOMIC_INT(T)                                                                               \
    static inline T atomicAdd(T* p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }         \
    static inline T atomicSub(T* p, T v) { return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST); }         \
    static inline T atomicExch(T* p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }       \
    static inline T atomicOr(T* p, T v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }           \
    static inline T atomicAnd(T* p, T v) { return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST); }         \
    static inline T atomicXor(T* p, T v) { return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST); }         \
    static inline T atomicCAS(T* p, T expected, T desired) {                                            \
        __atomic_compare_exchange_n(p, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); \
        return expected;                                                                                \
    }                                                                                                   \
    static inline T atomicMax(T* p, T v) {                                                              \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                   \
        while (old < v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
        }                                                                                               \
        return old;                                                                                     \
    }                                                                                                   \
    static inline T atomicMin(T* p, T v) {                                                              \
        T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);                                                   \
        while (old > v && !__atomic_compare_exchange_n(p, &old, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) { \
        }                                                                                               \
        return old;                                                                                     \
    }

EMU_ATOMIC_INT(int)
EMU_ATOMIC_INT(unsigned int)
EMU_ATOMIC_INT(unsigned long long)
#undef EMU_ATOMIC_INT

// atomicAdd on floats: a compare-and-swap loop over the bits.
template <class F, class U>
static inline F emu_atomic_add_float(F* p, F v) {
    U* bits = reinterpret_cast<U*>(p);
    U old = __atomic_load_n(bits, __ATOMIC_SEQ_CST);
    for (;;) {
        F cur;
        memcpy(&cur, &old, sizeof(F));
        const F sum = cur + v;
        U next;
        memcpy(&next, &sum, sizeof(F));
        if (__atomic_compare_exchange_n(bits, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return cur;
    }
}
static inline float atomicAdd(float* p, float v) { return emu_atomic_add_float<float, uint32_t>(p, v); }
static inline double atomicAdd(double* p, double v) { return emu_atomic_add_float<double, uint64_t>(p, v); }

// ---- integer intrinsics ----------------------------------------------------------------------

// Four 8-bit products summed into c: signed bytes (int forms) or unsigned (unsigned forms).
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
static inline unsigned int __dp4a(unsigned int a, unsigned int b, unsigned int c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
static inline int __dp4a(char4 a, char4 b, int c) {
    int ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return __dp4a(ia, ib, c);
}
static inline unsigned int __dp4a(uchar4 a, uchar4 b, unsigned int c) {
    unsigned int ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return __dp4a(ia, ib, c);
}

static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline unsigned int __brev(unsigned int x) {
    x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
    x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
    x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
    return __builtin_bswap32(x);
}
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const uint64_t both = ((uint64_t)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned int)((both >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

// ---- min / max as CUDA overloads them ----------------------------------------------------------

#define EMU_MINMAX(T)                                   \
    static inline T min(T a, T b) { return b < a ? b : a; } \
    static inline T max(T a, T b) { return a < b ? b : a; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned int)
EMU_MINMAX(long)
EMU_MINMAX(unsigned long)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
static inline unsigned int min(int a, unsigned int b) { return min((unsigned int)a, b); }
static inline unsigned int min(unsigned int a, int b) { return min(a, (unsigned int)b); }
static inline unsigned int max(int a, unsigned int b) { return max((unsigned int)a, b); }
static inline unsigned int max(unsigned int a, int b) { return max(a, (unsigned int)b); }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

// ---- float intrinsics (exact where the GPU approximates) ---------------------------------------

static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __float2int_rd(float x) { return (int)floorf(x); }
static inline int __float2int_ru(float x) { return (int)ceilf(x); }
static inline unsigned int __float2uint_rn(float x) { return (unsigned int)nearbyintf(x); }
static inline float __int2float_rn(int x) { return (float)x; }
static inline float __uint2float_rn(unsigned int x) { return (float)x; }
static inline float __int_as_float(int x) { return cuda_emu::from_bits<float>((uint32_t)x); }
static inline int __float_as_int(float x) { return (int)(uint32_t)cuda_emu::to_bits(x); }
static inline float __uint_as_float(unsigned int x) { return cuda_emu::from_bits<float>(x); }
static inline unsigned int __float_as_uint(float x) { return (uint32_t)cuda_emu::to_bits(x); }
// glibc's <math.h> declares __expf, __logf, __sinf, __cosf and __powf itself: macros, not overloads.
#define __expf(x) expf(x)
#define __exp10f(x) exp10f(x)
#define __logf(x) logf(x)
#define __log2f(x) log2f(x)
#define __sinf(x) sinf(x)
#define __cosf(x) cosf(x)
#define __tanf(x) tanf(x)
#define __powf(x, y) powf(x, y)
#define __sincosf(x, s, c) sincosf(x, s, c)

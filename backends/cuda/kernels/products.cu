// Matrix products with the weights read where they lie, in their GGUF blocks.
//
//   out (T, rows) float32 = x (T, cols) float32 @ W.T (+ bias (rows,))
//
// W is (rows, cols), each row a run of GGUF blocks. Three paths, chosen by the launcher on T:
//   T = 1..16  quantized W: x is first quantized per 32 values into integer codes, two 8-bit
//              codes per value ("precise", 15 bits: quantize_act_q8x2, then mvq2_<type>_<NT>)
//              or one ("fast", 8 bits: quantize_act_q8, then mvq_<type>_<NT>); the product
//              multiplies them with the weights' codes (dp4a), reading each weight once for all
//              T tokens (NT = 1, 4 or 16 accumulators, T <= NT).
//              Float W (F32, F16, BF16): mvf_<type>_<NT>, float products, x as it is.
//   T > 16     gemm_<type>: weight tiles dequantized into shared memory, float tiles of x.
// And rows_<type>: the float32 rows `ids` of W, times a scale (embedding lookups).
//
// Every format is decoded 32 weights (one "sub-block") at a time, the unit of the quantized
// activations: sub-block s of a row covers columns 32s..32s+31.
#include "common.cuh"

// ---- quantized activations ------------------------------------------------------------------
// x (T, cols) is quantized per 32 values (one sub-block) into NC 8-bit codes per value, which
// dp4a multiplies with the weights' codes. Two precisions, one code path (NC a template
// parameter):
//   NC = 1, "fast" (llama.cpp's MMVQ scheme): d = max|x| / 127, q = rint(x / d), x ~= fp16(d) q;
//     8 bits, an error up to d / 2 per value.
//   NC = 2, "precise": x ~= d1 q1 + d2 q2 with d1 = max|x| / 127, d2 = d1 / 254 and q2 the
//     rounded residual (|x - d1 q1| <= d1 / 2, so |q2| <= 127); 15 bits, the CPU backend's int16
//     precision, an error up to d2 / 2 = d1 / 508 per value. Computed as one 15-bit code
//       Q = rint(x / d2), d2 = max|x| / 32258 (= 127 * 254), |Q| <= 32258,
//     split exactly in integers: q1 = floor((Q + 127) / 254) (Q / 254 to the nearest, halves
//     down), q2 = Q - 254 q1 (in -127..126). So q2 = round((x - d1 q1) / d2) exactly, and
//     q1 = round(x / d1) except where x / d1 lies within 1/508 of a half. x ~= d2 Q: a product
//     runs one dp4a chain per code and joins them as 254 * sum(w q1) + sum(w q2).
// Codes (T, cols / 32, NC, 32) int8: the NC runs of 32 codes of a sub-block are adjacent (for
// NC = 1 that is (T, cols)). Scales (T, cols / 32): one ActCodes<NC>::Scale per sub-block, its
// d and the sum of its codes (Q for NC = 2), with which formats with an offset
// (w = d_w q_w + m) add m * d * sum; the sum is an integer below 2^21, exact as a float.
//
// Why the precise mode costs little: one token's product is bound by memory bandwidth. A
// sub-block of a 4- to 5-bit format is 18-24 bytes; an H200 streams 4.8 TB/s, 0.2-0.27
// sub-blocks per ns, while its 132 SMs retire about 17 integer operations per ns (64 lanes at
// ~1.98 GHz each): 60-80 integer slots per sub-block. Unpacking the weights (about 30
// operations) and the 8 dp4a of one code fit in them, and the second code adds only 8 dp4a and
// 2 multiply-adds per sub-block and token: the weights are unpacked once for both, and the
// codes of x (64 bytes per sub-block and token) come from the caches, shared by all rows. With
// 4 to 16 tokens the integer work grows with T while the bytes do not: there "fast" may be
// faster. (Estimates; the GPU session measures.)
struct alignas(4) Q8Scale {
    __half d;
    short sum;
};

struct alignas(8) Q15Scale {
    float d;  // d2
    int sum;  // of Q = 254 q1 + q2
};

constexpr int CODE_RADIX = 254;  // d1 / d2 of the two-code activations

template <int NC>
struct ActCodes;

template <>
struct ActCodes<1> {
    using Scale = Q8Scale;
    static constexpr float LEVELS = 127.0f;  // max|x| maps to this code
    static __device__ __forceinline__ Scale scale(float d, int sum) {
        Scale s;
        s.d = __float2half_rn(d);
        s.sum = (short)sum;
        return s;
    }
    static __device__ __forceinline__ float d(Scale s) { return __half2float(s.d); }
    static __device__ __forceinline__ void split(int q, int (&c)[1]) { c[0] = q; }
};

template <>
struct ActCodes<2> {
    using Scale = Q15Scale;
    static constexpr float LEVELS = 127.0f * CODE_RADIX;
    static __device__ __forceinline__ Scale scale(float d, int sum) {
        Scale s;
        s.d = d;
        s.sum = sum;
        return s;
    }
    static __device__ __forceinline__ float d(Scale s) { return s.d; }
    // Q = CODE_RADIX * c[0] + c[1]; the offset keeps the dividend positive (|Q| <= 32258).
    static __device__ __forceinline__ void split(int q, int (&c)[2]) {
        c[0] = (q + CODE_RADIX / 2 + CODE_RADIX * 128) / CODE_RADIX - 128;
        c[1] = q - CODE_RADIX * c[0];
    }
};

// Threads: 8 per 32-value block, 4 values each (one float4); 256 threads = 32 blocks.
template <int NC>
static __device__ __forceinline__ void quantize_act_body(const float* __restrict__ x, int8_t* __restrict__ codes,
                                                         unsigned int* __restrict__ scales, int n_blocks) {
    using Act = ActCodes<NC>;
    const int block = blockIdx.x * 32 + (threadIdx.x >> 3);
    const int part = threadIdx.x & 7;
    const bool on = block < n_blocks;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (on) v = reinterpret_cast<const float4*>(x)[block * 8 + part];
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
    const float d = amax / Act::LEVELS;
    int q[4] = {0, 0, 0, 0};
    if (d > 0.0f) {
        q[0] = __float2int_rn(v.x / d);
        q[1] = __float2int_rn(v.y / d);
        q[2] = __float2int_rn(v.z / d);
        q[3] = __float2int_rn(v.w / d);
    }
    int sum = q[0] + q[1] + q[2] + q[3];
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    if (on) {
        uint32_t packed[NC] = {};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            int c[NC];
            Act::split(q[i], c);
#pragma unroll
            for (int k = 0; k < NC; ++k) packed[k] |= (uint32_t)(c[k] & 0xff) << (8 * i);
        }
#pragma unroll
        for (int k = 0; k < NC; ++k) reinterpret_cast<uint32_t*>(codes)[(block * NC + k) * 8 + part] = packed[k];
        if (part == 0) reinterpret_cast<typename Act::Scale*>(scales)[block] = Act::scale(d, sum);
    }
}

// ---- one sub-block of weights, as integer codes ---------------------------------------------
// w[i] = d0 * q[i] + m for i < 16, d1 * q[i] + m for i >= 16 (d0 == d1 except in Q6_K, whose
// scales cover 16 weights). q[k] packs the int8 codes of weights 4k..4k+3, lowest byte first,
// so that dp4a multiplies it with the same four activation codes.
struct Sub {
    uint32_t q[8];
    float d0, d1, m;
};

// Four bits to four bytes: bit i of `n` becomes bit 0 of byte i.
static __device__ __forceinline__ uint32_t spread4(uint32_t n) {
    return ((n & 0xfu) * 0x00204081u) & 0x01010101u;
}

// Four unsigned codes below 128 + `bias` to the signed codes c - bias, byte by byte
// (c + 128 - bias stays below 256, so no byte carries into the next).
template <int bias>
static __device__ __forceinline__ uint32_t unbias(uint32_t c) {
    return (c + 0x01010101u * (uint32_t)(128 - bias)) ^ 0x80808080u;
}

// The 4-bit and 5-bit formats of 32-weight blocks: low nibbles hold weights 0..15, high nibbles
// 16..31; `qh` (5-bit formats) has the fifth bit of weight i at bit i.
template <int bias, bool five>
static __device__ __forceinline__ void nibble_codes(const uint32_t (&v)[4], uint32_t qh, Sub& w) {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        uint32_t c = (v[k & 3] >> (4 * (k >> 2))) & 0x0f0f0f0fu;
        if (five) c |= spread4(qh >> (4 * k)) << 4;
        w.q[k] = bias ? unbias<bias>(c) : c;
    }
}

struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + s * BYTES;
        uint32_t v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = load_u32_a2(b + 2 + 4 * k);
        nibble_codes<8, false>(v, 0, w);
        w.d0 = w.d1 = load_f16(b);
        w.m = 0.0f;
    }
};

struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + s * BYTES;
        uint32_t v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = load_u32_a4(b + 4 + 4 * k);
        nibble_codes<0, false>(v, 0, w);
        w.d0 = w.d1 = load_f16(b);
        w.m = load_f16(b + 2);
    }
};

struct Q5_0 {
    static constexpr int QK = 32, BYTES = 22;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + s * BYTES;
        uint32_t v[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) v[k] = load_u32_a2(b + 6 + 4 * k);
        nibble_codes<16, true>(v, load_u32_a2(b + 2), w);
        w.d0 = w.d1 = load_f16(b);
        w.m = 0.0f;
    }
};

struct Q5_1 {
    static constexpr int QK = 32, BYTES = 24;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + s * BYTES;
        const uint2 lo = *reinterpret_cast<const uint2*>(b + 8);
        const uint2 hi = *reinterpret_cast<const uint2*>(b + 16);
        const uint32_t v[4] = {lo.x, lo.y, hi.x, hi.y};
        nibble_codes<0, true>(v, load_u32_a4(b + 4), w);
        w.d0 = w.d1 = load_f16(b);
        w.m = load_f16(b + 2);
    }
};

struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + s * BYTES;
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = load_u32_a2(b + 2 + 4 * k);
        w.d0 = w.d1 = load_f16(b);
        w.m = 0.0f;
    }
};

struct Q1_0 {
    static constexpr int QK = 128, BYTES = 18;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + (s >> 2) * BYTES;
        const uint32_t bits = load_u32_a2(b + 2 + 4 * (s & 3));
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = ~(spread4(bits >> (4 * k)) * 0xfeu);  // bytes 1 (bit set) or -1
        w.d0 = w.d1 = load_f16(b);
        w.m = 0.0f;
    }
};

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block (layout in common.cuh).
static __device__ __forceinline__ void k_scale_min(const uint8_t* sc, int j, float d, float dmin, Sub& w) {
    int scale, min;
    if (j < 4) {
        scale = sc[j] & 63;
        min = sc[j + 4] & 63;
    } else {
        scale = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
        min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
    w.d0 = w.d1 = d * (float)scale;
    w.m = -(dmin * (float)min);
}

struct Q4_K {
    static constexpr int QK = 256, BYTES = 144;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + (s >> 3) * BYTES;
        const int j = s & 7;
        const uint4* qs = reinterpret_cast<const uint4*>(b + 16 + 32 * (j >> 1));
        const uint4 a = qs[0], c = qs[1];
        const uint32_t v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = (v[k] >> shift) & 0x0f0f0f0fu;
        k_scale_min(b + 4, j, load_f16(b), load_f16(b + 2), w);
    }
};

struct Q5_K {
    static constexpr int QK = 256, BYTES = 176;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + (s >> 3) * BYTES;
        const int j = s & 7;
        const uint4* qh = reinterpret_cast<const uint4*>(b + 16);
        const uint4* qs = reinterpret_cast<const uint4*>(b + 48 + 32 * (j >> 1));
        const uint4 h0 = qh[0], h1 = qh[1], a = qs[0], c = qs[1];
        const uint32_t h[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        const uint32_t v[8] = {a.x, a.y, a.z, a.w, c.x, c.y, c.z, c.w};
        const int shift = 4 * (j & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) w.q[k] = ((v[k] >> shift) & 0x0f0f0f0fu) | (((h[k] >> j) << 4) & 0x10101010u);
        k_scale_min(b + 4, j, load_f16(b), load_f16(b + 2), w);
    }
};

struct Q6_K {
    static constexpr int QK = 256, BYTES = 210;
    static __device__ __forceinline__ void load(const uint8_t* row, int s, Sub& w) {
        const uint8_t* b = row + (s >> 3) * BYTES;
        const int j = s & 7, half = j >> 2;
        const uint8_t* ql = b + 64 * half + 32 * (j & 1);
        const uint8_t* qh = b + 128 + 32 * half;
        const int lo_shift = 4 * ((j >> 1) & 1), hi_shift = 2 * (j & 3);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t c = ((load_u32_a2(ql + 4 * k) >> lo_shift) & 0x0f0f0f0fu) |
                               (((load_u32_a2(qh + 4 * k) >> hi_shift) & 0x03030303u) << 4);
            w.q[k] = unbias<32>(c);
        }
        const float d = load_f16(b + 208);
        const int8_t* scales = reinterpret_cast<const int8_t*>(b + 192);
        w.d0 = d * (float)scales[2 * j];
        w.d1 = d * (float)scales[2 * j + 1];
        w.m = 0.0f;
    }
};

// ---- float formats: 8 consecutive weights (one 16-byte load for F16/BF16) --------------------
struct F32 {
    static constexpr int QK = 1, BYTES = 4;
    static __device__ __forceinline__ void load8(const uint8_t* row, int g, float (&v)[8]) {
        const float4* p = reinterpret_cast<const float4*>(row) + 2 * g;
        const float4 a = p[0], b = p[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
};

struct F16 {
    static constexpr int QK = 1, BYTES = 2;
    static __device__ __forceinline__ void load8(const uint8_t* row, int g, float (&v)[8]) {
        const uint4 u = reinterpret_cast<const uint4*>(row)[g];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = f16_bits_to_float(w[k] & 0xffffu);
            v[2 * k + 1] = f16_bits_to_float(w[k] >> 16);
        }
    }
};

struct BF16 {
    static constexpr int QK = 1, BYTES = 2;
    static __device__ __forceinline__ void load8(const uint8_t* row, int g, float (&v)[8]) {
        const uint4 u = reinterpret_cast<const uint4*>(row)[g];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = bf16_bits_to_float(w[k] & 0xffffu);
            v[2 * k + 1] = bf16_bits_to_float(w[k] >> 16);
        }
    }
};

template <typename W>
struct IsFloat {
    static constexpr bool value = W::QK == 1;
};

static __host__ __device__ __forceinline__ size_t row_bytes_of(int cols, int qk, int bytes) {
    return (size_t)(cols / qk) * bytes;
}

// The 32 float32 weights of sub-block s of a row: exactly gguf-py's dequantized values.
template <typename W>
static __device__ __forceinline__ void dequantize_sub(const uint8_t* row, int s, float (&v)[32]) {
    if constexpr (IsFloat<W>::value) {
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            float e[8];
            W::load8(row, 4 * s + g, e);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[8 * g + i] = e[i];
        }
    } else {
        Sub w;
        W::load(row, s, w);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float d = k < 4 ? w.d0 : w.d1;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int code = (int)(int8_t)(w.q[k] >> (8 * i));
                v[4 * k + i] = mul_rn(d, (float)code) + w.m;
            }
        }
    }
}

// ---- mat-vec and small batches -----------------------------------------------------------
// Threads: a block of 4 warps; each warp owns R consecutive rows (R = MV_ROWS_Q<NT> for the
// quantized formats: 2 for one token, so that its activations are read once for two rows; 1 for
// the float formats), a block 4R rows, grid.x = ceil(rows / 4R). Lane l takes sub-blocks l,
// l + 32, ... of its rows: it reads each sub-block's weights once, multiplies them with the
// activations of every token (at most NT, T at run time), and the warp sums its lanes with
// shuffles. Consecutive lanes read consecutive sub-blocks: a warp's loads of one step cover one
// contiguous stretch of each row.
constexpr int MV_WARPS = 4;

template <int NT>
struct MvRowsQ {
    static constexpr int value = NT == 1 ? 2 : 1;
};

template <int R, int NT>
static __device__ __forceinline__ void mv_store(float (&acc)[R][NT], const float* bias, float* out, int rows,
                                                int row0, int t) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float v = warp_sum(acc[r][j]);
            if (lane == 0 && row < rows && j < t) out[(size_t)j * rows + row] = bias ? v + bias[row] : v;
        }
    }
}

// One dp4a chain: c + the dot product of 16 weight codes and 16 activation codes.
static __device__ __forceinline__ int dp4a_16(const uint32_t* wq, const int4& a, int c) {
    return __dp4a((int)wq[3], a.w, __dp4a((int)wq[2], a.z, __dp4a((int)wq[1], a.y, __dp4a((int)wq[0], a.x, c))));
}

// Sum over one sub-block of w * x, x given as its NC runs of 32 codes (xv[2k], xv[2k + 1] the
// k-th) and their scale. The chains of successive codes join as CODE_RADIX * previous + next.
template <int NC>
static __device__ __forceinline__ float sub_dot(const Sub& w, const int4 (&xv)[2 * NC],
                                                typename ActCodes<NC>::Scale sc) {
    int lo = dp4a_16(w.q, xv[0], 0), hi = dp4a_16(w.q + 4, xv[1], 0);
#pragma unroll
    for (int k = 1; k < NC; ++k) {
        lo = dp4a_16(w.q, xv[2 * k], CODE_RADIX * lo);
        hi = dp4a_16(w.q + 4, xv[2 * k + 1], CODE_RADIX * hi);
    }
    return ActCodes<NC>::d(sc) * (w.d0 * (float)lo + w.d1 * (float)hi + w.m * (float)sc.sum);
}

template <typename W, int NT, int NC>
static __device__ __forceinline__ void mv_quantized(const uint8_t* __restrict__ w, const int8_t* __restrict__ codes,
                                                    const unsigned int* __restrict__ scales,
                                                    const float* __restrict__ bias, float* __restrict__ out, int rows,
                                                    int cols, int t) {
    constexpr int R = MvRowsQ<NT>::value;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * MV_WARPS + (threadIdx.x >> 5)) * R;
    const int n_sub = cols / 32;
    const size_t row_bytes = row_bytes_of(cols, W::QK, W::BYTES);
    const typename ActCodes<NC>::Scale* xs = reinterpret_cast<const typename ActCodes<NC>::Scale*>(scales);
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j] = 0.0f;
    if (row0 < rows) {
        const int live = min(R, rows - row0);  // rows of this warp inside the matrix
#pragma unroll 1  // unrolled, ptxas spills a few bytes in some of the 16-token kernels
        for (int s = lane; s < n_sub; s += 32) {
            Sub ws[R];
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < live) W::load(w + row_bytes * (row0 + r), s, ws[r]);
            const int4* xq = reinterpret_cast<const int4*>(codes) + 2 * NC * s;  // token j's: + j * NC * cols / 16
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (j < t) {
                    int4 xv[2 * NC];
#pragma unroll
                    for (int k = 0; k < 2 * NC; ++k) xv[k] = xq[k];
                    const typename ActCodes<NC>::Scale sc = xs[(size_t)j * n_sub + s];
                    xq += NC * cols / 16;
#pragma unroll
                    for (int r = 0; r < R; ++r)
                        if (r < live) acc[r][j] += sub_dot<NC>(ws[r], xv, sc);
                }
            }
        }
    }
    mv_store<R, NT>(acc, bias, out, rows, row0, t);
}

template <typename W, int NT>
static __device__ __forceinline__ void mv_float(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                                const float* __restrict__ bias, float* __restrict__ out, int rows,
                                                int cols, int t) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * MV_WARPS + (threadIdx.x >> 5);
    float acc[1][NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[0][j] = 0.0f;
    if (row < rows) {
        const uint8_t* wr = w + row_bytes_of(cols, 1, W::BYTES) * row;
        for (int g = lane; g < cols / 8; g += 32) {
            float v[8];
            W::load8(wr, g, v);
            const float* xp = x + 8 * g;  // token j's values: xp + j * cols
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (j < t) {
                    const float4 a = reinterpret_cast<const float4*>(xp)[0], b = reinterpret_cast<const float4*>(xp)[1];
                    xp += cols;
                    acc[0][j] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
                              v[6] * b.z + v[7] * b.w;
                }
            }
        }
    }
    mv_store<1, NT>(acc, bias, out, rows, row, t);
}

// ---- prefill GEMM ------------------------------------------------------------------------
// Threads: 256 per block; a block computes a tile of 64 rows x 64 tokens (grid = ceil(rows / 64)
// x ceil(T / 64)). Per step of 64 columns (two sub-blocks): threads 0..127 each dequantize one
// sub-block (row tid % 64, sub-block tid / 64) into ws, threads 128..255 each copy 32 floats of
// one token into xs; then thread (tx, ty) = (tid % 16, tid / 16) accumulates rows 4tx..4tx+3 by
// tokens 4ty..4ty+3 of the tile. Both tiles are k-major, padded to 68 floats per k.
constexpr int GEMM_TILE = 64;

template <typename W>
static __device__ __forceinline__ void gemm_body(const uint8_t* __restrict__ w, const float* __restrict__ x,
                                                 const float* __restrict__ bias, float* __restrict__ out, int rows,
                                                 int cols, int t) {
    __shared__ float4 ws4[64][17];  // (k, row / 4)
    __shared__ float4 xs4[64][17];  // (k, token / 4)
    const int tid = threadIdx.x;
    const int row0 = blockIdx.x * GEMM_TILE, tok0 = blockIdx.y * GEMM_TILE;
    const int n_sub = cols / 32;
    const size_t row_bytes = row_bytes_of(cols, W::QK, W::BYTES);
    const int tx = tid & 15, ty = tid >> 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int s0 = 0; s0 < n_sub; s0 += 2) {
        const int lane64 = tid & 63, half = (tid >> 6) & 1, s = s0 + half;
        float v[32];
#pragma unroll
        for (int i = 0; i < 32; ++i) v[i] = 0.0f;
        if (tid < 128) {
            if (row0 + lane64 < rows && s < n_sub) dequantize_sub<W>(w + row_bytes * (row0 + lane64), s, v);
#pragma unroll
            for (int i = 0; i < 32; ++i) reinterpret_cast<float*>(ws4[32 * half + i])[lane64] = v[i];
        } else {
            if (tok0 + lane64 < t && s < n_sub) {
                const float4* xp = reinterpret_cast<const float4*>(x + (size_t)(tok0 + lane64) * cols) + 8 * s;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float4 e = xp[i];
                    v[4 * i] = e.x, v[4 * i + 1] = e.y, v[4 * i + 2] = e.z, v[4 * i + 3] = e.w;
                }
            }
#pragma unroll
            for (int i = 0; i < 32; ++i) reinterpret_cast<float*>(xs4[32 * half + i])[lane64] = v[i];
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < 64; ++k) {
            const float4 a = ws4[k][tx], b = xs4[k][ty];
            const float wa[4] = {a.x, a.y, a.z, a.w}, xb[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += wa[i] * xb[j];
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int row = row0 + 4 * tx + i;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int tok = tok0 + 4 * ty + j;
            if (row < rows && tok < t) out[(size_t)tok * rows + row] = bias ? acc[i][j] + bias[row] : acc[i][j];
        }
    }
}

// ---- rows (embedding lookup) -------------------------------------------------------------
// Threads: one per sub-block of 32 columns (grid.x = ceil(cols / 32 / 128)), grid.y = token.
template <typename W>
static __device__ __forceinline__ void rows_body(const uint8_t* __restrict__ w, const int* __restrict__ ids,
                                                 float* __restrict__ out, int cols, float scale) {
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    const int tok = blockIdx.y;
    if (s < cols / 32) {
        float v[32];
        dequantize_sub<W>(w + row_bytes_of(cols, W::QK, W::BYTES) * ids[tok], s, v);
        float4* o = reinterpret_cast<float4*>(out + (size_t)tok * cols) + 8 * s;
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] = make_float4(v[4 * i] * scale, v[4 * i + 1] * scale, v[4 * i + 2] * scale, v[4 * i + 3] * scale);
    }
}

// ---- entry points: one per format (and accumulator count), named <family>_<format>[_<NT>] ----
// mvq2_ (two codes) declare at least one block per SM: with the block size alone, ptxas traded
// registers for occupancy and spilled a few bytes in some of them on some architectures.
// clang-format off
extern "C" __global__ void __launch_bounds__(256) quantize_act_q8(const float* x, int8_t* codes, unsigned int* scales, int n_blocks) { quantize_act_body<1>(x, codes, scales, n_blocks); }
extern "C" __global__ void __launch_bounds__(256) quantize_act_q8x2(const float* x, int8_t* codes, unsigned int* scales, int n_blocks) { quantize_act_body<2>(x, codes, scales, n_blocks); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_1_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_1_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_1_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_1_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_1_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_1_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q8_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q8_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q8_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q1_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q1_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q1_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q4_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q5_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q6_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 1, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q6_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 4, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvq_q6_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 16, 1>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_0, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_1_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_1_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_1_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_1, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_0, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_1_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_1_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_1_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_1, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q8_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q8_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q8_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q8_0, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q1_0_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q1_0_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q1_0_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q1_0, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q4_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q4_K, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q5_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q5_K, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q6_k_1(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 1, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q6_k_4(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 4, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128, 1) mvq2_q6_k_16(const uint8_t* w, const int8_t* codes, const unsigned int* scales, const float* bias, float* out, int rows, int cols, int t) { mv_quantized<Q6_K, 16, 2>(w, codes, scales, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f32_1(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F32, 1>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f32_4(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F32, 4>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f32_16(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F32, 16>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f16_1(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F16, 1>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f16_4(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F16, 4>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_f16_16(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<F16, 16>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_bf16_1(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<BF16, 1>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_bf16_4(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<BF16, 4>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) mvf_bf16_16(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { mv_float<BF16, 16>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q4_0(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q4_0>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q4_1(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q4_1>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q5_0(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q5_0>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q5_1(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q5_1>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q8_0(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q8_0>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q1_0(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q1_0>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q4_k(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q4_K>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q5_k(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q5_K>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_q6_k(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<Q6_K>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_f32(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<F32>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_f16(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<F16>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(256) gemm_bf16(const uint8_t* w, const float* x, const float* bias, float* out, int rows, int cols, int t) { gemm_body<BF16>(w, x, bias, out, rows, cols, t); }
extern "C" __global__ void __launch_bounds__(128) rows_q4_0(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q4_0>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q4_1(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q4_1>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q5_0(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q5_0>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q5_1(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q5_1>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q8_0(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q8_0>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q1_0(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q1_0>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q4_k(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q4_K>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q5_k(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q5_K>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_q6_k(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<Q6_K>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_f32(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<F32>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_f16(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<F16>(w, ids, out, cols, scale); }
extern "C" __global__ void __launch_bounds__(128) rows_bf16(const uint8_t* w, const int* ids, float* out, int cols, float scale) { rows_body<BF16>(w, ids, out, cols, scale); }
// clang-format on

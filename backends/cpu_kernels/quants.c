/* GGUF block formats unpacked into int8 codes and lane scales, activation quantization,
 * and the row dot products. Bit layouts follow ggml-quants.c / gguf-py's quants.py. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"
#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

float fp16_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    if (exponent == 0) {
        float magnitude = (float)mantissa * (1.0f / 16777216.0f); /* subnormal: m * 2^-24, exact */
        memcpy(&bits, &magnitude, 4);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    }
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

static inline uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
#if defined(__F16C__)
static inline float f16(const uint8_t *p) { return _cvtsh_ss(u16(p)); } /* exact, as fp16_to_float */
#else
static inline float f16(const uint8_t *p) { return fp16_to_float(u16(p)); }
#endif

/* Byte vectors (GCC/Clang vector extensions: one AVX2 or two SSE/NEON registers). */
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef uint8_t u8x32 __attribute__((vector_size(32)));
typedef int8_t i8x32 __attribute__((vector_size(32)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

/* Byte vectors shifted in 16-bit lanes (one instruction, where a byte shift takes several);
 * the caller masks off the bits that crossed from the neighbouring byte. */
static inline u8x32 shl16(u8x32 v, int n) { return (u8x32)((u16x16)v << n); }
static inline u8x32 shr16(u8x32 v, int n) { return (u8x32)((u16x16)v >> n); }

static inline u8x16 load16(const uint8_t *p) {
    u8x16 v;
    memcpy(&v, p, 16);
    return v;
}
static inline u8x32 load32(const uint8_t *p) {
    u8x32 v;
    memcpy(&v, p, 32);
    return v;
}

static inline uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* Bit j of `bits` (LSB first) as byte j: 0xff if set, else 0. */
static inline i8x32 bit_mask(uint32_t bits) {
    const u8x32 select = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                          1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
#if defined(__AVX2__)
    /* byte k of the 4 to the 8 positions 8k .. 8k+7, in one in-lane shuffle of a broadcast */
    const __m256i spread_index = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                  2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    u8x32 spread = (u8x32)_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread_index);
#else
    uint8_t b0 = (uint8_t)bits, b1 = (uint8_t)(bits >> 8), b2 = (uint8_t)(bits >> 16), b3 = (uint8_t)(bits >> 24);
    u8x32 spread = {b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1,
                    b2, b2, b2, b2, b2, b2, b2, b2, b3, b3, b3, b3, b3, b3, b3, b3};
#endif
    return (i8x32)((spread & select) == select);
}

/* Bit j of `bits` (LSB first) as byte j, 0 or 1. */
static inline u8x32 expand_bits(uint32_t bits) { return (u8x32)bit_mask(bits) & 1; }

/* Nibbles 0-15 of qs[j] (low) and 16-31 (high) as 32 bytes. */
static inline u8x32 nibbles32(const uint8_t *qs) {
    u8x16 v = load16(qs);
    return __builtin_shufflevector(v & 15, v >> 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
                                   19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31);
}

int type_block(int type, int *weights, int *bytes) {
#define BLOCK_CASE(name, number, w, b, ...) \
    case number: *weights = w; *bytes = b; return 1;
    switch (type == T_Q1_0_TILES ? T_Q1_0 : type) { /* tiles hold the same blocks, regrouped */
        QUANT_TYPES(BLOCK_CASE)
    default: return 0;
    }
#undef BLOCK_CASE
}

/* the scale of weights 0-15 of a group, then of weights 16-31 */
static inline void set_scales(float *scale, float lo, float hi) {
    scale[0] = lo;
    scale[1] = hi;
}

/* Q4_0, 32 weights in 18 bytes:  | d: fp16 | qs: 16 bytes |
 * weight j < 16 is (low nibble of qs[j]) - 8, weight j + 16 is (high nibble of qs[j]) - 8; times d. */
static inline void unpack_q4_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x16 qs = load16(b + 2);
    i8x16 lo = (i8x16)(qs & 15) - 8, hi = (i8x16)(qs >> 4) - 8;
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q4_1, 32 weights in 20 bytes:  | d: fp16 | m: fp16 | qs: 16 bytes |   weight = d * nibble + m */
static inline void unpack_q4_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x16 qs = load16(b + 4), lo = qs & 15, hi = qs >> 4;
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q5_0, 32 weights in 22 bytes:  | d: fp16 | qh: 32 bits | qs: 16 bytes |
 * weight j = ((nibble j) | (bit j of qh) << 4) - 16, times d (nibbles as in Q4_0). */
static inline void unpack_q5_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    /* nibble | bit << 4, minus 16: the nibble, minus 16 where the bit is clear */
    i8x32 codes = (i8x32)nibbles32(b + 6) - (~bit_mask(u32(b + 2)) & 16);
    memcpy(q, &codes, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q5_1, 32 weights in 24 bytes:  | d: fp16 | m: fp16 | qh: 32 bits | qs: 16 bytes |   d * q5 + m */
static inline void unpack_q5_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x32 codes = nibbles32(b + 8) | (u8x32)(bit_mask(u32(b + 4)) & 16);
    memcpy(q, &codes, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q8_0, 32 weights in 34 bytes:  | d: fp16 | qs: 32 int8 | */
static inline void unpack_q8_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    memcpy(q, b + 2, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q1_0 (PrismML Bonsai), 128 weights in 18 bytes:  | d: fp16 | 16 bytes of bits, LSB first |
 * weight j is +d if bit j is set, else -d. */
static inline void unpack_q1_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    for (int g = 0; g < 4; g++) {
        i8x32 codes = (i8x32)(expand_bits(u32(b + 2 + 4 * g)) << 1) - 1; /* bit 1 -> +1, bit 0 -> -1 */
        memcpy(q + 32 * g, &codes, 32);
    }
    float d = f16(b);
    for (int g = 0; g < 4; g++) {
        set_scales(scale + HALVES * g, d, d);
        min[g] = 0.0f;
    }
}

/* The 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4). */
static inline void scale_min_k4(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* The 8 sub-block scales (d * sc) and min terms (-dmin * m) of a Q4_K or Q5_K block. */
static inline void k_scales(const uint8_t *b, float *scale, float *min) {
    float d = f16(b), dmin = f16(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, b + 4, &sc, &m);
        float ds = d * (float)sc;
        set_scales(scale + HALVES * j, ds, ds);
        min[j] = -(dmin * (float)m);
    }
}

/* Q4_K, 256 weights in 144 bytes:  | d: fp16 | dmin: fp16 | scales: 12 bytes | qs: 128 bytes |
 * 8 sub-blocks of 32, each with a 6-bit scale and min. Each 32 bytes of qs hold two
 * sub-blocks: low nibbles the first, high nibbles the second. weight = d*sc*q - dmin*m. */
static inline void unpack_q4_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *qs = b + 16;
    for (int i = 0; i < 4; i++) {
        u8x32 packed = load32(qs + 32 * i), lo = packed & 15, hi = packed >> 4;
        memcpy(q + 64 * i, &lo, 32);
        memcpy(q + 64 * i + 32, &hi, 32);
    }
    k_scales(b, scale, min);
}

/* Q5_K, 256 weights in 176 bytes:  | d | dmin | scales: 12 | qh: 32 | qs: 128 |
 * as Q4_K, plus a fifth bit: bit (2i) of qh[l] for weight 64i + l, bit (2i+1) for 64i + 32 + l. */
static inline void unpack_q5_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *qh = b + 16, *qs = b + 48;
    u8x32 high = load32(qh);
    for (int i = 0; i < 4; i++) {
        u8x32 packed = load32(qs + 32 * i);
        /* bit 2i (and 2i + 1) of each byte of qh moved to bit 4 */
        u8x32 bit_lo = 2 * i <= 4 ? shl16(high, 4 - 2 * i) : shr16(high, 2 * i - 4);
        u8x32 bit_hi = 2 * i + 1 <= 4 ? shl16(high, 3 - 2 * i) : shr16(high, 2 * i - 3);
        u8x32 lo = (packed & 15) | (bit_lo & 16);
        u8x32 hi = (shr16(packed, 4) & 15) | (bit_hi & 16);
        memcpy(q + 64 * i, &lo, 32);
        memcpy(q + 64 * i + 32, &hi, 32);
    }
    k_scales(b, scale, min);
}

/* Q6_K, 256 weights in 210 bytes:  | ql: 128 | qh: 64 | scales: 16 int8 | d: fp16 |
 * Two halves of 128; in half n, for l < 32 (ql, qh advanced by 64n and 32n):
 *   w[l]      = (ql[l] & 15      | (qh[l] >> 0 & 3) << 4) - 32
 *   w[l + 32] = (ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4) - 32
 *   w[l + 64] = (ql[l] >> 4      | (qh[l] >> 4 & 3) << 4) - 32
 *   w[l + 96] = (ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4) - 32
 * and weight e is scaled by d * scales[e / 16]. */
static inline void unpack_q6_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *l4 = ql + 64 * n, *h2 = qh + 32 * n;
        int8_t *y = q + 128 * n;
        u8x32 a = load32(l4), c = load32(l4 + 32), h = load32(h2);
        /* each 2-bit field of qh moved to bits 4-5 */
        i8x32 y0 = (i8x32)((a & 15) | (shl16(h, 4) & 48)) - 32;
        i8x32 y1 = (i8x32)((c & 15) | (shl16(h, 2) & 48)) - 32;
        i8x32 y2 = (i8x32)((shr16(a, 4) & 15) | (h & 48)) - 32;
        i8x32 y3 = (i8x32)((shr16(c, 4) & 15) | (shr16(h, 2) & 48)) - 32;
        memcpy(y, &y0, 32);
        memcpy(y + 32, &y1, 32);
        memcpy(y + 64, &y2, 32);
        memcpy(y + 96, &y3, 32);
    }
    for (int g = 0; g < 8; g++) {
        set_scales(scale + HALVES * g, d * (float)sc[2 * g], d * (float)sc[2 * g + 1]);
        min[g] = 0.0f;
    }
}

/* MXFP4 (gpt-oss's experts), 32 weights in 17 bytes: an E8M0 scale byte, then 16 bytes of
 * 4-bit E2M1 codes:
 *
 *     byte  0        1        2             16
 *         +--------+--------+--------+ ... +--------+
 *         |   e    | qs[0]  | qs[1]  |     | qs[15] |
 *         +--------+--------+--------+ ... +--------+
 *     qs[j]:  bits 7..4 = code of weight j + 16,  bits 3..0 = code of weight j
 *     code:   bit 3 the sign, bits 2..0 the E2M1 magnitude 0, 0.5, 1, 1.5, 2, 3, 4, 6
 *
 * A code c stands for kvalues_mxfp4[c], twice its E2M1 value (an int8 code), and the scale is
 * half of 2^(e - 127), as gguf-py's e8m0_to_fp32_half: 2^(e - 128), a subnormal float for
 * e < 2, and finite for every e (e = 255 is 2^127):
 *     weight j = kvalues_mxfp4[code j] * 2^(e - 128). */
static const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

/* the 16 codes of `index` (each 0-15) looked up in kvalues_mxfp4: one byte shuffle where the
 * tier has one, the same integers either way */
static inline i8x16 lookup_mxfp4(u8x16 index) {
#if defined(__SSSE3__)
    __m128i table = _mm_loadu_si128((const __m128i *)kvalues_mxfp4);
    return (i8x16)_mm_shuffle_epi8(table, (__m128i)index);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    return (i8x16)vqtbl1q_s8(vld1q_s8(kvalues_mxfp4), (uint8x16_t)index);
#else
    i8x16 out;
    for (int j = 0; j < 16; j++) out[j] = kvalues_mxfp4[index[j]];
    return out;
#endif
}

static inline void unpack_mxfp4(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x16 qs = load16(b + 1);
    i8x16 lo = lookup_mxfp4(qs & 15), hi = lookup_mxfp4(qs >> 4);
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
    float d = e8m0_half(b[0]);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}

void unpack_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf) {
    if (type == T_F32) {
        memcpy(buf->f, row, 4 * (size_t)cols);
        return;
    }
    if (type == T_F16 || type == T_BF16) {
        int64_t i = 0;
#if defined(__F16C__)
        if (type == T_F16)
            for (; i + 8 <= cols; i += 8)
                _mm256_storeu_ps(buf->f + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i))));
#endif
        for (; i < cols; i++) {
            uint16_t h = u16(row + 2 * i);
            buf->f[i] = type == T_F16 ? fp16_to_float(h) : bf16_to_float(h);
        }
        return;
    }
    /* one loop per type, so that each block's unpacking is inlined into it */
#define UNPACK_BLOCKS(unpack, weights, bytes)                                                               \
    for (int64_t blk = 0; blk < cols / (weights); blk++)                                                    \
        unpack(row + blk * (bytes), buf->q + blk * (weights), buf->scale + blk * ((weights) / GROUP) * HALVES, \
               buf->min + blk * ((weights) / GROUP));                                                        \
    break;
#define UNPACK_CASE(name, number, weights, bytes, form, unpack, ...) UNPACK_##form(number, weights, bytes, unpack)
#define UNPACK_FLOAT(...) /* above */
#define UNPACK_CODES(number, weights, bytes, unpack) \
    case number: UNPACK_BLOCKS(unpack, weights, bytes)
#define UNPACK_TILED UNPACK_CODES
    switch (type) {
        QUANT_TYPES(UNPACK_CASE)
    }
#undef UNPACK_CASE
#undef UNPACK_FLOAT
#undef UNPACK_CODES
#undef UNPACK_TILED
#undef UNPACK_BLOCKS
}

void dequantize_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf, float *out) {
    unpack_row(type, row, cols, buf);
    if (type_is_float(type)) {
        memcpy(out, buf->f, 4 * (size_t)cols);
        return;
    }
    for (int64_t g = 0; g < cols / GROUP; g++)
        for (int e = 0; e < GROUP; e += 8) { /* 8 weights: s * q + m */
            float s = buf->scale[g * HALVES + e / 16], m = buf->min[g];
            v8f w = widen8(buf->q + g * GROUP + e) * s + m;
            memcpy(out + g * GROUP + e, &w, sizeof w);
        }
}

void quantize_row(const float *x, int64_t K, int16_t *q, float *d, float *xsum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
        }
        if (!(amax <= 3.4e38f)) { /* inf or nan: the result must not look finite */
            memset(q + g * GROUP, 0, GROUP * sizeof *q);
            d[g] = NAN;
            xsum[g] = NAN;
            continue;
        }
        float scale = amax / 32767.0f, inverse = amax > 0.0f ? 32767.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < GROUP; i++) {
            int32_t v = (int32_t)nearbyintf(xg[i] * inverse);
            q[g * GROUP + i] = (int16_t)v;
            sum += v;
        }
        d[g] = scale;
        xsum[g] = scale * (float)sum;
    }
}

/* One group's contribution to a row's 8 float lanes. Weights with one scale per group sum
 * both halves in int32 first (exact); Q6_K's halves have a scale each. */
static inline v8f group_term(const int8_t *w, const int16_t *x, const float *scale, float xd, int split) {
    v8i lo, hi;
    dot32(w, x, &lo, &hi);
    if (!split) return __builtin_convertvector(lo + hi, v8f) * (scale[0] * xd);
    return __builtin_convertvector(lo, v8f) * (scale[0] * xd) + __builtin_convertvector(hi, v8f) * (scale[1] * xd);
}

/* Whether a value of each check format (QUANT_TYPES) at `p` is inf or nan. */
static inline int bad_FP16(const uint8_t *p) { return ((u16(p) >> 10) & 31) == 31; }
static inline int bad_BF16(const uint8_t *p) { return ((u16(p) >> 7) & 0xff) == 0xff; }
static inline int bad_F32(const uint8_t *p) { return ((u32(p) >> 23) & 0xff) == 0xff; }
static inline int bad_NONE(const uint8_t *p) { return p == NULL; } /* every value finite (MXFP4) */

/* Blocks whose fp16 scale (or min) is inf or nan; for float types, elements that are. */
int64_t count_bad_scales(int type, const uint8_t *data, int64_t n_blocks) {
    int64_t bad = 0;
#define CHECK_CASE(name, number, weights, bytes, form, unpack, has_min, split, check, ...) \
    case number: {                                                                        \
        static const int at[] = {__VA_ARGS__};                                            \
        for (int64_t i = 0; i < n_blocks; i++) {                                          \
            int any = 0;                                                                  \
            for (size_t j = 0; j < sizeof at / sizeof at[0]; j++)                         \
                any |= bad_##check(data + i * (bytes) + at[j]);                           \
            bad += any;                                                                   \
        }                                                                                 \
        break;                                                                            \
    }
    switch (type) {
        QUANT_TYPES(CHECK_CASE)
    }
#undef CHECK_CASE
    return bad;
}

/* The float row `w->f` (F32, F16, BF16) times float tokens t0 .. t1 - 1, into out[t * stride]. */
void dot_tokens(const RowBuffer *w, const float *x, int64_t K, int64_t t0, int64_t t1, float *out, int64_t stride) {
    for (int64_t t = t0; t < t1; t++) out[t * stride] = dot_float(w->f, x + t * K, K);
}

/* Whether a type's two half groups have scales of their own (QUANT_TYPES' split): a value
 * row_tokens reads at run time, as it did before the table, rather than a constant of each
 * case: folded into each case, it lets GCC unroll the scalar tier's loops 60% larger. */
static inline int type_split(int type) {
#define SPLIT_CASE(name, number, weights, bytes, form, unpack, has_min, split, ...) \
    case number: return split;
    switch (type) {
        QUANT_TYPES(SPLIT_CASE)
    default: return 0;
    }
#undef SPLIT_CASE
}

/* N tokens' products with one packed row, each block unpacked once into registers and the
 * stack for all of them (decode, speculative verification, batched decoding: each row is
 * read once). Token k's codes are at xq + k * K, its group scales and sums at xd, xs + k * G.
 * Each token's arithmetic is the same, in the same order, whatever N and the tokens beside
 * it: a group's int32 sums, then acc += sums * (wscale * xscale) in 8 lanes, reduce8, and
 * the min terms. `mins` is scratch for the row's min terms. */
static inline __attribute__((always_inline)) void row_tokens(int type, const uint8_t *row, int64_t K,
                                                             const int16_t *xq, const float *xd, const float *xs,
                                                             float *mins, const int N, float *out, int64_t stride) {
    v8f acc[ROW_TOKENS] = {{0}};
    int64_t G = K / GROUP;
    int with_mins = 0, split = type_split(type);
    float no_mins[8]; /* the zero min terms of types without any: stores the compiler drops */
#define DOT_BLOCKS(unpack, weights, bytes, has_min)                                                     \
    _Pragma("GCC unroll 2") for (int64_t blk = 0; blk < K / (weights); blk++) {                         \
        int8_t q[weights];                                                                              \
        float scale[(weights) / GROUP * HALVES];                                                        \
        int64_t g0 = blk * ((weights) / GROUP);                                                         \
        unpack(row + blk * (bytes), q, scale, (has_min) ? mins + g0 : no_mins);                         \
        for (int g = 0; g < (weights) / GROUP; g++)                                                     \
            _Pragma("GCC unroll 4") for (int k = 0; k < N; k++) acc[k] +=                               \
                group_term(q + g * GROUP, xq + k * K + (g0 + g) * GROUP, scale + g * HALVES, xd[k * G + g0 + g], split); \
    }                                                                                                   \
    with_mins = (has_min);                                                                              \
    break;
#define DOT_CASE(name, number, weights, bytes, form, unpack, has_min, ...) \
    DOT_##form(number, unpack, weights, bytes, has_min)
#define DOT_FLOAT(...) /* float rows: dot_tokens */
#define DOT_CODES(number, unpack, weights, bytes, has_min) \
    case number: DOT_BLOCKS(unpack, weights, bytes, has_min)
#define DOT_TILED(...) /* Q1_0: q1_tiles.c */
    switch (type) {
        QUANT_TYPES(DOT_CASE)
    }
#undef DOT_CASE
#undef DOT_FLOAT
#undef DOT_CODES
#undef DOT_TILED
#undef DOT_BLOCKS
    for (int k = 0; k < N; k++) {
        float total = reduce8(acc[k]);
        out[k * stride] = with_mins ? total + dot_float(mins, xs + k * G, G) : total;
    }
}

void dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, const float *xs,
                    float *mins, int n, float *out, int64_t stride) {
    switch (n) { /* one body per count, so that the loop over tokens unrolls and shares each unpacked block */
    case 1: row_tokens(type, row, K, xq, xd, xs, mins, 1, out, stride); break;
    case 2: row_tokens(type, row, K, xq, xd, xs, mins, 2, out, stride); break;
    case 3: row_tokens(type, row, K, xq, xd, xs, mins, 3, out, stride); break;
    default: row_tokens(type, row, K, xq, xd, xs, mins, ROW_TOKENS, out, stride); break;
    }
}


/* -- many tokens: rows dequantized to float, fused multiply-adds ----------------------------
 * A product over FLOAT_TOKENS or more tokens (prefill) takes the float activations as they
 * are and the weights as gguf-py dequantizes them (dequantize_row), and each (row, token) is
 * the sum of w[i] * x[i] in 8 lanes (lane i mod 8), each step one fused multiply-add, then
 * reduce8. FLOAT_ROWS rows x FLOAT_BLOCK tokens of accumulators share each load. */

/* R rows of `w` (row r at r * K) times tokens t .. t + TK - 1, into out[token * stride + row]. */
static inline __attribute__((always_inline)) void float_kernel(const float *w, int64_t K, const int R, const int TK,
                                                               const float *x, int64_t t, float *out, int64_t stride) {
    v8f acc[FLOAT_ROWS][FLOAT_BLOCK] = {{{0}}};
    for (int64_t i = 0; i < K; i += 8) {
        v8f wv[FLOAT_ROWS];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) memcpy(&wv[r], w + r * K + i, sizeof wv[r]);
#pragma GCC unroll 8
        for (int k = 0; k < TK; k++) {
            v8f xv;
            memcpy(&xv, x + (t + k) * K + i, sizeof xv);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) acc[r][k] = fma8(wv[r], xv, acc[r][k]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int k = 0; k < TK; k++) out[(t + k) * stride + r] = reduce8(acc[r][k]);
}

static inline __attribute__((always_inline)) void float_rows(const float *w, int64_t K, const int R, const float *x,
                                                             int64_t t0, int64_t t1, float *out, int64_t stride) {
    int64_t t = t0;
    for (; t + FLOAT_BLOCK <= t1; t += FLOAT_BLOCK) float_kernel(w, K, R, FLOAT_BLOCK, x, t, out, stride);
    for (; t < t1; t++) float_kernel(w, K, R, 1, x, t, out, stride);
}

/* n (1 .. FLOAT_ROWS) float rows (row r at w + r * K, K a multiple of 8) times tokens
 * t0 .. t1 - 1 of x (T, K), into out[t * stride + r]. */
void float_product(const float *w, int n, int64_t K, const float *x, int64_t t0, int64_t t1, float *out,
                   int64_t stride) {
    if (n == FLOAT_ROWS) {
        float_rows(w, K, FLOAT_ROWS, x, t0, t1, out, stride);
        return;
    }
    for (int r = 0; r < n; r++) float_rows(w + r * K, K, 1, x, t0, t1, out + r, stride);
}

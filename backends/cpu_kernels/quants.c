/* GGUF block formats unpacked into int8 codes and lane scales, activation quantization,
 * and the row dot products. Bit layouts follow ggml-quants.c / gguf-py's quants.py. */
#include <math.h>
#include <string.h>

#include "bytes.h"    /* u16, u32, f16 */
#include "iq_grids.h" /* kvalues_iq4nl, ksigns_iq2xs and the IQ grids (tools/fixtures/make_iq_grids.py) */
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

/* The unpack functions and group_term, always inlined into each type's product function
 * (and unpack_row): GCC's inlining limits would otherwise decide per translation unit, and
 * adding a type would move older types' unpacking out of line (a call per block or group). */
#define INLINED __attribute__((always_inline))

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

#if !defined(__AVX2__)
/* BYTE_MASKS[b]: the 8 bytes whose byte j (in memory order, little-endian) is 0xff where
 * bit j of b is set: a byte of bits spread in one load (the scalar and NEON tiers). */
#define BYTE_MASK(b)                                                                                   \
    ((((b) >> 0 & 1) * 0xffull) | (((b) >> 1 & 1) * 0xff00ull) | (((b) >> 2 & 1) * 0xff0000ull) |     \
     (((b) >> 3 & 1) * 0xff000000ull) | (((b) >> 4 & 1) * 0xff00000000ull) |                          \
     (((b) >> 5 & 1) * 0xff0000000000ull) | (((b) >> 6 & 1) * 0xff000000000000ull) |                  \
     (((b) >> 7 & 1) * 0xff00000000000000ull))
#define MASKS4(b) BYTE_MASK(b), BYTE_MASK((b) + 1), BYTE_MASK((b) + 2), BYTE_MASK((b) + 3)
#define MASKS16(b) MASKS4(b), MASKS4((b) + 4), MASKS4((b) + 8), MASKS4((b) + 12)
#define MASKS64(b) MASKS16(b), MASKS16((b) + 16), MASKS16((b) + 32), MASKS16((b) + 48)
static const uint64_t BYTE_MASKS[256] = {MASKS64(0), MASKS64(64), MASKS64(128), MASKS64(192)};
#undef MASKS64
#undef MASKS16
#undef MASKS4
#undef BYTE_MASK
#endif

/* Bit j of `bits` (LSB first) as byte j: 0xff if set, else 0. */
static inline i8x32 bit_mask(uint32_t bits) {
#if defined(__AVX2__)
    const u8x32 select = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128,
                          1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    /* byte k of the 4 to the 8 positions 8k .. 8k+7, in one in-lane shuffle of a broadcast */
    const __m256i spread_index = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                                  2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    u8x32 spread = (u8x32)_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread_index);
    return (i8x32)((spread & select) == select);
#else
    const uint64_t masks[4] = {BYTE_MASKS[bits & 255], BYTE_MASKS[(bits >> 8) & 255], BYTE_MASKS[(bits >> 16) & 255],
                               BYTE_MASKS[bits >> 24]};
    i8x32 out;
    memcpy(&out, masks, 32);
    return out;
#endif
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
    /* Q1_0 tiles and row tiles (of the types row_tiles.c takes) hold the same blocks, regrouped;
     * ternary tiles take 66 bytes per 256 weights, as TQ2_0 */
    const int tiled = row_tiles_of(type);
    switch (type == T_Q1_0_TILES ? T_Q1_0 : type == T_TQ_TILES ? T_TQ2_0 : tiled < 0 ? type : row_tiled_type(tiled) ? tiled : -1) {
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
static inline INLINED void unpack_q4_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x16 qs = load16(b + 2);
    i8x16 lo = (i8x16)(qs & 15) - 8, hi = (i8x16)(qs >> 4) - 8;
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q4_1, 32 weights in 20 bytes:  | d: fp16 | m: fp16 | qs: 16 bytes |   weight = d * nibble + m */
static inline INLINED void unpack_q4_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x16 qs = load16(b + 4), lo = qs & 15, hi = qs >> 4;
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q5_0, 32 weights in 22 bytes:  | d: fp16 | qh: 32 bits | qs: 16 bytes |
 * weight j = ((nibble j) | (bit j of qh) << 4) - 16, times d (nibbles as in Q4_0). */
static inline INLINED void unpack_q5_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    /* nibble | bit << 4, minus 16: the nibble, minus 16 where the bit is clear */
    i8x32 codes = (i8x32)nibbles32(b + 6) - (~bit_mask(u32(b + 2)) & 16);
    memcpy(q, &codes, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q5_1, 32 weights in 24 bytes:  | d: fp16 | m: fp16 | qh: 32 bits | qs: 16 bytes |   d * q5 + m */
static inline INLINED void unpack_q5_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x32 codes = nibbles32(b + 8) | (u8x32)(bit_mask(u32(b + 4)) & 16);
    memcpy(q, &codes, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q8_0, 32 weights in 34 bytes:  | d: fp16 | qs: 32 int8 | */
static inline INLINED void unpack_q8_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    /* in halves, as dot32_sum reads them: GCC then reads the row itself, where with AVX-512 on it
     * sent one 32-byte copy through the stack (1.2x slower on Zen 4) */
    memcpy(q, b + 2, 16);
    memcpy(q + 16, b + 18, 16);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q1_0 (PrismML Bonsai), 128 weights in 18 bytes:  | d: fp16 | 16 bytes of bits, LSB first |
 * weight j is +d if bit j is set, else -d. */
static inline INLINED void unpack_q1_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
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

/* The 8 sub-block scales (d * sc) and min terms (-dmin * m) of a Q4_K or Q5_K block (its 6-bit
 * values as bytes.h's k_scale_bytes unpacks them, 4 at a time in 32-bit words, as ggml's vec_dot does). */
static inline void k_scales(const uint8_t *b, float *scale, float *min) {
    uint64_t sc, m;
    k_scale_bytes(b, &sc, &m);
    v8f ds = f16(b) * widen8u(sc); /* d * sc */
    v8f mins = -(f16(b + 2) * widen8u(m)); /* -(dmin * m) */
    v8f lo = __builtin_shufflevector(ds, ds, 0, 0, 1, 1, 2, 2, 3, 3), hi = __builtin_shufflevector(ds, ds, 4, 4, 5, 5, 6, 6, 7, 7);
    memcpy(scale, &lo, sizeof lo); /* both halves of group j: scale[2j], scale[2j + 1] */
    memcpy(scale + 8, &hi, sizeof hi);
    memcpy(min, &mins, sizeof mins);
}

/* Q4_K, 256 weights in 144 bytes:  | d: fp16 | dmin: fp16 | scales: 12 bytes | qs: 128 bytes |
 * 8 sub-blocks of 32, each with a 6-bit scale and min. Each 32 bytes of qs hold two
 * sub-blocks: low nibbles the first, high nibbles the second. weight = d*sc*q - dmin*m. */
static inline INLINED void unpack_q4_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
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
static inline INLINED void unpack_q5_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
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
static inline INLINED void unpack_q6_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
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
    v8f lo = d * widen8(sc), hi = d * widen8(sc + 8); /* scale[e / 16] = d * scales[e / 16]: halves in order */
    memcpy(scale, &lo, sizeof lo);
    memcpy(scale + 8, &hi, sizeof hi);
    for (int g = 0; g < 8; g++) min[g] = 0.0f;
}

/* table[idx[j]] for 16 indices below 16 (one byte shuffle in AVX2 and NEON) */
static inline i8x16 lookup16(const int8_t *table, u8x16 idx) {
    i8x16 out;
#if defined(__AVX2__)
    out = (i8x16)_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)table), (__m128i)idx);
#elif defined(__ARM_NEON) && defined(__aarch64__)
    out = (i8x16)vqtbl1q_s8(vld1q_s8(table), (uint8x16_t)idx);
#else
    for (int j = 0; j < 16; j++) out[j] = table[idx[j]];
#endif
    return out;
}

/* The codes of 16 bytes of nibbles (low nibbles weights 0-15, high ones 16-31) through a table,
 * into q in two halves: as dot32_sum reads them, so that they stay in registers (a 32-byte vector
 * written whole and read back in halves goes through the stack). */
static inline void lookup_nibbles(const int8_t *table, const uint8_t *qs, int8_t *q) {
    const u8x16 v = load16(qs);
    const i8x16 lo = lookup16(table, v & 15), hi = lookup16(table, v >> 4);
    memcpy(q, &lo, 16);
    memcpy(q + 16, &hi, 16);
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
const int8_t kvalues_mxfp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float e8m0_halves[256]; /* e8m0_half of every byte: one load per block, where the bits took seven instructions */
static inline float e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float out;
    memcpy(&out, &bits, 4);
    return out;
}
__attribute__((constructor)) static void fill_e8m0_halves(void) {
    for (int e = 0; e < 256; e++) e8m0_halves[e] = e8m0_half((uint8_t)e);
}

static inline INLINED void unpack_mxfp4(const uint8_t *b, int8_t *q, float *scale, float *min) {
    lookup_nibbles(kvalues_mxfp4, b + 1, q);
    float d = e8m0_halves[b[0]];
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* The 2-bit fields of 64 bytes (Q2_K, Q3_K, TQ2_0) in weight order: in half n (128 weights),
 * for l < 32, field j (bits 2j, 2j + 1) of qs[32n + l] is weight 128n + 32j + l. */
static inline void crumbs(const uint8_t *qs, int n, u8x32 y[4]) {
    u8x32 packed = load32(qs + 32 * n);
    y[0] = packed & 3;
    y[1] = shr16(packed, 2) & 3;
    y[2] = shr16(packed, 4) & 3;
    y[3] = shr16(packed, 6) & 3;
}

/* Q2_K, 256 weights in 84 bytes:  | scales: 16 bytes | qs: 64 bytes | d: fp16 | dmin: fp16 |
 * 16 sub-blocks of 16 weights; sub-block k has the scale d * (scales[k] & 15) and the min
 * dmin * (scales[k] >> 4). Codes 0-3 as crumbs() draws them:
 *   weight 128n + 32j + l = (qs[32n + l] >> 2j) & 3      (n < 2, j < 4, l < 32)
 * weight e = d * (scales[e / 16] & 15) * code - dmin * (scales[e / 16] >> 4): the min is per
 * half group, so each group has two (MIN_SLOTS(2)). */
static inline INLINED void unpack_q2_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    for (int n = 0; n < 2; n++) {
        u8x32 y[4];
        crumbs(b + 16, n, y);
        memcpy(q + 128 * n, y, sizeof y);
    }
    float d = f16(b + 80), dmin = f16(b + 82);
    for (int k = 0; k < 16; k++) {
        scale[k] = d * (float)(b[k] & 15); /* the scale of half k % 2 of group k / 2 */
        min[k] = -(dmin * (float)(b[k] >> 4));
    }
}

/* Q3_K, 256 weights in 110 bytes:  | hmask: 32 | qs: 64 | scales: 12 | d: fp16 |
 * 16 sub-blocks of 16 weights, sub-block k with a 6-bit scale, stored as
 *   low 4 bits: scales[k % 8] >> 4 (k / 8),  high 2 bits: scales[8 + k % 4] >> 2 (k / 4),
 * taken minus 32. Each weight has 2 low bits in qs (as Q2_K) and a high bit in hmask:
 *   weight 32J + l (J < 8, l < 32): low = (qs[32 (J / 4) + l] >> 2 (J % 4)) & 3,
 *                                   high = bit J of hmask[l]
 * and is d * (sc - 32) * (low - (high ? 0 : 4)). */
static inline INLINED void unpack_q3_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    u8x32 high = load32(b);
    for (int n = 0; n < 2; n++) {
        u8x32 y[4];
        crumbs(b + 32, n, y);
        for (int j = 0; j < 4; j++) {
            int J = 4 * n + j; /* bit J of each hmask byte moved to bit 2 */
            u8x32 bit = (J <= 2 ? shl16(high, 2 - J) : shr16(high, J - 2)) & 4;
            i8x32 codes = (i8x32)(y[j] | bit) - 4;
            memcpy(q + 32 * J, &codes, 32);
        }
    }
    const uint8_t *sc = b + 96;
    float d = f16(b + 108);
    for (int k = 0; k < 16; k++) {
        scale[k] = d * (float)q3_k_scale(sc, k);
    }
    for (int g = 0; g < 8; g++) min[g] = 0.0f;
}

/* TQ2_0 (ternary), 256 weights in 66 bytes:  | qs: 64 bytes | d: fp16 |
 * weight 128n + 32j + l = ((qs[32n + l] >> 2j) & 3) - 1 (as Q2_K's codes), times d. */
static inline INLINED void unpack_tq2_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    for (int n = 0; n < 2; n++) {
        u8x32 y[4];
        crumbs(b, n, y);
        for (int j = 0; j < 4; j++) {
            i8x32 codes = (i8x32)y[j] - 1;
            memcpy(q + 128 * n + 32 * j, &codes, 32);
        }
    }
    float d = f16(b + 64);
    for (int g = 0; g < 8; g++) {
        set_scales(scale + HALVES * g, d, d);
        min[g] = 0.0f;
    }
}

/* Base-3 digit j of TQ1_0 bytes x, minus 1: the bytes hold 5 (qh: 4) digits as a fixed-point
 * fraction, digit j = ((uint8_t)(x * 3^j) * 3) >> 8, i.e. 0, 1 or 2 as the byte x * 3^j is
 * below 86, below 171, or not. */
#define TRITS(x, j, pow3) ((__typeof__(x))((x) * (uint8_t)(pow3)[j] > 85) + (__typeof__(x))((x) * (uint8_t)(pow3)[j] > 170))

/* TQ1_0 (ternary), 256 weights in 54 bytes:  | qs: 48 bytes | qh: 4 bytes | d: fp16 |
 *   weight 32j + l       = digit j of qs[l]       - 1   (j < 5, l < 32)
 *   weight 160 + 16j + l = digit j of qs[32 + l]  - 1   (j < 5, l < 16)
 *   weight 240 + 4j + l  = digit j of qh[l]       - 1   (j < 4, l < 4)
 * where digit j of byte x is ((uint8_t)(x * 3^j) * 3) >> 8; times d. */
static inline INLINED void unpack_tq1_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    u8x32 a = load32(b);
    u8x16 c = load16(b + 32);
    for (int j = 0; j < 5; j++) {
        /* the comparisons give 0 or -1: their sum is -digit, and the code digit - 1 */
        i8x32 ya = -(i8x32)TRITS(a, j, pow3) - 1;
        i8x16 yc = -(i8x16)TRITS(c, j, pow3) - 1;
        memcpy(q + 32 * j, &ya, 32);
        memcpy(q + 160 + 16 * j, &yc, 16);
    }
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 4; l++) q[240 + 4 * j + l] = (int8_t)((((uint8_t)(b[48 + l] * pow3[j]) * 3) >> 8) - 1);
    float d = f16(b + 52);
    for (int g = 0; g < 8; g++) {
        set_scales(scale + HALVES * g, d, d);
        min[g] = 0.0f;
    }
}

/* IQ4_NL, 32 weights in 18 bytes:  | d: fp16 | qs: 16 bytes |
 * weight j < 16 is kvalues[qs[j] & 15], weight j + 16 is kvalues[qs[j] >> 4]; times d. */
static inline INLINED void unpack_iq4_nl(const uint8_t *b, int8_t *q, float *scale, float *min) {
    lookup_nibbles(kvalues_iq4nl, b + 2, q);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* IQ4_XS, 256 weights in 136 bytes:  | d: fp16 | scales_h: 16 bits | scales_l: 4 bytes | qs: 128 |
 * 8 sub-blocks of 32; sub-block k has the 6-bit scale
 *   ((scales_l[k / 2] >> 4 (k % 2)) & 15) | ((scales_h >> 2k) & 3) << 4, taken minus 32
 *   (iq4_xs_scale in bytes.h),
 * and its weights are IQ4_NL's nibbles of qs[16k .. 16k + 15]; weight = d * (sc - 32) * kvalue. */
static inline INLINED void unpack_iq4_xs(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    for (int k = 0; k < 8; k++) {
        lookup_nibbles(kvalues_iq4nl, b + 8 + 16 * k, q + 32 * k);
        float ds = d * (float)iq4_xs_scale(b, k);
        set_scales(scale + HALVES * k, ds, ds);
        min[k] = 0.0f;
    }
}

/* -- the IQ grid formats: each 8 (or 4) weights are a point of a grid (iq_grids.h) with
 * signs of their own; the codes are the grid values with their signs, so that a grid point
 * is looked up once per block in every tier. Scales per 32 or 16 weights, as gguf-py. */

/* 32 weights, grid values (at most 62) copied to q: negated where bit j of `signs` is set,
 * as (g ^ m) - m with m = -1 there (two's complement negation), 0 elsewhere */
static inline void apply_signs32(int8_t *q, uint32_t signs) {
    i8x32 v, m = bit_mask(signs);
    memcpy(&v, q, 32);
    v = (v ^ m) - m;
    memcpy(q, &v, 32);
}

/* IQ2_XXS, 256 weights in 66 bytes:  | d: fp16 | 8 x (grid: 4 bytes | aux: 32 bits) |
 * group g (32 weights) of 4 x 8: weights 8l .. 8l + 7 are iq2xxs_grid[grid[l]] with the signs
 * ksigns_iq2xs[(aux >> 7l) & 127]; the group's scale is d * (0.5 + (aux >> 28)) * 0.25. */
static inline INLINED void unpack_iq2_xxs(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    for (int g = 0; g < 8; g++) {
        const uint8_t *p = b + 2 + 8 * g;
        uint32_t aux = u32(p + 4);
        uint32_t signs = 0;
        for (int l = 0; l < 4; l++) {
            memcpy(q + 32 * g + 8 * l, iq2xxs_grid[p[l]], 8);
            signs |= (uint32_t)ksigns_iq2xs[(aux >> (7 * l)) & 127] << (8 * l);
        }
        apply_signs32(q + 32 * g, signs);
        float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
        set_scales(scale + HALVES * g, db, db);
        min[g] = 0.0f;
    }
}

/* IQ2_XS, 256 weights in 74 bytes:  | d: fp16 | qs: 32 x 16 bits | scales: 8 bytes |
 * weights 8i .. 8i + 7 are iq2xs_grid[qs[i] & 511] with the signs ksigns_iq2xs[qs[i] >> 9];
 * the 16 weights of half k (k < 16) have the scale d * (0.5 + ((scales[k / 2] >> 4 (k % 2)) & 15)) * 0.25. */
static inline INLINED void unpack_iq2_xs(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    for (int g = 0; g < 8; g++) {
        uint32_t signs = 0;
        for (int l = 0; l < 4; l++) {
            uint16_t v = u16(b + 2 + 8 * g + 2 * l);
            memcpy(q + 32 * g + 8 * l, iq2xs_grid[v & 511], 8);
            signs |= (uint32_t)ksigns_iq2xs[v >> 9] << (8 * l);
        }
        apply_signs32(q + 32 * g, signs);
    }
    for (int k = 0; k < 16; k++)
        scale[k] = d * (0.5f + (float)((b[66 + k / 2] >> (4 * (k % 2))) & 15)) * 0.25f;
    for (int g = 0; g < 8; g++) min[g] = 0.0f;
}

/* IQ2_S, 256 weights in 82 bytes:  | d: fp16 | qs: 32 | signs: 32 | qh: 8 | scales: 8 |
 * weights 8i .. 8i + 7 are iq2s_grid[qs[i] | ((qh[i / 4] >> 2 (i % 4)) & 3) << 8], negated
 * where the bits of signs[i] are set; half k's scale as IQ2_XS's. */
static inline INLINED void unpack_iq2_s(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    const uint8_t *qs = b + 2, *signs = b + 34, *qh = b + 66, *sc = b + 74;
    for (int g = 0; g < 8; g++) { /* i = 4g + l: qh[i / 4] = qh[g] */
        for (int l = 0; l < 4; l++) memcpy(q + 32 * g + 8 * l, iq2s_grid[qs[4 * g + l] | ((qh[g] >> (2 * l)) & 3) << 8], 8);
        apply_signs32(q + 32 * g, u32(signs + 4 * g));
    }
    for (int k = 0; k < 16; k++) scale[k] = d * (0.5f + (float)((sc[k / 2] >> (4 * (k % 2))) & 15)) * 0.25f;
    for (int g = 0; g < 8; g++) min[g] = 0.0f;
}

/* IQ3_XXS, 256 weights in 98 bytes:  | d: fp16 | qs: 64 | aux: 8 x 32 bits |
 * in group g, weights 8l .. 8l + 3 and 8l + 4 .. 8l + 7 (l < 4) are iq3xxs_grid[qs[8g + 2l]]
 * and iq3xxs_grid[qs[8g + 2l + 1]], with the signs ksigns_iq2xs[(aux[g] >> 7l) & 127]; the
 * group's scale is d * (0.5 + (aux[g] >> 28)) * 0.5. */
static inline INLINED void unpack_iq3_xxs(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    const uint8_t *qs = b + 2;
    for (int g = 0; g < 8; g++) {
        uint32_t aux = u32(b + 66 + 4 * g);
        uint32_t signs = 0;
        for (int l = 0; l < 4; l++) {
            memcpy(q + 32 * g + 8 * l, iq3xxs_grid[qs[8 * g + 2 * l]], 4);
            memcpy(q + 32 * g + 8 * l + 4, iq3xxs_grid[qs[8 * g + 2 * l + 1]], 4);
            signs |= (uint32_t)ksigns_iq2xs[(aux >> (7 * l)) & 127] << (8 * l);
        }
        apply_signs32(q + 32 * g, signs);
        float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
        set_scales(scale + HALVES * g, db, db);
        min[g] = 0.0f;
    }
}

/* IQ3_S, 256 weights in 110 bytes:  | d: fp16 | qs: 64 | qh: 8 | signs: 32 | scales: 4 |
 * weights 4i .. 4i + 3 (i < 64) are iq3s_grid[qs[i] | ((qh[i / 8] >> (i % 8)) & 1) << 8];
 * weight e is negated where bit e % 8 of signs[e / 8] is set; group g's scale is
 * d * (1 + 2 ((scales[g / 2] >> 4 (g % 2)) & 15)). */
static inline INLINED void unpack_iq3_s(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    const uint8_t *qs = b + 2, *qh = b + 66, *signs = b + 74, *sc = b + 106;
    for (int g = 0; g < 8; g++) { /* i = 8g + l: qh[i / 8] = qh[g], bit i % 8 = l */
        for (int l = 0; l < 8; l++) memcpy(q + 32 * g + 4 * l, iq3s_grid[qs[8 * g + l] | ((qh[g] >> l) & 1) << 8], 4);
        apply_signs32(q + 32 * g, u32(signs + 4 * g));
    }
    for (int g = 0; g < 8; g++) {
        float db = d * (float)(1 + 2 * ((sc[g / 2] >> (4 * (g % 2))) & 15));
        set_scales(scale + HALVES * g, db, db);
        min[g] = 0.0f;
    }
}

/* 32 IQ1 weights, grid values (-1, 0, 1) copied to q: 8 * value + delta, delta -1 where bit
 * j of `negative` is set, else +1 (grid + delta / 8, in eighths) */
static inline void iq1_eighths32(int8_t *q, uint32_t negative) {
    i8x32 v, m = bit_mask(negative);
    memcpy(&v, q, 32);
    v = (i8x32)(shl16((u8x32)v, 3) & 0xf8) + (m | 1);
    memcpy(q, &v, 32);
}

/* IQ1_S, 256 weights in 50 bytes:  | d: fp16 | qs: 32 | qh: 8 x 16 bits |
 * group g: weights 8l .. 8l + 7 (l < 4) are iq1s_grid[qs[4g + l] | ((qh[g] >> 3l) & 7) << 8]
 * (values -1, 0, 1), plus delta = -1/8 if bit 15 of qh[g] is set, else +1/8; times
 * d * (2 ((qh[g] >> 12) & 7) + 1). As codes: 8 grid + 8 delta, with the scale over 8. */
static inline INLINED void unpack_iq1_s(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b);
    for (int g = 0; g < 8; g++) {
        uint16_t h = u16(b + 34 + 2 * g);
        for (int l = 0; l < 4; l++) memcpy(q + 32 * g + 8 * l, iq1s_grid[b[2 + 4 * g + l] | ((h >> (3 * l)) & 7) << 8], 8);
        iq1_eighths32(q + 32 * g, h & 0x8000 ? 0xffffffffu : 0);
        float dl = d * (float)(2 * ((h >> 12) & 7) + 1) * 0.125f; /* exact: a power of 2 */
        set_scales(scale + HALVES * g, dl, dl);
        min[g] = 0.0f;
    }
}

/* IQ1_M, 256 weights in 56 bytes:  | qs: 32 | qh: 16 | scales: 4 x 16 bits |
 * nibble i of qh (low nibble of qh[i / 2] first) holds 3 high grid-index bits and a delta bit:
 * weights 8i .. 8i + 7 are iq1s_grid[qs[i] | (nibble & 7) << 8] plus -1/8 if nibble & 8, else
 * +1/8; half k (16 weights) is times d * (2 ((scales[k / 4] >> 3 (k % 4)) & 7) + 1), d being
 * iq1m_d(scales). Codes in eighths, as IQ1_S. */
static inline INLINED void unpack_iq1_m(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *qh = b + 32, *sc = b + 48;
    float d = fp16_to_float(iq1m_d(sc));
    for (int g = 0; g < 8; g++) {
        uint32_t negative = 0;
        for (int l = 0; l < 4; l++) {
            int i = 4 * g + l, nibble = (qh[i / 2] >> (4 * (i % 2))) & 15;
            memcpy(q + 8 * i, iq1s_grid[b[i] | (nibble & 7) << 8], 8);
            negative |= nibble & 8 ? 0xffu << (8 * l) : 0;
        }
        iq1_eighths32(q + 32 * g, negative);
    }
    for (int k = 0; k < 16; k++) scale[k] = d * (float)(2 * ((u16(sc + 2 * (k / 4)) >> (3 * (k % 4))) & 7) + 1) * 0.125f;
    for (int g = 0; g < 8; g++) min[g] = 0.0f;
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
#define UNPACK_BLOCKS(unpack, weights, bytes, mins)                                                         \
    for (int64_t blk = 0; blk < cols / (weights); blk++)                                                    \
        unpack(row + blk * (bytes), buf->q + blk * (weights), buf->scale + blk * ((weights) / GROUP) * HALVES, \
               buf->min + blk * ((weights) / GROUP) * MIN_SLOTS(mins));                                      \
    break;
#define UNPACK_CASE(name, number, weights, bytes, form, unpack, mins, ...) \
    UNPACK_##form(number, weights, bytes, unpack, mins)
#define UNPACK_FLOAT(...) /* above */
#define UNPACK_CODES(number, weights, bytes, unpack, mins) \
    case number: UNPACK_BLOCKS(unpack, weights, bytes, mins)
#define UNPACK_INT16 UNPACK_CODES
#define UNPACK_OWN8 UNPACK_CODES
#define UNPACK_TILED UNPACK_CODES
    switch (type) {
        QUANT_TYPES(UNPACK_CASE)
    }
#undef UNPACK_CASE
#undef UNPACK_FLOAT
#undef UNPACK_CODES
#undef UNPACK_INT16
#undef UNPACK_OWN8
#undef UNPACK_TILED
#undef UNPACK_BLOCKS
}

/* RowBuffer.min entries per group of a type (MIN_SLOTS of its row's mins). */
static inline int type_min_slots(int type) {
#define MINS_CASE(name, number, weights, bytes, form, unpack, mins, ...) \
    case number: return MIN_SLOTS(mins);
    switch (type) {
        QUANT_TYPES(MINS_CASE)
    default: return 1;
    }
#undef MINS_CASE
}

void dequantize_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf, float *out) {
    if (iq_dequantize_row(type, row, cols, out)) return; /* this tier's own (iq_dots.c) */
    unpack_row(type, row, cols, buf);
    if (type_is_float(type)) {
        memcpy(out, buf->f, 4 * (size_t)cols);
        return;
    }
    int slots = type_min_slots(type); /* 1: a min per group; 2: one per half */
    for (int64_t g = 0; g < cols / GROUP; g++)
        for (int e = 0; e < GROUP; e += 8) { /* 8 weights: s * q + m */
            float s = buf->scale[g * HALVES + e / 16], m = buf->min[g * slots + (slots - 1) * (e / 16)];
            v8f w = widen8(buf->q + g * GROUP + e) * s + m;
            memcpy(out + g * GROUP + e, &w, sizeof w);
        }
}

void quantize_row(const float *x, int64_t K, int span, int16_t *q, float *d, float *xsum, float *xhalf) {
    for (int64_t s = 0; s < K / span; s++) {
        const float *xs = x + s * span;
        float amax = abs_max(xs, span);
        const int64_t g0 = s * (span / GROUP);
        if (!(amax <= 3.4e38f)) { /* inf or nan: the result must not look finite */
            memset(q + s * span, 0, (size_t)span * sizeof *q);
            d[s] = NAN;
            for (int64_t g = g0; g < g0 + span / GROUP; g++) xsum[g] = xhalf[HALVES * g] = xhalf[HALVES * g + 1] = NAN;
            continue;
        }
        float scale = amax / 32767.0f, inverse = amax > 0.0f ? 32767.0f / amax : 0.0f;
        for (int64_t g = g0; g < g0 + span / GROUP; g++) {
            int32_t sum[HALVES] = {0, 0};
            for (int i = 0; i < GROUP; i += 8) { /* 8 at a time: nearbyintf(x * inverse) each */
                v8f v;
                memcpy(&v, x + g * GROUP + i, sizeof v);
                v8i codes = round8(v * inverse);
                i16x8 narrow = __builtin_convertvector(codes, i16x8);
                memcpy(q + g * GROUP + i, &narrow, sizeof narrow);
                sum[i / 16] += ((codes[0] + codes[1]) + (codes[2] + codes[3])) + ((codes[4] + codes[5]) + (codes[6] + codes[7]));
            }
            xsum[g] = scale * (float)(sum[0] + sum[1]); /* exact integer sums: as one sum's bits */
            xhalf[HALVES * g] = scale * (float)sum[0];
            xhalf[HALVES * g + 1] = scale * (float)sum[1];
        }
        d[s] = scale;
    }
}

/* 8-bit codes of the blocks of BLOCK8 values of x (Codes8): per group of 32, d = amax / 127 and
 * q = x / d rounded to nearest (ties to even; a division rather than a product with 1 / d,
 * which overflows for the smallest d), and the codes' sums per 16. A group with an inf or nan
 * gets d = nan and zero codes, so that its products are nan. */
void quantize_row8(const float *x, int64_t K, Codes8 *out) {
    for (int64_t b = 0; b < codes8_blocks(K); b++, out++) {
        memset(out->q, 0, sizeof out->q);
        memset(out->sums, 0, sizeof out->sums);
        for (int g = 0; g < BLOCK8 / GROUP; g++) {
            const float *xg = x + b * BLOCK8 + g * GROUP;
            float amax = abs_max(xg, GROUP);
            float d = amax <= 3.4e38f ? amax / 127.0f : NAN;
            out->d[g] = d;
            if (!(d > 0.0f)) continue; /* zeros, values too small for a finite x / d, or inf and nan: codes 0 */
            for (int i = 0; i < GROUP; i += 8) { /* 8 at a time: nearbyintf(x / d) each, |x / d| <= 127 (rounded) */
                typedef int8_t i8x8 __attribute__((vector_size(8)));
                v8f v;
                memcpy(&v, xg + i, sizeof v);
                const v8i codes = round8(v / splat8(d));
                const i8x8 narrow = __builtin_convertvector(codes, i8x8);
                memcpy(out->q + g * GROUP + i, &narrow, sizeof narrow);
                out->sums[(g * GROUP + i) / 16] += (int16_t)(((codes[0] + codes[1]) + (codes[2] + codes[3])) +
                                                             ((codes[4] + codes[5]) + (codes[6] + codes[7])));
            }
        }
    }
}

/* One group's contribution to a row's 8 float lanes: both halves summed in int32 first (exact;
 * the CODES types have one scale per group). */
static inline INLINED v8f group_term(const int8_t *w, const int16_t *x, const float *scale, float xd) {
    return __builtin_convertvector(dot32_sum(w, x), v8f) * (scale[0] * xd);
}

/* (The avx512_ymm build, SPRIG_YMM, takes a group at a time as AVX2 does: where a core runs a
 * 512-bit operation as two halves, the pairs' permutes cost more than they save.) */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && !defined(SPRIG_YMM)
#define PAIR_WEIGHTS 64 /* weights that chunk_terms takes at a time: a pair of groups */

/* Two groups' terms for N tokens (AVX-512), group_term's arithmetic for each, the weights from
 * int8 codes q (two groups: q[0..63]): the first halves of both groups' weights in one register
 * of 32 int16 and their second halves in another, each token's codes permuted to match, so that
 * two dpwssd give both groups' lanes (lo + hi, exactly); then the float products of both groups
 * at once, and acc += group g's term, then group g + 1's, as in the loop over groups. */
static inline INLINED void pair_terms(const int8_t *q, const int16_t *xq, int64_t K, const float *scale,
                                      const float *xd, int64_t G, const int N, v8f *acc) {
    const __m512i w_lo = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)q)), _mm_loadu_si128((const __m128i *)(q + 32)), 1));
    const __m512i w_hi = _mm512_cvtepi8_epi16(_mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(q + 16))), _mm_loadu_si128((const __m128i *)(q + 48)), 1));
    const __m512i lo_words = _mm512_setr_epi64(0, 1, 2, 3, 8, 9, 10, 11), hi_words = _mm512_setr_epi64(4, 5, 6, 7, 12, 13, 14, 15);
    const __m512i first = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1); /* [v0 x 8 | v1 x 8] */
    const __m512 scales = _mm512_castps128_ps512(_mm_loadu_ps(scale)); /* g's twice, then g + 1's twice */
    const __m512 s = _mm512_permutexvar_ps(_mm512_add_epi32(first, first), scales);
    for (int k = 0; k < N; k++) {
        const __m512i x1 = _mm512_loadu_si512((const void *)(xq + k * K)), x2 = _mm512_loadu_si512((const void *)(xq + k * K + GROUP));
        const __m512i x_lo = _mm512_permutex2var_epi64(x1, lo_words, x2), x_hi = _mm512_permutex2var_epi64(x1, hi_words, x2);
        const __m512 xs = _mm512_permutexvar_ps(first, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd((const double *)(xd + k * G)))));
        const __m512i sums = _mm512_dpwssd_epi32(_mm512_madd_epi16(w_lo, x_lo), w_hi, x_hi);
        const __m512 term = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(s, xs));
        acc[k] += (v8f)_mm512_castps512_ps256(term);
        acc[k] += (v8f)_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(term), 1));
    }
}
#else
#define PAIR_WEIGHTS GROUP
#endif

/* `groups` groups' terms for N tokens into acc: token k's codes of the first at xq + k * K,
 * its scale at xd[k * G]; the weights' codes at q, their scales at scale (HALVES a group). */
static inline INLINED void chunk_terms(int groups, const int8_t *q, const int16_t *xq, int64_t K, const float *scale,
                                       const float *xd, int64_t G, const int N, v8f *acc) {
    int g = 0;
#if PAIR_WEIGHTS > GROUP
    for (; g + 1 < groups; g += 2) pair_terms(q + g * GROUP, xq + g * GROUP, K, scale + g * HALVES, xd + g, G, N, acc);
#endif
    for (; g < groups; g++)
        _Pragma("GCC unroll 4") for (int k = 0; k < N; k++) acc[k] +=
            group_term(q + g * GROUP, xq + k * K + g * GROUP, scale + g * HALVES, xd[k * G + g]);
}

/* Whether a value of each check format (QUANT_TYPES) at `p` is inf or nan. */
static inline int bad_FP16(const uint8_t *p) { return ((u16(p) >> 10) & 31) == 31; }
static inline int bad_BF16(const uint8_t *p) { return ((u16(p) >> 7) & 0xff) == 0xff; }
static inline int bad_F32(const uint8_t *p) { return ((u32(p) >> 23) & 0xff) == 0xff; }
static inline int bad_NONE(const uint8_t *p) { return p == NULL; } /* every value finite (MXFP4) */
static inline int bad_IQ1M(const uint8_t *p) { return ((iq1m_d(p) >> 10) & 31) == 31; } /* IQ1_M's d */

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

/* N tokens' products with one packed row, each block unpacked once into registers and the
 * stack for all of them (decode, speculative verification, batched decoding: each row is
 * read once). Token k's codes are at xq + k * K, its group scales and sums at xd, xs + k * G.
 * Each token's arithmetic is the same, in the same order, whatever N and the tokens beside
 * it: a group's int32 sums, then acc += sums * (wscale * xscale) in 8 lanes, reduce8, and
 * the min terms. `mins` is scratch for the row's min terms. `type` is a constant
 * (each type has its function, below). */
static inline __attribute__((always_inline)) void row_tokens(int type, const uint8_t *row, int64_t K,
                                                             const int16_t *xq, const float *xd, const float *xs,
                                                             const float *xh, float *mins, const int N, float *out,
                                                             int64_t stride) {
    v8f acc[ROW_TOKENS] = {{0}};
    int64_t G = K / GROUP;
    int with_mins = 0;
    float no_mins[8]; /* the zero min terms of types without any: stores the compiler drops */
#define DOT_BLOCKS(unpack, weights, bytes, has_min)                                                     \
    {                                                                                                   \
        /* blocks unpacked at a time: enough for PAIR_WEIGHTS (two 32-weight blocks on AVX-512) */    \
        enum { PER = (weights) >= PAIR_WEIGHTS ? 1 : PAIR_WEIGHTS / (weights), GROUPS = (weights) / GROUP };  \
        const size_t ahead = prefetch_ahead((size_t)(K / (weights) * (bytes)));                         \
        int64_t blk = 0;                                                                                \
        _Pragma("GCC unroll 2") for (; blk + PER <= K / (weights); blk += PER) {                        \
            int8_t q[PER * (weights)];                                                                  \
            float scale[PER * GROUPS * HALVES];                                                         \
            int64_t g0 = blk * GROUPS;                                                                  \
            for (int p = 0; p < PER; p++) prefetch_block(row + (blk + p) * (bytes), bytes, ahead);      \
            for (int p = 0; p < PER; p++)                                                               \
                unpack(row + (blk + p) * (bytes), q + p * (weights), scale + p * GROUPS * HALVES,      \
                       (has_min) ? mins + (g0 + p * GROUPS) * (has_min) : no_mins);                     \
            chunk_terms(PER * GROUPS, q, xq + g0 * GROUP, K, scale, xd + g0, G, N, acc);               \
        }                                                                                               \
        if (PER > 1 && blk < K / (weights)) { /* the last block alone, where the count is odd */       \
            int8_t q[weights];                                                                          \
            float scale[GROUPS * HALVES];                                                               \
            int64_t g0 = blk * GROUPS;                                                                  \
            unpack(row + blk * (bytes), q, scale, (has_min) ? mins + g0 * (has_min) : no_mins);         \
            chunk_terms(GROUPS, q, xq + g0 * GROUP, K, scale, xd + g0, G, N, acc);                     \
        }                                                                                               \
    }                                                                                                   \
    with_mins = (has_min);                                                                              \
    break;
#define DOT_CASE(name, number, weights, bytes, form, unpack, has_min, ...) \
    DOT_##form(number, unpack, weights, bytes, has_min)
#define DOT_FLOAT(...) /* float rows: dot_tokens */
#define DOT_CODES(number, unpack, weights, bytes, has_min) \
    case number: DOT_BLOCKS(unpack, weights, bytes, has_min)
#define DOT_INT16(...) /* Q4_K, Q5_K, Q6_K: int16_panels.c */
#define DOT_OWN8(...)  /* Q2_K, Q3_K, the IQ types but IQ4_NL: codes8_dots.c */
#define DOT_TILED(...) /* Q1_0: q1_tiles.c */
    switch (type) {
        QUANT_TYPES(DOT_CASE)
    }
#undef DOT_CASE
#undef DOT_FLOAT
#undef DOT_CODES
#undef DOT_INT16
#undef DOT_OWN8
#undef DOT_TILED
#undef DOT_BLOCKS
    for (int k = 0; k < N; k++) {
        float total = reduce8(acc[k]);
        out[k * stride] = with_mins == 2 ? total + dot_float(mins, xh + k * HALVES * G, HALVES * G) /* per half */
                          : with_mins    ? total + dot_float(mins, xs + k * G, G)
                                         : total;
    }
}

/* One function per CODES type (dot_Q4_0, ...): GCC's inlining
 * limits apply per function, so the code of one type's products never depends on how many
 * other types there are (in one function for all types, new rows pushed older types'
 * unpacking out of line, and group_term was called out of line in the scalar and NEON tiers). */
#define DOT_FUNCTION(name, number, weights, bytes, form, ...) DOT_FUNCTION_##form(name, number)
#define DOT_FUNCTION_FLOAT(...)
#define DOT_FUNCTION_TILED(...)
#define DOT_FUNCTION_INT16(...) /* int16_panels.c */
#define DOT_FUNCTION_OWN8(...) /* codes8_dots.c */
#define DOT_FUNCTION_CODES(name, number)                                                                              \
    static __attribute__((noinline)) void dot_##name(const uint8_t *row, int64_t K, const int16_t *xq,              \
                                                     const float *xd, const float *xs, const float *xh, float *mins,  \
                                                     int n, float *out, int64_t stride) {                             \
        switch (n) { /* one body per count, so that the loop over tokens unrolls and shares each unpacked block */ \
        case 1: row_tokens(number, row, K, xq, xd, xs, xh, mins, 1, out, stride); break;                      \
        case 2: row_tokens(number, row, K, xq, xd, xs, xh, mins, 2, out, stride); break;                      \
        case 3: row_tokens(number, row, K, xq, xd, xs, xh, mins, 3, out, stride); break;                      \
        default: row_tokens(number, row, K, xq, xd, xs, xh, mins, ROW_TOKENS, out, stride); break;            \
        }                                                                                                             \
    }
QUANT_TYPES(DOT_FUNCTION)
#undef DOT_FUNCTION_CODES
#undef DOT_FUNCTION_INT16
#undef DOT_FUNCTION_OWN8
#undef DOT_FUNCTION_TILED
#undef DOT_FUNCTION_FLOAT
#undef DOT_FUNCTION

void dot_row_tokens(int type, const uint8_t *row, int64_t K, const int16_t *xq, const float *xd, const float *xs,
                    const float *xh, const Codes8 *x8, float *mins, int n, float *out, int64_t stride) {
    if (iq_dot_row_tokens(type, row, K, xq, xd, n, out, stride)) return; /* this tier's own (iq_dots.c) */
#define CALL_CASE(name, number, weights, bytes, form, ...) CALL_##form(name, number)
#define CALL_FLOAT(...)
#define CALL_TILED(...)
#define CALL_CODES(name, number) \
    case number: dot_##name(row, K, xq, xd, xs, xh, mins, n, out, stride); break;
#define CALL_INT16(...)
#define CALL_OWN8(name, number) \
    case number: dot_##name(row, K, x8, n, out, stride); break;
    switch (type) {
        QUANT_TYPES(CALL_CASE)
    }
#undef CALL_CASE
#undef CALL_FLOAT
#undef CALL_TILED
#undef CALL_CODES
#undef CALL_INT16
#undef CALL_OWN8
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

/* (The avx512_ymm build takes AVX2's form, 8 lanes a register, 32 of them: on Zen 4, 64 tokens,
 * Q8_0, Q4_0 and MXFP4 1.25x the pairs.) */
#if defined(__AVX512F__) && !defined(SPRIG_YMM)
#define FLOAT_PAIRS 2 /* pairs of tokens register-blocked with FLOAT_ROWS rows (AVX-512) */
/* float_kernel for the 2P tokens t .. t + 2P - 1 in 512-bit registers: one register holds a
 * row's 8 lanes for two tokens (lanes 0-7 token t + 2p, lanes 8-15 token t + 2p + 1), each lane
 * the same fused multiply-adds in the same order, so the same bits. */
static inline __attribute__((always_inline)) void float_kernel_pairs(const float *w, int64_t K, const int R,
                                                                     const int P, const float *x, int64_t t,
                                                                     float *out, int64_t stride) {
    __m512 acc[FLOAT_ROWS][FLOAT_PAIRS];
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int64_t i = 0; i < K; i += 8) {
        __m512d xv[FLOAT_PAIRS];
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const float *a = x + (t + 2 * p) * K + i;
            xv[p] = _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_loadu_pd((const double *)a)),
                                       _mm256_loadu_pd((const double *)(a + K)), 1);
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 wv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double *)(w + r * K + i))));
#pragma GCC unroll 4
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(wv, _mm512_castpd_ps(xv[p]), acc[r][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) {
            v8f lo, hi;
            memcpy(&lo, &acc[r][p], sizeof lo);
            memcpy(&hi, (const float *)&acc[r][p] + 8, sizeof hi);
            out[(t + 2 * p) * stride + r] = reduce8(lo);
            out[(t + 2 * p + 1) * stride + r] = reduce8(hi);
        }
}
#endif

static inline __attribute__((always_inline)) void float_rows(const float *w, int64_t K, const int R, const float *x,
                                                             int64_t t0, int64_t t1, float *out, int64_t stride) {
    int64_t t = t0;
#if defined(FLOAT_PAIRS)
    for (; t + 2 * FLOAT_PAIRS <= t1; t += 2 * FLOAT_PAIRS) float_kernel_pairs(w, K, R, FLOAT_PAIRS, x, t, out, stride);
    for (; t + 2 <= t1; t += 2) float_kernel_pairs(w, K, R, 1, x, t, out, stride);
#else
    for (; t + FLOAT_BLOCK <= t1; t += FLOAT_BLOCK) float_kernel(w, K, R, FLOAT_BLOCK, x, t, out, stride);
#endif
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

/* GGUF block formats unpacked into int8 codes and lane scales, activation quantization,
 * and the row dot products. Bit layouts follow ggml-quants.c / gguf-py's quants.py. */
#include <math.h>
#include <string.h>

#include "kernels.h"
#include "simd.h"

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
static inline float f16(const uint8_t *p) { return fp16_to_float(u16(p)); }
static inline uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

int type_block(int type, int *weights, int *bytes) {
    switch (type) {
    case T_F32: *weights = 1; *bytes = 4; return 1;
    case T_F16: *weights = 1; *bytes = 2; return 1;
    case T_BF16: *weights = 1; *bytes = 2; return 1;
    case T_Q4_0: *weights = 32; *bytes = 18; return 1;
    case T_Q4_1: *weights = 32; *bytes = 20; return 1;
    case T_Q5_0: *weights = 32; *bytes = 22; return 1;
    case T_Q5_1: *weights = 32; *bytes = 24; return 1;
    case T_Q8_0: *weights = 32; *bytes = 34; return 1;
    case T_Q1_0: *weights = 128; *bytes = 18; return 1;
    case T_Q4_K: *weights = 256; *bytes = 144; return 1;
    case T_Q5_K: *weights = 256; *bytes = 176; return 1;
    case T_Q6_K: *weights = 256; *bytes = 210; return 1;
    default: return 0;
    }
}

int type_is_float(int type) { return type == T_F32 || type == T_F16 || type == T_BF16; }
int type_has_min(int type) { return type == T_Q4_1 || type == T_Q5_1 || type == T_Q4_K || type == T_Q5_K; }

/* lanes 0-3 scale bytes 0-15 of a group, lanes 4-7 bytes 16-31 */
static inline void set_scales(float *scale, float lo, float hi) {
    for (int l = 0; l < 4; l++) {
        scale[l] = lo;
        scale[l + 4] = hi;
    }
}

/* Q4_0, 32 weights in 18 bytes:  | d: fp16 | qs: 16 bytes |
 * weight j < 16 is (low nibble of qs[j]) - 8, weight j + 16 is (high nibble of qs[j]) - 8; times d. */
static void unpack_q4_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 15) - 8);
        q[j + 16] = (int8_t)((qs[j] >> 4) - 8);
    }
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q4_1, 32 weights in 20 bytes:  | d: fp16 | m: fp16 | qs: 16 bytes |   weight = d * nibble + m */
static void unpack_q4_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(qs[j] & 15);
        q[j + 16] = (int8_t)(qs[j] >> 4);
    }
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q5_0, 32 weights in 22 bytes:  | d: fp16 | qh: 32 bits | qs: 16 bytes |
 * weight j = ((nibble j) | (bit j of qh) << 4) - 16, times d (nibbles as in Q4_0). */
static void unpack_q5_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    uint32_t qh = u32(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - 16);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
    }
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q5_1, 32 weights in 24 bytes:  | d: fp16 | m: fp16 | qh: 32 bits | qs: 16 bytes |   d * q5 + m */
static void unpack_q5_1(const uint8_t *b, int8_t *q, float *scale, float *min) {
    uint32_t qh = u32(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)((qs[j] & 15) | (((qh >> j) & 1) << 4));
        q[j + 16] = (int8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = f16(b + 2);
}

/* Q8_0, 32 weights in 34 bytes:  | d: fp16 | qs: 32 int8 | */
static void unpack_q8_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    memcpy(q, b + 2, 32);
    float d = f16(b);
    set_scales(scale, d, d);
    min[0] = 0.0f;
}

/* Q1_0 (PrismML Bonsai), 128 weights in 18 bytes:  | d: fp16 | 16 bytes of bits, LSB first |
 * weight j is +d if bit j is set, else -d. */
static void unpack_q1_0(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *bits = b + 2;
    for (int j = 0; j < 128; j++) q[j] = (int8_t)((((bits[j >> 3] >> (j & 7)) & 1) << 1) - 1);
    float d = f16(b);
    for (int g = 0; g < 4; g++) {
        set_scales(scale + 8 * g, d, d);
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

/* Q4_K, 256 weights in 144 bytes:  | d: fp16 | dmin: fp16 | scales: 12 bytes | qs: 128 bytes |
 * 8 sub-blocks of 32, each with a 6-bit scale and min. Each 32 bytes of qs hold two
 * sub-blocks: low nibbles the first, high nibbles the second. weight = d*sc*q - dmin*m. */
static void unpack_q4_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *s = b + 4, *qs = b + 16;
    for (int i = 0; i < 4; i++) {
        for (int l = 0; l < 32; l++) {
            q[64 * i + l] = (int8_t)(qs[32 * i + l] & 15);
            q[64 * i + 32 + l] = (int8_t)(qs[32 * i + l] >> 4);
        }
    }
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, s, &sc, &m);
        float ds = d * (float)sc;
        set_scales(scale + 8 * j, ds, ds);
        min[j] = -(dmin * (float)m);
    }
}

/* Q5_K, 256 weights in 176 bytes:  | d | dmin | scales: 12 | qh: 32 | qs: 128 |
 * as Q4_K, plus a fifth bit: bit (2i) of qh[l] for weight 64i + l, bit (2i+1) for 64i + 32 + l. */
static void unpack_q5_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    float d = f16(b), dmin = f16(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *qs = b + 48;
    for (int i = 0; i < 4; i++) {
        for (int l = 0; l < 32; l++) {
            q[64 * i + l] = (int8_t)((qs[32 * i + l] & 15) | (((qh[l] >> (2 * i)) & 1) << 4));
            q[64 * i + 32 + l] = (int8_t)((qs[32 * i + l] >> 4) | (((qh[l] >> (2 * i + 1)) & 1) << 4));
        }
    }
    for (int j = 0; j < 8; j++) {
        int sc, m;
        scale_min_k4(j, s, &sc, &m);
        float ds = d * (float)sc;
        set_scales(scale + 8 * j, ds, ds);
        min[j] = -(dmin * (float)m);
    }
}

/* Q6_K, 256 weights in 210 bytes:  | ql: 128 | qh: 64 | scales: 16 int8 | d: fp16 |
 * Two halves of 128; in half n, for l < 32 (ql, qh advanced by 64n and 32n):
 *   w[l]      = (ql[l] & 15      | (qh[l] >> 0 & 3) << 4) - 32
 *   w[l + 32] = (ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4) - 32
 *   w[l + 64] = (ql[l] >> 4      | (qh[l] >> 4 & 3) << 4) - 32
 *   w[l + 96] = (ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4) - 32
 * and weight e is scaled by d * scales[e / 16]. */
static void unpack_q6_k(const uint8_t *b, int8_t *q, float *scale, float *min) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = f16(b + 208);
    for (int n = 0; n < 2; n++) {
        const uint8_t *l4 = ql + 64 * n, *h2 = qh + 32 * n;
        int8_t *y = q + 128 * n;
        for (int l = 0; l < 32; l++) {
            y[l] = (int8_t)(((l4[l] & 15) | (((h2[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = (int8_t)(((l4[l + 32] & 15) | (((h2[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = (int8_t)(((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = (int8_t)(((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4)) - 32);
        }
    }
    for (int g = 0; g < 8; g++) {
        set_scales(scale + 8 * g, d * (float)sc[2 * g], d * (float)sc[2 * g + 1]);
        min[g] = 0.0f;
    }
}

typedef void (*unpack_fn)(const uint8_t *, int8_t *, float *, float *);

static unpack_fn unpacker(int type) {
    switch (type) {
    case T_Q4_0: return unpack_q4_0;
    case T_Q4_1: return unpack_q4_1;
    case T_Q5_0: return unpack_q5_0;
    case T_Q5_1: return unpack_q5_1;
    case T_Q8_0: return unpack_q8_0;
    case T_Q1_0: return unpack_q1_0;
    case T_Q4_K: return unpack_q4_k;
    case T_Q5_K: return unpack_q5_k;
    case T_Q6_K: return unpack_q6_k;
    default: return NULL;
    }
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
        for (int64_t i = 0; i < cols; i++) {
            uint16_t h = u16(row + 2 * i);
            buf->f[i] = type == T_F16 ? fp16_to_float(h) : bf16_to_float(h);
        }
        return;
    }
    int weights, bytes;
    type_block(type, &weights, &bytes);
    unpack_fn unpack = unpacker(type);
    int groups = weights / GROUP;
    for (int64_t blk = 0; blk < cols / weights; blk++)
        unpack(row + blk * bytes, buf->q + blk * weights, buf->scale + blk * groups * LANES, buf->min + blk * groups);
}

void dequantize_row(int type, const uint8_t *row, int64_t cols, RowBuffer *buf, float *out) {
    unpack_row(type, row, cols, buf);
    if (type_is_float(type)) {
        memcpy(out, buf->f, 4 * (size_t)cols);
        return;
    }
    for (int64_t i = 0; i < cols; i++) {
        int64_t g = i / GROUP;
        float s = buf->scale[g * LANES + (i % GROUP) / 4];
        out[i] = s * (float)buf->q[i] + buf->min[g];
    }
}

void quantize_row(const float *x, int64_t K, int8_t *q, float *d, float *xsum) {
    for (int64_t g = 0; g < K / GROUP; g++) {
        const float *xg = x + g * GROUP;
        float amax = 0.0f;
        for (int i = 0; i < GROUP; i++) {
            float a = fabsf(xg[i]);
            amax = a > amax ? a : amax;
        }
        if (!(amax <= 3.4e38f)) { /* inf or nan: the result must not look finite */
            memset(q + g * GROUP, 0, GROUP);
            d[g] = NAN;
            xsum[g] = NAN;
            continue;
        }
        float scale = amax / 127.0f, inverse = amax > 0.0f ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < GROUP; i++) {
            int32_t v = (int32_t)nearbyintf(xg[i] * inverse);
            q[g * GROUP + i] = (int8_t)v;
            sum += v;
        }
        d[g] = scale;
        xsum[g] = scale * (float)sum;
    }
}

static inline float reduce8(v8f a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

float dot_quant(const RowBuffer *w, int has_min, const int8_t *xq, const float *xd, const float *xs, int64_t K) {
    v8f acc = {0};
    int64_t groups = K / GROUP;
    for (int64_t g = 0; g < groups; g++) {
        v8i p = dot32(w->q + g * GROUP, xq + g * GROUP);
        v8f s;
        memcpy(&s, w->scale + g * LANES, sizeof s);
        s = s * xd[g];
        acc += __builtin_convertvector(p, v8f) * s;
    }
    float total = reduce8(acc);
    if (has_min) {
        float m = 0.0f;
        for (int64_t g = 0; g < groups; g++) m += w->min[g] * xs[g];
        total += m;
    }
    return total;
}

float dot_float(const float *w, const float *x, int64_t K) {
    v8f acc = {0};
    int64_t i = 0;
    for (; i + LANES <= K; i += LANES) {
        v8f a, b;
        memcpy(&a, w + i, sizeof a);
        memcpy(&b, x + i, sizeof b);
        acc += a * b;
    }
    for (int l = 0; i + l < K; l++) acc[l] += w[i + l] * x[i + l];
    return reduce8(acc);
}

/* Blocks whose fp16 scale (or min) is inf or nan; for float types, elements that are. */
int64_t count_bad_scales(int type, const uint8_t *data, int64_t n_blocks) {
    int64_t bad = 0;
    for (int64_t i = 0; i < n_blocks; i++) {
        const uint8_t *b = data;
        int w, size;
        type_block(type, &w, &size);
        b += i * size;
        switch (type) {
        case T_F32: {
            uint32_t bits = u32(b);
            bad += ((bits >> 23) & 0xff) == 0xff;
            break;
        }
        case T_BF16: bad += ((u16(b) >> 7) & 0xff) == 0xff; break;
        case T_Q6_K: bad += ((u16(b + 208) >> 10) & 31) == 31; break;
        case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K:
            bad += (((u16(b) >> 10) & 31) == 31) || (((u16(b + 2) >> 10) & 31) == 31);
            break;
        default: bad += ((u16(b) >> 10) & 31) == 31; break; /* F16 and the d-first formats */
        }
    }
    return bad;
}

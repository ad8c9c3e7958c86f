/* Little-endian values read from GGUF block bytes (any alignment, any host byte order), for
 * the kernels that unpack blocks (quants.c, iq_dots.c, codes8_dots.c, int16_panels.c). */
#ifndef SPRIG_BYTES_H
#define SPRIG_BYTES_H

#include <stdint.h>

#include "kernels.h" /* fp16_to_float */
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline uint16_t u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint64_t u64(const uint8_t *p) { return (uint64_t)u32(p) | (uint64_t)u32(p + 4) << 32; }
/* Q3_K's 6-bit scale of sub-block k (k < 16) from its 12 scale bytes, minus 32: low 4 bits from
 * sc[k % 8] (its high nibble for k >= 8), high 2 bits from sc[8 + k % 4] >> 2 (k / 4). */
static inline int q3_k_scale(const uint8_t *sc, int k) {
    return (((sc[k % 8] >> (4 * (k / 8))) & 15) | (((sc[8 + k % 4] >> (2 * (k / 4))) & 3) << 4)) - 32;
}
/* IQ4_XS's 6-bit scale of sub-block k (k < 8) of block b, minus 32: low 4 bits from
 * scales_l[k / 2] (b[4 + k / 2], its high nibble for odd k), high 2 bits from scales_h (the
 * 16-bit word at b + 2) >> 2k. */
static inline int iq4_xs_scale(const uint8_t *b, int k) {
    return (((b[4 + k / 2] >> (4 * (k % 2))) & 15) | (((u16(b + 2) >> (2 * k)) & 3) << 4)) - 32;
}
/* IQ1_M's fp16 super-block scale: the top 4 bits of its 4 16-bit scale words at sc, low word first. */
static inline uint16_t iq1m_d(const uint8_t *sc) {
    return (uint16_t)((u16(sc) >> 12) | ((u16(sc + 2) >> 8) & 0x00f0) | ((u16(sc + 4) >> 4) & 0x0f00) |
                      (u16(sc + 6) & 0xf000));
}
/* Q4_K's and Q5_K's 6-bit sub-block scales and mins from their 12 bytes at b + 4, one byte each:
 * sc[k] is byte k of *sc, m[k] byte k of *m (k < 8). Scales and mins 0-3 are the low 6 bits of
 * bytes 0-3 and 4-7; 4-7 take their low 4 bits from bytes 8-11 (low and high nibbles) and
 * their top 2 from the top 2 bits of bytes 0-3 and 4-7. */
static inline void k_scale_bytes(const uint8_t *b, uint64_t *sc, uint64_t *m) {
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
    const uint32_t a = u32(b + 4), c = u32(b + 8), e = u32(b + 12);
    *sc = (a & low6) | (uint64_t)((e & low4) | (((a >> 6) & low2) << 4)) << 32;
    *m = (c & low6) | (uint64_t)(((e >> 4) & low4) | (((c >> 6) & low2) << 4)) << 32;
}
#if defined(__F16C__)
static inline float f16(const uint8_t *p) { return _cvtsh_ss(u16(p)); } /* exact, as fp16_to_float */
#else
static inline float f16(const uint8_t *p) { return fp16_to_float(u16(p)); }
#endif

/* The float D of a block of the types with integer sub-block scales: weight = D * sc * code
 * (codes8_dots.c's module comment; Q4_K, Q5_K: d * sc * code - dmin * m; Q6_K: d * sc * (q - 32)). */
static inline float block_scale(int type, const uint8_t *b) {
    switch (type) {
    case T_Q2_K: return f16(b + 80);
    case T_Q3_K: return f16(b + 108);
    case T_Q6_K: return f16(b + 208);
    case T_Q4_K: case T_Q5_K: case T_IQ4_XS: case T_IQ3_S: return f16(b);
    case T_IQ3_XXS: return f16(b) * 0.25f;
    case T_IQ1_M: return fp16_to_float(iq1m_d(b + 48)) * 0.125f;
    default: return f16(b) * 0.125f; /* IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S */
    }
}

#endif

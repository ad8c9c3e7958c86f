/* What the table-lookup kernels share (q1_tiles.c for Q1_0, tq_tiles.c for TQ1_0/TQ2_0):
 * where a tile's rows lie in a 32-byte step, and how a token's group of 32 activations
 * becomes integer codes for the tables. */
#ifndef SPRIG_TILES_H
#define SPRIG_TILES_H

#include <math.h>

#include "kernels.h"
#include "simd.h" /* abs_max */

/* The AVX2 kernels' lookups come out as int16 pairs, unpacked low/high within 128-bit
 * halves and then split into even and odd int32 lanes: result vector k, lane l belongs to
 * byte position (l < 4 ? 0 : 16) + (k >= 2 ? 8 : 0) + 2 (l mod 4) + (k mod 2). Placing row
 * 8k + l there makes the four result vectors rows 0-7, 8-15, 16-23, 24-31. */
static inline void tile_lanes(int lane_row[Q1_TILE], int row_lane[Q1_TILE]) {
    for (int k = 0; k < 4; k++)
        for (int l = 0; l < 8; l++) {
            int p = (l < 4 ? 0 : 16) + (k >= 2 ? 8 : 0) + 2 * (l % 4) + (k % 2);
            lane_row[p] = 8 * k + l;
            row_lane[8 * k + l] = p;
        }
}

/* A group of GROUP activations' scale for codes up to code_max: *xscale = amax / code_max,
 * and the factor that makes the codes. 0 where the group holds an inf or a nan: then the
 * scale is nan (the result must not look finite) and the caller zeroes the group's tables. */
static inline int group_codes(const float *xg, float code_max, float *inverse, float *xscale) {
    float amax = abs_max(xg, GROUP);
    if (!(amax <= 3.4e38f)) {
        *xscale = NAN;
        return 0;
    }
    *inverse = amax > 0.0f ? code_max / amax : 0.0f;
    *xscale = amax / code_max;
    return 1;
}

/* Table entry n of an int16 sum, split into a table of low bytes and one of high bytes. */
static inline void table_entry(uint8_t *low, uint8_t *high, int n, int32_t sum) {
    low[n] = (uint8_t)(sum & 0xff);
    high[n] = (uint8_t)((uint16_t)(int16_t)sum >> 8);
}

/* Entry `index` of such a split table, as the int16 it holds. */
static inline int32_t table_lookup(const uint8_t *low, const uint8_t *high, int index) {
    return (int16_t)(uint16_t)(low[index] | high[index] << 8);
}

#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>

/* The NEON kernels' step (16 rows per 128-bit half): the 32 bytes at `step`, their low nibbles
 * looked up in the split table (tl0, th0), their high nibbles in (tl1, th1), the int16 sums
 * added to sum16[i], byte positions 8i .. 8i + 7. */
static inline void neon_step(const uint8_t *step, uint8x16_t tl0, uint8x16_t th0, uint8x16_t tl1, uint8x16_t th1,
                             int16x8_t sum16[4]) {
    const uint8x16_t low4 = vdupq_n_u8(0x0f);
    for (int half = 0; half < 2; half++) {
        uint8x16_t w = vld1q_u8(step + 16 * half);
        uint8x16_t n0 = vandq_u8(w, low4), n1 = vshrq_n_u8(w, 4);
        uint8x16_t l0 = vqtbl1q_u8(tl0, n0), h0 = vqtbl1q_u8(th0, n0);
        uint8x16_t l1 = vqtbl1q_u8(tl1, n1), h1 = vqtbl1q_u8(th1, n1);
        int16x8_t a = vaddq_s16(vreinterpretq_s16_u8(vzip1q_u8(l0, h0)), vreinterpretq_s16_u8(vzip1q_u8(l1, h1)));
        int16x8_t c = vaddq_s16(vreinterpretq_s16_u8(vzip2q_u8(l0, h0)), vreinterpretq_s16_u8(vzip2q_u8(l1, h1)));
        sum16[2 * half] = vaddq_s16(sum16[2 * half], a);
        sum16[2 * half + 1] = vaddq_s16(sum16[2 * half + 1], c);
    }
}

/* sum16 (neon_step's) widened into isum[k], int32 for byte positions 4k .. 4k + 3. */
static inline void neon_widen(const int16x8_t sum16[4], int32x4_t isum[8]) {
    for (int i = 0; i < 4; i++) {
        isum[2 * i] = vaddw_s16(isum[2 * i], vget_low_s16(sum16[i]));
        isum[2 * i + 1] = vaddw_high_s16(isum[2 * i + 1], sum16[i]);
    }
}

/* A block's 32 fp16 row scales (row order, at `block`) as floats in byte position order. */
static inline void neon_scales(const uint8_t *block, const int *lane_row, float *d) {
    for (int p = 0; p < Q1_TILE; p++) d[p] = fp16_to_float((uint16_t)(block[2 * lane_row[p]] | block[2 * lane_row[p] + 1] << 8));
}

/* The accumulators of byte positions 4k .. 4k + 3 into out[row]. */
static inline void neon_store(const float32x4_t acc[8], const int *lane_row, float *out) {
    float by_position[Q1_TILE];
    for (int k = 0; k < 8; k++) vst1q_f32(by_position + 4 * k, acc[k]);
    for (int p = 0; p < Q1_TILE; p++) out[lane_row[p]] = by_position[p];
}

/* A group's sums into the accumulators of byte positions 4k .. 4k + 3:
 * acc += (float)isum * (d * xscale), d the rows' scales in byte position order. */
static inline void neon_accumulate(float32x4_t acc[8], const int32x4_t isum[8], const float *d, float xscale) {
    float32x4_t xs = vdupq_n_f32(xscale);
    for (int k = 0; k < 8; k++) acc[k] = vaddq_f32(acc[k], vmulq_f32(vcvtq_f32_s32(isum[k]), vmulq_f32(vld1q_f32(d + 4 * k), xs)));
}
#endif

#endif

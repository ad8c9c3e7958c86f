/* What the table-lookup kernels share (q1_tiles.c for Q1_0, tq_tiles.c for TQ1_0/TQ2_0):
 * where a tile's rows lie in a 32-byte step, and how a token's group of 32 activations
 * becomes integer codes for the tables. */
#ifndef SPRIG_TILES_H
#define SPRIG_TILES_H

#include <math.h>

#include "kernels.h"

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
    float amax = 0.0f;
    for (int i = 0; i < GROUP; i++) {
        float a = fabsf(xg[i]);
        amax = a > amax ? a : amax;
    }
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

#endif

/* Prefill products in 8-bit codes (panels.h's bytes form): the types on 8-bit activation codes
 * (form OWN8 in kernels.h: Q2_K, Q3_K and the IQ types but IQ4_NL), 32 tokens or more.
 *
 * Each of these types' blocks of 256 weights is, per sub-block of 16 (a half group), a float
 * scale S = D * sc times 8-bit codes c, |c| <= 127, plus Q2_K's min terms, as decode's
 * unpacking gives them (codes8_block in codes8_dots.c). A token's codes are
 * decode's (quantize_row8: per group of 32 a scale d = amax / 127, codes q = x / d rounded,
 * |q| <= 127, as llama.cpp's Q8_0), its scales written once per sub-block (d of lane l is its
 * group's). A scale per 256 (llama.cpp's Q8_K) cost SmolLM2 and Gemma-3 re-quantized into
 * Q3_K and IQ4_XS 1.1-1.5% in perplexity against float activations; per 32, the re-quantized
 * perplexity tests hold. For a row and a token, block by block, in 16 int32 lanes, lane l
 * taking sub-block l:
 *     isum[l] = sum of c q over its 16 weights         (|isum| <= 16 * 127 * 127: exact)
 *     y[l] = fma(float(isum[l]), S[l] * d[l], y[l])     (S * d rounded once; y from 0)
 * then the min terms and the reduction as int16_panels.c's. Only the integer lanes come from
 * tier code, and they are exact, so every tier gives the same bits.
 * The codes lie in lanes: weight k = 16 l + 4 v + i of a block (sub-block l, i < 4) at byte
 * 64 v + 4 l + i, both the rows' and the tokens', so that 64 bytes v of a row and of a token
 * are, dword l, 4 products of sub-block l. AVX-512 VNNI's dpbusd multiplies unsigned bytes by
 * signed ones, 64 at a time into 16 int32 lanes: the tokens' codes are kept plus 128, and each
 * sub-block's sums start from the row's offset, -128 times the sum of its codes (made on this
 * tier only). AVX2 takes the codes' magnitudes (maddubs) times the tokens' codes with the
 * codes' signs, in pair sums of at most 2 * 127 * 127 (no saturation), then madd; the
 * portable form sums in C. */
#include <string.h>

#include "panels.h"

/* Where weight k (< WIDE) of a block lies in the lanes (module comment). */
static inline int lane_byte(int k) { return 64 * ((k % 16) / 4) + 4 * (k / 16) + k % 4; }

void quantize_row_bytes(const float *x, int64_t K, uint8_t *u, float *d, float *xsum, float *xhalf) {
    for (int64_t b = 0; b < K / WIDE; b++) {
        Codes8 codes; /* decode's codes (quantize_row8), so a token's codes do not depend on the product */
        quantize_row8(x + b * WIDE, WIDE, &codes);
        for (int k = 0; k < WIDE; k++) u[b * WIDE + lane_byte(k)] = (uint8_t)(codes.q[k] + 128);
        for (int h = 0; h < WIDE / 16; h++) { /* exact integer sums times the scale, as quantize_row's */
            d[b * (WIDE / 16) + h] = codes.d[h / 2];
            xhalf[b * (WIDE / 16) + h] = codes.d[h / 2] * (float)codes.sums[h];
        }
        for (int g = 0; g < WIDE / GROUP; g++)
            xsum[b * (WIDE / GROUP) + g] = codes.d[g] * (float)(codes.sums[2 * g] + codes.sums[2 * g + 1]);
    }
}

typedef uint32_t u32x16 __attribute__((vector_size(64)));

/* A block's 256 codes, in order, into the lanes: 4 bytes at a time, a transpose of 16 sub-blocks
 * by 4 dwords into 4 vectors v of 16 dwords (dword l of vector v: sub-block l's dword v). */
static inline void block_lanes(const int8_t *c, int8_t *lanes) {
    const u32x16 even = {0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29};
    const u32x16 odd = even + 2, low = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, high = low + 8;
    u32x16 in[4];
    memcpy(in, c, sizeof in);                                  /* in[j]: sub-blocks 4j .. 4j + 3 */
    const u32x16 p0 = __builtin_shuffle(in[0], in[1], even), p1 = __builtin_shuffle(in[0], in[1], odd);
    const u32x16 q0 = __builtin_shuffle(in[2], in[3], even), q1 = __builtin_shuffle(in[2], in[3], odd);
    const u32x16 out[4] = {__builtin_shuffle(p0, q0, low), __builtin_shuffle(p0, q0, high), __builtin_shuffle(p1, q1, low),
                           __builtin_shuffle(p1, q1, high)}; /* p0: dwords 0 of sub-blocks 0-7 | dwords 1; q0: of 8-15 */
    memcpy(lanes, out, sizeof out);
}

void byte_panel_row(int type, const uint8_t *row, int64_t K, int8_t *w, float *scale, int32_t *offset, float *mins) {
    const int slots = MIN_SLOTS(type_mins(type)) * (BLOCK8 / GROUP); /* min factors per block */
    for (int64_t b = 0; b < K / WIDE; b++) {
        int8_t codes[WIDE];
        float block_mins[WIDE / 16];
        codes8_block(type, row + b * type_bytes(type), codes, scale + 16 * b, block_mins);
        memcpy(mins + slots * b, block_mins, sizeof(float) * (size_t)slots);
        block_lanes(codes, w + b * WIDE);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) /* the offsets, for the tile below: each lane's 16 codes summed */
        __m512i sums = _mm512_setzero_si512();
        for (int v = 0; v < 4; v++)
            sums = _mm512_dpbusd_epi32(sums, _mm512_set1_epi8(1), _mm512_loadu_si512((const void *)(w + b * WIDE + 64 * v)));
        _mm512_storeu_si512((void *)(offset + 16 * b), _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sums, 7)));
#endif
    }
#if !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
    (void)offset; /* the portable and AVX2 tiles sum the codes as they are */
#endif
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

/* R rows (codes w, scales S and offsets C per 16) by N tokens (codes u, scales xd per 16), rows
 * and tokens of K, over blocks b0 .. b1 - 1: the module comment's lanes, y[i * TILE_TOKENS + k]
 * carried in and out, in one register per (row, token) between. */
static inline __attribute__((always_inline)) void tile(const int8_t *w, const float *S, const int32_t *C, const uint8_t *u,
                                                       const float *xd, int64_t K, int64_t b0, int64_t b1, const int R,
                                                       const int N, v8f y[][2]) {
    const int64_t L = K / 16;
    __m512 acc[TILE_ROWS][TILE_TOKENS];
    for (int i = 0; i < R; i++)
        for (int k = 0; k < N; k++) memcpy(&acc[i][k], y[i * TILE_TOKENS + k], sizeof acc[i][k]);
    for (int64_t b = b0; b < b1; b++) {
        __m512i sums[TILE_ROWS][TILE_TOKENS];
        for (int i = 0; i < R; i++) {
            const __m512i start = _mm512_loadu_si512((const void *)(C + i * L + 16 * b));
            for (int k = 0; k < N; k++) sums[i][k] = start;
        }
        for (int v = 0; v < 4; v++) {
            __m512i xv[TILE_TOKENS];
            for (int k = 0; k < N; k++) xv[k] = _mm512_loadu_si512((const void *)(u + k * K + b * WIDE + 64 * v));
            for (int i = 0; i < R; i++) {
                const __m512i wv = _mm512_loadu_si512((const void *)(w + i * K + b * WIDE + 64 * v));
                for (int k = 0; k < N; k++) sums[i][k] = _mm512_dpbusd_epi32(sums[i][k], xv[k], wv);
            }
        }
        for (int i = 0; i < R; i++) {
            const __m512 s = _mm512_loadu_ps(S + i * L + 16 * b);
            for (int k = 0; k < N; k++)
                acc[i][k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[i][k]), _mm512_mul_ps(s, _mm512_loadu_ps(xd + k * L + 16 * b)),
                                            acc[i][k]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int k = 0; k < N; k++) memcpy(y[i * TILE_TOKENS + k], &acc[i][k], sizeof acc[i][k]);
}

#else

/* isum of the module comment for 32 bytes of a row and a token (8 lanes of one half of v) */
static inline v8i lane_sums32(const int8_t *w, const uint8_t *u) {
#if defined(__AVX2__)
    const __m256i c = _mm256_loadu_si256((const __m256i *)w);
    const __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)u), _mm256_set1_epi8((char)0x80));
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(c), _mm256_sign_epi8(q, c));
    return (v8i)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#else
    v8i s;
    for (int l = 0; l < 8; l++)
        s[l] = w[4 * l] * (u[4 * l] - 128) + w[4 * l + 1] * (u[4 * l + 1] - 128) + w[4 * l + 2] * (u[4 * l + 2] - 128) +
               w[4 * l + 3] * (u[4 * l + 3] - 128);
    return s;
#endif
}

/* The AVX-512 tile's arithmetic, 8 lanes at a time (C unused: the codes are summed as they are). */
static inline __attribute__((always_inline)) void tile(const int8_t *w, const float *S, const int32_t *C, const uint8_t *u,
                                                       const float *xd, int64_t K, int64_t b0, int64_t b1, const int R,
                                                       const int N, v8f y[][2]) {
    const int64_t L = K / 16;
    (void)C;
    for (int64_t b = b0; b < b1; b++) {
        v8i sums[TILE_ROWS][TILE_TOKENS][2] = {{{{0}}}};
        for (int v = 0; v < 4; v++)
            for (int h = 0; h < 2; h++)
                for (int i = 0; i < R; i++)
                    for (int k = 0; k < N; k++)
                        sums[i][k][h] += lane_sums32(w + i * K + b * WIDE + 64 * v + 32 * h, u + k * K + b * WIDE + 64 * v + 32 * h);
        for (int i = 0; i < R; i++)
            for (int h = 0; h < 2; h++) {
                v8f s, dk;
                memcpy(&s, S + i * L + 16 * b + 8 * h, sizeof s);
                for (int k = 0; k < N; k++) {
                    memcpy(&dk, xd + k * L + 16 * b + 8 * h, sizeof dk);
                    const v8f sd = s * dk;
                    y[i * TILE_TOKENS + k][h] = fma8(__builtin_convertvector(sums[i][k][h], v8f), sd, y[i * TILE_TOKENS + k][h]);
                }
            }
    }
}

#endif

/* panels.h's PanelTile: one body per shape, so that its loops unroll */
__attribute__((noinline)) void byte_tile(const Panel *p, int64_t r, int R, const PanelCodes *x, int64_t t, int N,
                                         int64_t b0, int64_t b1, v8f y[][2]) {
    const int64_t K = p->K, L = K / 16;
    const int8_t *w = (const int8_t *)p->w + r * K;
    const float *S = p->scale + r * L, *xd = x->d + t * L;
    const int32_t *C = p->offset + r * L;
    const uint8_t *u = (const uint8_t *)x->q + t * K;
    if (R == 1) tile(w, S, C, u, xd, K, b0, b1, 1, 1, y);
    else if (N == TILE_TOKENS) tile(w, S, C, u, xd, K, b0, b1, TILE_ROWS, TILE_TOKENS, y);
    else if (N == 1) tile(w, S, C, u, xd, K, b0, b1, TILE_ROWS, 1, y);
    else if (N == 2 || TILE_TOKENS <= 3) tile(w, S, C, u, xd, K, b0, b1, TILE_ROWS, 2, y); /* (tiles of 3: 2 left) */
    else tile(w, S, C, u, xd, K, b0, b1, TILE_ROWS, 3, y);                                  /* (tiles of 4: 3 left) */
}

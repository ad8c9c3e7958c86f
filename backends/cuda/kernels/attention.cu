// Attention over a float16 KV cache (backends/base.py's `attention` and `attention_batch`).
//
// A layer's cache: keys (Hkv, slots, Dh) and values (Hkv, slots, Dv), float16, position p at
// slot p, or at slot p % slots when the layer keeps a ring (`ring` set). Queries are float32
// (t, H, Dh), outputs float32 (t, H * Dv). Query head h reads KV head h / (H / Hkv). Positions
// are read from device memory (int32, one per query row), never passed as launch values, so
// a recorded decode step replays at whatever position the host wrote there.
//
// Masks, as the NumPy reference has them: causal queries see keys up to their own position;
// non-causal ones every key up to the pass's last position; a window keeps keys less than
// `window` before the query (and, non-causal, less than `window` after it). Scores are
// scale * q.k, then softcap * tanh(score / softcap) when softcap > 0; a head's sink joins
// the softmax's denominator as one more logit without a value.
//
// Rows of keys and values are read as 16-byte chunks (eight halves), so Dh and Dv are
// multiples of 8 (the launchers check).

#include <cuda_fp16.h>

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // -infinity (NVRTC has no INFINITY)
#define CHUNK 8        // halves in one 16-byte load
#define LANE_CHUNKS 2  // chunks of a row one lane holds at most (decode)

#define DECODE_WARPS 4
#define DECODE_THREADS (DECODE_WARPS * 32)
#define DECODE_MAX_D 512  // CHUNK * LANE_CHUNKS * 32

#define PREFILL_WARPS 4
#define PREFILL_THREADS (PREFILL_WARPS * 32)
#define PREFILL_ROWS 4                              // query rows per warp
#define PREFILL_BQ (PREFILL_WARPS * PREFILL_ROWS)  // query rows per block
#define PREFILL_BK 32                               // keys per tile: one per lane
#define PREFILL_MAX_D 256

#define WRITE_THREADS 128

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, offset));
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// exp(a - b), 0 when a is -inf (an empty softmax so far: nothing to rescale).
__device__ __forceinline__ float rescale(float a, float b) { return a == NEG_INF ? 0.0f : expf(a - b); }

__device__ __forceinline__ float2 half2_bits_to_float2(unsigned int bits) {
    __half2 h;
    *(unsigned int*)&h = bits;
    return __half22float2(h);
}

// Eight halves (one 16-byte chunk, as four 32-bit words) to floats.
__device__ __forceinline__ void chunk_to_floats(uint4 raw, float f[CHUNK]) {
    const unsigned int words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 v = half2_bits_to_float2(words[k]);
        f[2 * k] = v.x;
        f[2 * k + 1] = v.y;
    }
}

__device__ __forceinline__ float capped(float score, float softcap) {
    return softcap > 0.0f ? softcap * tanhf(score / softcap) : score;
}

// capped(), given inv_softcap = 1 / softcap (correctly rounded): score / softcap by the
// reciprocal and one remainder step (Markstein's), which rounds as the division does while
// the quotient is a normal float. Unlike `/` it has no slow-path subroutine call, whose
// calling convention made ptxas spill the decode loop's registers.
__device__ __forceinline__ float capped_by_inverse(float score, float softcap, float inv_softcap) {
    if (softcap <= 0.0f) return score;
    const float q = score * inv_softcap;
    return softcap * tanhf(fmaf(fmaf(-q, softcap, score), inv_softcap, q));
}

// -- writing new keys and values ---------------------------------------------------------
// k (t, Hkv, Dh), v (t, Hkv, Dv) float32 -> the cache's rows at each token's slot, rounded to
// float16 (nearest even). Thread map: block (token, KV head); its threads walk the key row,
// then the value row, consecutive threads on consecutive features.
extern "C" __global__ void __launch_bounds__(WRITE_THREADS)
    write_kv(const float* k, const float* v, int kv_heads, int head_dim, int value_dim, __half* keys,
             __half* values, int slots, int ring, const int* positions) {
    const int token = blockIdx.x, head = blockIdx.y;
    const int position = positions[token];
    const long long slot = ring ? position % slots : position;
    const float* k_row = k + ((long long)token * kv_heads + head) * head_dim;
    const float* v_row = v + ((long long)token * kv_heads + head) * value_dim;
    __half* key_row = keys + ((long long)head * slots + slot) * head_dim;
    __half* value_row = values + ((long long)head * slots + slot) * value_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) key_row[d] = __float2half_rn(k_row[d]);
    for (int d = threadIdx.x; d < value_dim; d += blockDim.x) value_row[d] = __float2half_rn(v_row[d]);
}

// -- one query per sequence (decoding), split among blocks ---------------------------------
// Thread map (flash decoding). Block (x, y, z) = (GQ query heads sharing one KV head, a split
// of the visible keys, sequence row z). Within a warp, a "key group" of `lanes_per_key` lanes
// (a power of two, 16 * lanes_per_key >= max(Dh, Dv)) reads one key row and its value row,
// lane l of the group chunks l, l + lanes_per_key (16 bytes each: the group's loads of a row
// are contiguous); the warp's 32 / lanes_per_key groups take consecutive keys, the block's
// warps the next ones, so a block iteration reads one contiguous run of rows, and the next
// iteration's rows are already loading while this one's are used. Each group keeps its own
// online softmax (max, sum, weighted values) for the GQ heads, whose queries (pre-scaled) sit
// in shared memory, so one read of a key serves all GQ heads. At the end the groups of a warp
// merge through shuffles, the warps through shared memory. With one split the block writes
// the normalised output (sinks included). With several, each block writes its partial max,
// sum and unnormalised values, and the last block of the (row, heads) to finish, counted in
// `counters` (zero before the launch, and left zero after it), merges them: one launch.
//
// A sequence's cache is `keys`, `values`, `slots`, or row z of `table` (keys pointer, values
// pointer, slots: three 64-bit words a row) when table is not null.
template <int GQ>
__device__ __forceinline__ void decode_split(const float* q, int heads, int kv_heads, int head_dim, int value_dim,
                                             const long long* table, const __half* keys0, const __half* values0,
                                             int slots0, int ring, const int* positions, float scale, int window,
                                             float softcap, const float* sinks, int lanes_per_key, float* out,
                                             float* partial_values, float* partial_stats, int* counters) {
    __shared__ float4 queries[GQ][DECODE_MAX_D / 4];
    __shared__ float merged_values[DECODE_WARPS][GQ][DECODE_MAX_D];
    __shared__ float merged_max[DECODE_WARPS][GQ];
    __shared__ float merged_sum[DECODE_WARPS][GQ];
    __shared__ int last_block;

    const int row = blockIdx.z, split = blockIdx.y, splits = gridDim.y;
    const int head0 = blockIdx.x * GQ;
    const int kv_head = head0 / (heads / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int group = lane / lanes_per_key, in_group = lane % lanes_per_key;
    const int groups = 32 / lanes_per_key;
    const int key_chunks = head_dim / CHUNK, value_chunks = value_dim / CHUNK;

    const __half* keys = keys0;
    const __half* values = values0;
    long long slots = slots0;
    if (table) {
        keys = (const __half*)table[3 * row];
        values = (const __half*)table[3 * row + 1];
        slots = table[3 * row + 2];
    }
    keys += (long long)kv_head * slots * head_dim;
    values += (long long)kv_head * slots * value_dim;
    // a 32-bit modulus for the ring (a 64-bit one is a subroutine call in the loop): keys are
    // below 2^31 - 1, so key % ring_slots is key % slots even for a table's larger slot counts
    const unsigned int ring_slots = (unsigned int)min(slots, 0x7fffffffLL);
    // 1 / softcap as `/` rounds it for a normal softcap (an approximation and one Newton step),
    // without `/`'s slow-path call, around which ptxas spilled
    const float rough = softcap > 0.0f ? __fdividef(1.0f, softcap) : 0.0f;
    const float inv_softcap = fmaf(rough, fmaf(-softcap, rough, 1.0f), rough);

    // this split's positions: the visible ones, first .. position, cut in equal runs
    const int position = positions[row];
    const int first = window > 0 ? max(0, position - window + 1) : 0;
    const int step = DECODE_WARPS * groups;  // keys per block iteration
    int per_split = (position + 1 - first + splits - 1) / splits;
    per_split = (per_split + step - 1) / step * step;
    const int lo = first + split * per_split;
    const int hi = min(lo + per_split, position + 1);

    // zeros past head_dim: a lane's chunks past the key row (zeros too) add 0 to its scores, so the
    // loop needs no per-chunk test there (fewer live predicates and registers)
    float* query_floats = (float*)queries;
    for (int i = threadIdx.x; i < GQ * DECODE_MAX_D; i += DECODE_THREADS) {
        const int h = i / DECODE_MAX_D, d = i % DECODE_MAX_D;
        query_floats[i] = d < head_dim ? q[((long long)row * heads + head0 + h) * head_dim + d] * scale : 0.0f;
    }
    __syncthreads();

    float run_max[GQ], run_sum[GQ], acc[GQ][LANE_CHUNKS][CHUNK];
#pragma unroll
    for (int h = 0; h < GQ; ++h) {
        run_max[h] = NEG_INF;
        run_sum[h] = 0.0f;
#pragma unroll
        for (int m = 0; m < LANE_CHUNKS; ++m)
#pragma unroll
            for (int e = 0; e < CHUNK; ++e) acc[h][m][e] = 0.0f;
    }

    // the key or value rows of the key a lane's group takes at `base`, zeros past the split's end
    auto load = [&](const __half* rows, int row_dim, int chunks, int base, uint4 raw[LANE_CHUNKS]) {
        const int key = base + warp * groups + group;
        const long long slot = ring ? (unsigned int)key % ring_slots : key;
#pragma unroll
        for (int m = 0; m < LANE_CHUNKS; ++m) {
            const int c = in_group + m * lanes_per_key;
            raw[m] = make_uint4(0, 0, 0, 0);
            if (key < hi && c < chunks) raw[m] = *(const uint4*)(rows + slot * row_dim + c * CHUNK);
        }
    };
    uint4 next_keys[LANE_CHUNKS], next_values[LANE_CHUNKS];
    load(keys, head_dim, key_chunks, lo, next_keys);
    load(values, value_dim, value_chunks, lo, next_values);
    for (int base = lo; base < hi; base += step) {  // the same trip count in every thread: shuffles stay whole
        uint4 key_raw[LANE_CHUNKS], value_raw[LANE_CHUNKS];
#pragma unroll
        for (int m = 0; m < LANE_CHUNKS; ++m) {
            key_raw[m] = next_keys[m];
            value_raw[m] = next_values[m];
        }
        load(keys, head_dim, key_chunks, base + step, next_keys);
        load(values, value_dim, value_chunks, base + step, next_values);
        const bool valid = base + warp * groups + group < hi;
        float score[GQ];
#pragma unroll
        for (int h = 0; h < GQ; ++h) score[h] = 0.0f;
#pragma unroll
        for (int m = 0; m < LANE_CHUNKS; ++m) {
            const int c = in_group + m * lanes_per_key;
            float kf[CHUNK];
            chunk_to_floats(key_raw[m], kf);
#pragma unroll
            for (int h = 0; h < GQ; ++h) {
                const float4 qa = queries[h][2 * c], qb = queries[h][2 * c + 1];
                score[h] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3];
                score[h] += qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
            }
        }
        for (int offset = lanes_per_key / 2; offset > 0; offset >>= 1)
#pragma unroll
            for (int h = 0; h < GQ; ++h) score[h] += __shfl_xor_sync(FULL_MASK, score[h], offset);
        if (valid) {
            // the heads' weights first, then each value chunk converted once and used by all heads:
            // 8 floats live at a time, not 16 (the same arithmetic per element as before)
            float keep[GQ], p[GQ];
#pragma unroll
            for (int h = 0; h < GQ; ++h) {
                const float s = capped_by_inverse(score[h], softcap, inv_softcap);
                const float new_max = fmaxf(run_max[h], s);
                keep[h] = rescale(run_max[h], new_max);
                p[h] = expf(s - new_max);
                run_max[h] = new_max;
                run_sum[h] = run_sum[h] * keep[h] + p[h];
            }
#pragma unroll
            for (int m = 0; m < LANE_CHUNKS; ++m) {
                float vf[CHUNK];
                chunk_to_floats(value_raw[m], vf);
#pragma unroll
                for (int h = 0; h < GQ; ++h)
#pragma unroll
                    for (int e = 0; e < CHUNK; ++e) acc[h][m][e] = acc[h][m][e] * keep[h] + p[h] * vf[e];
            }
        }
    }

    // merge the key groups of the warp (lanes in_group of every group hold the same chunks)
    for (int offset = lanes_per_key; offset < 32; offset <<= 1) {
#pragma unroll
        for (int h = 0; h < GQ; ++h) {
            const float other_max = __shfl_xor_sync(FULL_MASK, run_max[h], offset);
            const float other_sum = __shfl_xor_sync(FULL_MASK, run_sum[h], offset);
            const float new_max = fmaxf(run_max[h], other_max);
            const float mine = rescale(run_max[h], new_max), theirs = rescale(other_max, new_max);
            run_max[h] = new_max;
            run_sum[h] = run_sum[h] * mine + other_sum * theirs;
#pragma unroll
            for (int m = 0; m < LANE_CHUNKS; ++m)
#pragma unroll
                for (int e = 0; e < CHUNK; ++e)
                    acc[h][m][e] = acc[h][m][e] * mine + __shfl_xor_sync(FULL_MASK, acc[h][m][e], offset) * theirs;
        }
    }
    if (group == 0) {
#pragma unroll
        for (int h = 0; h < GQ; ++h) {
#pragma unroll
            for (int m = 0; m < LANE_CHUNKS; ++m) {
                const int c = in_group + m * lanes_per_key;
                if (c < value_chunks)
#pragma unroll
                    for (int e = 0; e < CHUNK; ++e) merged_values[warp][h][c * CHUNK + e] = acc[h][m][e];
            }
            if (in_group == 0) {
                merged_max[warp][h] = run_max[h];
                merged_sum[warp][h] = run_sum[h];
            }
        }
    }
    __syncthreads();

    // merge the warps: thread i takes output i, i + DECODE_THREADS, ... of the GQ heads' rows
    for (int i = threadIdx.x; i < GQ * value_dim; i += DECODE_THREADS) {
        const int h = i / value_dim, d = i % value_dim;
        float total_max = NEG_INF;
        for (int w = 0; w < DECODE_WARPS; ++w) total_max = fmaxf(total_max, merged_max[w][h]);
        float total_sum = 0.0f, total = 0.0f;
        for (int w = 0; w < DECODE_WARPS; ++w) {
            const float weight = rescale(merged_max[w][h], total_max);
            total_sum += merged_sum[w][h] * weight;
            total += merged_values[w][h][d] * weight;
        }
        const long long at = (long long)row * heads + head0 + h;  // (row, head)
        if (splits == 1) {
            if (sinks) {
                const float sink = sinks[head0 + h];
                const float with_sink = fmaxf(total_max, sink);
                const float weight = rescale(total_max, with_sink);
                total *= weight;
                total_sum = total_sum * weight + expf(sink - with_sink);
            }
            out[at * value_dim + d] = total / total_sum;
        } else {
            partial_values[(at * splits + split) * value_dim + d] = total;
            if (d == 0) {
                partial_stats[2 * (at * splits + split)] = total_max;
                partial_stats[2 * (at * splits + split) + 1] = total_sum;
            }
        }
    }
    if (splits == 1) return;  // the whole block

    // the last block of these heads to finish merges every split's partials
    __threadfence();  // this block's partials are visible before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        int* counter = counters + (long long)row * gridDim.x + blockIdx.x;
        last_block = atomicAdd(counter, 1) == splits - 1;
        if (last_block) *counter = 0;  // every split has counted: ready for the next launch
    }
    __syncthreads();
    if (!last_block) return;  // the whole block
    __threadfence();
    for (int i = threadIdx.x; i < GQ * value_dim; i += DECODE_THREADS) {
        const int h = i / value_dim, d = i % value_dim;
        const long long at = (long long)row * heads + head0 + h;
        const volatile float* stats = partial_stats + 2 * at * splits;  // written by other blocks: not from L1
        const volatile float* parts = partial_values + at * splits * value_dim + d;
        float total_max = sinks ? sinks[head0 + h] : NEG_INF;
        for (int s = 0; s < splits; ++s) total_max = fmaxf(total_max, stats[2 * s]);
        float total_sum = sinks ? expf(sinks[head0 + h] - total_max) : 0.0f, total = 0.0f;
        for (int s = 0; s < splits; ++s) {
            const float weight = rescale(stats[2 * s], total_max);
            total_sum += stats[2 * s + 1] * weight;
            total += parts[(long long)s * value_dim] * weight;
        }
        out[at * value_dim + d] = total / total_sum;
    }
}

#define DECODE_PARAMS                                                                                           \
    const float *q, int heads, int kv_heads, int head_dim, int value_dim, const long long *table,              \
        const __half *keys, const __half *values, int slots, int ring, const int *positions, float scale,      \
        int window, float softcap, const float *sinks, int lanes_per_key, float *out, float *partial_values,   \
        float *partial_stats, int *counters
#define DECODE_ARGS                                                                                             \
    q, heads, kv_heads, head_dim, value_dim, table, keys, values, slots, ring, positions, scale, window, softcap, \
        sinks, lanes_per_key, out, partial_values, partial_stats, counters

// One entry per number of query heads a block serves (1 to 4), each written out: the emulator's
// build finds kernels by their declarations. Each declares the blocks per SM it is built for:
// without that ptxas picks an occupancy itself, and for GQ 2 to 4 it picked register counts a
// few short of the loop's needs and spilled (differently on each architecture). With these,
// every architecture fits without spilling: GQ 1 in 128 registers (4 blocks), GQ 2 and 3 in 168
// (3 blocks), GQ 4, whose 64 accumulators a lane and the next rows in flight need about 200,
// in 2 blocks (as it already ran on sm_90; its 41 KB of shared memory allows 1 on sm_75).
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 4) decode_gq1(DECODE_PARAMS) { decode_split<1>(DECODE_ARGS); }
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 3) decode_gq2(DECODE_PARAMS) { decode_split<2>(DECODE_ARGS); }
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 3) decode_gq3(DECODE_PARAMS) { decode_split<3>(DECODE_ARGS); }
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 2) decode_gq4(DECODE_PARAMS) { decode_split<4>(DECODE_ARGS); }

// -- many queries (prefill), tiled ----------------------------------------------------------
// Thread map. Block (x, y) = (PREFILL_BQ consecutive queries, one query head). The block
// stages its queries (pre-scaled, float32) in shared memory, then walks the keys its queries
// can see in tiles of PREFILL_BK: all threads load a tile of keys (transposed, as half2
// pairs of features, so that lane j reading key j is free of bank conflicts) and of values
// (row-major) into shared memory. Warp w owns query rows 4w .. 4w + 3 of the block: lane j
// scores key j of the tile against its four rows; an online softmax per row (the max over the
// warp by shuffles, each lane's share of the sum kept apart until the end); then for each key
// of the tile the lanes take its weight by shuffle and accumulate their value features,
// lane l owning the half2 pairs l, l + 32, ... of the value row.
extern "C" __global__ void __launch_bounds__(PREFILL_THREADS)
    prefill(const float* q, int t, int heads, int kv_heads, int head_dim, int value_dim, const __half* keys,
            const __half* values, int slots, int ring, const int* positions, float scale, int window, float softcap,
            const float* sinks, int causal, float* out) {
    // declared as 16-byte vectors for their alignment, used as floats and half2 words
    __shared__ float4 q_vectors[PREFILL_BQ][PREFILL_MAX_D / 4];
    __shared__ unsigned int key_tile[PREFILL_MAX_D / 2][PREFILL_BK];  // half2 words, transposed
    __shared__ uint4 value_vectors[PREFILL_BK][PREFILL_MAX_D / 8];
    float(*q_tile)[PREFILL_MAX_D] = (float(*)[PREFILL_MAX_D])q_vectors;
    unsigned int(*value_tile)[PREFILL_MAX_D / 2] = (unsigned int(*)[PREFILL_MAX_D / 2])value_vectors;

    const int head = blockIdx.y, row0 = blockIdx.x * PREFILL_BQ;
    const int kv_head = head / (heads / kv_heads);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int key_chunks = head_dim / CHUNK, value_chunks = value_dim / CHUNK;
    const int key_pairs = head_dim / 2, value_pairs = value_dim / 2;
    keys += (long long)kv_head * slots * head_dim;
    values += (long long)kv_head * slots * value_dim;

    for (int i = threadIdx.x; i < PREFILL_BQ * head_dim; i += PREFILL_THREADS) {
        const int r = i / head_dim, d = i % head_dim;
        q_tile[r][d] = row0 + r < t ? q[((long long)(row0 + r) * heads + head) * head_dim + d] * scale : 0.0f;
    }

    // the keys the block's queries can see
    const int last_row = min(row0 + PREFILL_BQ, t) - 1;
    const int pass_last = positions[t - 1];
    const int first_query = positions[row0], last_query = positions[last_row];
    const int key_lo = window > 0 ? max(0, first_query - window + 1) : 0;
    int key_hi = causal ? last_query : pass_last;  // inclusive
    if (window > 0 && !causal) key_hi = min(key_hi, last_query + window - 1);

    int query_pos[PREFILL_ROWS];
#pragma unroll
    for (int r = 0; r < PREFILL_ROWS; ++r) query_pos[r] = positions[min(row0 + warp * PREFILL_ROWS + r, t - 1)];

    float run_max[PREFILL_ROWS], lane_sum[PREFILL_ROWS], acc[PREFILL_ROWS][PREFILL_MAX_D / 64][2];
#pragma unroll
    for (int r = 0; r < PREFILL_ROWS; ++r) {
        run_max[r] = NEG_INF;
        lane_sum[r] = 0.0f;
#pragma unroll
        for (int m = 0; m < PREFILL_MAX_D / 64; ++m) acc[r][m][0] = acc[r][m][1] = 0.0f;
    }

    for (int tile = key_lo; tile <= key_hi; tile += PREFILL_BK) {
        __syncthreads();  // the previous tile is used up (and, the first time, the queries are staged)
        for (int i = threadIdx.x; i < PREFILL_BK * key_chunks; i += PREFILL_THREADS) {
            const int j = i % PREFILL_BK, c = i / PREFILL_BK;  // consecutive threads: consecutive keys
            const int key = tile + j;
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (key <= key_hi)
                raw = *(const uint4*)(keys + (ring ? key % slots : key) * (long long)head_dim + c * CHUNK);
            key_tile[4 * c][j] = raw.x;
            key_tile[4 * c + 1][j] = raw.y;
            key_tile[4 * c + 2][j] = raw.z;
            key_tile[4 * c + 3][j] = raw.w;
        }
        for (int i = threadIdx.x; i < PREFILL_BK * value_chunks; i += PREFILL_THREADS) {
            const int j = i / value_chunks, c = i % value_chunks;  // consecutive threads: one value row
            const int key = tile + j;
            uint4 raw = make_uint4(0, 0, 0, 0);
            if (key <= key_hi)
                raw = *(const uint4*)(values + (ring ? key % slots : key) * (long long)value_dim + c * CHUNK);
            value_vectors[j][c] = raw;
        }
        __syncthreads();

        float score[PREFILL_ROWS] = {};
        for (int p = 0; p < key_pairs; p += 2) {
            const float2 k01 = half2_bits_to_float2(key_tile[p][lane]);
            const float2 k23 = half2_bits_to_float2(key_tile[p + 1][lane]);
#pragma unroll
            for (int r = 0; r < PREFILL_ROWS; ++r) {
                const float4 qv = q_vectors[warp * PREFILL_ROWS + r][p / 2];  // features 2p .. 2p + 3
                score[r] += qv.x * k01.x + qv.y * k01.y + qv.z * k23.x + qv.w * k23.y;
            }
        }
        const int key = tile + lane;
        float weight[PREFILL_ROWS];
#pragma unroll
        for (int r = 0; r < PREFILL_ROWS; ++r) {
            const int qp = query_pos[r];
            bool seen = key <= key_hi && (causal ? key <= qp : key <= pass_last);
            if (window > 0) seen = seen && key > qp - window && (causal || key < qp + window);
            const float s = seen ? capped(score[r], softcap) : NEG_INF;
            const float new_max = fmaxf(run_max[r], warp_max(s));
            const float keep = new_max == NEG_INF ? 1.0f : rescale(run_max[r], new_max);
            weight[r] = seen ? expf(s - new_max) : 0.0f;
            run_max[r] = new_max;
            lane_sum[r] = lane_sum[r] * keep + weight[r];
#pragma unroll
            for (int m = 0; m < PREFILL_MAX_D / 64; ++m) {
                acc[r][m][0] *= keep;
                acc[r][m][1] *= keep;
            }
        }
        for (int j = 0; j < PREFILL_BK; ++j) {
            float w[PREFILL_ROWS];
#pragma unroll
            for (int r = 0; r < PREFILL_ROWS; ++r) w[r] = __shfl_sync(FULL_MASK, weight[r], j);
#pragma unroll
            for (int m = 0; m < PREFILL_MAX_D / 64; ++m) {
                const int pair = lane + 32 * m;
                if (pair < value_pairs) {
                    const float2 v = half2_bits_to_float2(value_tile[j][pair]);
#pragma unroll
                    for (int r = 0; r < PREFILL_ROWS; ++r) {
                        acc[r][m][0] += w[r] * v.x;
                        acc[r][m][1] += w[r] * v.y;
                    }
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < PREFILL_ROWS; ++r) {
        const int query = row0 + warp * PREFILL_ROWS + r;
        float total_sum = warp_sum(lane_sum[r]);
        float weight = 1.0f;
        if (sinks) {
            const float with_sink = fmaxf(run_max[r], sinks[head]);
            weight = rescale(run_max[r], with_sink);
            total_sum = total_sum * weight + expf(sinks[head] - with_sink);
        }
        if (query < t) {
            float* out_row = out + ((long long)query * heads + head) * value_dim;
#pragma unroll
            for (int m = 0; m < PREFILL_MAX_D / 64; ++m) {
                const int pair = lane + 32 * m;
                if (pair < value_pairs) {
                    out_row[2 * pair] = acc[r][m][0] * weight / total_sum;
                    out_row[2 * pair + 1] = acc[r][m][1] * weight / total_sum;
                }
            }
        }
    }
}

// Picking the next token on the device: argmax, and sampling with temperature, top-k, top-p
// and min-p in the order and with the tie rules of engine/sampling.py.
//
// Sampling works on a total order of the tokens: larger logits first, equal logits by lower
// id, expressed as one 64-bit rank (the logit's order-preserving bits above the complement
// of the id). Every cut (top-k, top-p, the draw) is "the first token, in that order, at
// which a running sum of weights reaches a target", found by radix descent on the rank: a
// 256-bin histogram of weights per 8 bits, from the top byte down, the bin where the sum
// crosses picked by one warp's scan. Weights are fixed-point integers (weight * 2^40 for
// weights in (0, 1]), so sums are exact and independent of the order threads add them in:
// the same logits and uniform give the same token on any GPU. A set of tokens is "every
// rank at or above a cut" (optionally also with exp(logit - max) >= min_p).
//
// To keep the descents cheap the kernel first finds a logit threshold (max - 2^j) that keeps
// what top-k or top-p needs and at most SAMPLE_CAPACITY tokens, and copies those into shared
// memory; the descents then run there. When no threshold fits, they run over the whole
// vocabulary in global memory (slower, same result).

#define FULL_MASK 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)  // -infinity (NVRTC has no INFINITY)
#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_CAPACITY 4096
#define THRESHOLDS 8            // max - logit <= 2^(j - 1), j = 0 .. 7
#define FIXED_ONE 1099511627776.0f  // 2^40

#define WEIGHT_COUNT 0     // every token weighs 1 (top-k)
#define WEIGHT_MASS 1      // exp(logit - max): probabilities before temperature (top-p, min-p)
#define WEIGHT_TEMPERED 2  // exp((logit - max) / temperature): the draw

typedef unsigned long long u64;

// -- argmax ------------------------------------------------------------------------------
// Thread map: one block; thread i scans logits i, i + SAMPLE_THREADS, ... keeping its best
// (value, index), the lower index on ties; then warp shuffles and one shared row merge them.

__device__ __forceinline__ void keep_better(float& value, int& index, float other_value, int other_index) {
    if (other_value > value || (other_value == value && other_index < index)) {
        value = other_value;
        index = other_index;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) argmax(const float* logits, int vocab, int* out) {
    __shared__ float best_values[SAMPLE_WARPS];
    __shared__ int best_indices[SAMPLE_WARPS];
    float value = NEG_INF;
    int index = vocab;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) keep_better(value, index, logits[i], i);
    for (int offset = 16; offset > 0; offset >>= 1)
        keep_better(value, index, __shfl_xor_sync(FULL_MASK, value, offset), __shfl_xor_sync(FULL_MASK, index, offset));
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (lane == 0) {
        best_values[warp] = value;
        best_indices[warp] = index;
    }
    __syncthreads();
    if (warp == 0) {
        value = best_values[lane];
        index = best_indices[lane];
        for (int offset = 16; offset > 0; offset >>= 1)
            keep_better(value, index, __shfl_xor_sync(FULL_MASK, value, offset),
                        __shfl_xor_sync(FULL_MASK, index, offset));
        if (lane == 0) *out = index < vocab ? index : 0;  // all -inf (or NaN): token 0
    }
}

// -- sampling ---------------------------------------------------------------------------

// Tokens to choose from: logits[i] is token i, or (after the copy to shared memory) token ids[i].
struct Source {
    const float* logits;
    const int* ids;
    int n;
    __device__ __forceinline__ int id(int i) const { return ids ? ids[i] : i; }
};

// What a descent or a sum counts: the tokens of rank >= cut (and, when min_p > 0, of
// exp(logit - max) >= min_p), weighed by `weight`.
struct Selection {
    u64 cut;
    float min_p;
    int weight;
    int by_id;  // rank by id alone (vocabulary order) instead of by logit
};

struct SampleShared {
    u64 bin_weights[256];
    unsigned int bin_counts[256];
    u64 warp_totals[SAMPLE_WARPS];
    u64 total;
    u64 above;
    int bin;
};

__device__ __forceinline__ unsigned int order_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 rank_of(float logit, int id, int by_id) {
    const u64 low = (unsigned int)~id;  // lower ids rank higher
    return by_id ? low : ((u64)order_bits(logit) << 32) | low;
}

__device__ __forceinline__ u64 weight_of(int weight, float logit, float top, float temperature) {
    if (weight == WEIGHT_COUNT) return 1;
    const float w = weight == WEIGHT_MASS ? expf(logit - top) : expf((logit - top) / temperature);
    return (u64)(w * FIXED_ONE);
}

__device__ __forceinline__ bool selected(const Selection& s, u64 rank, float logit, float top) {
    return rank >= s.cut && (s.min_p <= 0.0f || expf(logit - top) >= s.min_p);
}

__device__ __forceinline__ u64 warp_sum64(u64 v) {
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(FULL_MASK, v, offset);
    return v;
}

// The sum of the selection's weights (every thread gets it).
__device__ u64 selection_total(const Source& src, const Selection& s, float top, float temperature,
                               SampleShared& sh) {
    u64 sum = 0;
    for (int i = threadIdx.x; i < src.n; i += SAMPLE_THREADS) {
        const float logit = src.logits[i];
        if (selected(s, rank_of(logit, src.id(i), s.by_id), logit, top))
            sum += weight_of(s.weight, logit, top, temperature);
    }
    sum = warp_sum64(sum);
    if ((threadIdx.x & 31) == 0) sh.warp_totals[threadIdx.x >> 5] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (int w = 0; w < SAMPLE_WARPS; ++w) total += sh.warp_totals[w];
        sh.total = total;
    }
    __syncthreads();
    const u64 total = sh.total;
    __syncthreads();  // sh.total may be reused
    return total;
}

// The rank of the first selected token, in rank order, at which the running sum of weights
// reaches `target` (strict: exceeds it); the last selected token when the sum never does.
__device__ u64 descend(const Source& src, const Selection& s, float top, float temperature, u64 target, bool strict,
                       SampleShared& sh) {
    u64 prefix = 0, above = 0;
    for (int level = s.by_id ? 4 : 0; level < 8; ++level) {
        const int shift = 56 - 8 * level;
        for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS) {
            sh.bin_weights[b] = 0;
            sh.bin_counts[b] = 0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < src.n; i += SAMPLE_THREADS) {
            const float logit = src.logits[i];
            const u64 rank = rank_of(logit, src.id(i), s.by_id);
            if (!selected(s, rank, logit, top) || (level > 0 && (rank >> (shift + 8)) != (prefix >> (shift + 8))))
                continue;
            const int bin = (int)((rank >> shift) & 255);
            const u64 w = weight_of(s.weight, logit, top, temperature);
            if (w) atomicAdd(&sh.bin_weights[bin], w);
            atomicAdd(&sh.bin_counts[bin], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32) {  // lane l scans bins 255 - 8l down to 248 - 8l
            const int lane = threadIdx.x;
            u64 lane_weight = 0;
            unsigned int lane_count = 0;
            for (int k = 0; k < 8; ++k) {
                lane_weight += sh.bin_weights[255 - 8 * lane - k];
                lane_count += sh.bin_counts[255 - 8 * lane - k];
            }
            u64 through = lane_weight;  // the bins of lanes 0 .. lane
            for (int offset = 1; offset < 32; offset <<= 1) {
                const u64 other = __shfl_up_sync(FULL_MASK, through, offset);
                if (lane >= offset) through += other;
            }
            const bool crosses = strict ? above + through > target : above + through >= target;
            const unsigned int crossing = __ballot_sync(FULL_MASK, crosses);
            const unsigned int present = __ballot_sync(FULL_MASK, lane_count > 0);
            const int chosen = crossing ? __ffs(crossing) - 1 : 31 - __clz(present);
            if (lane == chosen) {
                u64 sum = above + through - lane_weight;
                int bin = -1;
                u64 before = sum;
                for (int k = 0; k < 8; ++k) {
                    const int b = 255 - 8 * lane - k;
                    const u64 next = sum + sh.bin_weights[b];
                    if (crossing) {
                        if (strict ? next > target : next >= target) {
                            bin = b;
                            before = sum;
                            break;
                        }
                    } else if (sh.bin_counts[b]) {
                        bin = b;  // keep going: the lowest present bin
                        before = sum;
                    }
                    sum = next;
                }
                sh.bin = bin;
                sh.above = before;
            }
        }
        __syncthreads();
        prefix |= (u64)sh.bin << shift;
        above = sh.above;
        __syncthreads();  // sh.bin is read before the next level's scan writes it
    }
    return prefix;
}

__device__ __forceinline__ int token_of(u64 rank) { return (int)~(unsigned int)(rank & 0xffffffffu); }

// Thread map: one block of SAMPLE_THREADS; every step strides the tokens over all threads.
// Steps: the max logit; with neither top-k nor top-p, the draw in vocabulary order over the
// min-p survivors; otherwise the count and mass under each threshold, the copy of the
// chosen threshold's tokens to shared memory, then top-k (a count descent), top-p (a mass
// descent within the top-k pool, mass counted over the pool) and the draw (a tempered
// descent over the survivors, min-p applied): the token whose running sum first exceeds
// uniform * the survivors' total.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample(const float* logits, int vocab, float temperature, int top_k, float top_p, float min_p, float uniform,
           int* out) {
    __shared__ float candidate_logits[SAMPLE_CAPACITY];
    __shared__ int candidate_ids[SAMPLE_CAPACITY];
    __shared__ unsigned int threshold_counts[THRESHOLDS];
    __shared__ u64 threshold_mass[THRESHOLDS];
    __shared__ float top_shared[SAMPLE_WARPS];
    __shared__ int candidates;
    __shared__ u64 mass_total;
    __shared__ SampleShared sh;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

    float top = NEG_INF;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) top = fmaxf(top, logits[i]);
    for (int offset = 16; offset > 0; offset >>= 1) top = fmaxf(top, __shfl_xor_sync(FULL_MASK, top, offset));
    if (lane == 0) top_shared[warp] = top;
    if (threadIdx.x < THRESHOLDS) {
        threshold_counts[threadIdx.x] = 0;
        threshold_mass[threadIdx.x] = 0;
    }
    if (threadIdx.x == 0) {
        candidates = 0;
        mass_total = 0;
    }
    __syncthreads();
    top = top_shared[0];
    for (int w = 1; w < SAMPLE_WARPS; ++w) top = fmaxf(top, top_shared[w]);

    Source everything = {logits, 0, vocab};
    const bool pool_cut = top_k > 0 && top_k < vocab;
    const bool nucleus = top_p < 1.0f;
    if (!pool_cut && !nucleus) {
        const Selection survivors = {0, min_p, WEIGHT_TEMPERED, 1};
        const u64 total = selection_total(everything, survivors, top, temperature, sh);
        const u64 target = (u64)((double)uniform * (double)total);
        const u64 rank = descend(everything, survivors, top, temperature, target, true, sh);
        if (threadIdx.x == 0) *out = token_of(rank);
        return;
    }

    // how many tokens lie within 2^(j - 1) of the max, and (for top-p over every token) their mass
    unsigned int counts[THRESHOLDS] = {};
    u64 mass[THRESHOLDS] = {};
    u64 full_mass = 0;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const float logit = logits[i];
        const u64 w = pool_cut ? 0 : weight_of(WEIGHT_MASS, logit, top, temperature);
        full_mass += w;
#pragma unroll
        for (int j = 0; j < THRESHOLDS; ++j) {
            if (top - logit <= (float)(1 << j) * 0.5f) {
                counts[j] += 1;
                mass[j] += w;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < THRESHOLDS; ++j) {
        unsigned int c = counts[j];
        for (int offset = 16; offset > 0; offset >>= 1) c += __shfl_xor_sync(FULL_MASK, c, offset);
        const u64 m = warp_sum64(mass[j]);
        if (lane == 0) {
            atomicAdd(&threshold_counts[j], c);
            atomicAdd(&threshold_mass[j], m);
        }
    }
    full_mass = warp_sum64(full_mass);
    if (lane == 0) atomicAdd(&mass_total, full_mass);
    __syncthreads();
    const u64 z_all = mass_total;  // without top-k: the pool's mass
    const u64 nucleus_target = (u64)ceil((double)top_p * (double)z_all);
    int chosen = -1;  // the first threshold that keeps what is needed; -1: none fits in shared memory
    for (int j = 0; j < THRESHOLDS; ++j) {
        const bool enough = pool_cut ? threshold_counts[j] >= (unsigned int)top_k : threshold_mass[j] >= nucleus_target;
        if (enough) {
            chosen = threshold_counts[j] <= SAMPLE_CAPACITY ? j : -1;
            break;
        }
    }
    Source src = everything;
    if (chosen >= 0) {
        const float limit = (float)(1 << chosen) * 0.5f;
        for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
            const float logit = logits[i];
            if (top - logit <= limit) {
                const int at = atomicAdd(&candidates, 1);
                candidate_logits[at] = logit;
                candidate_ids[at] = i;
            }
        }
        __syncthreads();
        src = Source{candidate_logits, candidate_ids, candidates};
    }

    u64 pool = 0;  // every token
    u64 pool_mass = z_all;
    if (pool_cut) {
        pool = descend(src, Selection{0, 0.0f, WEIGHT_COUNT, 0}, top, temperature, (u64)top_k, false, sh);
        pool_mass = selection_total(src, Selection{pool, 0.0f, WEIGHT_MASS, 0}, top, temperature, sh);
    }
    u64 kept = pool;
    if (nucleus) {
        const u64 target = (u64)ceil((double)top_p * (double)pool_mass);
        kept = descend(src, Selection{pool, 0.0f, WEIGHT_MASS, 0}, top, temperature, target, false, sh);
    }
    const Selection survivors = {kept, min_p, WEIGHT_TEMPERED, 0};
    const u64 total = selection_total(src, survivors, top, temperature, sh);
    const u64 rank = descend(src, survivors, top, temperature, (u64)((double)uniform * (double)total), true, sh);
    if (threadIdx.x == 0) *out = token_of(rank);
}

// Greedy sampling on the device: the index of each row's largest logit, so a
// decode step returns one integer per sequence instead of a vocabulary of floats.
#include "common.cuh"

// "No candidate yet": larger than any column index.
#define ARGMAX_NONE 0x7fffffff

// Does (v, i) beat (bv, bi)? Larger value first, then the lower index. A NaN
// value never wins (both comparisons are false), -inf still does against "none".
__device__ __forceinline__ bool argmax_before(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The warp's best (value, index) into lane 0's (bv, bi), by a fixed tree.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, o);
        const int oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (argmax_before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
}

// (best_v, best_i)[r * gridDim.y + p] = the largest (value, index) of row r
// among columns [p * span, min(cols, (p + 1) * span)) of logits[r * stride +
// c], ties to the lowest index, NaN never winning (ARGMAX_NONE where nothing
// won); span a multiple of 4. Grid (rows, parts), any block of whole warps.
// Each thread scans its columns (float4 loads when rows are 16-byte aligned,
// then the last columns one by one); the (value, index) order makes the
// result independent of the scan order, and a fixed tree combines the
// threads: deterministic. A 250k vocabulary in one block per row is one SM
// streaming 1 MB, a visible part of a decode step; split over ~60 blocks and
// merged by argmax_merge it is a small one.
KESTREL_EXTERN void argmax_parts(float* __restrict__ part_v, int* __restrict__ part_i,
                                 const float* __restrict__ logits, int cols, int stride, int span) { pdl_begin();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float* row = logits + (size_t)blockIdx.x * stride;
    const int c_begin = blockIdx.y * span, c_end = min(cols, c_begin + span);
    float bv = -INFINITY;
    int bi = ARGMAX_NONE;
    int scalar_from = c_begin;
    if ((stride & 3) == 0) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        const int end4 = c_end / 4;
        // Four 16-byte loads in flight per thread before any is compared.
        constexpr int B = 4;
        for (int c0 = c_begin / 4 + threadIdx.x; c0 < end4; c0 += B * blockDim.x) {
            float4 vs[B];
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int c = c0 + u * blockDim.x;
                vs[u] = c < end4 ? row4[c] : make_float4(NAN, NAN, NAN, NAN);  // NaN never wins
            }
#pragma unroll
            for (int u = 0; u < B; ++u) {
                const int c = c0 + u * blockDim.x;
                const float4 v = vs[u];
                if (argmax_before(v.x, 4 * c, bv, bi)) bv = v.x, bi = 4 * c;
                if (argmax_before(v.y, 4 * c + 1, bv, bi)) bv = v.y, bi = 4 * c + 1;
                if (argmax_before(v.z, 4 * c + 2, bv, bi)) bv = v.z, bi = 4 * c + 2;
                if (argmax_before(v.w, 4 * c + 3, bv, bi)) bv = v.w, bi = 4 * c + 3;
            }
        }
        scalar_from = max(c_begin, end4 * 4);
    }
    for (int c = scalar_from + threadIdx.x; c < c_end; c += blockDim.x)
        if (argmax_before(row[c], c, bv, bi)) bv = row[c], bi = c;
    warp_argmax(bv, bi);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (argmax_before(best_v[w], best_i[w], bv, bi)) bv = best_v[w], bi = best_i[w];
        part_v[blockIdx.x * gridDim.y + blockIdx.y] = bv;
        part_i[blockIdx.x * gridDim.y + blockIdx.y] = bi;
    }
}

// out[r] = the best of row r's `parts` (value, index) pairs from
// argmax_parts, 0 where none won (a row of NaN). Grid rows, block 32.
KESTREL_EXTERN void argmax_merge(int* __restrict__ out, const float* __restrict__ part_v,
                                 const int* __restrict__ part_i, int parts) { pdl_begin();
    float bv = -INFINITY;
    int bi = ARGMAX_NONE;
    for (int p = threadIdx.x; p < parts; p += 32) {
        const float v = part_v[blockIdx.x * parts + p];
        const int i = part_i[blockIdx.x * parts + p];
        if (argmax_before(v, i, bv, bi)) bv = v, bi = i;
    }
    warp_argmax(bv, bi);
    if (threadIdx.x == 0) out[blockIdx.x] = bi == ARGMAX_NONE ? 0 : bi;
}

// ---- Sampling candidates ---------------------------------------------------
// top_candidates: per requested row, apply the sampler's penalties and mask,
// then find the `count` largest logits (ties to the lowest id, NaN and -inf
// never) by radix select over an order-preserving integer key, plus the
// row's largest logit and the count and weight of the logits above the
// min-p line, and, given the sampler's uniform draw, the kept id where the
// weights summed in id order cross it. One block of 1024 threads per request;
// integer counts and fixed reduction trees only, so the output repeats bit
// for bit.

// A request: TOPC_DESC_WORDS ints (floats as their bits). Must match
// `ops/sample.rs`.
#define TOPC_ROW 0
#define TOPC_COLS 1
#define TOPC_COUNT 2
#define TOPC_PEN_BEGIN 3      // into `aux`: 3 ints per penalty (id, output count, seen)
#define TOPC_PEN_COUNT 4
#define TOPC_MASK_BEGIN 5     // into `aux`: one id per masked token
#define TOPC_MASK_COUNT 6
#define TOPC_SCRATCH 7        // into `scratch` (cols floats), -1: no penalties, read the logits
#define TOPC_OUT 8            // into `out`: TOPC_HEADER + 2 * count words
#define TOPC_REPETITION 9
#define TOPC_FREQUENCY 10
#define TOPC_PRESENCE 11
#define TOPC_MIN_P_OFFSET 12
#define TOPC_INV_TEMPERATURE 13
#define TOPC_UNIFORM_LO 14    // the draw's uniform (f64 bits, low word first); negative: no draw
#define TOPC_UNIFORM_HI 15
#define TOPC_DESC_WORDS 16
// Output header: found, max logit bits, kept, drawn id (TOPC_NO_DRAW: none),
// then as f64 (low word first) the kept weight, and the cumulative weights
// before and after the drawn id; then `count` ids, then `count` logit bits.
#define TOPC_HEADER 10
#define TOPC_NO_DRAW 0xffffffffu
#define TOPC_THREADS 1024
#define TOPC_WARPS (TOPC_THREADS / 32)
#define RADIX_BUCKETS 2048
// Every pass over a row loads TOPC_BATCH values (or warp chunks) per thread
// before using any: one block walks a whole 248K-column row several times,
// and with one load in flight per thread each pass was a chain of ~240 memory
// latencies per sampled token. Values are still used in
// column order, so every count, sum and choice is unchanged.
#define TOPC_BATCH 8

// v[u] = src[first + u * step] for u < TOPC_BATCH, `fill` from `end` on: the
// loads of one pass step, all issued before any value is used.
__device__ __forceinline__ void load_batch(float (&v)[TOPC_BATCH], const float* src, int first, int step, int end,
                                           float fill) {
#pragma unroll
    for (int u = 0; u < TOPC_BATCH; ++u) {
        const int c = first + u * step;
        v[u] = c < end ? src[c] : fill;
    }
}

// Orders floats like their values with -0 == +0 (`candidates::rank_key`).
__device__ __forceinline__ unsigned rank_key(float v) {
    const unsigned b = v == 0.f ? 0u : __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float logit_of_key(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Not NaN and above -inf.
__device__ __forceinline__ bool eligible(float v) { return v > -INFINITY; }

// A logit's weight in the kept sum and the draw: the sampler's f32
// `exp((logit - max) * inv_temp)` (no fused multiply-add), 0 when not kept.
__device__ __forceinline__ double kept_weight_of(float v, float threshold, float max_logit,
                                                 float inv_temp) {
    return eligible(v) && v >= threshold
        ? (double)expf(__fmul_rn(__fsub_rn(v, max_logit), inv_temp)) : 0.0;
}

// Inclusive prefix sum over a warp's lanes in lane order (a fixed shuffle tree).
__device__ __forceinline__ double warp_inclusive_scan_f64(double x) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    return x;
}

// The weight of columns [begin, end) summed by the calling warp in id order:
// each 32-column chunk scanned, the chunk totals added in turn. Every lane
// gets the sum.
__device__ double warp_run_weight(const float* src, int begin, int end, float threshold,
                                  float max_logit, float inv_temp) {
    double sum = 0.0;
    const int lane = threadIdx.x & 31;
    for (int base = begin; base < end; base += 32 * TOPC_BATCH) {
        float v[TOPC_BATCH];
        load_batch(v, src, base + lane, 32, end, NAN);
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u) {
            if (base + 32 * u >= end) break;  // uniform over the warp
            const double w = kept_weight_of(v[u], threshold, max_logit, inv_temp);
            sum += __shfl_sync(0xffffffffu, warp_inclusive_scan_f64(w), 31);
        }
    }
    return sum;
}

// incl[w] = the sum of the warp totals of warps 0..=w (each warp passes its
// total, the same in every lane), for every thread to read. Needs
// TOPC_WARPS == 32.
__device__ void warp_totals_inclusive_scan(double warp_total, double* incl) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // incl may still be read by a previous search
    if (lane == 0) incl[warp] = warp_total;
    __syncthreads();
    if (warp == 0) {
        const double x = warp_inclusive_scan_f64(incl[lane]);
        incl[lane] = x;
    }
    __syncthreads();
}

// The columns [begin, end) split into TOPC_WARPS contiguous runs, one per warp.
__device__ __forceinline__ void warp_run(int begin, int end, int warp, int* run_begin,
                                         int* run_end) {
    const int run = (end - begin + TOPC_WARPS - 1) / TOPC_WARPS;
    *run_begin = min(end, begin + warp * run);
    *run_end = min(end, *run_begin + run);
}

// `candidates::penalised_logit`, operation for operation (no fused multiply-add).
__device__ __forceinline__ float penalised(float v, int count, int seen, float rep, float freq,
                                           float pres) {
    if (seen && rep != 1.f) v = v > 0.f ? __fdiv_rn(v, rep) : __fmul_rn(v, rep);
    if (count > 0 && (freq != 0.f || pres != 0.f)) {
        v = __fsub_rn(v, __fmul_rn(freq, __uint2float_rn((unsigned)count)));
        v = __fsub_rn(v, pres);
    }
    return v;
}

// The key's bits above `shift` (shift 32: nothing, every key is in bucket 0).
__device__ __forceinline__ unsigned key_prefix(unsigned key, int shift) {
    return (unsigned)((unsigned long long)key >> shift);
}

__device__ __forceinline__ unsigned block_sum_u32(unsigned v, unsigned* tmp) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) tmp[threadIdx.x >> 5] = v;
    __syncthreads();
    v = tmp[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ unsigned block_max_u32(unsigned v, unsigned* tmp) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0) tmp[threadIdx.x >> 5] = v;
    __syncthreads();
    v = tmp[threadIdx.x & 31];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Exclusive prefix sum over the block's threads in thread order; `*total` gets the sum.
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned v, unsigned* tmp, unsigned* total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) tmp[warp] = x;
    __syncthreads();
    if (warp == 0) {
        unsigned w = tmp[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const unsigned y = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += y;
        }
        tmp[lane] = w;
    }
    __syncthreads();
    *total = tmp[TOPC_WARPS - 1];
    return (warp ? tmp[warp - 1] : 0u) + x - v;
}

// Count keys into hist[bucket] for the eligible logits whose key bits above
// `shift + bits` equal `prefix`; equal buckets within a warp are added once
// (logits crowd into few buckets, and shared atomics on one address serialise).
__device__ void radix_histogram(const float* src, int cols, unsigned prefix, int shift, int bits,
                                unsigned* hist) {
    for (int i = threadIdx.x; i < (1 << bits); i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int base = 0; base < cols; base += TOPC_BATCH * blockDim.x) {
        float v[TOPC_BATCH];
        load_batch(v, src, base + threadIdx.x, blockDim.x, cols, NAN);  // NaN is never eligible
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u) {
            int bucket = -1;
            const unsigned k = rank_key(v[u]);
            if (eligible(v[u]) && key_prefix(k, shift + bits) == prefix)
                bucket = (int)((k >> shift) & ((1u << bits) - 1));
            const unsigned peers = __match_any_sync(0xffffffffu, bucket);
            if (bucket >= 0 && (threadIdx.x & 31) == __ffs(peers) - 1)
                atomicAdd(&hist[bucket], __popc(peers));
        }
    }
    __syncthreads();
}

// The bucket holding the `want`-th largest key counted in `hist` (1-based):
// sel[0] = the bucket, sel[1] = how many keys lie in higher buckets.
__device__ void select_bucket(const unsigned* hist, int buckets, unsigned want, unsigned* sel,
                              unsigned* tmp) {
    const int per = (buckets + blockDim.x - 1) / blockDim.x;
    unsigned mine = 0;
    for (int j = 0; j < per; ++j) {
        const int b = buckets - 1 - ((int)threadIdx.x * per + j);  // high buckets first
        if (b >= 0) mine += hist[b];
    }
    unsigned total;
    unsigned above = block_exclusive_scan(mine, tmp, &total);
    for (int j = 0; j < per; ++j) {
        const int b = buckets - 1 - ((int)threadIdx.x * per + j);
        if (b < 0) break;
        const unsigned h = hist[b];
        if (above < want && want <= above + h) sel[0] = (unsigned)b, sel[1] = above;
        above += h;
    }
    __syncthreads();
}

// Copy the row into scratch with the penalties, then the mask, applied.
__device__ void penalise_row(const float* row, float* dst, const int* d, const int* aux) {
    const int cols = d[TOPC_COLS];
    for (int base = threadIdx.x; base < cols; base += TOPC_BATCH * blockDim.x) {
        float v[TOPC_BATCH];
        load_batch(v, row, base, blockDim.x, cols, 0.f);
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u) {
            const int c = base + u * blockDim.x;
            if (c < cols) dst[c] = v[u];
        }
    }
    __syncthreads();
    const float rep = __int_as_float(d[TOPC_REPETITION]);
    const float freq = __int_as_float(d[TOPC_FREQUENCY]);
    const float pres = __int_as_float(d[TOPC_PRESENCE]);
    const int* pen = aux + d[TOPC_PEN_BEGIN];
    for (int e = threadIdx.x; e < d[TOPC_PEN_COUNT]; e += blockDim.x) {
        const int id = pen[3 * e];
        if (id >= 0 && id < cols) dst[id] = penalised(dst[id], pen[3 * e + 1], pen[3 * e + 2], rep, freq, pres);
    }
    __syncthreads();
    const int* mask = aux + d[TOPC_MASK_BEGIN];
    for (int e = threadIdx.x; e < d[TOPC_MASK_COUNT]; e += blockDim.x) {
        const int id = mask[e];
        if (id >= 0 && id < cols) dst[id] = -INFINITY;
    }
    __syncthreads();
}

// out, per request: see TOPC_HEADER. logits: [rows, stride]. Grid: one block
// of TOPC_THREADS per request.
KESTREL_EXTERN void __launch_bounds__(TOPC_THREADS) top_candidates(unsigned* out, const float* logits, float* scratch,
                                   const int* desc, const int* aux, int stride) { pdl_begin();
    __shared__ unsigned hist[RADIX_BUCKETS];
    __shared__ unsigned tmp[32];
    __shared__ unsigned sel[2];
    __shared__ unsigned warp_base[2][TOPC_WARPS];
    __shared__ double weight_incl[TOPC_WARPS];
    __shared__ unsigned drawn_id;
    __shared__ double drawn_sums[2];
    const int* d = desc + blockIdx.x * TOPC_DESC_WORDS;
    const int cols = d[TOPC_COLS], count = d[TOPC_COUNT];
    unsigned* o = out + d[TOPC_OUT];
    // Plain pointers (not __restrict__): the scratch row is written, then read.
    const float* src = logits + (size_t)d[TOPC_ROW] * stride;
    if (d[TOPC_SCRATCH] >= 0) {
        penalise_row(src, scratch + d[TOPC_SCRATCH], d, aux);
        src = scratch + d[TOPC_SCRATCH];
    }

    // The eligible logits, their largest key, and the first radix digit.
    unsigned n_eligible = 0, max_key = 0;
    for (int base = threadIdx.x; base < cols; base += TOPC_BATCH * blockDim.x) {
        float v[TOPC_BATCH];
        load_batch(v, src, base, blockDim.x, cols, NAN);
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u)
            if (eligible(v[u])) ++n_eligible, max_key = max(max_key, rank_key(v[u]));
    }
    n_eligible = block_sum_u32(n_eligible, tmp);
    max_key = block_max_u32(max_key, tmp);
    const float max_logit = n_eligible ? logit_of_key(max_key) : -INFINITY;
    const unsigned found = min((unsigned)count, n_eligible);

    // Radix select (11, 11, 10 bits from the top) of the found-th largest key.
    // Keys with prefix > `prefix` (at `shift`) are taken; of those equal to
    // it, the `want` lowest ids. Stops early once a bucket is taken whole.
    unsigned prefix = 0, want = found;
    int shift = 32;
    bool whole_bucket = found == n_eligible;  // every eligible logit is taken
    if (found == 1 && !whole_bucket) {
        // The best is the lowest id holding the largest key: no passes.
        prefix = max_key;
        shift = 0;
        whole_bucket = true;
    }
    const int digit_bits[3] = {11, 11, 10};
    for (int pass = 0; pass < 3 && !whole_bucket; ++pass) {
        const int bits = digit_bits[pass];
        radix_histogram(src, cols, prefix, shift - bits, bits, hist);
        select_bucket(hist, 1 << bits, want, sel, tmp);
        const unsigned bucket = sel[0], in_bucket = hist[bucket];
        want -= sel[1];
        prefix = (prefix << bits) | bucket;
        shift -= bits;
        __syncthreads();  // hist and sel are rewritten by the next pass
        whole_bucket = in_bucket == want;
    }

    // Each warp walks its own contiguous run of columns, so positions follow
    // id order: counts first, then the writes.
    const float threshold = __int_as_float(d[TOPC_MIN_P_OFFSET]) == -INFINITY
        ? -INFINITY : __fadd_rn(max_logit, __int_as_float(d[TOPC_MIN_P_OFFSET]));
    const float inv_temp = __int_as_float(d[TOPC_INV_TEMPERATURE]);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int run_begin, run_end;
    warp_run(0, cols, warp, &run_begin, &run_end);
    unsigned n_above = 0, n_tied = 0, kept = 0;
    // The kept weight in id order (warp runs in order, each summed chunk by
    // chunk), so that the draw below can search the same sums.
    double run_weight = 0.0;
    for (int base0 = run_begin; base0 < run_end; base0 += 32 * TOPC_BATCH) {
        float vs[TOPC_BATCH];
        load_batch(vs, src, base0 + lane, 32, run_end, NAN);
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u) {
            if (base0 + 32 * u >= run_end) break;  // uniform over the warp
            const float v = vs[u];
            const bool ok = eligible(v);
            const unsigned p = key_prefix(rank_key(v), shift);
            n_above += __popc(__ballot_sync(0xffffffffu, ok && found && p > prefix));
            n_tied += __popc(__ballot_sync(0xffffffffu, ok && found && p == prefix));
            kept += ok && v >= threshold;
            if (inv_temp > 0.f) {  // the same in every thread
                const double w = kept_weight_of(v, threshold, max_logit, inv_temp);
                run_weight += __shfl_sync(0xffffffffu, warp_inclusive_scan_f64(w), 31);
            }
        }
    }
    kept = block_sum_u32(kept, tmp);
    warp_totals_inclusive_scan(run_weight, weight_incl);
    const double weight = weight_incl[TOPC_WARPS - 1];

    // The draw: the first kept id whose cumulative weight exceeds
    // uniform * weight. The warp runs' prefix sums pick a run; it is split
    // into runs again until one is at most 32 columns (250k columns: 7.8k,
    // 245, 8), whose lanes' prefix sums pick the id. Sums differ between
    // levels only by f64 rounding; a target that falls between them reports
    // no draw, and the sampler would have called such a target undecided.
    const double uniform = __hiloint2double(d[TOPC_UNIFORM_HI], d[TOPC_UNIFORM_LO]);
    if (threadIdx.x == 0) drawn_id = TOPC_NO_DRAW, drawn_sums[0] = drawn_sums[1] = 0.0;
    __syncthreads();
    if (uniform >= 0.0 && inv_temp > 0.f && weight > 0.0 && isfinite(max_logit)) {
        const double target = uniform * weight;
        int begin = 0, end = cols;
        double base = 0.0;  // the weight of the kept ids below `begin`
        bool lost = false;
        for (;;) {
            // Every thread reads the same sums: the loop is uniform over the block.
            int w = 0;
            while (w < TOPC_WARPS && !(target < base + weight_incl[w])) ++w;
            if (w == TOPC_WARPS) {
                lost = true;
                break;
            }
            if (w > 0) base += weight_incl[w - 1];
            warp_run(begin, end, w, &begin, &end);
            if (end - begin <= 32) break;
            int sub_begin, sub_end;
            warp_run(begin, end, warp, &sub_begin, &sub_end);
            warp_totals_inclusive_scan(
                warp_run_weight(src, sub_begin, sub_end, threshold, max_logit, inv_temp),
                weight_incl);
        }
        if (!lost && warp == 0) {
            const int c = begin + lane;
            const double w = c < end ? kept_weight_of(src[c], threshold, max_logit, inv_temp) : 0.0;
            const double after = base + warp_inclusive_scan_f64(w);
            const double prev = __shfl_up_sync(0xffffffffu, after, 1);
            const unsigned crossed = __ballot_sync(0xffffffffu, c < end && target < after);
            if (crossed && lane == __ffs(crossed) - 1) {
                drawn_id = (unsigned)c;
                drawn_sums[0] = lane ? prev : base;
                drawn_sums[1] = after;
            }
        }
    }
    unsigned total;
    const unsigned above_before = block_exclusive_scan(lane == 0 ? n_above : 0u, tmp, &total);
    if (lane == 0) warp_base[0][warp] = above_before;
    const unsigned tied_before = block_exclusive_scan(lane == 0 ? n_tied : 0u, tmp, &total);
    if (lane == 0) warp_base[1][warp] = tied_before;
    __syncthreads();

    const unsigned n_taken_above = found - want;
    unsigned* ids = o + TOPC_HEADER;
    unsigned* vals = ids + count;
    unsigned next_above = warp_base[0][warp], next_tied = warp_base[1][warp];
    for (int base0 = run_begin; base0 < run_end && found; base0 += 32 * TOPC_BATCH) {
        float vs[TOPC_BATCH];
        load_batch(vs, src, base0 + lane, 32, run_end, NAN);
#pragma unroll
        for (int u = 0; u < TOPC_BATCH; ++u) {
            const int base = base0 + 32 * u;
            if (base >= run_end) break;  // uniform over the warp
            const int c = base + lane;
            const float v = vs[u];
            const bool ok = eligible(v);
            const unsigned p = key_prefix(rank_key(v), shift);
            const unsigned lower = (1u << lane) - 1;
            const unsigned above = __ballot_sync(0xffffffffu, ok && p > prefix);
            const unsigned tied = __ballot_sync(0xffffffffu, ok && p == prefix);
            unsigned slot = 0xffffffffu;
            if ((above >> lane) & 1) slot = next_above + __popc(above & lower);
            if ((tied >> lane) & 1) {
                const unsigned rank = next_tied + __popc(tied & lower);
                if (rank < want) slot = n_taken_above + rank;
            }
            if (slot != 0xffffffffu) ids[slot] = (unsigned)c, vals[slot] = __float_as_uint(v);
            next_above += __popc(above);
            next_tied += __popc(tied);
        }
    }
    __syncthreads();  // the draw's result
    if (threadIdx.x == 0) {
        const double f64s[3] = {weight, drawn_sums[0], drawn_sums[1]};
        o[0] = found;
        o[1] = __float_as_uint(max_logit);
        o[2] = kept;
        o[3] = drawn_id;
        for (int i = 0; i < 3; ++i) {
            const unsigned long long b = (unsigned long long)__double_as_longlong(f64s[i]);
            o[4 + 2 * i] = (unsigned)b;
            o[5 + 2 * i] = (unsigned)(b >> 32);
        }
    }
}

// Structured outputs: logits[rows[m] * stride + c] = -inf for every column c
// whose bit (bit c % 32 of allowed[m * words + c / 32]) is clear, the mask of
// m a bit per id over `words` words (ids past them are disallowed). Grid
// (column blocks, masks); each thread one column, so the result does not
// depend on the launch shape.
KESTREL_EXTERN void mask_logits(float* __restrict__ logits, const int* __restrict__ rows,
                                const unsigned* __restrict__ allowed, int words, int stride) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= stride) return;
    const int m = blockIdx.y;
    const int w = c >> 5;
    const bool ok = w < words && ((allowed[(size_t)m * words + w] >> (c & 31)) & 1u);
    if (!ok) logits[(size_t)rows[m] * stride + c] = -INFINITY;
}

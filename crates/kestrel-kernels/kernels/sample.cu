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

// out[r] = argmax over c < cols of logits[r * stride + c]; ties go to the
// lowest index, NaN never wins, a row of NaN only gives 0. `cols` below
// `stride` leaves out a vocabulary's padded tail. Grid rows, block 1024 (any
// multiple of 32 up to 1024). Each thread scans its columns (float4 loads
// when rows are 16-byte aligned, then the last cols % 4 one by one); the
// (value, index) order makes the result independent of the scan order, and a
// fixed tree combines the threads: deterministic.
KESTREL_EXTERN void argmax_rows(int* __restrict__ out, const float* __restrict__ logits, int cols, int stride) { pdl_begin();
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    const float* row = logits + (size_t)blockIdx.x * stride;
    float bv = -INFINITY;
    int bi = ARGMAX_NONE;
    int scalar_from = 0;
    if ((stride & 3) == 0) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int c = threadIdx.x; c < cols / 4; c += blockDim.x) {
            const float4 v = row4[c];
            if (argmax_before(v.x, 4 * c, bv, bi)) bv = v.x, bi = 4 * c;
            if (argmax_before(v.y, 4 * c + 1, bv, bi)) bv = v.y, bi = 4 * c + 1;
            if (argmax_before(v.z, 4 * c + 2, bv, bi)) bv = v.z, bi = 4 * c + 2;
            if (argmax_before(v.w, 4 * c + 3, bv, bi)) bv = v.w, bi = 4 * c + 3;
        }
        scalar_from = cols & ~3;
    }
    for (int c = scalar_from + threadIdx.x; c < cols; c += blockDim.x)
        if (argmax_before(row[c], c, bv, bi)) bv = row[c], bi = c;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_down_sync(0xffffffffu, bv, o);
        const int oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (argmax_before(ov, oi, bv, bi)) bv = ov, bi = oi;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        best_v[warp] = bv;
        best_i[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
            if (argmax_before(best_v[w], best_i[w], bv, bi)) bv = best_v[w], bi = best_i[w];
        out[blockIdx.x] = bi == ARGMAX_NONE ? 0 : bi;
    }
}

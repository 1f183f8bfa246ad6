// Streaming dot products of bf16 weight rows with f32 activation rows: the core
// of every decode-time (few-token) matrix product. At batch <= 8 a product
// reads each weight once and does almost no arithmetic per byte, so the only
// goal is to keep HBM busy: 16-byte weight loads, several of them in flight
// per lane before any is consumed, and activations kept in f32 (no rounding).
//
// Summation order depends only on the shapes (lane/chunk assignment and the
// fixed shuffle tree), never on timing, so results are bit-reproducible.
#pragma once
#include "common.cuh"

// 16-byte weight load that does not allocate in L1: weights are read once,
// and keeping them out of L1 leaves it to the activation rows that every warp
// of the SM re-reads.
__device__ __forceinline__ uint4 ld_weights(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// bf16 -> f32 is a 16-bit shift; element 0 of a pair is the low half.
__device__ __forceinline__ float bf16_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// acc + sum_i a|b[i] * w[i] over 8 elements, in element order.
__device__ __forceinline__ float dot8(float acc, uint4 w, float4 a, float4 b) {
    acc = fmaf(a.x, bf16_lo(w.x), acc);
    acc = fmaf(a.y, bf16_hi(w.x), acc);
    acc = fmaf(a.z, bf16_lo(w.y), acc);
    acc = fmaf(a.w, bf16_hi(w.y), acc);
    acc = fmaf(b.x, bf16_lo(w.z), acc);
    acc = fmaf(b.y, bf16_hi(w.z), acc);
    acc = fmaf(b.z, bf16_lo(w.w), acc);
    acc = fmaf(b.w, bf16_hi(w.w), acc);
    return acc;
}

// Per-lane partial sums acc[m][r] += x[m, 8c .. 8c+8] . w[r][8c .. 8c+8] over the
// 16-byte chunks c = first, first + stride, ... < chunks. `x` rows are `ldx`
// floats apart (16-byte aligned). U chunks of every row are loaded before any
// is used, so U * R loads are in flight per lane; the x rows (tiny, shared by
// all warps) come through the read-only cache and are reused across the R rows.
template <int M, int R, int U>
__device__ __forceinline__ void dot_chunks(float (&acc)[M][R], const uint4* const (&w)[R],
                                           const float* __restrict__ x, size_t ldx, int first,
                                           int stride, int chunks) {
    for (int c = first; c < chunks; c += U * stride) {
        uint4 wv[U][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int cu = c + u * stride;
#pragma unroll
            for (int r = 0; r < R; ++r) wv[u][r] = cu < chunks ? ld_weights(w[r] + cu) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int cu = c + u * stride;
            if (cu >= chunks) break;
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const float4* xm = reinterpret_cast<const float4*>(x + m * ldx) + 2 * cu;
                const float4 a = __ldg(xm), b = __ldg(xm + 1);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[m][r] = dot8(acc[m][r], wv[u][r], a, b);
            }
        }
    }
}

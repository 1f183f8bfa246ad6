// Streaming dot products of bf16 weight rows with f32 activation rows: the core
// of every decode-time (few-token) matrix product. At batch <= 8 a product
// reads each weight once and does almost no arithmetic per byte, so the only
// goal is to keep HBM busy: 16-byte weight loads, several of them in flight
// per lane before any is consumed, and activations kept in f32 (no rounding).
//
// Summation order depends only on the shapes (lane/chunk assignment and the
// fixed shuffle tree), never on timing, so results are bit-reproducible.
#pragma once
#include <cuda_fp16.h>

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

// The 16-bit weight formats: bf16 (every checkpoint in serving) and f16
// (f16 checkpoints under the reference precision, kept exact). Element 0 of
// a pair is the low half.
struct Bf16W {
    // bf16 -> f32 is a 16-bit shift.
    static __device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
    static __device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
};
struct F16W {
    static __device__ __forceinline__ float lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu))); }
    static __device__ __forceinline__ float hi(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }
};

// acc + sum_i a|b[i] * w[i] over 8 elements, in element order.
template <typename WT>
__device__ __forceinline__ float dot8(float acc, uint4 w, float4 a, float4 b) {
    acc = fmaf(a.x, WT::lo(w.x), acc);
    acc = fmaf(a.y, WT::hi(w.x), acc);
    acc = fmaf(a.z, WT::lo(w.y), acc);
    acc = fmaf(a.w, WT::hi(w.y), acc);
    acc = fmaf(b.x, WT::lo(w.z), acc);
    acc = fmaf(b.y, WT::hi(w.z), acc);
    acc = fmaf(b.z, WT::lo(w.w), acc);
    acc = fmaf(b.w, WT::hi(w.w), acc);
    return acc;
}

// One step of the streaming loop: U chunks c, c + stride, ... of each of the R
// rows (zeros past the end), all issued before any is used.
template <int R, int U>
__device__ __forceinline__ void load_chunks(uint4 (&wv)[U][R], const uint4* const (&w)[R], int c, int stride,
                                            int chunks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int cu = c + u * stride;
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = cu < chunks ? ld_weights(w[r] + cu) : make_uint4(0, 0, 0, 0);
    }
}

// Activation rows in global memory (read through the read-only cache) or in
// shared memory (XS: a gemv that computed them itself).
template <bool XS>
__device__ __forceinline__ float4 load_x(const float4* p) {
    if constexpr (XS) return *p;
    else return __ldg(p);
}

// acc[m][r] += x[m, chunk] . wv[u][r] for the chunks loaded by load_chunks(c).
template <int M, int R, int U, typename WT, bool XS = false>
__device__ __forceinline__ void use_chunks(float (&acc)[M][R], const uint4 (&wv)[U][R],
                                           const float* __restrict__ x, size_t ldx, int c, int stride, int chunks) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int cu = c + u * stride;
        if (cu >= chunks) break;
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const float4* xm = reinterpret_cast<const float4*>(x + m * ldx) + 2 * cu;
            const float4 a = load_x<XS>(xm), b = load_x<XS>(xm + 1);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] = dot8<WT>(acc[m][r], wv[u][r], a, b);
        }
    }
}

// Per-lane partial sums acc[m][r] += x[m, 8c .. 8c+8] . w[r][8c .. 8c+8] over the
// 16-byte chunks c = first, first + stride, ... < chunks. `x` rows are `ldx`
// floats apart (16-byte aligned). U chunks of every row are loaded before any
// is used, so U * R loads are in flight per lane; the x rows (tiny, shared by
// all warps) come through the read-only cache and are reused across the R rows.
template <int M, int R, int U, typename WT = Bf16W, bool XS = false>
__device__ __forceinline__ void dot_chunks(float (&acc)[M][R], const uint4* const (&w)[R],
                                           const float* __restrict__ x, size_t ldx, int first,
                                           int stride, int chunks) {
    for (int c = first; c < chunks; c += U * stride) {
        uint4 wv[U][R];
        load_chunks<R, U>(wv, w, c, stride, chunks);
        use_chunks<M, R, U, WT, XS>(acc, wv, x, ldx, c, stride, chunks);
    }
}

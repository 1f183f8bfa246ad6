// Streaming dot products of bf16 (or f16, or block-FP8) weight rows with f32 activation rows: the core
// of every decode-time (few-token) matrix product. At batch <= 8 a product
// reads each weight once and does almost no arithmetic per byte, so the only
// goal is to keep HBM busy: 16-byte weight loads, several of them in flight
// per lane before any is consumed, and activations kept in f32 (no rounding).
//
// Summation order depends only on the shapes (lane/chunk assignment and the
// fixed shuffle tree), never on timing, so results are bit-reproducible.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

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

// The weight formats. A 16-byte chunk holds ELEMS weights of one row:
// 8 bf16 (every checkpoint in serving) or f16 (f16 checkpoints under the
// reference precision, kept exact); or 16 block-FP8 codes (Qwen's -FP8
// checkpoints: e4m3 with one f32 scale per 128 x 128 block, SCALED). Element
// 0 of a 16-bit pair is the low half.
struct Bf16W {
    static constexpr int ELEMS = 8;
    static constexpr bool SCALED = false;
    static constexpr bool F32_ONCE = false;
    // bf16 -> f32 is a 16-bit shift.
    static __device__ __forceinline__ float lo(uint32_t v) { return __uint_as_float(v << 16); }
    static __device__ __forceinline__ float hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }
};
struct F16W {
    static constexpr int ELEMS = 8;
    static constexpr bool SCALED = false;
    static constexpr bool F32_ONCE = false;
    static __device__ __forceinline__ float lo(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v & 0xffffu))); }
    static __device__ __forceinline__ float hi(uint32_t v) { return __half2float(__ushort_as_half((unsigned short)(v >> 16))); }
};
struct Fp8W {
    static constexpr int ELEMS = 16;
    static constexpr bool SCALED = true;
    static constexpr bool F32_ONCE = false;
};
// The same weights for products of many x rows: each chunk's codes become
// 16 f32 values once, which every x row then meets with FMAs alone (Fp8W
// converts f16 -> f32 again for each row, which at 8 or 16 rows costs as
// many instructions as the FMAs). The values, products and order of sums
// are Fp8W's: the two give the same bits.
struct Fp8F32W {
    static constexpr int ELEMS = 16;
    static constexpr bool SCALED = true;
    static constexpr bool F32_ONCE = true;
};

// Columns of one FP8 scale block, and the chunks that span it.
constexpr int FP8_BLOCK = 128;
constexpr int FP8_BLOCK_CHUNKS = FP8_BLOCK / Fp8W::ELEMS;

// The 16 codes of an FP8 chunk as two chunks of 8 f16 values, exactly
// (e4m3 is a subset of f16): one hardware conversion per pair, then the
// f16 -> f32 step on the FMA pipe. Integer bit tricks to bf16 (about three
// integer operations per code) measured slower at 8 rows
// (docs/benchmarks/2026-12-02-h200-fp8-decode/).
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint32_t pair) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)pair, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
__device__ __forceinline__ void fp8_chunk_to_f16(uint4 w, uint4& lo, uint4& hi) {
    lo = make_uint4(e4m3x2_to_f16x2(w.x & 0xffffu), e4m3x2_to_f16x2(w.x >> 16), e4m3x2_to_f16x2(w.y & 0xffffu),
                    e4m3x2_to_f16x2(w.y >> 16));
    hi = make_uint4(e4m3x2_to_f16x2(w.z & 0xffffu), e4m3x2_to_f16x2(w.z >> 16), e4m3x2_to_f16x2(w.w & 0xffffu),
                    e4m3x2_to_f16x2(w.w >> 16));
}

// Row n of a [rows, k] matrix of format WT at w, as 16-byte chunks.
template <typename WT>
__device__ __forceinline__ const uint4* weight_row(const void* w, size_t n, int k) {
    constexpr size_t BYTES = WT::ELEMS == 16 ? 1 : 2;
    return reinterpret_cast<const uint4*>(reinterpret_cast<const uint8_t*>(w) + n * (size_t)k * BYTES);
}

// The scales of row n's blocks (FP8: a [ceil(rows/128), ceil(k/128)] grid),
// null for the 16-bit formats.
template <typename WT>
__device__ __forceinline__ const float* scale_row(const float* scales, size_t n, int k) {
    if constexpr (WT::SCALED) return scales + (n / FP8_BLOCK) * (size_t)((k + FP8_BLOCK - 1) / FP8_BLOCK);
    else return nullptr;
}

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

// The 16 values of the x row at `xr` that FP8 chunk `cu` meets.
template <bool XS>
__device__ __forceinline__ void load_x16(const float* xr, int cu, float4& a, float4& b, float4& c, float4& d) {
    const float4* p = reinterpret_cast<const float4*>(xr) + 4 * cu;
    a = load_x<XS>(p);
    b = load_x<XS>(p + 1);
    c = load_x<XS>(p + 2);
    d = load_x<XS>(p + 3);
}

// acc[m][r] += x[m, chunk] . wv[u][r] for the chunks loaded by load_chunks(c).
// FP8 chunks are turned into f16 once, before the x rows meet them; each
// chunk's 16-term sum starts at zero and is added with its block's scale.
// `sc` holds the rows' scale rows (scale_row; unused by the 16-bit
// formats). Fetching the scales with the codes instead (one more array of
// loads in flight) measured slower (same report).
template <int M, int R, int U, typename WT, bool XS = false>
__device__ __forceinline__ void use_chunks(float (&acc)[M][R], const uint4 (&wv)[U][R],
                                           const float* __restrict__ x, size_t ldx, int c, int stride, int chunks,
                                           const float* const (&sc)[R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int cu = c + u * stride;
        if (cu >= chunks) break;
        if constexpr (WT::SCALED && WT::F32_ONCE) {
            float wf[R][16];
            float scale[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                uint4 lo, hi;
                fp8_chunk_to_f16(wv[u][r], lo, hi);
                const uint32_t words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    wf[r][2 * i] = F16W::lo(words[i]);
                    wf[r][2 * i + 1] = F16W::hi(words[i]);
                }
                scale[r] = __ldg(sc[r] + cu / FP8_BLOCK_CHUNKS);
            }
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float4 a, b, c2, d;
                load_x16<XS>(x + m * ldx, cu, a, b, c2, d);
                const float xs[16] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w,
                                      c2.x, c2.y, c2.z, c2.w, d.x, d.y, d.z, d.w};
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float p = 0.f;
#pragma unroll
                    for (int i = 0; i < 16; ++i) p = fmaf(xs[i], wf[r][i], p);
                    acc[m][r] = fmaf(p, scale[r], acc[m][r]);
                }
            }
        } else if constexpr (WT::SCALED) {
            uint4 lo[R], hi[R];
            float scale[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                fp8_chunk_to_f16(wv[u][r], lo[r], hi[r]);
                scale[r] = __ldg(sc[r] + cu / FP8_BLOCK_CHUNKS);
            }
#pragma unroll
            for (int m = 0; m < M; ++m) {
                float4 a, b, c2, d;
                load_x16<XS>(x + m * ldx, cu, a, b, c2, d);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float p = dot8<F16W>(dot8<F16W>(0.f, lo[r], a, b), hi[r], c2, d);
                    acc[m][r] = fmaf(p, scale[r], acc[m][r]);
                }
            }
        } else {
#pragma unroll
            for (int m = 0; m < M; ++m) {
                const float4* xm = reinterpret_cast<const float4*>(x + m * ldx) + 2 * cu;
                const float4 a = load_x<XS>(xm), b = load_x<XS>(xm + 1);
#pragma unroll
                for (int r = 0; r < R; ++r) acc[m][r] = dot8<WT>(acc[m][r], wv[u][r], a, b);
            }
        }
    }
}

// Per-lane partial sums acc[m][r] += x[m, E*c .. E*c+E] . w[r][E*c .. E*c+E]
// (E = WT::ELEMS) over the 16-byte chunks c = first, first + stride, ... <
// chunks. `x` rows are `ldx` floats apart (16-byte aligned). U chunks of
// every row are loaded before any is used, so U * R loads are in flight per
// lane; the x rows (tiny, shared by all warps) come through the read-only
// cache and are reused across the R rows. `sc`: as for use_chunks.
template <int M, int R, int U, typename WT = Bf16W, bool XS = false>
__device__ __forceinline__ void dot_chunks(float (&acc)[M][R], const uint4* const (&w)[R],
                                           const float* __restrict__ x, size_t ldx, int first,
                                           int stride, int chunks, const float* const (&sc)[R]) {
    for (int c = first; c < chunks; c += U * stride) {
        uint4 wv[U][R];
        load_chunks<R, U>(wv, w, c, stride, chunks);
        use_chunks<M, R, U, WT, XS>(acc, wv, x, ldx, c, stride, chunks, sc);
    }
}

// As use_chunks(wv, first) followed by dot_chunks(first + U * stride), with
// each step's next U chunks requested before the current ones are used, so
// a warp always has loads in flight. Same chunks, same order of sums.
template <int M, int R, int U, typename WT = Bf16W, bool XS = false>
__device__ __forceinline__ void dot_chunks_ahead(float (&acc)[M][R], uint4 (&wv)[U][R], const uint4* const (&w)[R],
                                                 const float* __restrict__ x, size_t ldx, int first, int stride,
                                                 int chunks, const float* const (&sc)[R]) {
    for (int c = first; c < chunks; c += U * stride) {
        uint4 next[U][R];
        load_chunks<R, U>(next, w, c + U * stride, stride, chunks);
        use_chunks<M, R, U, WT, XS>(acc, wv, x, ldx, c, stride, chunks, sc);
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int r = 0; r < R; ++r) wv[u][r] = next[u][r];
    }
}

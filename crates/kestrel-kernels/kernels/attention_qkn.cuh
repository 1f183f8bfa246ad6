// The q/k norm + RoPE + cache write that every attention path starts with
// (attention.cu's kernels, and attention_block.cu's for a drafter's blocks).
#pragma once
#include "common.cuh"

namespace qkn {
__device__ __forceinline__ float kv_load(const __nv_bfloat16* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ void kv_store(__nv_bfloat16* p, float v) { *p = f32_to_bf16(v); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
}  // namespace qkn
using qkn::kv_load;
using qkn::kv_store;

// Per-head RMSNorm + RoPE for q and k, then k and v are written into the
// cache. A block serves QKN_WARPS heads of one token, a warp each (q heads,
// then k heads, then v heads): its threads first form the token's rotary
// angles once (cos and sin of position * inv_freq[j], j < rotary_dim / 2) in
// shared memory. With every warp forming its own angles, the kernel took four
// times as long as its memory traffic; the arithmetic per element is the same (same inv_freq, same
// sincosf argument, same order of operations).
// q goes to `q_out` [T, Hq*D]; k/v go to cache slot `slot_mapping[t]`
// (page * block_size + offset) of a cache laid out [slots, Hkv, D].
// Grid (T, ceil((Hq + 2 Hkv) / QKN_WARPS)), block 32 * QKN_WARPS, dynamic
// shared memory (rotary_dim + QKN_WARPS * D) floats.
constexpr int QKN_WARPS = 8;
template <typename KV>
__device__ __forceinline__ void qk_norm_rope_kv_write_impl(
    const float* __restrict__ proj, int proj_stride, float* __restrict__ q_out, KV* __restrict__ k_cache,
    KV* __restrict__ v_cache, const float* __restrict__ q_norm, const float* __restrict__ k_norm,
    const int* __restrict__ positions, const int* __restrict__ slot_mapping, int hq, int hkv, int d,
    int rotary_dim, float theta, float eps, int k_offset, int v_offset) {
    extern __shared__ float smem_qkn[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x, head = blockIdx.y * QKN_WARPS + warp;
    const int half = rotary_dim / 2;
    float* cos_t = smem_qkn;
    float* sin_t = cos_t + half;
    float* buf = sin_t + half + warp * d;
    const float* row = proj + (size_t)t * proj_stride;
    const int64_t slot = slot_mapping[t];  // 64-bit: slot * hkv * d can pass 2^31

    // inv_freq[j] = theta^(-2j/rotary_dim), rounded once from double.
    const float pos = (float)positions[t];
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        const float inv_freq = (float)pow((double)theta, -2.0 * j / rotary_dim);
        float sn, cs;
        sincosf(pos * inv_freq, &sn, &cs);
        cos_t[j] = cs;
        sin_t[j] = sn;
    }
    __syncthreads();

    if (head >= hq + 2 * hkv) return;
    if (head >= hq + hkv) {  // v head: copy into the cache as is
        const int h = head - hq - hkv;
        const float* src = row + v_offset + h * d;
        KV* dst = v_cache + (slot * hkv + h) * d;
        for (int i = lane; i < d; i += 32) kv_store(dst + i, src[i]);
        return;
    }
    const bool is_q = head < hq;
    const int h = is_q ? head : head - hq;
    const float* src = row + (is_q ? h * d : k_offset + h * d);
    const float* w = is_q ? q_norm : k_norm;

    float ss = 0.f;
    for (int i = lane; i < d; i += 32) {
        const float v = src[i];
        buf[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(warp_sum(ss) / d + eps);
    __syncwarp();  // buf is complete
    for (int i = lane; i < d; i += 32) {
        float v = buf[i] * inv * w[i];
        if (i < rotary_dim) {
            // rotate-half pairing (i, i + half)
            const int j = i < half ? i : i - half;
            const float s = sin_t[j], c = cos_t[j];
            const int pair = i < half ? i + half : i - half;
            const float other = buf[pair] * inv * w[pair];
            v = i < half ? v * c - other * s : v * c + other * s;
        }
        if (is_q) {
            q_out[((size_t)t * hq + h) * d + i] = v;
        } else {
            kv_store(k_cache + (slot * hkv + h) * d + i, v);
        }
    }
}

// Full attention over a paged KV cache: the q/k norm + RoPE + cache write
// shared by every path, and a generic attention kernel for head dims that the
// tensor-core kernels (attention_decode.cu, attention_prefill.cu) do not cover.
// Both come for a bf16 cache (the default) and an f32 cache (`_f32`, the
// reference precision: the generic kernel then serves every head dim).
// Exact math (no fast math): the rotary angles and the softmax must track the
// f32 reference.
#include "common.cuh"

namespace {
__device__ __forceinline__ float kv_load(const __nv_bfloat16* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ float kv_load(const float* p) { return *p; }
__device__ __forceinline__ void kv_store(__nv_bfloat16* p, float v) { *p = f32_to_bf16(v); }
__device__ __forceinline__ void kv_store(float* p, float v) { *p = v; }
}  // namespace

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

#define KESTREL_QKN_ARGS                                                                                        \
    const float *__restrict__ proj, int proj_stride, float *__restrict__ q_out, KV *__restrict__ k_cache,       \
        KV *__restrict__ v_cache, const float *__restrict__ q_norm, const float *__restrict__ k_norm,           \
        const int *__restrict__ positions, const int *__restrict__ slot_mapping, int hq, int hkv,             \
        int d, int rotary_dim, float theta, float eps, int k_offset, int v_offset
#define KESTREL_QKN_CALL                                                                                   \
    pdl_begin();                                                                                           \
    qk_norm_rope_kv_write_impl<KV>(proj, proj_stride, q_out, k_cache, v_cache, q_norm, k_norm, positions, \
                                   slot_mapping, hq, hkv, d, rotary_dim, theta, eps, k_offset, v_offset)
namespace qkn_bf16 { using KV = __nv_bfloat16; KESTREL_EXTERN void qk_norm_rope_kv_write(KESTREL_QKN_ARGS) { KESTREL_QKN_CALL; } }
namespace qkn_f32 { using KV = float; KESTREL_EXTERN void qk_norm_rope_kv_write_f32(KESTREL_QKN_ARGS) { KESTREL_QKN_CALL; } }

// The generic kernel below is simple and slow (no K/V reuse across queries).
constexpr int ATTN_THREADS = 128;
constexpr int ATTN_MAX_DIMS_PER_THREAD = 4;  // head_dim <= 512

// Causal GQA attention of each new token over its sequence's cached tokens
// (positions 0..=pos), online softmax over tiles of ATTN_THREADS keys.
// Grid (Hq, T), block ATTN_THREADS. Optional output gate: out *= sigmoid(gate)
// with gate at proj[t, gate_offset + h*D + i] (gate_offset < 0: none).
// Dynamic shared memory: D floats (q) + ATTN_THREADS floats (scores).
template <typename KV>
__device__ __forceinline__ void paged_attention_impl(float* __restrict__ out, const float* __restrict__ q,
                                                     const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
                                                     const int* __restrict__ positions,
                                                     const int* __restrict__ token_seq,
                                                     const int* __restrict__ seq_table_offset,
                                                     const int* __restrict__ block_tables, int hq, int hkv, int d,
                                                     int block_size, float scale, const float* __restrict__ proj,
                                                     int proj_stride, int gate_offset) {
    extern __shared__ float smem[];
    float* qs = smem;
    float* ps = smem + d;
    __shared__ float scratch[32];
    const int t = blockIdx.y;
    const int h = blockIdx.x;
    const int kvh = h / (hq / hkv);
    const int pos = positions[t];
    const int* table = block_tables + seq_table_offset[token_seq[t]];

    for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = q[((size_t)t * hq + h) * d + i];
    __syncthreads();

    float acc[ATTN_MAX_DIMS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ATTN_MAX_DIMS_PER_THREAD; ++r) acc[r] = 0.f;
    float m = -INFINITY, l = 0.f;

    for (int base = 0; base <= pos; base += ATTN_THREADS) {
        const int key = base + threadIdx.x;
        float s = -INFINITY;
        if (key <= pos) {
            const int64_t slot = (int64_t)table[key / block_size] * block_size + key % block_size;
            const KV* kr = k_cache + (slot * hkv + kvh) * d;
            float dot = 0.f;
            for (int i = 0; i < d; ++i) dot += qs[i] * kv_load(kr + i);
            s = dot * scale;
        }
        const float m_new = fmaxf(m, block_max(s, scratch));
        const float p = key <= pos ? expf(s - m_new) : 0.f;
        ps[threadIdx.x] = p;
        const float tile_sum = block_sum(p, scratch);  // syncs: ps is complete
        const float correction = expf(m - m_new);
        l = l * correction + tile_sum;
        m = m_new;
        const int n = min(ATTN_THREADS, pos + 1 - base);
#pragma unroll
        for (int r = 0; r < ATTN_MAX_DIMS_PER_THREAD; ++r) {
            const int i = threadIdx.x + r * ATTN_THREADS;
            if (i >= d) break;
            float a = acc[r] * correction;
            for (int j = 0; j < n; ++j) {
                const int kj = base + j;
                const int64_t slot = (int64_t)table[kj / block_size] * block_size + kj % block_size;
                a += ps[j] * kv_load(v_cache + (slot * hkv + kvh) * d + i);
            }
            acc[r] = a;
        }
        __syncthreads();  // ps is rewritten by the next tile
    }

    const float inv_l = 1.f / l;
#pragma unroll
    for (int r = 0; r < ATTN_MAX_DIMS_PER_THREAD; ++r) {
        const int i = threadIdx.x + r * ATTN_THREADS;
        if (i >= d) break;
        float o = acc[r] * inv_l;
        if (gate_offset >= 0) o *= sigmoidf_exact(proj[(size_t)t * proj_stride + gate_offset + h * d + i]);
        out[((size_t)t * hq + h) * d + i] = o;
    }
}

#define KESTREL_ATTN_ARGS                                                                                          \
    float *__restrict__ out, const float *__restrict__ q, const KV *__restrict__ k_cache,                         \
        const KV *__restrict__ v_cache, const int *__restrict__ positions, const int *__restrict__ token_seq,    \
        const int *__restrict__ seq_table_offset, const int *__restrict__ block_tables, int hq, int hkv, int d, \
        int block_size, float scale, const float *__restrict__ proj, int proj_stride, int gate_offset
#define KESTREL_ATTN_CALL                                                                                        \
    pdl_begin();                                                                                                 \
    paged_attention_impl<KV>(out, q, k_cache, v_cache, positions, token_seq, seq_table_offset, block_tables, hq, \
                             hkv, d, block_size, scale, proj, proj_stride, gate_offset)
namespace attn_bf16 { using KV = __nv_bfloat16; KESTREL_EXTERN void paged_attention(KESTREL_ATTN_ARGS) { KESTREL_ATTN_CALL; } }
namespace attn_f32 { using KV = float; KESTREL_EXTERN void paged_attention_f32(KESTREL_ATTN_ARGS) { KESTREL_ATTN_CALL; } }

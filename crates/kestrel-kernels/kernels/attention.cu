// Full attention over a paged KV cache: the q/k norm + RoPE + cache write
// shared by every path, and a generic attention kernel for head dims that the
// tensor-core kernels (attention_decode.cu, attention_prefill.cu) do not cover.
// Both come for a bf16 cache (the default) and an f32 cache (`_f32`, the
// reference precision: the generic kernel then serves every head dim).
// Exact math (no fast math): the rotary angles and the softmax must track the
// f32 reference.
#include "attention_qkn.cuh"

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

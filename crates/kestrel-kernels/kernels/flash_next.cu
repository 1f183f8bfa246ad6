// Qwen3.8-Flash-Next's own operations (`FlashNextOps`): the four-stream
// hyper-connections (grouped RMSNorm, the low-rank gate's activation, the
// stream mean, the inject), the PLE layer's per-stream gate and dilated causal
// conv, and the QSA indexer's raw-key store, pooled keys of the blocks a step
// completes and block scores. Exact math (no fast math): everything here feeds a sigmoid, a norm
// or the indexer's top-k, whose choice of blocks decides what attention reads.
// Where the host reference (`kestrel_core::flash_next::host`) forms a sum in a
// fixed order that is cheap to keep (the conv, the block pooling), the kernel
// keeps it with explicit roundings.
#include <cuda_fp16.h>

#include "common.cuh"
#include "kestrel_abi.h"

// out[t, s * cols + j] = x[t, j] for every stream s.
// Grid (ceil(cols / 256), T), block 256.
KESTREL_EXTERN void hc_repeat_streams(float* __restrict__ out, const float* __restrict__ x, int cols, int streams) {
    pdl_begin();
    const int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= cols) return;
    const float v = x[(size_t)t * cols + j];
    for (int s = 0; s < streams; ++s) out[((size_t)t * streams + s) * cols + j] = v;
}

// RMSNorm of every `group`-wide slice of rows `cols` wide:
// out = (x * (1 / sqrt(mean(x^2) + eps))) * w, `w` as wide as a row.
// Grid (cols / group, T), block 256.
KESTREL_EXTERN void hc_grouped_rms_norm(float* __restrict__ out, const float* __restrict__ x,
                                        const float* __restrict__ w, int cols, int group, float eps) {
    pdl_begin();
    __shared__ float scratch[32];
    const size_t base = (size_t)blockIdx.y * cols + (size_t)blockIdx.x * group;
    const float* xr = x + base;
    float ss = 0.f;
    for (int i = threadIdx.x; i < group; i += blockDim.x) ss = __fmaf_rn(xr[i], xr[i], ss);
    const float inv = 1.f / sqrtf(block_sum(ss, scratch) / group + eps);
    const float* wg = w + (size_t)blockIdx.x * group;
    for (int i = threadIdx.x; i < group; i += blockDim.x) out[base + i] = (xr[i] * inv) * wg[i];
}

// out = silu(x / divisor), elementwise over n values. Grid ceil(n / 256), block 256.
KESTREL_EXTERN void hc_scaled_silu(float* __restrict__ out, const float* __restrict__ x, int n, float divisor) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = siluf_exact(x[i] / divisor);
}

// The sublayer input: out[t, j] = (sum over s of sigmoid(gate[t, s, j]) * normed[t, s, j]) / streams,
// streams added in order. Grid (ceil(hidden / 256), T), block 256.
KESTREL_EXTERN void hc_mix(float* __restrict__ out, const float* __restrict__ normed, const float* __restrict__ gate,
                           int hidden, int streams) {
    pdl_begin();
    const int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= hidden) return;
    float acc = 0.f;
    for (int s = 0; s < streams; ++s) {
        const size_t i = ((size_t)t * streams + s) * hidden + j;
        acc = __fadd_rn(acc, __fmul_rn(sigmoidf_exact(gate[i]), normed[i]));
    }
    out[(size_t)t * hidden + j] = acc / (float)streams;
}

// x[t, s, j] += out[t, j] * (2 * sigmoid(inject[t, s] / streams)).
// Grid (ceil(hidden / 256), T), block 256.
KESTREL_EXTERN void hc_inject(float* __restrict__ x, const float* __restrict__ out, const float* __restrict__ inject,
                              int hidden, int streams) {
    pdl_begin();
    const int t = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= hidden) return;
    const float o = out[(size_t)t * hidden + j];
    for (int s = 0; s < streams; ++s) {
        const float w = 2.f * sigmoidf_exact(inject[(size_t)t * streams + s] / (float)streams);
        float* d = x + ((size_t)t * streams + s) * hidden + j;
        *d = __fadd_rn(*d, __fmul_rn(o, w));
    }
}

// What comes before a sublayer, one block a token row (grid T, block 256):
// the previous sublayer's output added to every stream as hc_inject does,
// then each stream's RMSNorm as hc_grouped_rms_norm does (same thread count
// and order of additions, so the same values), then the inject logits
// logits[t, r] = sum over the row of normed * inject[r, :]. The thread that
// updates an element of x also normalises it: no barrier between the passes
// beyond the norms' sums.
KESTREL_EXTERN void hc_norm(const __grid_constant__ HcNormArgs a) {
    pdl_begin();
    __shared__ float scratch[32];
    __shared__ float inv[HC_MAX_STREAMS];
    const int t = blockIdx.x, hidden = a.hidden, streams = a.streams, width = hidden * streams;
    float* xr = a.x + (size_t)t * width;
    for (int s = 0; s < streams; ++s) {
        float* xs = xr + (size_t)s * hidden;
        float ss = 0.f;
        if (a.out != nullptr) {
            const float w = 2.f * sigmoidf_exact(a.out_logits[(size_t)t * streams + s] / (float)streams);
            const float* o = a.out + (size_t)t * hidden;
            for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
                const float v = __fadd_rn(xs[j], __fmul_rn(o[j], w));
                xs[j] = v;
                ss = __fmaf_rn(v, v, ss);
            }
        } else {
            for (int j = threadIdx.x; j < hidden; j += blockDim.x) ss = __fmaf_rn(xs[j], xs[j], ss);
        }
        const float total = block_sum(ss, scratch);
        if (threadIdx.x == 0) inv[s] = 1.f / sqrtf(total / hidden + a.eps);
    }
    __syncthreads();
    float acc[HC_MAX_STREAMS];
#pragma unroll
    for (int r = 0; r < HC_MAX_STREAMS; ++r) acc[r] = 0.f;
    float* nr = a.normed + (size_t)t * width;
    for (int s = 0; s < streams; ++s) {
        const float is = inv[s];
        for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
            const int c = s * hidden + j;
            const float v = (xr[c] * is) * a.norm_w[c];
            nr[c] = v;
            if (a.inject != nullptr) {
#pragma unroll
                for (int r = 0; r < HC_MAX_STREAMS; ++r) {
                    if (r >= streams) break;
                    const uint16_t bits = a.inject[(size_t)r * width + c];
                    const float w = a.inject_f16 ? __half2float(__ushort_as_half(bits))
                                                 : __bfloat162float(__ushort_as_bfloat16(bits));
                    acc[r] = __fmaf_rn(v, w, acc[r]);
                }
            }
        }
    }
    if (a.inject == nullptr) return;
    for (int r = 0; r < streams; ++r) {
        const float total = block_sum(acc[r], scratch);
        if (threadIdx.x == 0) a.logits[(size_t)t * streams + r] = total;
    }
}

// Eight 16-bit weights as floats.
__device__ __forceinline__ void hc_weights8(const uint16_t* __restrict__ w, bool f16, float out[8]) {
    const uint4 v = *reinterpret_cast<const uint4*>(w);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const uint16_t lo = (uint16_t)(words[i] & 0xffffu), hi = (uint16_t)(words[i] >> 16);
        out[2 * i] = f16 ? __half2float(__ushort_as_half(lo)) : __bfloat162float(__ushort_as_bfloat16(lo));
        out[2 * i + 1] = f16 ? __half2float(__ushort_as_half(hi)) : __bfloat162float(__ushort_as_bfloat16(hi));
    }
}

// acc + x[0..8] . w, the products added in order (x 16-byte aligned).
__device__ __forceinline__ float hc_dot8(const float* __restrict__ x, const float w[8], float acc) {
    const float4 lo = reinterpret_cast<const float4*>(x)[0], hi = reinterpret_cast<const float4*>(x)[1];
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) acc = __fmaf_rn(v[i], w[i], acc);
    return acc;
}

constexpr int HC_LOW_WARPS_PER_ROW = 4;

// The low-rank gate's first product and activation of a decode-shaped step
// (at most HC_GATE_MAX_ROWS tokens): low[t, r] = silu((normed[t] . down[r]) /
// streams), as the product then hc_scaled_silu compute it. Two rows of
// `down` a block, four warps a row, each over a quarter of the row's
// 8-element chunks. Grid ceil(rank / 2), block 256. Needs width and rank
// multiples of 8.
KESTREL_EXTERN void hc_low_rank(const __grid_constant__ HcGateArgs a) {
    pdl_begin();
    __shared__ float partial[8][HC_GATE_MAX_ROWS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r = blockIdx.x * 2 + warp / HC_LOW_WARPS_PER_ROW, quarter = warp % HC_LOW_WARPS_PER_ROW;
    const int width = a.hidden * a.streams, chunks = width / 8, T = a.rows;
    float acc[HC_GATE_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) acc[t] = 0.f;
    if (r < a.rank) {
        const int c0 = quarter * chunks / HC_LOW_WARPS_PER_ROW, c1 = (quarter + 1) * chunks / HC_LOW_WARPS_PER_ROW;
        for (int c = c0 + lane; c < c1; c += 32) {
            float w[8];
            hc_weights8(a.down + (size_t)r * width + 8 * c, a.f16, w);
#pragma unroll
            for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) {
                if (t >= T) break;
                acc[t] = hc_dot8(a.normed + (size_t)t * width + 8 * c, w, acc[t]);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) partial[warp][t] = v;
    }
    __syncthreads();
    // Thread (row i, token t) adds its row's four quarters in order.
    const int i = threadIdx.x / HC_GATE_MAX_ROWS, t = threadIdx.x % HC_GATE_MAX_ROWS;
    const int row = blockIdx.x * 2 + i;
    if (i < 2 && t < T && row < a.rank) {
        float sum = 0.f;
        for (int q = 0; q < HC_LOW_WARPS_PER_ROW; ++q) sum = __fadd_rn(sum, partial[i * HC_LOW_WARPS_PER_ROW + q][t]);
        a.low[(size_t)t * a.rank + row] = siluf_exact(sum / (float)a.streams);
    }
}

// The gate's second product and the stream mean of a decode-shaped step:
// mixed[t, j] = (sum over s of sigmoid(low[t] . up[s * hidden + j]) *
// normed[t, s * hidden + j]) / streams, streams added in order as hc_mix
// does. A warp per j (its rows of `up` for every stream), 8 a block.
// Grid ceil(hidden / 8), block 256. Needs rank a multiple of 8.
KESTREL_EXTERN void hc_gate_mix(const __grid_constant__ HcGateArgs a) {
    pdl_begin();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * 8 + warp;
    if (j >= a.hidden) return;
    const int width = a.hidden * a.streams, chunks = a.rank / 8, T = a.rows;
    float mixed[HC_GATE_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) mixed[t] = 0.f;
    for (int s = 0; s < a.streams; ++s) {
        const int row = s * a.hidden + j;
        float acc[HC_GATE_MAX_ROWS];
#pragma unroll
        for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) acc[t] = 0.f;
        for (int c = lane; c < chunks; c += 32) {
            float w[8];
            hc_weights8(a.up + (size_t)row * a.rank + 8 * c, a.f16, w);
#pragma unroll
            for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) {
                if (t >= T) break;
                acc[t] = hc_dot8(a.low + (size_t)t * a.rank + 8 * c, w, acc[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < HC_GATE_MAX_ROWS; ++t) {
            if (t >= T) break;
            const float g = warp_sum(acc[t]);
            const float n = a.normed[(size_t)t * width + row];
            mixed[t] = __fadd_rn(mixed[t], __fmul_rn(sigmoidf_exact(g), n));
        }
    }
#pragma unroll
    for (int t = 0; t < HC_GATE_MAX_ROWS; ++t)
        if (t < T && lane == t) a.mixed[(size_t)t * a.hidden + j] = mixed[t] / (float)a.streams;
}

// The PLE gate of one stream of one token: a = key_n . query_n / sqrt(hidden),
// g = sign(a) * sqrt(max(|a|, 1e-6)), gated[t, s, :] = sigmoid(g) * value[t, :].
// key_n and query_n are [T, streams * hidden] (normalised per stream).
// Grid (streams, T), block 256.
KESTREL_EXTERN void ple_gate(float* __restrict__ gated, const float* __restrict__ key_n,
                             const float* __restrict__ query_n, const float* __restrict__ value, int hidden,
                             int streams) {
    pdl_begin();
    __shared__ float scratch[32];
    const int t = blockIdx.y, s = blockIdx.x;
    const size_t row = ((size_t)t * streams + s) * hidden;
    float d = 0.f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) d = __fmaf_rn(key_n[row + i], query_n[row + i], d);
    const float a = block_sum(d, scratch) / sqrtf((float)hidden);
    const float sign = a > 0.f ? 1.f : (a < 0.f ? -1.f : 0.f);
    const float w = sigmoidf_exact(sqrtf(fmaxf(fabsf(a), 1e-6f)) * sign);
    const float* v = value + (size_t)t * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) gated[row + i] = w * v[i];
}

// The PLE output: out = gated + silu(depthwise causal conv of `normed` with
// `kernel` taps `dilation` apart), each sequence continuing from its slot's
// `(kernel - 1) * dilation` past inputs in `state` ([slots * len, width],
// oldest first). The window after token i also goes to `token_ckpt[i]` when
// that is a slot (speculative checkpoints, the prefix cache's in-pass
// snapshot), and the window after the last token back to the sequence's slot.
// Taps are summed oldest input first, as the host does. A thread per
// (sequence, channel): grid (ceil(width / 128), S), block 128.
KESTREL_EXTERN void ple_conv_add(float* __restrict__ out, const float* __restrict__ gated,
                                 const float* __restrict__ normed, const float* __restrict__ taps,
                                 float* __restrict__ state, const int* __restrict__ seq_start,
                                 const int* __restrict__ seq_slot, const int* __restrict__ token_ckpt, int width,
                                 int kernel, int dilation) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, s = blockIdx.y;
    if (c >= width) return;
    const int len = (kernel - 1) * dilation;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    const int64_t slot = seq_slot[s];
    float past[PLE_MAX_STATE];
    for (int r = 0; r < len; ++r) past[r] = state[(slot * len + r) * width + c];
    // Input `row` of the sequence's run: past inputs, then the new ones.
    auto input = [&](int row) { return row < len ? past[row] : normed[(size_t)(start + row - len) * width + c]; };
    for (int i = 0; i < n; ++i) {
        float acc = 0.f;
        for (int j = 0; j < kernel; ++j)
            acc = __fadd_rn(acc, __fmul_rn(taps[c * kernel + j], input(len + i - (kernel - 1 - j) * dilation)));
        const size_t o = (size_t)(start + i) * width + c;
        out[o] = __fadd_rn(gated[o], siluf_exact(acc));
        const int64_t ckpt = token_ckpt[start + i];
        if (ckpt >= 0)
            for (int r = 0; r < len; ++r) state[(ckpt * len + r) * width + c] = input(i + 1 + r);
    }
    // Every read of `past` is done: the slot's own window last.
    for (int r = 0; r < len; ++r) state[(slot * len + r) * width + c] = input(n + r);
}

// The indexer's raw key of every new token into its paged row:
// keys[slot_mapping[t], :] = proj[t, key_col : key_col + d]. Grid T, block 128.
KESTREL_EXTERN void qsa_store_keys(float* __restrict__ keys, const float* __restrict__ proj, int proj_stride,
                                   int key_col, const int* __restrict__ slot_mapping, int d) {
    pdl_begin();
    const int t = blockIdx.x;
    const int64_t slot = slot_mapping[t];
    if (slot < 0) return;  // a token without a page (the attention kernels report it)
    for (int i = threadIdx.x; i < d; i += blockDim.x) keys[slot * d + i] = proj[(size_t)t * proj_stride + key_col + i];
}

// RoPE's cos and sin at `pos` for pair j, in the host's f32 arithmetic:
// angle = pos * (1 / theta^(2j / rotary_dim)).
__device__ __forceinline__ void qsa_rope(int pos, int j, int rotary_dim, float theta, float* c, float* s) {
    const float inv_freq = 1.f / powf(theta, (float)(2 * j) / (float)rotary_dim);
    const float angle = (float)pos * inv_freq;
    *c = cosf(angle);
    *s = sinf(angle);
}

// Row of the pooled-key store holding block b of a sequence (pages of
// `block_size` positions, `block_size / ratio` pooled rows each).
__device__ __forceinline__ int64_t qsa_pooled_row(const int* table, int block_size, int ratio, int b) {
    const int first = b * ratio;
    return (int64_t)table[first / block_size] * (block_size / ratio) + first % block_size / ratio;
}

// The pooled, normalised and rotated key of each block this step completes:
// new token i (at `positions[i]`, of sequence `token_seq[i]`) completes block
// b when its position is the block's last, and then block b is the f32 mean
// of the raw keys at positions b * ratio .. (b + 1) * ratio (added in order,
// then divided), its RMSNorm times `k_norm`, rotated at position b * ratio,
// written to its row of `pooled`. The step's layout decides which tokens
// pool, so a recorded decode step replays it with no host list. A warp per
// new token, head dims up to QSA_MAX_HEAD_DIM: grid ceil(tokens /
// QSA_WARPS), block 32 * QSA_WARPS, dynamic shared memory QSA_WARPS * d floats.
KESTREL_EXTERN void qsa_pool_blocks(float* __restrict__ pooled, const float* __restrict__ keys,
                                    const int* __restrict__ positions, const int* __restrict__ token_seq,
                                    int tokens, const int* __restrict__ table_offset,
                                    const int* __restrict__ block_tables, const float* __restrict__ k_norm,
                                    int block_size, int ratio, int d, int rotary_dim, float theta, float eps) {
    pdl_begin();
    extern __shared__ float smem_bk[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * (blockDim.x >> 5) + warp;
    if (i >= tokens) return;
    const int end = positions[i] + 1;
    if (end % ratio != 0) return;
    const int s = token_seq[i], b = end / ratio - 1;
    const int* table = block_tables + table_offset[s];
    float* buf = smem_bk + warp * d;
    float ss = 0.f;
    for (int j = lane; j < d; j += 32) {
        float acc = 0.f;
        for (int p = b * ratio; p < (b + 1) * ratio; ++p) {
            const int64_t row = (int64_t)table[p / block_size] * block_size + p % block_size;
            acc = __fadd_rn(acc, keys[row * d + j]);
        }
        acc = acc / (float)ratio;
        buf[j] = acc;
        ss = __fmaf_rn(acc, acc, ss);
    }
    const float inv = 1.f / sqrtf(warp_sum(ss) / d + eps);
    __syncwarp();
    for (int j = lane; j < d; j += 32) buf[j] = (buf[j] * inv) * k_norm[j];
    __syncwarp();
    const int half = rotary_dim / 2;
    float* dst = pooled + qsa_pooled_row(table, block_size, ratio, b) * d;
    for (int j = lane; j < d; j += 32) {
        float v = buf[j];
        if (j < rotary_dim) {
            const int k = j < half ? j : j - half;
            float c, sn;
            qsa_rope(b * ratio, k, rotary_dim, theta, &c, &sn);
            v = j < half ? buf[j] * c + (-buf[j + half]) * sn : buf[j] * c + buf[j - half] * sn;
        }
        dst[j] = v;
    }
}

// Block scores of the tokens that choose: for scored token u (token
// `rows[4u]` of sequence `rows[4u + 1]`, with `rows[4u + 2]` complete blocks,
// written from scores[rows[4u + 3]]), score[b] = sum over heads h of
// relu(q[t, h] . pooled key of block b) / sqrt(d), q already normalised and
// rotated ([T, heads * d]). A warp per block, head dims up to
// QSA_MAX_HEAD_DIM: grid (ceil(max blocks / QSA_WARPS), scored tokens), block
// 32 * QSA_WARPS, dynamic shared memory heads * d floats (the token's queries).
KESTREL_EXTERN void qsa_scores(float* __restrict__ scores, const float* __restrict__ q,
                               const float* __restrict__ pooled, const int* __restrict__ rows,
                               const int* __restrict__ table_offset, const int* __restrict__ block_tables,
                               int block_size, int ratio, int heads, int d) {
    pdl_begin();
    extern __shared__ float smem_q[];
    const int u = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = rows[4 * u], seq = rows[4 * u + 1], blocks = rows[4 * u + 2], out = rows[4 * u + 3];
    for (int i = threadIdx.x; i < heads * d; i += blockDim.x) smem_q[i] = q[(size_t)t * heads * d + i];
    __syncthreads();
    const int b = blockIdx.x * (blockDim.x >> 5) + warp;
    if (b >= blocks) return;
    const float* k = pooled + qsa_pooled_row(block_tables + table_offset[seq], block_size, ratio, b) * d;
    constexpr int PER_LANE = QSA_MAX_HEAD_DIM / 32;
    float kv[PER_LANE];
#pragma unroll
    for (int m = 0; m < PER_LANE; ++m) kv[m] = lane + 32 * m < d ? k[lane + 32 * m] : 0.f;
    float total = 0.f;
    for (int h = 0; h < heads; ++h) {
        float dot = 0.f;
#pragma unroll
        for (int m = 0; m < PER_LANE; ++m)
            if (lane + 32 * m < d) dot = __fmaf_rn(smem_q[h * d + lane + 32 * m], kv[m], dot);
        total = __fadd_rn(total, fmaxf(warp_sum(dot), 0.f));
    }
    if (lane == 0) scores[out + b] = total / sqrtf((float)d);
}

// Gated DeltaNet, the general kernels: the causal depthwise conv with carried
// state (all steps), the token-by-token delta rule (the fallback for shapes the
// specialised kernels of gdn_decode.cu / gdn_chunk.cu do not cover), and the
// gated RMSNorm. Exact math throughout: the decay
// exp(-exp(A_log) * softplus(a + dt_bias)) compounds over tokens.
#include <type_traits>

#include "gdn.cuh"
#include "kestrel_abi.h"

constexpr int GDN_CONV_TOKENS = 64;  // tokens per block of gdn_conv

// Per (sequence, channel, tile of 64 new tokens):
//   out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c])
// where inputs before the sequence's new tokens come from
// conv_state[slot, c, 0..K-1] (oldest first). Tiling the tokens keeps long
// prompts parallel; only tile 0 reads the old state, so tile 0 also writes the
// new one (the last K-1 inputs) once it has read it. A thread owns V adjacent
// channels: V = 4 (16-byte loads and stores, when the rows allow them) keeps
// four times the bytes in flight per thread, which an 8K-token prefill needs
// to stream its ~0.5 GB per layer near the HBM rate; it is built for conv
// kernels of at most KMAX = 4 taps (Qwen3.5/3.6, Qwen3-Next), so that its
// windows fit in registers (sized for 8 taps it took 165 registers a thread
// and ran slower than V = 1).
// token_ckpt[t] >= 0 (speculative verification) also stores the state after
// token t (its window) in that slot.
// Grid (ceil(C/(128 V)), ceil(max_new/64), S), block 128.
template <int V, int KMAX>
__device__ __forceinline__ void gdn_conv_body(float* __restrict__ out, const float* __restrict__ proj,
                                              int proj_stride, const __nv_bfloat16* __restrict__ conv_w,
                                              float* __restrict__ conv_state, const int* __restrict__ seq_start,
                                              const int* __restrict__ seq_slot,
                                              const int* __restrict__ token_ckpt, int channels, int kernel) {
    using Vec = typename std::conditional<V == 4, float4, float>::type;
    const int c = (blockIdx.x * blockDim.x + threadIdx.x) * V;
    const int tile = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    const int t0 = tile * GDN_CONV_TOKENS;
    if (c >= channels || t0 >= n) return;
    const int hist = kernel - 1;
    const float* x = proj + (size_t)start * proj_stride + c;  // x[i * proj_stride]: new input i
    auto input = [&](int i) { return *reinterpret_cast<const Vec*>(x + (size_t)i * proj_stride); };
    auto lane = [](const Vec& v, int e) -> float {
        if constexpr (V == 4) return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
        else return v;
    };
    float window[V][KMAX];  // the `hist` inputs before the current token, oldest first
    float w[V][KMAX];
#pragma unroll
    for (int e = 0; e < V; ++e) {
        const float* st = conv_state + ((size_t)seq_slot[s] * channels + c + e) * hist;
#pragma unroll
        for (int j = 0; j < KMAX; ++j) {
            if (j < kernel) w[e][j] = bf16_to_f32(conv_w[(size_t)(c + e) * kernel + j]);
            if (j < hist) {
                const int i = t0 - hist + j;
                window[e][j] = i >= 0 ? x[(size_t)i * proj_stride + e] : st[hist + i];
            }
        }
    }
    const int t1 = min(t0 + GDN_CONV_TOKENS, n);
    // Unrolled so that several tokens' loads are in flight at once.
#pragma unroll 8
    for (int t = t0; t < t1; ++t) {
        const Vec xt = input(t);
        float res[V];
#pragma unroll
        for (int e = 0; e < V; ++e) {
            const float xe = lane(xt, e);
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j)
                if (j < hist) acc += w[e][j] * window[e][j];
            acc += w[e][hist] * xe;
            res[e] = siluf_exact(acc);
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j)
                if (j < hist) window[e][j] = j + 1 < hist ? window[e][j + 1] : xe;
        }
        const int ckpt = token_ckpt[start + t];
        if (ckpt >= 0) {
#pragma unroll
            for (int e = 0; e < V; ++e) {
                float* st = conv_state + ((size_t)ckpt * channels + c + e) * hist;
#pragma unroll
                for (int j = 0; j < KMAX - 1; ++j)
                    if (j < hist) st[j] = window[e][j];
            }
        }
        float* o = out + (size_t)(start + t) * channels + c;
        if constexpr (V == 4) *reinterpret_cast<float4*>(o) = make_float4(res[0], res[1], res[2], res[3]);
        else o[0] = res[0];
    }
    if (tile == 0) {
        // New state: inputs n-hist..n-1 of [old state ; new inputs].
#pragma unroll
        for (int e = 0; e < V; ++e) {
            float* st = conv_state + ((size_t)seq_slot[s] * channels + c + e) * hist;
            float next[KMAX];
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j) {
                if (j < hist) {
                    const int i = n - hist + j;
                    next[j] = i >= 0 ? x[(size_t)i * proj_stride + e] : st[hist + i];
                }
            }
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j)
                if (j < hist) st[j] = next[j];
        }
    }
}

// One channel per thread: any shape.
KESTREL_EXTERN void gdn_conv(float* __restrict__ out, const float* __restrict__ proj, int proj_stride,
                             const __nv_bfloat16* __restrict__ conv_w, float* __restrict__ conv_state,
                             const int* __restrict__ seq_start, const int* __restrict__ seq_slot,
                             const int* __restrict__ token_ckpt, int channels, int kernel) {
    pdl_begin();
    gdn_conv_body<1, GDN_MAX_KERNEL>(out, proj, proj_stride, conv_w, conv_state, seq_start, seq_slot, token_ckpt,
                                     channels, kernel);
}

// Four channels per thread: channels and proj_stride multiples of 4, proj
// and out 16-byte aligned, kernel <= 4 (ops/gdn/ checks).
KESTREL_EXTERN void gdn_conv_v4(float* __restrict__ out, const float* __restrict__ proj, int proj_stride,
                                const __nv_bfloat16* __restrict__ conv_w, float* __restrict__ conv_state,
                                const int* __restrict__ seq_start, const int* __restrict__ seq_slot,
                                const int* __restrict__ token_ckpt, int channels, int kernel) {
    pdl_begin();
    gdn_conv_body<4, 4>(out, proj, proj_stride, conv_w, conv_state, seq_start, seq_slot, token_ckpt, channels,
                        kernel);
}

constexpr int GDN_COLS = GDN_COLS_PER_BLOCK;  // value columns per block (src/abi.rs)
constexpr int GDN_GROUPS = 4;   // key-row groups per block
// Delta rule per (sequence, value head, 32-column chunk of Dv), tokens in order:
//   S *= exp(g); delta = (v - S^T k) * beta; S += k delta^T; o = S^T q
// with q, k L2-normalised (eps 1e-6), q scaled by Dk^-0.5, q/k heads shared
// by Hv/Hk value heads, g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
// State [slot, Hv, Dk, Dv] f32; token_ckpt[t] >= 0 also receives the state
// after token t. Grid (ceil(Dv/32), Hv, S), block 128.
// Dynamic shared memory: (Dk*32 + 2*Dk) floats.
KESTREL_EXTERN void gdn_recurrent(const __grid_constant__ GdnRecurrentArgs args) {
    pdl_begin();
    float* __restrict__ core = args.core;
    const float* __restrict__ qkv = args.qkv;
    const float* __restrict__ proj = args.proj;
    const float* __restrict__ a_log = args.a_log;
    const float* __restrict__ dt_bias = args.dt_bias;
    float* __restrict__ state = args.state;
    const int* __restrict__ seq_start = args.seq_start;
    const int* __restrict__ seq_slot = args.seq_slot;
    const int* __restrict__ token_ckpt = args.token_ckpt;
    const int proj_stride = args.proj_stride, b_offset = args.b_offset, a_offset = args.a_offset;
    const int hk = args.hk, hv = args.hv, dk = args.dk, dv = args.dv;
    extern __shared__ float smem[];
    float* S = smem;                // [dk][GDN_COLS]
    float* qs = S + dk * GDN_COLS;  // [dk]
    float* ks = qs + dk;            // [dk]
    __shared__ float partial[GDN_GROUPS][GDN_COLS];
    __shared__ float scratch[32];
    __shared__ float gate[2];

    const int col0 = blockIdx.x * GDN_COLS;
    const int h = blockIdx.y;
    const int s = blockIdx.z;
    const int kh = h / (hv / hk);
    const int c = threadIdx.x % GDN_COLS;
    const int g = threadIdx.x / GDN_COLS;
    const int col = col0 + c;
    const bool live = col < dv;
    const int conv_dim = 2 * hk * dk + hv * dv;
    float* st = state + ((size_t)seq_slot[s] * hv + h) * dk * dv;

    for (int r = g; r < dk; r += GDN_GROUPS) S[r * GDN_COLS + c] = live ? st[(size_t)r * dv + col] : 0.f;

    const float q_scale = rsqrtf((float)dk);
    for (int t = seq_start[s]; t < seq_start[s + 1]; ++t) {
        const float* row = qkv + (size_t)t * conv_dim;
        float qq = 0.f, kk = 0.f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            const float qv = row[kh * dk + i], kv = row[hk * dk + kh * dk + i];
            qs[i] = qv;
            ks[i] = kv;
            qq += qv * qv;
            kk += kv * kv;
        }
        const float q_inv = rsqrtf(block_sum(qq, scratch) + 1e-6f) * q_scale;
        const float k_inv = rsqrtf(block_sum(kk, scratch) + 1e-6f);
        if (threadIdx.x == 0) {
            const float* pr = proj + (size_t)t * proj_stride;
            gate[0] = expf(gdn_log_decay(pr[a_offset + h], a_log[h], dt_bias[h]));
            gate[1] = sigmoidf_exact(pr[b_offset + h]);
        }
        __syncthreads();
        const float decay = gate[0], beta = gate[1];

        // kv_mem = (decay * S)^T k
        float acc = 0.f;
        for (int r = g; r < dk; r += GDN_GROUPS) acc += S[r * GDN_COLS + c] * ks[r];
        partial[g][c] = acc;
        __syncthreads();
        float kv_mem = 0.f;
#pragma unroll
        for (int j = 0; j < GDN_GROUPS; ++j) kv_mem += partial[j][c];
        kv_mem *= decay * k_inv;
        const float v = live ? row[2 * hk * dk + h * dv + col] : 0.f;
        const float delta = (v - kv_mem) * beta;
        __syncthreads();  // partial is reused below

        float o = 0.f;
        const int ckpt = token_ckpt[t];
        float* ckpt_st = ckpt >= 0 && live ? state + ((size_t)ckpt * hv + h) * dk * dv : nullptr;
        for (int r = g; r < dk; r += GDN_GROUPS) {
            const float updated = S[r * GDN_COLS + c] * decay + ks[r] * k_inv * delta;
            S[r * GDN_COLS + c] = updated;
            o += updated * qs[r];
            // The state after token t, for a verify step's checkpoint.
            if (ckpt_st) ckpt_st[(size_t)r * dv + col] = updated;
        }
        partial[g][c] = o;
        __syncthreads();
        if (g == 0 && live) {
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < GDN_GROUPS; ++j) sum += partial[j][c];
            core[(size_t)t * hv * dv + h * dv + col] = sum * q_inv;
        }
        __syncthreads();  // qs/ks/partial are rewritten by the next token
    }
    for (int r = g; r < dk; r += GDN_GROUPS)
        if (live) st[(size_t)r * dv + col] = S[r * GDN_COLS + c];
}

// out[t, h*Dv + i] = w[i] * rms_norm(core[t, h, :])[i] * act(z[t, h*Dv + i]),
// act SiLU, or sigmoid with `sigmoid_gate` (Qwen3.8-Flash-Next's gate),
// z at proj[t, z_offset + ...]. One warp per (token, head) row, Dv <= 256
// (up to 8 values per lane, kept in registers): a block per row spent most
// of an 8K prefill's ~260K tiny blocks on scheduling and barriers.
// out_bf16, when not null, also receives out rounded to bf16 (the input of
// a prefill's cuBLAS out_proj). Grid ceil(T * Hv / 8), block 256.
constexpr int GATED_NORM_MAX_PER_LANE = 8;
KESTREL_EXTERN void gdn_gated_norm(float* __restrict__ out, __nv_bfloat16* __restrict__ out_bf16,
                                   const float* __restrict__ core,
                                   const float* __restrict__ proj, int proj_stride, int z_offset,
                                   const float* __restrict__ w, int hv, int dv, float eps, int rows,
                                   int sigmoid_gate) {
    pdl_begin();
    auto act = [sigmoid_gate](float z) { return sigmoid_gate ? sigmoidf_exact(z) : siluf_exact(z); };
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int t = row / hv, h = row % hv;
    // core and out are [T, Hv * Dv]: row (t, h) starts at row * Dv.
    const float* o = core + (size_t)row * dv;
    if (dv == 128 && proj_stride % 4 == 0 && z_offset % 4 == 0) {
        // One 16-byte access per lane and tensor (4-byte ones fell well
        // short of the memory bandwidth).
        const float4 a = reinterpret_cast<const float4*>(o)[lane];
        const float inv = rsqrtf(warp_sum(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w) / dv + eps);
        const float4 zq = reinterpret_cast<const float4*>(proj + (size_t)t * proj_stride + z_offset + h * dv)[lane];
        const float4 wq = reinterpret_cast<const float4*>(w)[lane];
        const float4 y = make_float4(wq.x * (a.x * inv) * act(zq.x), wq.y * (a.y * inv) * act(zq.y),
                                     wq.z * (a.z * inv) * act(zq.z), wq.w * (a.w * inv) * act(zq.w));
        reinterpret_cast<float4*>(out + (size_t)row * dv)[lane] = y;
        if (out_bf16 != nullptr)
            reinterpret_cast<uint2*>(out_bf16 + (size_t)row * dv)[lane] =
                make_uint2(pack_bf16(y.x, y.y), pack_bf16(y.z, y.w));
        return;
    }
    float v[GATED_NORM_MAX_PER_LANE];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < GATED_NORM_MAX_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        v[j] = i < dv ? o[i] : 0.f;
        ss += v[j] * v[j];
    }
    const float inv = rsqrtf(warp_sum(ss) / dv + eps);
    const float* z = proj + (size_t)t * proj_stride + z_offset + h * dv;
#pragma unroll
    for (int j = 0; j < GATED_NORM_MAX_PER_LANE; ++j) {
        const int i = lane + 32 * j;
        if (i < dv) {
            const float y = w[i] * (v[j] * inv) * act(z[i]);
            out[(size_t)row * dv + i] = y;
            if (out_bf16 != nullptr) out_bf16[(size_t)row * dv + i] = f32_to_bf16(y);
        }
    }
}

// Gated DeltaNet, the general kernels: the causal depthwise conv with carried
// state (all steps), the token-by-token delta rule (the fallback for shapes the
// specialised kernels of gdn_decode.cu / gdn_chunk.cu do not cover), and the
// gated RMSNorm. Exact math throughout: the decay
// exp(-exp(A_log) * softplus(a + dt_bias)) compounds over tokens.
#include "gdn.cuh"

constexpr int GDN_CONV_TOKENS = 64;  // tokens per block of gdn_conv

// Per (sequence, channel, tile of 64 new tokens):
//   out[t, c] = silu(sum_j w[c, j] * x[t - (K-1) + j, c])
// where inputs before the sequence's new tokens come from
// conv_state[slot, c, 0..K-1] (oldest first). Tiling the tokens keeps long
// prompts parallel; only tile 0 reads the old state, so tile 0 also writes the
// new one (the last K-1 inputs) once it has read it.
// Grid (ceil(C/128), ceil(max_new/64), S), block 128.
KESTREL_EXTERN void gdn_conv(float* __restrict__ out, const float* __restrict__ proj, int proj_stride,
                             const __nv_bfloat16* __restrict__ conv_w, float* __restrict__ conv_state,
                             const int* __restrict__ seq_start, const int* __restrict__ seq_slot, int channels,
                             int kernel) { pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const int tile = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    const int t0 = tile * GDN_CONV_TOKENS;
    if (c >= channels || t0 >= n) return;
    const int hist = kernel - 1;
    float* st = conv_state + ((size_t)seq_slot[s] * channels + c) * hist;
    const float* x = proj + (size_t)start * proj_stride + c;  // x[i * proj_stride]: new input i
    float window[GDN_MAX_KERNEL];  // the `hist` inputs before the current token, oldest first
    float w[GDN_MAX_KERNEL];
#pragma unroll
    for (int j = 0; j < GDN_MAX_KERNEL; ++j) {
        if (j < kernel) w[j] = bf16_to_f32(conv_w[(size_t)c * kernel + j]);
        if (j < hist) {
            const int i = t0 - hist + j;
            window[j] = i >= 0 ? x[(size_t)i * proj_stride] : st[hist + i];
        }
    }
    const int t1 = min(t0 + GDN_CONV_TOKENS, n);
    // Unrolled so that several tokens' loads are in flight at once.
#pragma unroll 8
    for (int t = t0; t < t1; ++t) {
        const float xt = x[(size_t)t * proj_stride];
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j)
            if (j < hist) acc += w[j] * window[j];
        acc += w[hist] * xt;
        out[(size_t)(start + t) * channels + c] = siluf_exact(acc);
#pragma unroll
        for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j)
            if (j < hist) window[j] = j + 1 < hist ? window[j + 1] : xt;
    }
    if (tile == 0) {
        // New state: inputs n-hist..n-1 of [old state ; new inputs].
        float next[GDN_MAX_KERNEL];
#pragma unroll
        for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j) {
            if (j < hist) {
                const int i = n - hist + j;
                next[j] = i >= 0 ? x[(size_t)i * proj_stride] : st[hist + i];
            }
        }
#pragma unroll
        for (int j = 0; j < GDN_MAX_KERNEL - 1; ++j)
            if (j < hist) st[j] = next[j];
    }
}

constexpr int GDN_COLS = 32;    // value columns per block
constexpr int GDN_GROUPS = 4;   // key-row groups per block
// Delta rule per (sequence, value head, 32-column chunk of Dv), tokens in order:
//   S *= exp(g); delta = (v - S^T k) * beta; S += k delta^T; o = S^T q
// with q, k L2-normalised (eps 1e-6), q scaled by Dk^-0.5, q/k heads shared
// by Hv/Hk value heads, g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
// State [slot, Hv, Dk, Dv] f32. Grid (ceil(Dv/32), Hv, S), block 128.
// Dynamic shared memory: (Dk*32 + 2*Dk) floats.
KESTREL_EXTERN void gdn_recurrent(float* __restrict__ core, const float* __restrict__ qkv,
                                  const float* __restrict__ proj, int proj_stride, int b_offset, int a_offset,
                                  const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                  float* __restrict__ state, const int* __restrict__ seq_start,
                                  const int* __restrict__ seq_slot, int hk, int hv, int dk, int dv) { pdl_begin();
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
        for (int r = g; r < dk; r += GDN_GROUPS) {
            const float updated = S[r * GDN_COLS + c] * decay + ks[r] * k_inv * delta;
            S[r * GDN_COLS + c] = updated;
            o += updated * qs[r];
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

// out[t, h*Dv + i] = w[i] * rms_norm(core[t, h, :])[i] * silu(z[t, h*Dv + i]),
// z at proj[t, z_offset + ...]. Grid (Hv, T), block 128.
KESTREL_EXTERN void gdn_gated_norm(float* __restrict__ out, const float* __restrict__ core,
                                   const float* __restrict__ proj, int proj_stride, int z_offset,
                                   const float* __restrict__ w, int hv, int dv, float eps) { pdl_begin();
    __shared__ float scratch[32];
    const int h = blockIdx.x, t = blockIdx.y;
    const float* o = core + (size_t)t * hv * dv + h * dv;
    float ss = 0.f;
    for (int i = threadIdx.x; i < dv; i += blockDim.x) ss += o[i] * o[i];
    const float inv = rsqrtf(block_sum(ss, scratch) / dv + eps);
    const float* z = proj + (size_t)t * proj_stride + z_offset + h * dv;
    for (int i = threadIdx.x; i < dv; i += blockDim.x)
        out[(size_t)t * hv * dv + h * dv + i] = w[i] * (o[i] * inv) * siluf_exact(z[i]);
}

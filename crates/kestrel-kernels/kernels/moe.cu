// Mixture-of-experts pieces: f32 router logits, softmax + top-k, and the row
// gathers/scatters around the per-expert matrix products. Exact math: the
// router decides which experts run, so it must agree with the reference.
#include "common.cuh"

// logits[t, e] = x[t, :] . w[e, :] with f32 accumulation (bf16 weights).
// One warp per (t, e): grid ceil(T*E / 8), block 256.
KESTREL_EXTERN void router_logits(float* __restrict__ logits, const float* __restrict__ x,
                                  const __nv_bfloat16* __restrict__ w, int tokens, int experts, int hidden) {
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= tokens * experts) return;
    const int t = warp / experts, e = warp % experts;
    const float* xr = x + (size_t)t * hidden;
    const __nv_bfloat16* wr = w + (size_t)e * hidden;
    float acc = 0.f;
    for (int i = lane; i < hidden; i += 32) acc += xr[i] * bf16_to_f32(wr[i]);
    acc = warp_sum(acc);
    if (lane == 0) logits[warp] = acc;
}

// Softmax over E logits, then the k largest probabilities (lowest index wins
// ties), optionally renormalised to sum to one. One thread per token.
KESTREL_EXTERN void router_topk(int* __restrict__ ids, float* __restrict__ weights, const float* __restrict__ logits,
                                int tokens, int experts, int k, int renormalize) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* l = logits + (size_t)t * experts;
    float mx = -INFINITY;
    for (int e = 0; e < experts; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.f;
    for (int e = 0; e < experts; ++e) sum += expf(l[e] - mx);
    float chosen_sum = 0.f;
    int prev = -1;
    float prev_val = INFINITY;
    for (int j = 0; j < k; ++j) {
        // next largest strictly after (prev_val, prev) in (value desc, index asc) order
        int best = -1;
        float best_val = -INFINITY;
        for (int e = 0; e < experts; ++e) {
            const float v = l[e];
            const bool after_prev = v < prev_val || (v == prev_val && e > prev);
            if (after_prev && (best < 0 || v > best_val)) {
                best = e;
                best_val = v;
            }
        }
        const float p = expf(best_val - mx) / sum;
        ids[t * k + j] = best;
        weights[t * k + j] = p;
        chosen_sum += p;
        prev = best;
        prev_val = best_val;
    }
    if (renormalize)
        for (int j = 0; j < k; ++j) weights[t * k + j] /= chosen_sum;
}

// out[i, :] = bf16(x[rows[i], :]). Grid (ceil(cols/256), n).
KESTREL_EXTERN void gather_rows_to_bf16(__nv_bfloat16* __restrict__ out, const float* __restrict__ x,
                                        const int* __restrict__ rows, int cols) {
    const int i = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)i * cols + c] = f32_to_bf16(x[(size_t)rows[i] * cols + c]);
}

// out[i, j] = bf16(silu(gu[i, j]) * gu[i, inter + j]). Grid (ceil(inter/256), n).
KESTREL_EXTERN void swiglu_to_bf16(__nv_bfloat16* __restrict__ out, const float* __restrict__ gu, int inter) {
    const int i = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const float* row = gu + (size_t)i * 2 * inter;
    out[(size_t)i * inter + j] = f32_to_bf16(siluf_exact(row[j]) * row[inter + j]);
}

// out[rows[i], :] += weights[i] * y[i, :]. Rows must be distinct within one
// launch (each token appears once per expert). Grid (ceil(cols/256), n).
KESTREL_EXTERN void scatter_add_weighted(float* __restrict__ out, const float* __restrict__ y,
                                         const int* __restrict__ rows, const float* __restrict__ weights, int cols) {
    const int i = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)rows[i] * cols + c] += weights[i] * y[(size_t)i * cols + c];
}

// out[t, :] += sigmoid(gate[t]) * y[t, :] (gate == nullptr: plain add).
// Grid (ceil(cols/256), T).
KESTREL_EXTERN void add_gated_rows(float* __restrict__ out, const float* __restrict__ y,
                                   const float* __restrict__ gate, int cols) {
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float g = gate ? sigmoidf_exact(gate[t]) : 1.f;
    out[(size_t)t * cols + c] += g * y[(size_t)t * cols + c];
}

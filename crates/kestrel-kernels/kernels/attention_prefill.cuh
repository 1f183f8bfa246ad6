// What the prefill attention kernels (attention_prefill.cu on mma.sync,
// attention_prefill_sm90.cu on wgmma) share: the per-warp online softmax over
// a key tile and the output rows. A warp owns 16 query rows,
// and its scores and outputs are in mma.m16n8k16's accumulator layout (which
// is also the per-warp layout of wgmma's).
#pragma once
#include "attention_mma.cuh"

constexpr int PF_KEYS = 64;  // keys per K/V tile of the mma.sync kernels

// Scale, causal mask (only tiles that reach past row g's position pos0),
// online softmax: sc becomes P (unnormalised, base 2); m, l and o are updated.
// The O rescale is skipped when no row of the warp raised its max (exact:
// it would multiply by 1).
// KEYS: the keys of the tile (64 for the mma.sync kernels). MASK = false:
// the caller knows that no key of the tile lies past the warp's first row
// (no mask code at all).
template <int D, int KEYS = PF_KEYS, bool MASK = true>
__device__ __forceinline__ void online_softmax(float (&sc)[KEYS / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                               float (&l)[2], int kb, int pos0, int c, float scale_log2) {
    const bool diagonal = MASK && kb + KEYS - 1 > pos0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < KEYS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = sc[nt][e] * scale_log2;
            if (diagonal && kb + 8 * nt + 2 * c + (e & 1) > pos0 + (e >> 1) * 8) v = -INFINITY;
            sc[nt][e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
        }
    float alpha[2], base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], quad_max(mx[r]));
        // A row with no key yet (never the case for a real row after tile 0) stays neutral.
        base[r] = m_new == -INFINITY ? 0.f : m_new;
        alpha[r] = exp2f(m[r] - base[r]);
        m[r] = m_new;
        l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < KEYS / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            sc[nt][e] = exp2f(sc[nt][e] - base[e >> 1]);
            l[e >> 1] += sc[nt][e];
        }
    if (__any_sync(FULL_MASK, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            o[nt][0] *= alpha[0];
            o[nt][1] *= alpha[0];
            o[nt][2] *= alpha[1];
            o[nt][3] *= alpha[1];
        }
    }
}

// Rows g and g + 8 of the warp whose first row is wrow0: O / l, times the
// sigmoid of the output gate when there is one (gate_offset >= 0).
template <int D>
__device__ __forceinline__ void store_rows(float* __restrict__ out, const float (&o)[D / 8][4], const float (&l)[2],
                                           int wrow0, int g, int c, int n_new, int t0, int hq, int h,
                                           const float* __restrict__ proj, int proj_stride, int gate_offset) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = wrow0 + g + 8 * r;
        if (row >= n_new) continue;
        const float inv_l = 1.f / quad_sum(l[r]);
        const size_t t = t0 + row;
        float* dst = out + (t * hq + h) * D + 2 * c;
        const float* gate = proj + t * proj_stride + max(gate_offset, 0) + h * D + 2 * c;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt) {
            float2 v = make_float2(o[nt][2 * r] * inv_l, o[nt][2 * r + 1] * inv_l);
            if (gate_offset >= 0) {
                const float2 gt = *reinterpret_cast<const float2*>(gate + nt * 8);
                v.x *= sigmoidf_exact(gt.x);
                v.y *= sigmoidf_exact(gt.y);
            }
            *reinterpret_cast<float2*>(dst + nt * 8) = v;
        }
    }
}

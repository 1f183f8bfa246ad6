// Pieces of the prefill attention kernels (attention_prefill.cu on mma.sync,
// attention_prefill_sm90.cu on wgmma): tile constants, the per-warp online
// softmax over a 64-key tile and the output rows. A warp owns 16 query rows,
// and its scores and outputs are in mma.m16n8k16's accumulator layout (which
// is also the per-warp layout of wgmma's).
#pragma once
#include "attention_mma.cuh"

constexpr int PF_KEYS = 64;  // keys per K/V tile of the mma.sync kernels

// Shared tiles hold rows of D bf16 as 16-byte chunks; chunk ch of row r sits
// at ch ^ (r % 8), so the 8 row addresses of every ldmatrix hit distinct banks.
template <int D>
__device__ __forceinline__ int swz(int row, int ch) {
    return row * (D / 8) + (ch ^ (row & 7));
}

// The Q rows [row0, row0 + ROWS) of the chunk as bf16 into the swizzled tile
// (rows past the chunk are zero and never written out).
template <int D, int ROWS, int THREADS>
__device__ __forceinline__ void load_q_tile(uint4* __restrict__ sq, const float* __restrict__ q, int t0, int row0,
                                            int n_new, int hq, int h) {
    constexpr int CH = D / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += THREADS) {
        const int r = idx / CH, ch = idx % CH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (row0 + r < n_new) {
            const float4* src = reinterpret_cast<const float4*>(q + ((size_t)(t0 + row0 + r) * hq + h) * D + ch * 8);
            const float4 a = src[0], b = src[1];
            v = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
        }
        sq[swz<D>(r, ch)] = v;
    }
}

// sc = this warp's 16 query rows . the tile's PF_KEYS keys.
template <int D>
__device__ __forceinline__ void qk_scores(float (&sc)[PF_KEYS / 8][4], const uint4* sq, const uint4* sk, int warp,
                                          int lane) {
#pragma unroll
    for (int nt = 0; nt < PF_KEYS / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(sq + swz<D>(warp * 16 + (lane & 15), 2 * ks + (lane >> 4))));
#pragma unroll
        for (int jp = 0; jp < PF_KEYS / 16; ++jp) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(sk + swz<D>(jp * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1))));
            mma_bf16(sc[2 * jp], a, b[0], b[1]);
            mma_bf16(sc[2 * jp + 1], a, b[2], b[3]);
        }
    }
}

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

// o += P . V, P straight from the score accumulators (no shuffles).
template <int D>
__device__ __forceinline__ void pv_accumulate(float (&o)[D / 8][4], const float (&sc)[PF_KEYS / 8][4],
                                              const uint4* sv, int lane) {
#pragma unroll
    for (int kk = 0; kk < PF_KEYS / 16; ++kk) {
        const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                               pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, smem_addr(sv + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                       2 * np + (lane >> 4))));
            mma_bf16(o[2 * np], a, b[0], b[1]);
            mma_bf16(o[2 * np + 1], a, b[2], b[3]);
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

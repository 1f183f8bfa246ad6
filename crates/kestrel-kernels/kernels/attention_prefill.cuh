// What the prefill attention kernels (attention_prefill.cu on mma.sync,
// attention_prefill_sm90.cu on wgmma) share: a block's rows and keys, the
// staging of K/V and Q tiles into shared memory, the per-warp online softmax
// over a key tile and the output rows. A warp owns 16 query rows, and its
// scores and outputs are in mma.m16n8k16's accumulator layout (which is also
// the per-warp layout of wgmma's).
#pragma once
#include "attention_mma.cuh"

constexpr int PF_KEYS = 64;  // keys per K/V tile

// The query tile a block serves: rows row0 .. row0 + ROWS - 1 of sequence
// s's new tokens (t0 is the first one's token index), and the keys they
// attend to (positions < kv_end; the cache pages at `table`).
struct PrefillRows {
    int t0, n_new, row0, cached, kvh, kv_end;
    const int* table;
};

// False when query tile qt lies past the sequence's new tokens.
template <int ROWS>
__device__ __forceinline__ bool prefill_rows(PrefillRows& p, int qt, int h, int s, const int* __restrict__ seq_start,
                                             const int* __restrict__ seq_len, const int* __restrict__ table_offset,
                                             const int* __restrict__ block_tables, int hq, int hkv) {
    p.t0 = seq_start[s];
    p.n_new = seq_start[s + 1] - p.t0;
    p.row0 = qt * ROWS;
    if (p.row0 >= p.n_new) return false;
    p.cached = seq_len[s] - p.n_new;
    p.kvh = h / (hq / hkv);
    // Keys of the last query row of this tile: positions < kv_end.
    p.kv_end = p.cached + min(p.n_new, p.row0 + ROWS);
    p.table = block_tables + table_offset[s];
    return true;
}

// rows[i] = the cache row of key kb + i (-1 past kv_end: its copies
// zero-fill), for the PF_KEYS keys of a tile; threads 0 .. PF_KEYS - 1.
__device__ __forceinline__ void stage_key_rows(int64_t* rows, const PrefillRows& p, int kb, int block_size,
                                               int hkv) {
    const int i = threadIdx.x;
    if (i < PF_KEYS) {
        const int key = kb + i;
        rows[i] = key < p.kv_end ? kv_row(p.table, key, block_size, hkv, p.kvh) : -1;
    }
}

// The K and V rows of a staged tile into shared memory by THREADS threads,
// 16-byte chunk ch of row r at sk[at(r, ch)] (and the same in sv).
template <int D, int THREADS, typename At>
__device__ __forceinline__ void load_kv_tile(uint4* sk, uint4* sv, const int64_t* rows,
                                             const __nv_bfloat16* __restrict__ k_cache,
                                             const __nv_bfloat16* __restrict__ v_cache, At at) {
    constexpr int CH = D / 8, TILE = PF_KEYS * CH;
#pragma unroll
    for (int i = 0; i < (TILE + THREADS - 1) / THREADS; ++i) {
        const int idx = threadIdx.x + i * THREADS;
        if (TILE % THREADS != 0 && idx >= TILE) break;
        const int r = idx / CH, ch = idx % CH;
        const int64_t row = rows[r];
        const int64_t off = (row < 0 ? 0 : row) * D + ch * 8;
        cp_async_16(smem_addr(sk + at(r, ch)), k_cache + off, row >= 0);
        cp_async_16(smem_addr(sv + at(r, ch)), v_cache + off, row >= 0);
    }
}

// The tile's ROWS query rows as bf16 into shared memory by THREADS threads,
// chunk ch of row r at sq[at(r, ch)] (rows past the chunk are zero and never
// written out).
template <int D, int ROWS, int THREADS, typename At>
__device__ __forceinline__ void load_q_tile(uint4* __restrict__ sq, const float* __restrict__ q, const PrefillRows& p,
                                            int hq, int h, At at) {
    constexpr int CH = D / 8;
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += THREADS) {
        const int r = idx / CH, ch = idx % CH;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (p.row0 + r < p.n_new) {
            const float4* src =
                reinterpret_cast<const float4*>(q + ((size_t)(p.t0 + p.row0 + r) * hq + h) * D + ch * 8);
            const float4 a = src[0], b = src[1];
            v = make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
        }
        sq[at(r, ch)] = v;
    }
}

// Scale, causal mask (only tiles that reach past row g's position pos0),
// online softmax: sc becomes P (unnormalised, base 2); m, l and o are updated.
// The O rescale is skipped when no row of the warp raised its max (exact:
// it would multiply by 1).
// MASK = false: the caller knows that no key of the tile lies past the warp's
// first row (no mask code at all).
template <int D, bool MASK = true>
__device__ __forceinline__ void online_softmax(float (&sc)[PF_KEYS / 8][4], float (&o)[D / 8][4], float (&m)[2],
                                               float (&l)[2], int kb, int pos0, int c, float scale_log2) {
    const bool diagonal = MASK && kb + PF_KEYS - 1 > pos0;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < PF_KEYS / 8; ++nt)
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
    for (int nt = 0; nt < PF_KEYS / 8; ++nt)
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

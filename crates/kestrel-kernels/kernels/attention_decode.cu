// Decode attention (every sequence has exactly one new token): split-KV flash
// decoding on tensor cores, then a combine kernel that merges the splits and
// applies the output gate.
//
// Replayable as a CUDA graph: the grid depends only on the number of
// sequences, the heads and the split count; sequence lengths are read on the
// device, and a split that gets no keys writes a neutral partial (m = -inf,
// l = 0). Deterministic: every reduction has a fixed order, no atomics.
#include "attention_mma.cuh"

constexpr int DEC_KEYS = 16;   // keys per warp step: one mma k-step of P.V
constexpr int DEC_HEADS = 8;   // q heads per block: one mma n-tile of P^T
constexpr int DEC_STAGES = 3;  // per-warp cp.async ring: two steps in flight while one is computed
constexpr int DEC_MAX_SPLITS = 128;  // at most one split per thread of the combine kernel
// Warps per block: the ring of a block stays within 96 KiB (sm_121 allows 99),
// dec_warps * DEC_STAGES * 2 * 16 * D * 2 bytes; two blocks fit an SM of Hopper.
template <int D>
__host__ __device__ constexpr int dec_warps() {
    return D >= 256 ? 2 : 4;
}

template <int D>
__device__ __forceinline__ int dec_swz(int row, int ch) {
    return row * (D / 8) + (ch ^ (row & 7));
}

// One block = one split of one sequence's keys for up to 8 q heads of one kv
// group, so each K/V element is loaded once for all heads of the group.
// Grid (hkv * ceil(group / 8), S, splits), block 32 * dec_warps<D>(),
// dynamic shared memory dec_warps * DEC_STAGES * 2 * 16 * D * 2 bytes.
//
// A split is a multiple of the block step (16 keys per warp) and at least one
// step, so short sequences use few splits. Warp w takes steps w, w + W, ...;
// each warp streams its steps through a private 3-stage cp.async ring in
// shared memory (no block barriers in the loop), so K/V bytes in flight do not
// cost registers. Per step, on tensor cores:
//   S = Q K^T: rows = the 8 q heads (rows 8..15 zero), n = 8 keys, k = dims;
//   O^T += V^T P^T: rows = dims, n = the 8 heads, k = the 16 keys; P^T's
//   fragment is exactly this lane's S accumulator (no shuffles), and V^T's
//   fragments come from ldmatrix.trans of the V rows.
// Partials: part_o [S, hq, splits, D] (unnormalised, relative to m),
// part_ml [S, hq, splits, 2] = (m, l), m in log2 units.
template <int D>
__device__ __forceinline__ void decode_split(float* __restrict__ part_o, float* __restrict__ part_ml,
                                             const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,
                                             const __nv_bfloat16* __restrict__ v_cache,
                                             const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                             const int* __restrict__ table_offset,
                                             const int* __restrict__ block_tables, int hq, int hkv, int block_size,
                                             float scale_log2, int splits) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int W = dec_warps<D>(), CH = D / 8, STEP = W * DEC_KEYS;
    constexpr int TILE = DEC_KEYS * CH;  // 16-byte chunks of 16 rows of K (or V)
    extern __shared__ uint4 dec_smem[];
    __shared__ float s_ml[W][2][DEC_HEADS];

    const int group = hq / hkv;
    const int chunks = (group + DEC_HEADS - 1) / DEC_HEADS;
    const int kvh = blockIdx.x / chunks;
    const int h0 = kvh * group + (blockIdx.x % chunks) * DEC_HEADS;
    const int nh = min(DEC_HEADS, kvh * group + group - h0);
    const int s = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

    const int len = seq_len[s];
    int chunk = (len + splits - 1) / splits;
    chunk = max(STEP, (chunk + STEP - 1) / STEP * STEP);
    const int begin = split * chunk;
    const int end = min(len, begin + chunk);
    // Partial of head h0 + i: index part + i * splits.
    const size_t part = ((size_t)s * hq + h0) * splits + split;
    if (begin >= end) {
        if (threadIdx.x < nh) {
            part_ml[(part + threadIdx.x * splits) * 2] = -INFINITY;
            part_ml[(part + threadIdx.x * splits) * 2 + 1] = 0.f;
        }
        return;
    }
    const int* table = block_tables + table_offset[s];
    const int t = seq_start[s];

    // Steps of this warp start at kb0 + n * STEP, multiples of 16: with pages
    // of a multiple of 16 keys a step lies in one page, whose number is read
    // one step ahead so that issuing copies never waits for the table.
    const int kb0 = begin + warp * DEC_KEYS;
    const int n_steps = kb0 < end ? (end - kb0 + STEP - 1) / STEP : 0;
    const bool one_page = block_size % DEC_KEYS == 0;
    int page = one_page && n_steps > 0 ? table[kb0 / block_size] : 0;
    uint4* ring = dec_smem + warp * DEC_STAGES * 2 * TILE;
    auto issue = [&](int n) {
        const int kb = kb0 + n * STEP;
        uint4* kt = ring + (n % DEC_STAGES) * 2 * TILE;
        const int64_t first = (int64_t)page * block_size + kb % block_size;
#pragma unroll 4
        for (int idx = lane; idx < TILE; idx += 32) {
            const int r = idx / CH, ch = idx % CH, key = kb + r;
            const bool valid = key < end;  // past the end: zeros (masked scores, and V must not be NaN)
            const int64_t row =
                !valid ? 0 : one_page ? (first + r) * hkv + kvh : kv_row(table, key, block_size, hkv, kvh);
            cp_async_16(smem_addr(kt + dec_swz<D>(r, ch)), k_cache + row * D + ch * 8, valid);
            cp_async_16(smem_addr(kt + TILE + dec_swz<D>(r, ch)), v_cache + row * D + ch * 8, valid);
        }
        if (one_page && n + 1 < n_steps) page = table[(kb + STEP) / block_size];
    };
    for (int n = 0; n < DEC_STAGES - 1; ++n) {
        if (n < n_steps) issue(n);
        cp_async_commit();
    }

    // Q fragments of head h0 + g (zero beyond the block's heads): k-step ks
    // holds dims 16ks + 2c, +1 and 16ks + 8 + 2c, +1; rows g + 8 are zero.
    uint32_t qa[D / 16][2];
    {
        const bool valid = g < nh;
        const float* qrow = q + ((size_t)t * hq + h0 + (valid ? g : 0)) * D + 2 * c;
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            float2 lo = make_float2(0.f, 0.f), hi = lo;
            if (valid) {
                lo = *reinterpret_cast<const float2*>(qrow + 16 * ks);
                hi = *reinterpret_cast<const float2*>(qrow + 16 * ks + 8);
            }
            qa[ks][0] = pack_bf16(lo.x, lo.y);
            qa[ks][1] = pack_bf16(hi.x, hi.y);
        }
    }

    float o[D / 16][4];
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    float m = -INFINITY, l = 0.f;  // of head g, the same in the four lanes of the quad
    // ldmatrix row addresses: K as B (n = keys) and V as A^T (k = keys) use the
    // same pattern, matrices (keys 0-7 | 8-15) x (chunk lo | hi).
    const int ld_row = (lane & 7) + ((lane >> 4) << 3), ld_hi = (lane >> 3) & 1;

    for (int n = 0; n < n_steps; ++n) {
        if (n + DEC_STAGES - 1 < n_steps) issue(n + DEC_STAGES - 1);
        cp_async_commit();
        cp_async_wait<DEC_STAGES - 1>();  // step n has landed (for this lane)
        __syncwarp();                     // ... and for every lane
        const uint4* kt = ring + (n % DEC_STAGES) * 2 * TILE;
        const uint4* vt = kt + TILE;
        const int kb = kb0 + n * STEP;

        float sc[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(kt + dec_swz<D>(ld_row, 2 * ks + ld_hi)));
            const uint32_t a[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
            mma_bf16(sc[0], a, b[0], b[1]);
            mma_bf16(sc[1], a, b[2], b[3]);
        }

        // Head g's scores of keys kb + 8tt + 2c + e, in log2 units.
        float p[2][2];
        float mx = -INFINITY;
#pragma unroll
        for (int tt = 0; tt < 2; ++tt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int key = kb + 8 * tt + 2 * c + e;
                p[tt][e] = key < end ? sc[tt][e] * scale_log2 : -INFINITY;
                mx = fmaxf(mx, p[tt][e]);
            }
        // Key kb is valid, so the new maximum is finite.
        const float m_new = fmaxf(m, quad_max(mx));
        const float alpha = exp2f(m - m_new);
        uint32_t pb[2];
        float rs = 0.f;
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
            pb[tt] = pack_bf16(exp2f(p[tt][0] - m_new), exp2f(p[tt][1] - m_new));
            // Sum the rounded weights, the ones P.V uses.
            rs += bf16_lo(pb[tt]) + bf16_hi(pb[tt]);
        }
        l = l * alpha + quad_sum(rs);
        m = m_new;

        // This lane's O^T columns are heads 2c and 2c + 1.
        const float a_lo = __shfl_sync(FULL_MASK, alpha, 8 * c);
        const float a_hi = __shfl_sync(FULL_MASK, alpha, 8 * c + 4);
#pragma unroll
        for (int mt = 0; mt < D / 16; ++mt) {
            uint32_t a[4];
            ldmatrix_x4_trans(a, smem_addr(vt + dec_swz<D>(ld_row, 2 * mt + ld_hi)));
            // The matrices come as (keys lo, dims lo), (keys lo, dims hi), (keys hi, dims lo),
            // (keys hi, dims hi): A's registers are (rows lo, k lo), (rows hi, k lo), (rows lo, k hi),
            // (rows hi, k hi), i.e. the same order.
            o[mt][0] *= a_lo;
            o[mt][1] *= a_hi;
            o[mt][2] *= a_lo;
            o[mt][3] *= a_hi;
            mma_bf16(o[mt], a, pb[0], pb[1]);
        }
        __syncwarp();  // every lane is done with this stage before it is refilled
    }
    cp_async_wait<0>();  // nothing in flight into the ring, which is reused below

    // Merge the warps (a warp without keys has m = -inf, l = 0, o = 0).
    float* s_o = reinterpret_cast<float*>(dec_smem);  // [W][DEC_HEADS][D]
    __syncthreads();
    if (c == 0) {
        s_ml[warp][0][g] = m;
        s_ml[warp][1][g] = l;
    }
    float* so = s_o + warp * DEC_HEADS * D;
#pragma unroll
    for (int mt = 0; mt < D / 16; ++mt) {
        const int dim = 16 * mt + g;
        so[(2 * c) * D + dim] = o[mt][0];
        so[(2 * c + 1) * D + dim] = o[mt][1];
        so[(2 * c) * D + dim + 8] = o[mt][2];
        so[(2 * c + 1) * D + dim + 8] = o[mt][3];
    }
    __syncthreads();
    if (threadIdx.x < nh) {
        const int hh = threadIdx.x;
        float mm = -INFINITY, ll = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) mm = fmaxf(mm, s_ml[w][0][hh]);
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float f = exp2f(s_ml[w][0][hh] - mm);
            s_ml[w][0][hh] = f;  // from here on: the warp's weight
            ll += f * s_ml[w][1][hh];
        }
        const size_t pi = part + (size_t)hh * splits;
        part_ml[pi * 2] = mm;
        part_ml[pi * 2 + 1] = ll;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < nh * D; idx += blockDim.x) {
        const int hh = idx / D, dim = idx % D;
        float acc = 0.f;
#pragma unroll
        for (int w = 0; w < W; ++w) acc += s_ml[w][0][hh] * s_o[(w * DEC_HEADS + hh) * D + dim];
        part_o[(part + (size_t)hh * splits) * D + dim] = acc;
    }
}

#define DECODE_KERNEL(D)                                                                                          \
    KESTREL_EXTERN void __launch_bounds__(dec_warps<D>() * 32) attention_decode_d##D(                               \
        float* __restrict__ part_o, float* __restrict__ part_ml, const float* __restrict__ q,                      \
        const __nv_bfloat16* __restrict__ k_cache, const __nv_bfloat16* __restrict__ v_cache,                     \
        const int* __restrict__ seq_start, const int* __restrict__ seq_len, const int* __restrict__ table_offset, \
        const int* __restrict__ block_tables, int hq, int hkv, int block_size, float scale_log2, int splits) { pdl_begin();     \
        decode_split<D>(part_o, part_ml, q, k_cache, v_cache, seq_start, seq_len, table_offset, block_tables, hq, \
                        hkv, block_size, scale_log2, splits);                                                     \
    }

DECODE_KERNEL(64)
DECODE_KERNEL(128)
DECODE_KERNEL(256)

// Merge the splits of one (q head, sequence): out = sum_i w_i o_i / sum_i w_i l_i
// with w_i = 2^(m_i - max m), then the optional gate out *= sigmoid(gate), the
// gate at proj[t, gate_offset + h*D + i] (gate_offset < 0: none).
// The splits that got keys are a prefix (split i has keys iff i * chunk < len)
// and have l >= 1; the others were never written past (m, l) and are not read.
// Grid (hq, S), block COMBINE_THREADS: thread = (float4 column, split lane),
// each split lane sums every L-th split, then the lanes are added in order.
constexpr int COMBINE_THREADS = 256;
KESTREL_EXTERN void __launch_bounds__(COMBINE_THREADS)
    attention_decode_combine(float* __restrict__ out, const float* __restrict__ part_o,
                             const float* __restrict__ part_ml, const int* __restrict__ seq_start, int hq, int d,
                             int splits, const float* __restrict__ proj, int proj_stride, int gate_offset) { pdl_begin();
    __shared__ float w[DEC_MAX_SPLITS];
    __shared__ float scratch[32];
    __shared__ float4 red[COMBINE_THREADS];
    const int h = blockIdx.x, s = blockIdx.y, tid = threadIdx.x;
    const size_t base = ((size_t)s * hq + h) * splits;
    const int cols = d / 4, lanes = COMBINE_THREADS / cols;
    const int col = tid % cols, lane = tid / cols;
    // The gate does not depend on the partials: load it first.
    const int t = seq_start[s];
    float4 gate = make_float4(0.f, 0.f, 0.f, 0.f);
    if (gate_offset >= 0 && lane == 0)
        gate = *reinterpret_cast<const float4*>(proj + (size_t)t * proj_stride + gate_offset + h * d + 4 * col);
    float mi = -INFINITY, li = 0.f;
    if (tid < splits) {
        mi = part_ml[(base + tid) * 2];
        li = part_ml[(base + tid) * 2 + 1];
    }
    const float mm = block_max(mi, scratch);
    const float wi = li > 0.f ? exp2f(mi - mm) : 0.f;
    if (tid < splits) w[tid] = wi;
    const float inv_l = 1.f / block_sum(wi * li, scratch);
    const int active = (int)block_sum(li > 0.f ? 1.f : 0.f, scratch);  // syncs: w is complete

    const float4* po = reinterpret_cast<const float4*>(part_o) + base * cols + col;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (lane < lanes) {
#pragma unroll 4
        for (int sp = lane; sp < active; sp += lanes) {
            const float ws = w[sp];
            const float4 v = po[(size_t)sp * cols];
            acc.x += ws * v.x;
            acc.y += ws * v.y;
            acc.z += ws * v.z;
            acc.w += ws * v.w;
        }
    }
    red[tid] = acc;
    __syncthreads();
    if (lane != 0) return;
    for (int i = 1; i < lanes; ++i) {
        const float4 v = red[i * cols + col];
        acc.x += v.x;
        acc.y += v.y;
        acc.z += v.z;
        acc.w += v.w;
    }
    float4 o = make_float4(acc.x * inv_l, acc.y * inv_l, acc.z * inv_l, acc.w * inv_l);
    if (gate_offset >= 0) {
        o.x *= sigmoidf_exact(gate.x);
        o.y *= sigmoidf_exact(gate.y);
        o.z *= sigmoidf_exact(gate.z);
        o.w *= sigmoidf_exact(gate.w);
    }
    *reinterpret_cast<float4*>(out + ((size_t)t * hq + h) * d + 4 * col) = o;
}

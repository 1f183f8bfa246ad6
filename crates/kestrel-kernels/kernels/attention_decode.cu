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

// The step's new token as attention_decode_fused reads it: instead of a
// kernel of its own (q/k norm + RoPE + cache write, attention.cu) before the
// attention, every block normalises and rotates the q heads it serves from the
// projection, with the same arithmetic, and the blocks of split 0 also the
// kv head's k and v, which they write into the cache. No block reads the new
// token from the cache (other blocks of this kernel may not have written it
// yet): split 0 adds it as one more key.
struct NewToken {
    const float* proj;  // [T, proj_stride]: [q | gate | k | v]
    int proj_stride, k_offset, v_offset;
    const float* q_norm;  // [D]
    const float* k_norm;  // [D]
    const int* positions;
    const int* slot_mapping;
    int rotary_dim;  // (rotary_dim / 2) % 4 == 0, rotary_dim <= D
    float theta, eps;
};

// Fills `rows` (f32, D apart) with the normalised + rotated q heads h0 ..
// h0 + nh - 1 of token t, then row DEC_HEADS with its k of kv head kvh (both
// as qk_norm_rope_kv_write computes them), rounded to bf16 for k; rows
// DEC_HEADS + 1 and + 2 hold the q and k norm weights meanwhile. `v_row`
// gets its v rounded to bf16. `kv` (split 0): also computes k and v and
// writes both into the cache. Every thread of the block calls it; it ends
// with a barrier.
template <int D>
__device__ __forceinline__ void new_token_rows(float* __restrict__ rows, float* __restrict__ v_row,
                                               const NewToken& nt, int t, int h0, int nh, int kvh, int hkv,
                                               bool kv, bool write_cache, __nv_bfloat16* __restrict__ k_cache,
                                               __nv_bfloat16* __restrict__ v_cache) {
    constexpr int C4 = D / 4;  // float4s per row
    __shared__ float inv[DEC_HEADS + 1];
    // cos and sin of each rotary pair's angle: the same for every row.
    __shared__ float rope_cos[D / 2], rope_sin[D / 2];
    const int tid = threadIdx.x, threads = blockDim.x, warp = tid >> 5, lane = tid & 31, W = threads >> 5;
    const float* row = nt.proj + (size_t)t * nt.proj_stride;
    // Row r < nh: q head h0 + r; row DEC_HEADS: k. Every load first.
    const int n4 = (nh + (kv ? 1 : 0)) * C4;
    constexpr int PER = (DEC_HEADS + 1) * C4 / 64 + 1;  // >= loads per thread (>= 64 threads)
    float4 x[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = tid + j * threads;
        if (i < n4) {
            const int r = i / C4, c = i % C4;
            const float* src = r < nh ? row + (size_t)(h0 + r) * D : row + nt.k_offset + (size_t)kvh * D;
            x[j] = reinterpret_cast<const float4*>(src)[c];
        }
    }
    float4 v4 = make_float4(0.f, 0.f, 0.f, 0.f), qw4 = v4, kw4 = v4;
    if (kv && tid < C4) v4 = reinterpret_cast<const float4*>(row + nt.v_offset + (size_t)kvh * D)[tid];
    // The norm weights go to shared memory too: the scaling loop below reads
    // each many times (a short block has dozens of elements per thread).
    if (tid < C4) {
        qw4 = reinterpret_cast<const float4*>(nt.q_norm)[tid];
        if (kv) kw4 = reinterpret_cast<const float4*>(nt.k_norm)[tid];
    }
    const int pos_i = nt.positions[t];
    const int64_t slot = nt.slot_mapping[t];
    // While the rows load: inv_freq[e] = theta^(-2e/rotary_dim), rounded once
    // from double, and the angles, as qk_norm_rope_kv_write computes them.
    const int half = nt.rotary_dim / 2;
    for (int e = tid; e < half; e += threads) {
        const float inv_freq = (float)pow((double)nt.theta, -2.0 * e / nt.rotary_dim);
        sincosf((float)pos_i * inv_freq, &rope_sin[e], &rope_cos[e]);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = tid + j * threads;
        if (i < n4) {
            const int r = i / C4, c = i % C4;
            reinterpret_cast<float4*>(rows + (r < nh ? r : DEC_HEADS) * D)[c] = x[j];
        }
    }
    if (tid < C4) {
        reinterpret_cast<float4*>(rows + (DEC_HEADS + 1) * D)[tid] = qw4;
        reinterpret_cast<float4*>(rows + (DEC_HEADS + 2) * D)[tid] = kw4;
    }
    if (kv && tid < C4) {
        const float vv[4] = {v4.x, v4.y, v4.z, v4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const __nv_bfloat16 b = f32_to_bf16(vv[e]);
            v_row[4 * tid + e] = bf16_to_f32(b);
            if (write_cache) v_cache[(slot * hkv + kvh) * D + 4 * tid + e] = b;
        }
    }
    __syncthreads();
    // Each row's sum of squares in qk_norm_rope_kv_write's order: lane-strided,
    // then the warp's shuffle tree.
    for (int r = warp; r < DEC_HEADS + 1; r += W) {
        if (r >= nh && !(r == DEC_HEADS && kv)) continue;
        const float* xr = rows + r * D;
        float ss = 0.f;
        for (int i = lane; i < D; i += 32) ss += xr[i] * xr[i];
        const float v = rsqrtf(warp_sum(ss) / D + nt.eps);
        if (lane == 0) inv[r] = v;
    }
    __syncthreads();
    // Scale and rotate: a thread takes a rotary pair (i, i + half) or a dim
    // past the rotary ones, of one row.
    const int per_row = half + (D - nt.rotary_dim);
    for (int idx = tid; idx < (DEC_HEADS + 1) * per_row; idx += threads) {
        const int r = idx / per_row, e = idx % per_row;
        if (r >= nh && !(r == DEC_HEADS && kv)) continue;
        float* xr = rows + r * D;
        const float* w = rows + (r < nh ? DEC_HEADS + 1 : DEC_HEADS + 2) * D;
        const float s_inv = inv[r];
        float a, b = 0.f;
        int i0 = e, i1 = -1;
        if (e < half) {
            i1 = e + half;
            const float sn = rope_sin[e], cs = rope_cos[e];
            const float lo = xr[e] * s_inv * w[e], hi = xr[i1] * s_inv * w[i1];
            a = lo * cs - hi * sn;
            b = hi * cs + lo * sn;
        } else {
            i0 = e + half;
            a = xr[i0] * s_inv * w[i0];
        }
        if (r == DEC_HEADS) {  // k: what the cache holds
            const __nv_bfloat16 ba = f32_to_bf16(a);
            xr[i0] = bf16_to_f32(ba);
            if (write_cache) k_cache[(slot * hkv + kvh) * D + i0] = ba;
            if (i1 >= 0) {
                const __nv_bfloat16 bb = f32_to_bf16(b);
                xr[i1] = bf16_to_f32(bb);
                if (write_cache) k_cache[(slot * hkv + kvh) * D + i1] = bb;
            }
        } else {
            xr[i0] = a;
            if (i1 >= 0) xr[i1] = b;
        }
    }
    __syncthreads();
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
// FUSED (attention_decode_fused): q and the new token come from `nt`
// (new_token_rows), `q` is not read, and the cache holds only the older keys.
template <int D, bool FUSED = false>
__device__ __forceinline__ void decode_split(float* __restrict__ part_o, float* __restrict__ part_ml,
                                             const float* __restrict__ q, __nv_bfloat16* __restrict__ k_cache,
                                             __nv_bfloat16* __restrict__ v_cache,
                                             const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                             const int* __restrict__ table_offset,
                                             const int* __restrict__ block_tables, int hq, int hkv, int block_size,
                                             float scale_log2, int splits, const NewToken* nt = nullptr) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int W = dec_warps<D>(), CH = D / 8, STEP = W * DEC_KEYS;
    constexpr int TILE = DEC_KEYS * CH;  // 16-byte chunks of 16 rows of K (or V)
    extern __shared__ uint4 dec_smem[];
    __shared__ float s_ml[W][2][DEC_HEADS];
    // FUSED: the new key's score per head (log2 units), then its weight; its v.
    __shared__ float new_score[DEC_HEADS];
    __shared__ float new_v[FUSED ? D : 1];

    const int group = hq / hkv;
    const int chunks = (group + DEC_HEADS - 1) / DEC_HEADS;
    const int kvh = blockIdx.x / chunks;
    const int h0 = kvh * group + (blockIdx.x % chunks) * DEC_HEADS;
    const int nh = min(DEC_HEADS, kvh * group + group - h0);
    const int s = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

    // FUSED: the cached keys are all but the last (the new token's).
    const int len = seq_len[s] - (FUSED ? 1 : 0);
    // Split 0 adds the new token's key (FUSED), even without cached keys.
    const bool new_key = FUSED && split == 0;
    int chunk = (len + splits - 1) / splits;
    chunk = max(STEP, (chunk + STEP - 1) / STEP * STEP);
    const int begin = split * chunk;
    const int end = min(len, begin + chunk);
    // Partial of head h0 + i: index part + i * splits.
    const size_t part = ((size_t)s * hq + h0) * splits + split;
    if (begin >= end && !new_key) {
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
            cp_async_16(smem_addr(kt + tile_swz<D>(r, ch)), k_cache + row * D + ch * 8, valid);
            cp_async_16(smem_addr(kt + TILE + tile_swz<D>(r, ch)), v_cache + row * D + ch * 8, valid);
        }
        if (one_page && n + 1 < n_steps) page = table[(kb + STEP) / block_size];
    };
    for (int n = 0; n < DEC_STAGES - 1; ++n) {
        if (n < n_steps) issue(n);
        cp_async_commit();
    }

    // FUSED: q (and k) rows staged in warp 0's last ring stage, which is not
    // issued before the loop; the barrier after the fragments frees it.
    const float* q_rows = q + ((size_t)t * hq + h0) * D;
    if constexpr (FUSED) {
        // (DEC_HEADS + 3) rows of D floats: 44 D bytes of the stage's 64 D.
        float* rows = reinterpret_cast<float*>(dec_smem + (DEC_STAGES - 1) * 2 * TILE);
        new_token_rows<D>(rows, new_v, *nt, t, h0, nh, kvh, hkv, new_key,
                          new_key && blockIdx.x % chunks == 0, k_cache, v_cache);
        if (new_key) {
            // Scores of the new key, from the bf16 q and k the tensor cores would use.
            for (int hh = warp; hh < nh; hh += W) {
                float acc = 0.f;
                for (int i = lane; i < D; i += 32)
                    acc += bf16_to_f32(f32_to_bf16(rows[hh * D + i])) * rows[DEC_HEADS * D + i];
                acc = warp_sum(acc);
                if (lane == 0) new_score[hh] = acc * scale_log2;
            }
        }
        q_rows = rows;
    }

    // Q fragments of head h0 + g (zero beyond the block's heads): k-step ks
    // holds dims 16ks + 2c, +1 and 16ks + 8 + 2c, +1; rows g + 8 are zero.
    uint32_t qa[D / 16][2];
    {
        const bool valid = g < nh;
        const float* qrow = q_rows + (size_t)(valid ? g : 0) * D + 2 * c;
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
    if constexpr (FUSED) __syncthreads();  // the staged rows are read

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
            ldmatrix_x4(b, smem_addr(kt + tile_swz<D>(ld_row, 2 * ks + ld_hi)));
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
            ldmatrix_x4_trans(a, smem_addr(vt + tile_swz<D>(ld_row, 2 * mt + ld_hi)));
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
        if (new_key) mm = fmaxf(mm, new_score[hh]);
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float f = exp2f(s_ml[w][0][hh] - mm);
            s_ml[w][0][hh] = f;  // from here on: the warp's weight
            ll += f * s_ml[w][1][hh];
        }
        if (new_key) {
            // The new key as one more partial: m = its score, l = 1, o = v.
            const float f = exp2f(new_score[hh] - mm);
            new_score[hh] = f;  // from here on: its weight
            ll += f;
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
        if (new_key) acc += new_score[hh] * new_v[dim];
        part_o[(part + (size_t)hh * splits) * D + dim] = acc;
    }
}

#define DECODE_KERNEL(D)                                                                                          \
    KESTREL_EXTERN void __launch_bounds__(dec_warps<D>() * 32) attention_decode_d##D(                               \
        float* __restrict__ part_o, float* __restrict__ part_ml, const float* __restrict__ q,                      \
        __nv_bfloat16* __restrict__ k_cache, __nv_bfloat16* __restrict__ v_cache,                                 \
        const int* __restrict__ seq_start, const int* __restrict__ seq_len, const int* __restrict__ table_offset, \
        const int* __restrict__ block_tables, int hq, int hkv, int block_size, float scale_log2, int splits) { pdl_begin();     \
        decode_split<D>(part_o, part_ml, q, k_cache, v_cache, seq_start, seq_len, table_offset, block_tables, hq, \
                        hkv, block_size, scale_log2, splits);                                                     \
    }

// The fused kernel only where a block has 128 threads: at head_dim 256 its two
// warps spend longer on the new token than the separate kernel and its launch
// take (docs/benchmarks/2026-11-30-h200-decode-fusion/).
#define DECODE_FUSED_KERNEL(D)                                                                                    \
    KESTREL_EXTERN void __launch_bounds__(dec_warps<D>() * 32) attention_decode_fused_d##D(                         \
        float* __restrict__ part_o, float* __restrict__ part_ml, __nv_bfloat16* __restrict__ k_cache,              \
        __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ seq_start, const int* __restrict__ seq_len,   \
        const int* __restrict__ table_offset, const int* __restrict__ block_tables, int hq, int hkv,              \
        int block_size, float scale_log2, int splits, const float* __restrict__ proj, int proj_stride,            \
        int k_offset, int v_offset, const float* __restrict__ q_norm, const float* __restrict__ k_norm,           \
        const int* __restrict__ positions, const int* __restrict__ slot_mapping, int rotary_dim, float theta,    \
        float eps) { pdl_begin();                                                                                  \
        const NewToken nt{proj, proj_stride, k_offset, v_offset, q_norm, k_norm, positions, slot_mapping,         \
                          rotary_dim, theta, eps};                                                                 \
        decode_split<D, true>(part_o, part_ml, nullptr, k_cache, v_cache, seq_start, seq_len, table_offset,       \
                              block_tables, hq, hkv, block_size, scale_log2, splits, &nt);                        \
    }

DECODE_KERNEL(64)
DECODE_KERNEL(128)
DECODE_KERNEL(256)
DECODE_FUSED_KERNEL(64)
DECODE_FUSED_KERNEL(128)

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

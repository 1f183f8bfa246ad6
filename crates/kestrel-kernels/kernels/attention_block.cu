// Non-causal attention of a block drafter's rows (DFlash): every query row of
// a sequence's block sees the same keys, the sequence's stored context and
// the block's own keys, slots lo .. lo + len of the sequence's store
// ([slot, hkv, D] bf16, as the paged cache lays out a page's rows).
//
// Why not the decode kernels: they take one query row as one sequence, so a
// block of B rows reads every key B times, and a batch of sequences costs a
// launch each. Here one block serves up to BLOCK_ATTN_ROWS query rows of one
// (sequence, kv head): the (block row, q head of the kv group) pairs, B x
// group of them, so each K/V tile is loaded once for all of them, and one
// launch serves every sequence of the step. Keys are split over blocks
// (split-KV) so that a single sequence still fills the device; the partials
// go to attention_decode_combine's layout, each query row as its own
// "sequence", and that kernel merges them.
//
// The blocks' rows are formed first by block_norm_rope_write (below): one
// launch for every sequence, each row's key and value into its sequence's
// store.
//
// Per 64-key tile, on tensor cores (m16n8k16, bf16 in, f32 accumulation):
//   S = Q K^T: rows = 16 query rows a warp, n = keys, k = dims;
//   O += P V:  rows = the same query rows, n = dims, k = keys; P's A
//   fragments are the S accumulators rounded to bf16 (no shuffles).
// K/V tiles are double-buffered through cp.async; keys past the split's end
// are zero-filled and masked. Scores are taken in log2 units; each row's
// sum counts the bf16-rounded weights that P.V uses, as the decode kernel's.
#include "attention_mma.cuh"
#include "attention_qkn.cuh"
#include "kestrel_abi.h"

constexpr int BLK_WARPS = BLOCK_ATTN_ROWS / 16;
constexpr int BLK_KEYS = BLOCK_ATTN_KEYS;
constexpr int BLK_STAGES = 2;

// Grid (hkv * row_groups, sequences, splits), block 32 * BLK_WARPS, dynamic
// shared memory BLK_STAGES * 2 * BLK_KEYS * D * 2 bytes. Query row m of a
// (sequence, kv head) is block row m / group, q head kvh * group + m % group;
// row group rg holds m in [rg * BLOCK_ATTN_ROWS, +BLOCK_ATTN_ROWS).
template <int D>
__device__ __forceinline__ void block_attention_body(const BlockAttentionArgs& a) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int CH = D / 8, TILE = BLK_KEYS * CH;  // 16-byte chunks of a K (or V) tile
    extern __shared__ uint4 blk_smem[];

    const int group = a.hq / a.hkv, m_total = a.rows * group;
    const int row_groups = (m_total + BLOCK_ATTN_ROWS - 1) / BLOCK_ATTN_ROWS;
    const int kvh = blockIdx.x / row_groups, rg = blockIdx.x % row_groups;
    const int seq = blockIdx.y, split = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;

    const int len = a.key_len[seq];
    int chunk = (len + a.splits - 1) / a.splits;
    chunk = max(BLK_KEYS, (chunk + BLK_KEYS - 1) / BLK_KEYS * BLK_KEYS);
    const int begin = split * chunk, end = min(len, begin + chunk);

    // This lane's two query rows (g and g + 8 of the warp's 16) and their
    // partials: (row t, head h) at ((t * hq + h) * splits + split).
    const int m_base = rg * BLOCK_ATTN_ROWS + warp * 16;
    size_t part[2];
    bool valid[2];
    const float* q_row[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int m = m_base + g + 8 * i;
        valid[i] = m < m_total;
        const int mm = valid[i] ? m : 0;
        const int t = seq * a.rows + mm / group, h = kvh * group + mm % group;
        part[i] = ((size_t)t * a.hq + h) * a.splits + split;
        q_row[i] = a.q + ((size_t)t * a.hq + h) * D;
    }
    const bool warp_active = m_base < m_total;

    if (begin >= end) {
        // No keys: a neutral partial, which the combine does not read past (m, l).
        if (warp_active && c == 0)
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if (valid[i]) {
                    a.part_ml[part[i] * 2] = -INFINITY;
                    a.part_ml[part[i] * 2 + 1] = 0.f;
                }
        return;
    }

    const __nv_bfloat16* k_store = reinterpret_cast<const __nv_bfloat16*>(a.k_base[seq]);
    const __nv_bfloat16* v_store = reinterpret_cast<const __nv_bfloat16*>(a.v_base[seq]);
    const int lo = a.key_lo[seq];
    const int n_tiles = (end - begin + BLK_KEYS - 1) / BLK_KEYS;
    auto issue = [&](int n) {
        uint4* kt = blk_smem + (n % BLK_STAGES) * 2 * TILE;
        const int kb = begin + n * BLK_KEYS;
        for (int idx = threadIdx.x; idx < TILE; idx += 32 * BLK_WARPS) {
            const int r = idx / CH, ch = idx % CH, key = kb + r;
            const bool ok = key < end;  // past the end: zeros (masked scores; V must not be NaN)
            const int64_t row = ok ? ((int64_t)(lo + key) * a.hkv + kvh) * D : 0;
            cp_async_16(smem_addr(kt + tile_swz<D>(r, ch)), k_store + row + ch * 8, ok);
            cp_async_16(smem_addr(kt + TILE + tile_swz<D>(r, ch)), v_store + row + ch * 8, ok);
        }
    };
    issue(0);
    cp_async_commit();

    // Q fragments (A, rows g / g + 8, k-step ks: dims 16ks + 2c, +1 and +8).
    uint32_t qa[D / 16][4];
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            float2 lo2 = make_float2(0.f, 0.f), hi2 = lo2;
            if (valid[i]) {
                lo2 = *reinterpret_cast<const float2*>(q_row[i] + 16 * ks + 2 * c);
                hi2 = *reinterpret_cast<const float2*>(q_row[i] + 16 * ks + 8 + 2 * c);
            }
            qa[ks][i] = pack_bf16(lo2.x, lo2.y);
            qa[ks][2 + i] = pack_bf16(hi2.x, hi2.y);
        }

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    // Rows g and g + 8: running max (log2 units) and sum, the same in the
    // four lanes of the quad.
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
    // ldmatrix row addresses. K as B (n = keys): matrices (keys 0-7 | 8-15) x
    // (chunk lo | hi) in the order b0, b1 of keys 0-7, b0, b1 of keys 8-15.
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_hi = (lane >> 3) & 1;
    // V as B (k = keys, n = dims), transposed: matrices (keys 0-7 | 8-15) x
    // (dims chunk lo | hi) in the order b0, b1 of dims lo, b0, b1 of dims hi.
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_hi = lane >> 4;

    for (int n = 0; n < n_tiles; ++n) {
        if (n + 1 < n_tiles) issue(n + 1);
        cp_async_commit();
        cp_async_wait<1>();  // tile n has landed (this thread's copies)
        __syncthreads();     // ... and every thread's
        if (warp_active) {
            const uint4* kt = blk_smem + (n % BLK_STAGES) * 2 * TILE;
            const uint4* vt = kt + TILE;
            const int kb = begin + n * BLK_KEYS;

            float sc[BLK_KEYS / 8][4];
#pragma unroll
            for (int j = 0; j < BLK_KEYS / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int kp = 0; kp < BLK_KEYS / 16; ++kp)
#pragma unroll
                for (int ks = 0; ks < D / 16; ++ks) {
                    uint32_t b[4];
                    ldmatrix_x4(b, smem_addr(kt + tile_swz<D>(16 * kp + k_row, 2 * ks + k_hi)));
                    mma_bf16(sc[2 * kp], qa[ks], b[0], b[1]);
                    mma_bf16(sc[2 * kp + 1], qa[ks], b[2], b[3]);
                }

            // Scores in log2 units, keys past the end masked; the tile's
            // first key is valid, so every new maximum is finite.
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int j = 0; j < BLK_KEYS / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = kb + 8 * j + 2 * c + (e & 1);
                    sc[j][e] = key < end ? sc[j][e] * a.scale_log2 : -INFINITY;
                    mx[e >> 1] = fmaxf(mx[e >> 1], sc[j][e]);
                }
            float alpha[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const float m_new = fmaxf(m_run[i], quad_max(mx[i]));
                alpha[i] = exp2f(m_run[i] - m_new);
                m_run[i] = m_new;
            }
            // P rounded to bf16, packed as O's A fragments: k-step kk
            // (keys 16kk..) is S tiles 2kk (a[0], a[1]) and 2kk + 1 (a[2], a[3]).
            uint32_t pa[BLK_KEYS / 16][4];
            float rs[2] = {0.f, 0.f};
#pragma unroll
            for (int j = 0; j < BLK_KEYS / 8; ++j)
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    const uint32_t p =
                        pack_bf16(exp2f(sc[j][2 * i] - m_run[i]), exp2f(sc[j][2 * i + 1] - m_run[i]));
                    pa[j >> 1][(j & 1) * 2 + i] = p;
                    rs[i] += bf16_lo(p) + bf16_hi(p);
                }
#pragma unroll
            for (int i = 0; i < 2; ++i) l_run[i] = l_run[i] * alpha[i] + quad_sum(rs[i]);
#pragma unroll
            for (int nt = 0; nt < D / 8; ++nt) {
                o[nt][0] *= alpha[0];
                o[nt][1] *= alpha[0];
                o[nt][2] *= alpha[1];
                o[nt][3] *= alpha[1];
            }
#pragma unroll
            for (int kk = 0; kk < BLK_KEYS / 16; ++kk)
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    uint32_t b[4];
                    ldmatrix_x4_trans(b, smem_addr(vt + tile_swz<D>(16 * kk + v_row, 2 * dp + v_hi)));
                    mma_bf16(o[2 * dp], pa[kk], b[0], b[1]);
                    mma_bf16(o[2 * dp + 1], pa[kk], b[2], b[3]);
                }
        }
        __syncthreads();  // every warp is done with this stage before it is refilled
    }
    cp_async_wait<0>();

    if (!warp_active) return;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        if (!valid[i]) continue;
        float* po = a.part_o + part[i] * D + 2 * c;
#pragma unroll
        for (int nt = 0; nt < D / 8; ++nt)
            *reinterpret_cast<float2*>(po + 8 * nt) = make_float2(o[nt][2 * i], o[nt][2 * i + 1]);
        if (c == 0) {
            a.part_ml[part[i] * 2] = m_run[i];
            a.part_ml[part[i] * 2 + 1] = l_run[i];
        }
    }
}

#define BLOCK_ATTENTION_KERNEL(D)                                                                    \
    KESTREL_EXTERN void __launch_bounds__(32 * BLK_WARPS)                                            \
        attention_block_d##D(const __grid_constant__ BlockAttentionArgs a) {                         \
        pdl_begin();                                                                                 \
        block_attention_body<D>(a);                                                                  \
    }

BLOCK_ATTENTION_KERNEL(64)
BLOCK_ATTENTION_KERNEL(128)

// qk_norm_rope_kv_write over the rows of several sequences (a block pass's,
// or context rows appended; hq = 0 forms no q), the same arithmetic: row t
// belongs to sequence row_seq[t], whose stores receive its key and value at
// slot_mapping[t]. Grid (T, ceil((hq + 2 hkv) / QKN_WARPS)), block
// 32 * QKN_WARPS, dynamic shared memory (rotary_dim + QKN_WARPS * d) floats.
KESTREL_EXTERN void block_norm_rope_write(const __grid_constant__ BlockNormRopeArgs a) {
    pdl_begin();
    const int seq = a.row_seq[blockIdx.x];
    qk_norm_rope_kv_write_impl<__nv_bfloat16>(
        a.proj, a.proj_stride, a.q_out, reinterpret_cast<__nv_bfloat16*>(a.k_base[seq]),
        reinterpret_cast<__nv_bfloat16*>(a.v_base[seq]), a.q_norm, a.k_norm, a.positions, a.slot_mapping, a.hq,
        a.hkv, a.d, a.rotary_dim, a.theta, a.eps, a.k_offset, a.v_offset);
}

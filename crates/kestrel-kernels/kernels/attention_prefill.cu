// Prefill attention: causal flash attention over the paged cache on tensor
// cores (mma m16n8k16, bf16 in, f32 accumulate, online softmax in f32).
// Handles any mix of sequences, including one-token ones; eager only (the
// grid is sized from the step's longest chunk).
#include "attention_prefill.cuh"

constexpr int PF_ROWS = 64;  // queries per block: 4 warps x 16 rows
constexpr int PF_THREADS = 128;

// ---- pieces of both mma.sync versions (one warp = 16 query rows) ----------

// sc = this warp's 16 query rows . the tile's PF_KEYS keys.
template <int D>
__device__ __forceinline__ void qk_scores(float (&sc)[PF_KEYS / 8][4], const uint4* sq, const uint4* sk, int warp,
                                          int lane) {
#pragma unroll
    for (int nt = 0; nt < PF_KEYS / 8; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        uint32_t a[4];
        ldmatrix_x4(a, smem_addr(sq + tile_swz<D>(warp * 16 + (lane & 15), 2 * ks + (lane >> 4))));
#pragma unroll
        for (int jp = 0; jp < PF_KEYS / 16; ++jp) {
            uint32_t b[4];
            ldmatrix_x4(b, smem_addr(sk + tile_swz<D>(jp * 16 + (lane & 7) + ((lane >> 4) << 3), 2 * ks + ((lane >> 3) & 1))));
            mma_bf16(sc[2 * jp], a, b[0], b[1]);
            mma_bf16(sc[2 * jp + 1], a, b[2], b[3]);
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
            ldmatrix_x4_trans(b, smem_addr(sv + tile_swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                       2 * np + (lane >> 4))));
            mma_bf16(o[2 * np], a, b[0], b[1]);
            mma_bf16(o[2 * np + 1], a, b[2], b[3]);
        }
    }
}


// One block = 64 new tokens of one sequence for one q head.
// Grid (ceil(max_new / 64), hq, S), block 128, dynamic shared memory
// 3 * 64 * D * 2 bytes (Q, K and V tiles).
//
// Per K/V tile: V's copy is in flight while S = Q K^T runs, and the next K's
// copy while the softmax and O += P V run (single buffers, cp.async groups).
// Warp w owns query rows 16w..16w+15: S and O stay in mma accumulators, and
// P goes from the S accumulator to the A fragment of P.V without shuffles.
template <int D>
__device__ __forceinline__ void prefill_tile(float* __restrict__ out, const float* __restrict__ q,
                                             const __nv_bfloat16* __restrict__ k_cache,
                                             const __nv_bfloat16* __restrict__ v_cache,
                                             const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                             const int* __restrict__ table_offset,
                                             const int* __restrict__ block_tables, int hq, int hkv, int block_size,
                                             float scale_log2, const float* __restrict__ proj, int proj_stride,
                                             int gate_offset) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int CH = D / 8;
    extern __shared__ uint4 smem[];
    uint4* sq = smem;
    uint4* sk = sq + PF_ROWS * CH;
    uint4* sv = sk + PF_KEYS * CH;
    // Cache rows of the keys of the next tiles (-1: past the end, zero-filled).
    __shared__ int64_t s_row[2][PF_KEYS];

    // Late query tiles have the most keys: start them first.
    const int h = blockIdx.y, s = blockIdx.z;
    PrefillRows p;
    if (!prefill_rows<PF_ROWS>(p, gridDim.x - 1 - blockIdx.x, h, s, seq_start, seq_len, table_offset, block_tables,
                               hq, hkv))
        return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;

    auto stage_rows = [&](int buf, int kb) { stage_key_rows(s_row[buf], p, kb, block_size, hkv); };
    auto load_tile = [&](uint4* dst, const __nv_bfloat16* cache, int buf) {
        for (int idx = tid; idx < PF_KEYS * CH; idx += PF_THREADS) {
            const int r = idx / CH, ch = idx % CH;
            const int64_t row = s_row[buf][r];
            cp_async_16(smem_addr(dst + tile_swz<D>(r, ch)), cache + (row < 0 ? 0 : row) * D + ch * 8, row >= 0);
        }
    };

    load_q_tile<D, PF_ROWS, PF_THREADS>(sq, q, p, hq, h, [](int r, int ch) { return tile_swz<D>(r, ch); });
    stage_rows(0, 0);
    __syncthreads();
    load_tile(sk, k_cache, 0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    // Rows g and g + 8 of this warp: running max (log2 units) and this lane's
    // part of the running sum (summed over the quad at the end).
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int pos0 = p.cached + p.row0 + warp * 16 + g;  // position of row g; row g + 8 is pos0 + 8

    const int n_tiles = (p.kv_end + PF_KEYS - 1) / PF_KEYS;
    for (int it = 0; it < n_tiles; ++it) {
        const int kb = it * PF_KEYS;
        load_tile(sv, v_cache, it & 1);
        cp_async_commit();
        cp_async_wait<1>();  // K(it) has landed (V(it) may still be in flight)
        __syncthreads();

        float sc[PF_KEYS / 8][4];
        qk_scores<D>(sc, sq, sk, warp, lane);

        if (it + 1 < n_tiles) stage_rows((it + 1) & 1, kb + PF_KEYS);
        __syncthreads();  // every warp is done with K; the next tile's rows are staged
        if (it + 1 < n_tiles) load_tile(sk, k_cache, (it + 1) & 1);
        cp_async_commit();  // possibly empty: keeps the group count uniform

        online_softmax<D>(sc, o, m, l, kb, pos0, c, scale_log2);

        cp_async_wait<1>();  // V(it) has landed (the next K may still be in flight)
        __syncthreads();
        pv_accumulate<D>(o, sc, sv, lane);
        __syncthreads();  // every warp is done with V before the next copy into it
    }

    store_rows<D>(out, o, l, p.row0 + warp * 16, g, c, p.n_new, p.t0, hq, h, proj, proj_stride, gate_offset);
}

#define PREFILL_KERNEL(D)                                                                                         \
    KESTREL_EXTERN void __launch_bounds__(PF_THREADS, 2) attention_prefill_d##D(                                  \
        float* __restrict__ out, const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,          \
        const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ seq_start,                             \
        const int* __restrict__ seq_len, const int* __restrict__ table_offset,                                    \
        const int* __restrict__ block_tables, int hq, int hkv, int block_size, float scale_log2,                  \
        const float* __restrict__ proj, int proj_stride, int gate_offset) { pdl_begin();                                       \
        prefill_tile<D>(out, q, k_cache, v_cache, seq_start, seq_len, table_offset, block_tables, hq, hkv,        \
                        block_size, scale_log2, proj, proj_stride, gate_offset);                                  \
    }

PREFILL_KERNEL(64)
PREFILL_KERNEL(128)
PREFILL_KERNEL(256)

// ---------------------------------------------------------------------------
// Version 2 (the default; `KESTREL_ATTN_PREFILL=v1` selects the kernel above).
//
// Same arithmetic per key tile as version 1 (64-key tiles from key 0, the same
// mma order and softmax updates), so its output is expected to be bit-identical;
// what changes is how the tiles are fed:
// - 128 queries per block (8 warps x 16 rows): every K/V tile brought from L2
//   serves twice the queries, halving L2 -> shared traffic (at head_dim 256 a
//   64-query block needs ~4 TB/s of L2 reads at 280 TFLOP/s).
// - K and V of a tile are one cp.async group, double-buffered: tile it + 1
//   streams in during all of tile it's math, with two barriers per tile
//   instead of four and no wait for V between S and P.V.
// - A warp skips a tile that lies wholly above its causal diagonal (exact:
//   such a tile changes neither m, l nor O).
// - Query tiles are the slowest grid dimension, heaviest first, so the
//   longest blocks of every head start in the first wave instead of the
//   last heads' longest blocks starting in the last wave.
// Shared memory: (128 + 2 * 2 * 64) * D * 2 bytes = 48, 96, 192 KiB at
// D = 64, 128, 256 (the host falls back to version 1 where that does not fit).
constexpr int PF2_WARPS = 8;
constexpr int PF2_ROWS = 16 * PF2_WARPS;
constexpr int PF2_THREADS = 32 * PF2_WARPS;

// Grid (hq, S, ceil(max_new / 128)), block 256.
template <int D>
__device__ __forceinline__ void prefill_tile_v2(float* __restrict__ out, const float* __restrict__ q,
                                                const __nv_bfloat16* __restrict__ k_cache,
                                                const __nv_bfloat16* __restrict__ v_cache,
                                                const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                                const int* __restrict__ table_offset,
                                                const int* __restrict__ block_tables, int hq, int hkv,
                                                int block_size, float scale_log2, const float* __restrict__ proj,
                                                int proj_stride, int gate_offset) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int CH = D / 8;
    constexpr int TILE = PF_KEYS * CH;  // 16-byte chunks of one K (or V) tile
    extern __shared__ uint4 smem[];
    uint4* sq = smem;
    uint4* skv = sq + PF2_ROWS * CH;  // buffer b: K at skv + 2b * TILE, V right after it
    // Cache rows of the keys of two tiles (-1: past the end, zero-filled).
    __shared__ int64_t s_row[2][PF_KEYS];

    const int h = blockIdx.x, s = blockIdx.y;
    PrefillRows p;
    if (!prefill_rows<PF2_ROWS>(p, gridDim.z - 1 - blockIdx.z, h, s, seq_start, seq_len, table_offset,
                                block_tables, hq, hkv))
        return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, c = lane & 3;
    // Keys this warp's real rows attend to: positions < w_end (0: no real row).
    const int wrow0 = p.row0 + warp * 16;
    const int w_end = wrow0 < p.n_new ? p.cached + min(p.n_new, wrow0 + 16) : 0;

    const auto at = [](int r, int ch) { return tile_swz<D>(r, ch); };
    auto stage_rows = [&](int buf, int kb) { stage_key_rows(s_row[buf], p, kb, block_size, hkv); };
    auto load_tile = [&](int buf) {
        uint4* sk = skv + 2 * buf * TILE;
        load_kv_tile<D, PF2_THREADS>(sk, sk + TILE, s_row[buf], k_cache, v_cache, at);
    };

    load_q_tile<D, PF2_ROWS, PF2_THREADS>(sq, q, p, hq, h, at);
    const int n_tiles = (p.kv_end + PF_KEYS - 1) / PF_KEYS;
    stage_rows(0, 0);
    if (n_tiles > 1) stage_rows(1, PF_KEYS);
    __syncthreads();
    load_tile(0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int pos0 = p.cached + wrow0 + g;  // position of row g; row g + 8 is pos0 + 8

    for (int it = 0; it < n_tiles; ++it) {
        const int kb = it * PF_KEYS, buf = it & 1;
        // Every warp is done with tile it - 1, whose buffer the next copy
        // overwrites, and the rows of tile it + 1 are staged.
        __syncthreads();
        if (it + 1 < n_tiles) load_tile(buf ^ 1);
        cp_async_commit();  // possibly empty: keeps the group count uniform
        // s_row[buf] was last read by tile it's copy, issued before the barrier.
        if (it + 2 < n_tiles) stage_rows(buf, kb + 2 * PF_KEYS);
        cp_async_wait<1>();  // this thread's part of tile it has landed
        __syncthreads();     // ... and everyone's
        // Wholly above this warp's diagonal (warp-uniform): nothing to add.
        if (kb >= w_end) continue;
        const uint4* sk = skv + 2 * buf * TILE;
        const uint4* sv = sk + TILE;

        float sc[PF_KEYS / 8][4];
        qk_scores<D>(sc, sq, sk, warp, lane);
        online_softmax<D>(sc, o, m, l, kb, pos0, c, scale_log2);
        pv_accumulate<D>(o, sc, sv, lane);
    }
    cp_async_wait<0>();  // nothing may be in flight into shared memory at exit

    store_rows<D>(out, o, l, wrow0, g, c, p.n_new, p.t0, hq, h, proj, proj_stride, gate_offset);
}

// Blocks per SM: two at D <= 128 (96 KiB of tiles each at most; at D = 128 the
// 128-register cap costs ~140 bytes of spills, outside the mma loops, which is
// cheaper than halving the warps per SM), one at 256 (192 KiB, and its 128 O
// accumulators per thread need the whole register file).
#define PREFILL_V2_KERNEL(D, MIN_BLOCKS)                                                                          \
    KESTREL_EXTERN void __launch_bounds__(PF2_THREADS, MIN_BLOCKS) attention_prefill_v2_d##D(                     \
        float* __restrict__ out, const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,          \
        const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ seq_start,                             \
        const int* __restrict__ seq_len, const int* __restrict__ table_offset,                                    \
        const int* __restrict__ block_tables, int hq, int hkv, int block_size, float scale_log2,                  \
        const float* __restrict__ proj, int proj_stride, int gate_offset) {                                       \
        pdl_begin();                                                                                              \
        prefill_tile_v2<D>(out, q, k_cache, v_cache, seq_start, seq_len, table_offset, block_tables, hq, hkv,     \
                           block_size, scale_log2, proj, proj_stride, gate_offset);                               \
    }

PREFILL_V2_KERNEL(64, 2)
PREFILL_V2_KERNEL(128, 2)
PREFILL_V2_KERNEL(256, 1)

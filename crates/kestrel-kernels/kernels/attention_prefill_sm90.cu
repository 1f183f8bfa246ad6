// Prefill attention on Hopper's warpgroup tensor-core instructions (wgmma,
// sm_90a only; the host runs attention_prefill.cu's kernels elsewhere).
//
// The same causal flash attention over the paged cache as version 2 of
// attention_prefill.cu, with the same online softmax (attention_prefill.cuh)
// and output rows; what changes is who multiplies. A block holds WGS
// warpgroups of 64 queries; per tile of 64 keys a warpgroup issues
//   S = Q K^T: D / 16 wgmma.m64n64k16, Q and K both read from shared
//              memory by descriptor (no ldmatrix, no operand registers);
//   O += P V:  4 wgmma.m64n{D}k16 with P straight from the softmax's
//              registers (the S accumulator layout is the A register layout)
//              and V read N-major from shared memory (no transpose).
// mma.sync needed an ldmatrix per operand fragment, whose shared-memory
// traffic and issue slots bounded version 2 at head dim 128. The warpgroups run their softmax and products
// independently, so one's exponentials overlap another's wgmma, and each
// tile's P V runs on while the next tile's Q K^T is issued. The output is
// bit-identical to version 2's on the benchmark shapes.
//
// Tiles in shared memory are column blocks of 64 dims, each [rows][64] bf16
// with 128-byte rows in wgmma's 128-byte swizzle (wgmma.cuh), so that Q and
// K are K-major operands and V (keys as rows) an N-major one.
#include "attention_prefill.cuh"
#include "wgmma.cuh"

// 16-byte chunk `ch` (of D / 8) of row `row` of a [ROWS][D] tile stored as
// column blocks of 64 dims (8 chunks), in 16-byte units from the tile start.
template <int ROWS>
__device__ __forceinline__ int wg_swz(int row, int ch) {
    return (ch >> 3) * ROWS * 8 + row * 8 + ((ch & 7) ^ (row & 7));
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// O += P V for one warpgroup at head dim D.
template <int D>
__device__ __forceinline__ void wg_pv(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t db) {
    if constexpr (D == 64) wgmma_m64n64k16_rs(o, a, db);
    else if constexpr (D == 128) wgmma_m64n128k16_rs(o, a, db);
    else wgmma_m64n256k16_rs(o, a, db);
}

// WGS warpgroups of 64 queries per block, PF_KEYS keys per K/V tile.
// Grid (hq, S, ceil(max_new / (64 WGS))), block 128 WGS, dynamic shared
// memory (64 WGS + 4 PF_KEYS) D * 2 + 1024 bytes (ops/attention/kernels.rs): the Q
// tile and two buffers of K and V.
template <int D, int WGS>
__device__ __forceinline__ void prefill_tile_wg(float* __restrict__ out, const float* __restrict__ q,
                                                const __nv_bfloat16* __restrict__ k_cache,
                                                const __nv_bfloat16* __restrict__ v_cache,
                                                const int* __restrict__ seq_start, const int* __restrict__ seq_len,
                                                const int* __restrict__ table_offset,
                                                const int* __restrict__ block_tables, int hq, int hkv,
                                                int block_size, float scale_log2, const float* __restrict__ proj,
                                                int proj_stride, int gate_offset) {
    static_assert(D % 64 == 0, "head_dim must be a multiple of 64");
    constexpr int KEYS = PF_KEYS;
    constexpr int CH = D / 8;
    constexpr int WG_ROWS = 64 * WGS, WG_THREADS = 128 * WGS;
    constexpr int TILE = KEYS * CH;  // 16-byte chunks of one K (or V) tile
    extern __shared__ uint4 smem_raw[];
    // Tiles on a 1,024-byte boundary (the launch adds 1 KiB for this).
    const uint32_t raw = smem_addr(smem_raw);
    uint4* sq = smem_raw + (((raw + 1023u) & ~1023u) - raw) / 16;
    uint4* skv = sq + WG_ROWS * CH;  // buffer b: K at skv + 2b * TILE, V right after it
    __shared__ int64_t s_row[2][KEYS];

    const int h = blockIdx.x, s = blockIdx.y;
    PrefillRows p;
    if (!prefill_rows<WG_ROWS>(p, gridDim.z - 1 - blockIdx.z, h, s, seq_start, seq_len, table_offset,
                               block_tables, hq, hkv))
        return;
    const int tid = threadIdx.x, wgr = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    // Keys this warpgroup's real rows attend to: positions < wg_end (0: none).
    const int wg_row0 = p.row0 + 64 * wgr;
    const int wg_end = wg_row0 < p.n_new ? p.cached + min(p.n_new, wg_row0 + 64) : 0;
    const int wrow0 = wg_row0 + 16 * warp;

    auto stage_rows = [&](int buf, int kb) { stage_key_rows(s_row[buf], p, kb, block_size, hkv); };
    auto load_tile = [&](int buf) {
        uint4* sk = skv + 2 * buf * TILE;
        load_kv_tile<D, WG_THREADS>(sk, sk + TILE, s_row[buf], k_cache, v_cache,
                                    [](int r, int ch) { return wg_swz<KEYS>(r, ch); });
    };

    load_q_tile<D, WG_ROWS, WG_THREADS>(sq, q, p, hq, h, [](int r, int ch) { return wg_swz<WG_ROWS>(r, ch); });
    fence_proxy_async();  // the Q stores, for wgmma (made visible by the first barrier below)
    const int n_tiles = (p.kv_end + KEYS - 1) / KEYS;
    stage_rows(0, 0);
    if (n_tiles > 1) stage_rows(1, KEYS);
    __syncthreads();
    load_tile(0);
    cp_async_commit();

    float o[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    float(&o_flat)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
    const int pos0 = p.cached + wrow0 + g;  // position of row g; row g + 8 is pos0 + 8
    // This warpgroup's 64 Q rows in each 64-dim column block.
    const uint32_t q_base = smem_addr(sq) + wgr * 64 * 128;

    // S = Q K^T into sc, which holds zeros.
    float sc[KEYS / 8][4];
    float(&sc_flat)[KEYS / 2] = reinterpret_cast<float(&)[KEYS / 2]>(sc);
    auto zero_scores = [&]() {
#pragma unroll
        for (int i = 0; i < KEYS / 2; ++i) sc_flat[i] = 0.f;
        pin(sc_flat);
    };
    auto qk = [&](uint32_t k_base) {
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < D / 16; ++ks) {
            // K step ks: column block ks / 4, 32 bytes per step inside it.
            const uint32_t qa = q_base + (ks >> 2) * WG_ROWS * 128 + (ks & 3) * 32;
            const uint32_t ka = k_base + (ks >> 2) * KEYS * 128 + (ks & 3) * 32;
            wgmma_m64n64k16(sc_flat, wgmma_desc(qa), wgmma_desc(ka));
        }
        wgmma_commit();
    };
    // P as bf16 A fragments (keys 16 kk .. + 15 are score blocks 2 kk and
    // 2 kk + 1), then O += P V. The scores are zeroed for the next tile's S
    // before these products are issued, which run on into the next tile:
    // the fragments are pinned after the wait that ends them, so that no
    // other value takes their registers while the products still read them.
    uint32_t a[KEYS / 16][4];
    auto pv = [&](uint32_t v_base) {
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk) {
            a[kk][0] = pack_bf16(sc[2 * kk][0], sc[2 * kk][1]);
            a[kk][1] = pack_bf16(sc[2 * kk][2], sc[2 * kk][3]);
            a[kk][2] = pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            a[kk][3] = pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
        }
        zero_scores();
        pin(o_flat);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KEYS / 16; ++kk)  // 16 keys = two 8-row groups = 2,048 bytes
            wg_pv<D>(o_flat, a[kk], wgmma_desc_n_major(v_base + kk * 2048, KEYS * 128));
        wgmma_commit();
    };

    // Tile it: P V of tile it - 1 may still be running; S of this tile
    // queues behind it, and the barrier after both frees tile it - 1's
    // buffer for the copy of tile it + 1.
    auto step = [&](int it, auto mask_tag) {
        constexpr bool MASK = decltype(mask_tag)::value;
        const int kb = it * KEYS, buf = it & 1;
        const uint32_t k_base = smem_addr(skv + 2 * buf * TILE);
        const uint32_t v_base = k_base + TILE * 16;
        // Wholly above this warpgroup's diagonal (warpgroup-uniform): nothing to add.
        const bool active = !MASK || kb < wg_end;
        cp_async_wait<0>();   // this thread's part of tile it has landed
        fence_proxy_async();  // ... visible to wgmma
        __syncthreads();      // ... and everyone's
        if (active) qk(k_base);
        wgmma_wait<0>();
        pin(o_flat);
        pin(sc_flat);
        pin(a);
        __syncthreads();  // every warpgroup's P V of tile it - 1 is done
        if (it + 1 < n_tiles) load_tile(buf ^ 1);
        cp_async_commit();
        if (it + 2 < n_tiles) stage_rows(buf, kb + 2 * KEYS);
        if (!active) return;
        online_softmax<D, MASK>(sc, o, m, l, kb, pos0, c, scale_log2);
        pv(v_base);
    };
    // Tiles whose keys all precede the block's first query need no mask.
    // They run in a loop of their own: with the mask code in the loop that
    // keeps P V running into the next tile, ptxas serializes every wgmma
    // (C7515), which made head dim 256 markedly slower.
    const int unmasked = min(n_tiles, (p.cached + p.row0 + 1) / KEYS);
    zero_scores();
    for (int it = 0; it < unmasked; ++it) step(it, std::false_type{});
    for (int it = unmasked; it < n_tiles; ++it) step(it, std::true_type{});
    wgmma_wait<0>();
    pin(o_flat);
    pin(a);
    cp_async_wait<0>();  // nothing may be in flight into shared memory at exit

    store_rows<D>(out, o, l, wrow0, g, c, p.n_new, p.t0, hq, h, proj, proj_stride, gate_offset);
}
#define WG_BODY(D, WGS)                                                                                    \
    prefill_tile_wg<D, WGS>(out, q, k_cache, v_cache, seq_start, seq_len, table_offset, block_tables, hq, hkv, \
                            block_size, scale_log2, proj, proj_stride, gate_offset)
#else
#define WG_BODY(D, WGS) __trap()
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The arguments of attention_prefill_v2_d{D}; one block per SM (its shared
// memory and registers).
#define PREFILL_WG_KERNEL(NAME, D, WGS)                                                                     \
    KESTREL_EXTERN void __launch_bounds__(128 * WGS, 1) NAME(                                                    \
        float* __restrict__ out, const float* __restrict__ q, const __nv_bfloat16* __restrict__ k_cache,          \
        const __nv_bfloat16* __restrict__ v_cache, const int* __restrict__ seq_start,                             \
        const int* __restrict__ seq_len, const int* __restrict__ table_offset,                                    \
        const int* __restrict__ block_tables, int hq, int hkv, int block_size, float scale_log2,                  \
        const float* __restrict__ proj, int proj_stride, int gate_offset) {                                       \
        pdl_begin();                                                                                              \
        WG_BODY(D, WGS);                                                                                    \
    }

// Block shapes chosen with attn_prefill_bench at 8K and 32K tokens
// (docs/benchmarks/2026-11-30-h200-wgmma-attention/): at head dim 128, three
// warpgroups and 64-key tiles (two warpgroups were slower with 64 keys and
// level with 128; three with 128 keys need more than the 168 registers a
// thread has, and ptxas serializes them); at 256 the O accumulators leave
// room for two warpgroups only. With 64-key
// tiles the output is bit-identical to version 2's on the benchmark shapes.
// ops/attention/kernels.rs mirrors the warpgroups (WG_WARPGROUPS).
PREFILL_WG_KERNEL(attention_prefill_wg_d64, 64, 3)
PREFILL_WG_KERNEL(attention_prefill_wg_d128, 128, 3)
PREFILL_WG_KERNEL(attention_prefill_wg_d256, 256, 2)

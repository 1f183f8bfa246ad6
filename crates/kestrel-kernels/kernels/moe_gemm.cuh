// The grouped expert GEMMs of the prefill MoE: tile shapes, the swizzled
// shared-memory layout and the mapping of blocks to (expert, row tile),
// shared by the mma.sync kernels (moe_prefill.cu) and the wgmma ones
// (moe_gemm_sm90.cu).
#pragma once
#include "attention_mma.cuh"

// Block tile: 64 rows (tokens) x 128 weight rows, K in steps of 64, a 4-stage
// cp.async pipeline.
constexpr int MG_BM = 64;
constexpr int MG_BN = 128;
constexpr int MG_BK = 64;
constexpr int MG_STAGES = 4;
constexpr int MG_A_CHUNKS = MG_BM * MG_BK / 8;  // 16-byte chunks per stage
constexpr int MG_B_CHUNKS = MG_BN * MG_BK / 8;
constexpr int MG_STAGE_CHUNKS = MG_A_CHUNKS + MG_B_CHUNKS;
// Dynamic shared memory of the GEMM kernels: 4 * (8 + 16) KiB = 96 KiB
// (mirrored by `GEMM_SMEM_BYTES` in ops/moe.rs; the wgmma kernels take 1 KiB
// more to align their stages).
constexpr int MG_SMEM_BYTES = MG_STAGES * MG_STAGE_CHUNKS * 16;
static_assert(MG_SMEM_BYTES == 96 * 1024, "ops/moe.rs assumes 96 KiB");

enum { MG_ROUTER = 0, MG_GATE_UP = 1, MG_DOWN = 2 };

// Tile rows are 64 bf16 = 8 chunks of 16 bytes; chunk ch of row r sits at
// ch ^ (r % 8), so the 8 row addresses of every ldmatrix hit distinct banks
// (the layout of attention_prefill.cu with D = 64). On a 1024-byte aligned
// tile this is also the 128-byte swizzle of wgmma's K-major operands.
__device__ __forceinline__ int mg_swz(int row, int ch) { return row * 8 + (ch ^ (row & 7)); }

// The rows block `slot` serves: group (expert) grp, grouped rows row0 ..
// row0 + m_rows. Rows are in "grouped order": group e owns rows offsets[e] ..
// offsets[e+1]; its 64-row tiles are numbered tile_off[e] .. tile_off[e+1] in
// one flat list (computed on the device by moe_route_plan), and the grid
// launches an upper bound of tiles, the extra blocks finding none (false).
// With tile_off == nullptr there is one group of rows 0 .. rows.
// BM: the rows of a tile (64, or 128 for the wgmma kernels' large tiles);
// tile_off must have been computed for the same BM.
struct MgTile {
    int grp, row0, m_rows;
};
template <int BM = MG_BM>
__device__ __forceinline__ bool mg_tile(MgTile& t, int slot, const int* __restrict__ offsets,
                                        const int* __restrict__ tile_off, int groups, int rows) {
    int row_end;
    t.grp = 0;
    if (tile_off != nullptr) {
        if (slot >= tile_off[groups]) return false;
        int lo = 0, hi = groups;  // tile_off[lo] <= slot < tile_off[hi]
        while (hi - lo > 1) {
            const int mid = (lo + hi) >> 1;
            if (tile_off[mid] <= slot) lo = mid;
            else hi = mid;
        }
        t.grp = lo;
        t.row0 = offsets[lo] + (slot - tile_off[lo]) * BM;
        row_end = offsets[lo + 1];
    } else {
        t.row0 = slot * BM;
        row_end = rows;
    }
    if (t.row0 >= row_end) return false;
    t.m_rows = min(BM, row_end - t.row0);
    return true;
}

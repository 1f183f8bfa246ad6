// The prefill MoE's expert GEMMs on Hopper's warpgroup tensor-core
// instructions (wgmma, sm_90a only): the same tiles, grid, shared-memory
// layout and epilogues as the mma.sync kernels of moe_prefill.cu, which
// other GPUs keep using. The router GEMM (MG_ROUTER) has a wgmma form too.
//
// A block tile is BM x BN: BM = 64 rows for one warpgroup (128 threads),
// or 128 rows for two that share each stage's weight tile (256 threads),
// which halves the weight bytes per FLOP where experts get enough rows
// (ops/moe picks); BN = 128 weight rows, or 256 for 128-row tiles (the
// default there, see Mgw). The cp.async pipeline fills 3 or 4 stages; each
// K tile of 64 is then 4 wgmma.m64n{BN}k16 per
// warpgroup that read both operands straight from shared memory through
// matrix descriptors (mma.sync needed an ldmatrix per operand fragment,
// whose shared-memory traffic and issue slots bounded the old kernels). The
// tiles' layout (moe_gemm.cuh: 128-byte rows,
// 16-byte chunk c of row r at c ^ (r % 8)) is wgmma's 128-byte swizzle for
// K-major operands once each stage starts on a 1024-byte boundary.
//
// Accumulation: per K tile, in tile order, as the mma.sync kernels; each
// thread's registers after wgmma.wait hold (PTX ISA, "wgmma 64xNx16 D"), for
// warp w, g = lane / 4, c = lane % 4 and every 8-column block j:
//   d[4j], d[4j+1] = D[16w + g][8j + 2c, +1], d[4j+2], d[4j+3] = D[16w + g + 8][...].
#include <cuda_fp8.h>

#include "moe_gemm.cuh"
#include "wgmma.cuh"

// Threads, pipeline stages, 16-byte chunks of a stage (A then B), and the
// dynamic shared memory (the stages plus 1 KiB for alignment; ops/moe mirrors
// it) per tile of BM rows and BN weight rows. At BN = 128, three stages (97
// KiB at 128 rows, 73 at 64) let two blocks (three at 64 rows) share an SM,
// so that one's epilogue and tile start overlap another's main loop: with 4
// stages (129 KiB, one block per SM) the schedulers issued in a third of the
// cycles, and gate_up was slower. The wide tiles (BM = 128, BN = 256) read a quarter fewer bytes
// per product from L2 and take a whole SM with 4 stages (193 KiB). A
// warp-specialized form of the wide tiles (a producer warpgroup feeding
// the weights by TMA and the rows by cp.async, mbarriers instead of block
// barriers) was correct and exactly as fast, so it was not kept
// (docs/benchmarks/2026-11-30-h200-moe-wide-tiles/).
//
// Block-FP8 weights (FP8 = true; e4m3 codes, one f32 scale per 128 x 128
// block): a stage holds the weight tile as it is in memory (BN rows of 64
// codes, 4 chunks a row, unswizzled), and each thread turns the chunks it
// copied into bf16 (code * scale, rounded once: the values of the bf16 copy
// fp8.cu's fp8_to_bf16 makes, so the products are those of that copy) in one
// of three swizzled bf16 weight tiles. K tile kt + 1 is converted while the
// wgmmas of tiles kt - 1 and kt run (the third tile is the one kt - 2 read),
// so the conversion stays off the tensor cores' path (converting tile kt just
// before its own wgmmas, with two tiles, put it on that path, measured in
// docs/benchmarks/2026-12-04-h200-fp8-prefill-kv-budget). A tile is
// converted one iteration before it is used, so the copies need one more
// stage of lead: 4 stages where a block has the SM (128-row tiles), 3 where
// two share it (64 rows).
template <int BM, int BN = MG_BN, bool FP8 = false>
struct Mgw {
    static constexpr int THREADS = 2 * BM;
    static constexpr int STAGES = FP8 ? (BM == 64 ? 3 : 4) : (BN == MG_BN ? 3 : 4);
    static constexpr int A_CHUNKS = BM * MG_BK / 8;
    static constexpr int B_CHUNKS = BN * MG_BK / 8;
    // FP8: a stage's codes (16 per chunk); the bf16 tiles follow the stages.
    static constexpr int B8_CHUNKS = BN * MG_BK / 16;
    static constexpr int BF16_TILES = FP8 ? 3 : 0;
    static constexpr int STAGE_CHUNKS = A_CHUNKS + (FP8 ? B8_CHUNKS : B_CHUNKS);
    static constexpr int SMEM_BYTES = (STAGES * STAGE_CHUNKS + BF16_TILES * B_CHUNKS) * 16 + 1024;
    // Copies per thread and K tile: A and B rows r_lo + ROW_STEP * i.
    static constexpr int ROW_STEP = THREADS / 8;
    static constexpr int A_LOADS = BM / ROW_STEP, B_LOADS = BN / ROW_STEP;
    // FP8 code copies: chunk tid % 4 of rows tid / 4 + ROW_STEP8 * i.
    static constexpr int ROW_STEP8 = THREADS / 4;
    static constexpr int B8_LOADS = BN / ROW_STEP8;
    // Accumulators per thread: a warpgroup's 64 x BN tile over 128 threads.
    static constexpr int ACC = BN / 2;
};
static_assert(Mgw<64>::SMEM_BYTES == 73 * 1024 && Mgw<128>::SMEM_BYTES == 97 * 1024 &&
                  Mgw<128, 256>::SMEM_BYTES == 193 * 1024 && Mgw<64, 128, true>::SMEM_BYTES == 97 * 1024 &&
                  Mgw<128, 128, true>::SMEM_BYTES == 145 * 1024 && Mgw<128, 256, true>::SMEM_BYTES == 225 * 1024,
              "ops/moe/kernels.rs mirrors these");
// A scale block spans whole K tiles, and whole chunks of codes.
static_assert(128 % MG_BK == 0 && MG_BK % 16 == 0, "FP8 scale blocks of 128");

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// The product of one K step of 16 at tile width BN.
template <int BN>
__device__ __forceinline__ void wgmma_k16(float (&d)[BN / 2], uint64_t da, uint64_t db) {
    if constexpr (BN == 256) wgmma_m64n256k16(d, da, db);
    else wgmma_m64n128k16(d, da, db);
}

// 16 e4m3 codes times `scale`, as 16 bf16 (two 16-byte chunks).
__device__ __forceinline__ void fp8x16_to_bf16(uint4& lo, uint4& hi, uint4 codes, float scale) {
    const uint32_t w[4] = {codes.x, codes.y, codes.z, codes.w};
    uint32_t out[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const __nv_fp8x2_storage_t pair = (__nv_fp8x2_storage_t)((w[i / 2] >> (16 * (i % 2))) & 0xffffu);
        const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3);
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&hr));
        out[i] = pack_bf16(f.x * scale, f.y * scale);
    }
    lo = make_uint4(out[0], out[1], out[2], out[3]);
    hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// The epilogue of both kernel forms: this thread's accumulators (warpgroup
// wgr, warp w of it) to bf16 rows of the output, SwiGLU applied for gate_up
// (gate columns in the tile's first half, their up columns in the second).
template <int MODE, int BN>
__device__ __forceinline__ void mgw_epilogue(void* __restrict__ out, int ldo, const float (&acc)[BN / 2], int row0,
                                             int m_rows, int nt, int n) {
    constexpr int HALF = BN / 2;
    const int tid = threadIdx.x, lane = tid & 31, wgr = tid >> 7, warp = (tid >> 5) & 3;
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
        const int r = 64 * wgr + 16 * warp + g + 8 * hr;
        if (r >= m_rows) continue;
        const size_t p = (size_t)(row0 + r);
        if (MODE == MG_GATE_UP) {
            __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + p * ldo;
#pragma unroll
            for (int j = 0; j < BN / 16; ++j) {
                const int col = nt * HALF + 8 * j + 2 * c;  // n % 8 == 0: col + 1 < n too
                if (col >= n) continue;
                const float v0 = siluf_exact(acc[4 * j + 2 * hr]) * acc[4 * (j + BN / 16) + 2 * hr];
                const float v1 = siluf_exact(acc[4 * j + 2 * hr + 1]) * acc[4 * (j + BN / 16) + 2 * hr + 1];
                *reinterpret_cast<uint32_t*>(o + col) = pack_bf16(v0, v1);
            }
        } else if (MODE == MG_ROUTER) {
            float* o = static_cast<float*>(out) + p * ldo;  // ldo may be odd: scalar stores
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int col = nt * BN + 8 * j + 2 * c;
                if (col < n) o[col] = acc[4 * j + 2 * hr];
                if (col + 1 < n) o[col + 1] = acc[4 * j + 2 * hr + 1];
            }
        } else {
            __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + p * ldo;
#pragma unroll
            for (int j = 0; j < BN / 8; ++j) {
                const int col = nt * BN + 8 * j + 2 * c;  // n % 8 == 0: col + 1 < n too
                if (col >= n) continue;
                *reinterpret_cast<uint32_t*>(o + col) = pack_bf16(acc[4 * j + 2 * hr], acc[4 * j + 2 * hr + 1]);
            }
        }
    }
}

// w: bf16 weights, or for FP8 the codes, with w_scale their block scales
// (scale_stride floats between two groups' grids, ceil(k / 128) a row).
template <int MODE, int BM, int BN, bool FP8 = false>
__device__ __forceinline__ void moe_gemm_wg(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a,
                                            int lda, const int* __restrict__ a_rows, const void* __restrict__ w,
                                            long long w_stride, const float* __restrict__ w_scale,
                                            long long scale_stride, const int* __restrict__ offsets,
                                            const int* __restrict__ tile_off, int groups, int rows, int n, int k,
                                            int k_period, int n_tiles) {
    extern __shared__ uint4 smem_raw[];
    // Stages on a 1024-byte boundary (the launch adds 1 KiB for this).
    const uint32_t raw = smem_addr(smem_raw);
    uint4* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw) / 16;
    const int nt = (int)(blockIdx.x % (unsigned)n_tiles);
    const int slot = (int)(blockIdx.x / (unsigned)n_tiles);
    using P = Mgw<BM, BN, FP8>;
    constexpr int HALF = BN / 2;  // gate_up: act columns per tile
    MgTile tile;
    if (!mg_tile<BM>(tile, slot, offsets, tile_off, groups, rows)) return;
    const int grp = tile.grp, row0 = tile.row0, m_rows = tile.m_rows;

    // Warpgroup wgr computes tile rows 64 wgr .. + 63 (the epilogue: warp w of it rows 16 w ...).
    const int tid = threadIdx.x, wgr = tid >> 7;

    // Each thread copies chunk `ch` of A and B tile rows r_lo + ROW_STEP i
    // (FP8 codes: chunk ch8 of rows r_lo8 + ROW_STEP8 i).
    const int ch = tid & 7, r_lo = tid >> 3;
    const int ch8 = tid & 3, r_lo8 = tid >> 2;
    const __nv_bfloat16* a_src[P::A_LOADS];
    bool a_ok[P::A_LOADS];
#pragma unroll
    for (int i = 0; i < P::A_LOADS; ++i) {
        const int r = r_lo + P::ROW_STEP * i;
        a_ok[i] = r < m_rows;
        int arow = row0 + (a_ok[i] ? r : 0);
        if (a_rows != nullptr) arow = a_rows[arow];
        a_src[i] = a + (size_t)arow * lda;
    }
    // Weight row of B tile row r (an output column of the tile), or -1.
    auto weight_row = [&](int r) {
        if (MODE == MG_GATE_UP) {
            // Rows 0 .. HALF-1: the gate rows of act columns nt*HALF + r; then their up rows.
            const int col = nt * HALF + r % HALF;
            return col < n ? (r < HALF ? col : n + col) : -1;
        }
        const int col = nt * BN + r;
        return col < n ? col : -1;
    };
    constexpr int BL = FP8 ? P::B8_LOADS : P::B_LOADS;
    const char* b_src[BL];
    bool b_ok[BL];
    // FP8: the scale row of each copied row (this K block's scale, the next one's).
    const float* sc_row[BL];
    float sc_cur[BL], sc_next[BL];
    const int scale_cols = (k + 127) / 128;
#pragma unroll
    for (int i = 0; i < BL; ++i) {
        const int wrow = FP8 ? weight_row(r_lo8 + P::ROW_STEP8 * i) : weight_row(r_lo + P::ROW_STEP * i);
        b_ok[i] = wrow >= 0;
        const size_t row = (size_t)(b_ok[i] ? wrow : 0);
        if constexpr (FP8) {
            b_src[i] = static_cast<const char*>(w) + (size_t)grp * (size_t)w_stride + row * (size_t)k_period;
            sc_row[i] = w_scale + (size_t)grp * (size_t)scale_stride + (row / 128) * (size_t)scale_cols;
            sc_cur[i] = sc_row[i][0];
            sc_next[i] = sc_row[i][scale_cols > 1 ? 1 : 0];
        } else {
            b_src[i] = reinterpret_cast<const char*>(static_cast<const __nv_bfloat16*>(w) + (size_t)grp * (size_t)w_stride +
                                                     row * (size_t)k_period);
        }
    }

    auto load_stage = [&](int stage, int kt) {
        uint4* sa = smem + stage * P::STAGE_CHUNKS;
        uint4* sb = sa + P::A_CHUNKS;
        const int kk = kt * MG_BK + ch * 8;
        const bool k_ok = kk < k;
        const int ka = k_ok ? kk : 0;
        const int kb = MODE == MG_ROUTER ? ka % k_period : ka;
#pragma unroll
        for (int i = 0; i < P::A_LOADS; ++i)
            cp_async_16(smem_addr(sa + mg_swz(r_lo + P::ROW_STEP * i, ch)), a_src[i] + ka, a_ok[i] && k_ok);
        if constexpr (FP8) {
            const int k8 = kt * MG_BK + ch8 * 16;  // k % 16 == 0: a chunk is in or out whole
            const bool k8_ok = k8 < k;
#pragma unroll
            for (int i = 0; i < BL; ++i) {
                const int r = r_lo8 + P::ROW_STEP8 * i;
                cp_async_16(smem_addr(sb + r * 4 + ch8), b_src[i] + (k8_ok ? k8 : 0), b_ok[i] && k8_ok);
            }
        } else {
#pragma unroll
            for (int i = 0; i < BL; ++i)
                cp_async_16(smem_addr(sb + mg_swz(r_lo + P::ROW_STEP * i, ch)), b_src[i] + 2 * (size_t)kb,
                            b_ok[i] && k_ok);
        }
    };

    const int k_tiles = (k + MG_BK - 1) / MG_BK;
#pragma unroll
    for (int s = 0; s < P::STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();
    }

    float acc[P::ACC];
#pragma unroll
    for (int i = 0; i < P::ACC; ++i) acc[i] = 0.f;

    // FP8: K tile kt's codes (this thread's copies, landed) as bf16 in
    // weight tile kt % 3, whose last reader (tile kt - 3) is done. Tiles are
    // converted in order (the scales advance with them).
    auto bf16_tile = [&](int kt) { return smem + P::STAGES * P::STAGE_CHUNKS + (kt % 3) * P::B_CHUNKS; };
    auto convert = [&](int kt, const uint4* stage) {
        if constexpr (FP8) {
            if (kt % 2 == 0 && kt > 0) {  // a new scale block: 128 = 2 K tiles
#pragma unroll
                for (int i = 0; i < BL; ++i) sc_cur[i] = sc_next[i];
                const int next = min(kt / 2 + 1, scale_cols - 1);
#pragma unroll
                for (int i = 0; i < BL; ++i) sc_next[i] = sc_row[i][next];
            }
            asm volatile("" ::: "memory");  // the reads below follow the wait
            const uint4* s8 = stage + P::A_CHUNKS;
            uint4* sbf = bf16_tile(kt);
#pragma unroll
            for (int i = 0; i < BL; ++i) {
                const int r = r_lo8 + P::ROW_STEP8 * i;
                uint4 lo, hi;
                fp8x16_to_bf16(lo, hi, s8[r * 4 + ch8], sc_cur[i]);
                sbf[mg_swz(r, 2 * ch8)] = lo;
                sbf[mg_swz(r, 2 * ch8 + 1)] = hi;
            }
        }
    };

    // Stage of K tile kt landed and visible to wgmma; its descriptors.
    auto stage_ready = [&](int kt, uint64_t& da, uint64_t& db) {
        cp_async_wait<P::STAGES - 2>();  // K tile kt has landed (this thread's copies)
        fence_proxy_async();             // ... and is visible to wgmma
        __syncthreads();                 // ... for every thread's copies
        const uint4* sa = smem + (kt % P::STAGES) * P::STAGE_CHUNKS;
        // This warpgroup's 64 A rows (8 KiB further for the second), all of B.
        da = wgmma_desc(smem_addr(sa + wgr * MG_A_CHUNKS));
        db = wgmma_desc(smem_addr(sa + P::A_CHUNKS));
    };
    // After tile kt's wgmmas are issued and tile kt - 1's are done: refill
    // tile kt - 1's stage with tile kt + STAGES - 1.
    auto refill = [&](int kt) {
        const int next = kt + P::STAGES - 1;
        if (next < k_tiles) load_stage(next % P::STAGES, next);
        cp_async_commit();
    };

    if constexpr (FP8) {
        static_assert(MODE != MG_ROUTER, "the router's weights are bf16");
        // Tile 0 converted and visible before the loop; then each iteration
        // issues tile kt, converts tile kt + 1 while kt - 1 and kt run, waits
        // for kt - 1, and refills its stage (its codes were converted one
        // iteration earlier) with tile kt + STAGES - 1.
        cp_async_wait<P::STAGES - 2>();
        convert(0, smem);
        fence_proxy_async();
        __syncthreads();
        for (int kt = 0; kt < k_tiles; ++kt) {
            const uint4* sa = smem + (kt % P::STAGES) * P::STAGE_CHUNKS;
            const uint64_t da = wgmma_desc(smem_addr(sa + wgr * MG_A_CHUNKS));
            const uint64_t db = wgmma_desc(smem_addr(bf16_tile(kt)));
            pin(acc);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < MG_BK / 16; ++ks) wgmma_k16<BN>(acc, da + 2 * ks, db + 2 * ks);
            wgmma_commit();
            if (kt + 1 < k_tiles) {
                cp_async_wait<P::STAGES - 3>();  // tile kt + 1 has landed (this thread's copies)
                convert(kt + 1, smem + ((kt + 1) % P::STAGES) * P::STAGE_CHUNKS);
            }
            wgmma_wait<1>();
            pin(acc);
            // Tile kt + 1 visible to wgmma; every warpgroup done with kt - 1.
            fence_proxy_async();
            __syncthreads();
            refill(kt);
        }
    } else if constexpr (MODE == MG_ROUTER) {
        // Each K tile in fresh registers, then an f32 add to the total (see
        // MG_ROUTER in moe_prefill.cu); the other block on the SM fills the
        // wait. (Two tiles in flight in two sets of registers, the first
        // added while the second's products ran, was slower.)
        for (int kt = 0; kt < k_tiles; ++kt) {
            uint64_t da, db;
            stage_ready(kt, da, db);
            float part[P::ACC];
#pragma unroll
            for (int i = 0; i < P::ACC; ++i) part[i] = 0.f;
            pin(part);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < MG_BK / 16; ++ks) wgmma_k16<BN>(part, da + 2 * ks, db + 2 * ks);
            wgmma_commit();
            wgmma_wait<0>();
            pin(part);
#pragma unroll
            for (int i = 0; i < P::ACC; ++i) acc[i] = __fadd_rn(acc[i], part[i]);
            refill(kt);
        }
    } else {
        // K tile kt's wgmmas run while the next tile's are issued: after
        // committing tile kt, waiting for all but one group means tile kt - 1
        // is done, so its stage can take the copies of tile kt + STAGES - 1.
        for (int kt = 0; kt < k_tiles; ++kt) {
            uint64_t da, db;
            stage_ready(kt, da, db);
            pin(acc);
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < MG_BK / 16; ++ks)  // 16 columns = 32 bytes = 2 descriptor units
                wgmma_k16<BN>(acc, da + 2 * ks, db + 2 * ks);
            wgmma_commit();
            wgmma_wait<1>();
            pin(acc);
            // With two warpgroups, the other one's tile kt - 1 products may
            // still read the stage about to be refilled: wait for them too.
            if constexpr (BM > 64) __syncthreads();
            refill(kt);
        }
    }
    wgmma_wait<0>();
    pin(acc);
    cp_async_wait<0>();

    mgw_epilogue<MODE, BN>(out, ldo, acc, row0, m_rows, nt, n);
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

// The gate_up and down modes of moe_prefill.cu's kernels (same arguments but
// no w_extra and k_period == k), with 64-row tiles (one warpgroup) and with
// 128-row tiles (two). Built for sm_90a only: on other targets the kernels
// exist but trap, and ops/moe never launches them there.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MGW_BODY(MODE, BM, BN)                                                                                 \
    moe_gemm_wg<MODE, BM, BN>(out, ldo, a, lda, a_rows, w, w_stride, nullptr, 0, offsets, tile_off, groups, rows, \
                              n, k, k, n_tiles)
#define MGW_FP8_BODY(MODE, BM, BN)                                                                           \
    moe_gemm_wg<MODE, BM, BN, true>(out, ldo, a, lda, a_rows, w, w_stride, w_scale, scale_stride, offsets,  \
                                    tile_off, groups, rows, n, k, k, n_tiles)
#define MGW_ROUTER_BODY                                                                                       \
    moe_gemm_wg<MG_ROUTER, 64, MG_BN>(out, ldo, a, lda, a_rows, w, w_stride, nullptr, 0, offsets, tile_off,   \
                                      groups, rows, n, k, k_period, n_tiles)
#else
#define MGW_BODY(MODE, BM, BN) __trap()
#define MGW_FP8_BODY(MODE, BM, BN) __trap()
#define MGW_ROUTER_BODY __trap()
#endif
#define MOE_GEMM_WG_KERNEL(NAME, MODE, BM, BN, MIN_BLOCKS)                                                       \
    KESTREL_EXTERN void __launch_bounds__(2 * BM, MIN_BLOCKS)                                                    \
        NAME(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a, int lda,                      \
             const int* __restrict__ a_rows, const __nv_bfloat16* __restrict__ w, long long w_stride,            \
             const int* __restrict__ offsets, const int* __restrict__ tile_off, int groups, int rows, int n,     \
             int k, int n_tiles) {                                                                               \
        pdl_begin();                                                                                             \
        MGW_BODY(MODE, BM, BN);                                                                                  \
    }
// The FP8 forms: w holds codes (w_stride codes between groups) and w_scale
// their block scales (scale_stride floats between groups).
#define MOE_GEMM_WG_FP8_KERNEL(NAME, MODE, BM, BN, MIN_BLOCKS)                                                   \
    KESTREL_EXTERN void __launch_bounds__(2 * BM, MIN_BLOCKS)                                                    \
        NAME(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a, int lda,                      \
             const int* __restrict__ a_rows, const uint8_t* __restrict__ w, long long w_stride,                  \
             const float* __restrict__ w_scale, long long scale_stride, const int* __restrict__ offsets,         \
             const int* __restrict__ tile_off, int groups, int rows, int n, int k, int n_tiles) {                \
        pdl_begin();                                                                                             \
        MGW_FP8_BODY(MODE, BM, BN);                                                                              \
    }

// Launch: grid n_tiles * row tiles of BM (1-D), block 2 * BM, dynamic shared
// memory Mgw<BM, BN, FP8>::SMEM_BYTES; a column tile is BN weight rows
// (gate_up: BN / 2 act columns).
MOE_GEMM_WG_KERNEL(moe_gate_up_gemm_sm90, MG_GATE_UP, 64, 128, 3)
MOE_GEMM_WG_KERNEL(moe_down_gemm_sm90, MG_DOWN, 64, 128, 3)
MOE_GEMM_WG_KERNEL(moe_gate_up_gemm_sm90_m128, MG_GATE_UP, 128, 128, 2)
MOE_GEMM_WG_KERNEL(moe_down_gemm_sm90_m128, MG_DOWN, 128, 128, 2)
MOE_GEMM_WG_KERNEL(moe_gate_up_gemm_sm90_m128_n256, MG_GATE_UP, 128, 256, 1)
MOE_GEMM_WG_KERNEL(moe_down_gemm_sm90_m128_n256, MG_DOWN, 128, 256, 1)
// FP8: 97 KiB at 64 rows, two blocks an SM (the bf16 form fits three); the
// 128-row forms take a whole SM (145 and 225 KiB).
MOE_GEMM_WG_FP8_KERNEL(moe_gate_up_gemm_sm90_fp8, MG_GATE_UP, 64, 128, 2)
MOE_GEMM_WG_FP8_KERNEL(moe_down_gemm_sm90_fp8, MG_DOWN, 64, 128, 2)
MOE_GEMM_WG_FP8_KERNEL(moe_gate_up_gemm_sm90_m128_fp8, MG_GATE_UP, 128, 128, 1)
MOE_GEMM_WG_FP8_KERNEL(moe_down_gemm_sm90_m128_fp8, MG_DOWN, 128, 128, 1)
MOE_GEMM_WG_FP8_KERNEL(moe_gate_up_gemm_sm90_m128_n256_fp8, MG_GATE_UP, 128, 256, 1)
MOE_GEMM_WG_FP8_KERNEL(moe_down_gemm_sm90_m128_n256_fp8, MG_DOWN, 128, 256, 1)

// The router logits (MG_ROUTER of moe_prefill.cu: f32 out, weight columns
// k % k_period) on one warpgroup's 64-row tiles, with the mma.sync router's
// arguments; w_extra must be null (the gate logit has its own kernel).
// Launch: grid n_tiles * row tiles of 64, block 128, dynamic shared memory
// Mgw<64>::SMEM_BYTES.
KESTREL_EXTERN void __launch_bounds__(128, 2)
    moe_router_gemm_sm90(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a, int lda,
                         const int* __restrict__ a_rows, const __nv_bfloat16* __restrict__ w, long long w_stride,
                         const __nv_bfloat16* __restrict__ w_extra, const int* __restrict__ offsets,
                         const int* __restrict__ tile_off, int groups, int rows, int n, int k, int k_period,
                         int n_tiles) {
    pdl_begin();
    (void)w_extra;
    MGW_ROUTER_BODY;
}

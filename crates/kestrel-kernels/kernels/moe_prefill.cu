// Mixture of experts for prefill (more than 8 tokens), entirely on the device:
// no host round trip, launch shapes that depend only on T and the spec (so a
// step could be recorded in a CUDA graph), and results that never depend on
// timing (no float atomics; integer counts only).
//
//   moe_split_x      x (f32) -> xs = [hi | mid | lo] bf16 per token row: x is
//                    hi + mid + lo to ~2^-27, and hi = bf16(x) feeds the experts.
//   moe_router_gemm  logits [T, E (+1 shared-expert gate)] = xs . [W | W | W]^T
//                    on tensor cores: three bf16 products that add up to the f32
//                    product (see the kernel), then moe_topk_warps (moe.cu).
//   moe_route_plan   tokens per expert, their exclusive scan (grouped row
//                    offsets) and the scan of 64-row tiles per expert.
//   moe_route_fill   per expert, its (token, pick) pairs in ascending token
//                    order: a stable counting sort, one block per expert.
//   moe_gate_up_gemm act [pairs, I] = silu(gate) * up of each pair's expert,
//                    rows gathered from xs, bf16 out (grouped order).
//   moe_down_gemm    y [pairs, H] = act . W_down[e]^T, bf16 out (grouped order).
//   moe_combine      out[t] = sum over picks in ascending expert id of
//                    w * y[pos(t, j)], then + sigmoid(gate) * y_shared[t].
//
// The shared expert runs through the same two GEMM kernels as one dense group
// of all T tokens.
#include "moe_gemm.cuh"

// ---- grouped GEMM on tensor cores -------------------------------------------

// The mma.sync kernels: 8 warps as 2 (rows) x 4 (columns); each warp owns
// 32 x 32 of the 64 x 128 block tile (moe_gemm.cuh): 2 m16 tiles x 4 n8
// tiles of mma m16n8k16 (bf16 in, f32 acc).
constexpr int MG_THREADS = 256;
static_assert(MG_A_CHUNKS == 2 * MG_THREADS && MG_B_CHUNKS == 4 * MG_THREADS, "one load pattern per thread");

// One block computes one (group, 64-row tile, column tile), see mg_tile.
// Block b is column tile b % n_tiles of flat tile b / n_tiles: the column
// tiles of one row tile run side by side, so its A rows and its expert's
// weights are served from L2 after the first read.
//
//   a      A rows (bf16), `lda` elements apart; grouped row p reads A row
//          a_rows[p] (a_rows == nullptr: row p).
//   w      B: group e's matrix at w + e * w_stride, rows `k_period` long. The
//          k-th product column reads weight column k % k_period.
//   k      reduction length (a multiple of 8; the tail of the last K tile is
//          zero-filled), n the output columns (see the modes).
//
// Modes (the output row of grouped row p is p):
//   MG_ROUTER  out f32 [rows, ldo]: column c < n is row c of w, except row
//              n - 1 taken from w_extra when that is not null. Each K tile
//              is summed in fresh registers and then added to the total
//              with an ordinary f32 add, which keeps the tensor cores'
//              truncating accumulation to one K tile.
//   MG_GATE_UP out bf16 [., ldo]: n = I act columns; a column tile is 64 act
//              columns, whose 64 gate rows (e's rows c) and 64 up rows (rows
//              I + c) form the 128 B rows, arranged so that each warp holds
//              16 act columns' gate and up values: act = silu(gate) * up.
//   MG_DOWN    out bf16 [., ldo]: n columns, rows of w. Each expert's output
//              is rounded to bf16, as a bf16 model's expert computes it;
//              the combine adds them in f32. (This path serves bf16
//              precision only: under f32 a prefill takes the decode path.)
//              An f32 y cost 537 MB of writes and as many reads a layer at
//              an 8K-token Qwen3.6 prefill.
template <int MODE>
__device__ __forceinline__ void moe_gemm(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a,
                                         int lda, const int* __restrict__ a_rows,
                                         const __nv_bfloat16* __restrict__ w, long long w_stride,
                                         const __nv_bfloat16* __restrict__ w_extra, const int* __restrict__ offsets,
                                         const int* __restrict__ tile_off, int groups, int rows, int n, int k,
                                         int k_period, int n_tiles) {
    extern __shared__ uint4 smem[];
    const int nt = (int)(blockIdx.x % (unsigned)n_tiles);
    const int slot = (int)(blockIdx.x / (unsigned)n_tiles);

    MgTile tile;
    if (!mg_tile(tile, slot, offsets, tile_off, groups, rows)) return;
    const int grp = tile.grp, row0 = tile.row0, m_rows = tile.m_rows;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp >> 2, wn = warp & 3;  // 32-row half, 32-column quarter
    const int g = lane >> 2, c = lane & 3;

    // Each thread copies chunk `ch` of A tile rows r_lo, r_lo + 32 and of B
    // tile rows r_lo + 32 i (i < 4) at every K step; a_src / b_src are the
    // starts of those rows.
    const int ch = tid & 7, r_lo = tid >> 3;
    const __nv_bfloat16* a_src[2];
    bool a_ok[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int r = r_lo + 32 * i;
        a_ok[i] = r < m_rows;
        int arow = row0 + (a_ok[i] ? r : 0);
        if (a_rows != nullptr) arow = a_rows[arow];
        a_src[i] = a + (size_t)arow * lda;
    }
    const __nv_bfloat16* wg = w + (size_t)grp * (size_t)w_stride;
    const __nv_bfloat16* b_src[4];
    bool b_ok[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16* row_ptr;
        if (MODE == MG_GATE_UP) {
            // Tile row 32 i + r_lo belongs to warp column i: rows 0..15 are the
            // gate rows of act columns nt*64 + 16 i + 0..15, rows 16..31 their up rows.
            const int col = nt * 64 + 16 * i + (r_lo & 15);
            b_ok[i] = col < n;
            const int wrow = b_ok[i] ? (r_lo < 16 ? col : n + col) : 0;
            row_ptr = wg + (size_t)wrow * k_period;
        } else {
            const int col = nt * MG_BN + 32 * i + r_lo;
            b_ok[i] = col < n;
            if (MODE == MG_ROUTER && w_extra != nullptr && col == n - 1) row_ptr = w_extra;
            else row_ptr = wg + (size_t)(b_ok[i] ? col : 0) * k_period;
        }
        b_src[i] = row_ptr;
    }

    auto load_stage = [&](int stage, int kt) {
        uint4* sa = smem + stage * MG_STAGE_CHUNKS;
        uint4* sb = sa + MG_A_CHUNKS;
        const int kk = kt * MG_BK + ch * 8;  // this thread's first product column
        const bool k_ok = kk < k;
        const int ka = k_ok ? kk : 0;
        const int kb = MODE == MG_ROUTER ? ka % k_period : ka;
#pragma unroll
        for (int i = 0; i < 2; ++i)
            cp_async_16(smem_addr(sa + mg_swz(r_lo + 32 * i, ch)), a_src[i] + ka, a_ok[i] && k_ok);
#pragma unroll
        for (int i = 0; i < 4; ++i)
            cp_async_16(smem_addr(sb + mg_swz(r_lo + 32 * i, ch)), b_src[i] + kb, b_ok[i] && k_ok);
    };

    const int k_tiles = (k + MG_BK - 1) / MG_BK;
#pragma unroll
    for (int s = 0; s < MG_STAGES - 1; ++s) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();
    }

    float acc[2][4][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int nj = 0; nj < 4; ++nj)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mi][nj][e] = 0.f;

    // d += the product of one K tile (64 columns) held in stage `stage`.
    auto tile_mma = [&](float (&d)[2][4][4], int stage) {
        const uint4* sa = smem + stage * MG_STAGE_CHUNKS;
        const uint4* sb = sa + MG_A_CHUNKS;
#pragma unroll
        for (int ks = 0; ks < MG_BK / 16; ++ks) {
            uint32_t af[2][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
                ldmatrix_x4(af[mi], smem_addr(sa + mg_swz(wm * 32 + mi * 16 + (lane & 15), 2 * ks + (lane >> 4))));
#pragma unroll
            for (int jp = 0; jp < 2; ++jp) {
                uint32_t bf[4];
                ldmatrix_x4(bf, smem_addr(sb + mg_swz(wn * 32 + jp * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                      2 * ks + ((lane >> 3) & 1))));
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    mma_bf16(d[mi][2 * jp], af[mi], bf[0], bf[1]);
                    mma_bf16(d[mi][2 * jp + 1], af[mi], bf[2], bf[3]);
                }
            }
        }
    };

    for (int kt = 0; kt < k_tiles; ++kt) {
        cp_async_wait<MG_STAGES - 2>();  // K tile kt has landed
        __syncthreads();                 // ... for every thread; and tile kt - 1 is consumed
        const int next = kt + MG_STAGES - 1;
        if (next < k_tiles) load_stage(next % MG_STAGES, next);
        cp_async_commit();  // possibly empty: keeps the group count uniform
        if (MODE == MG_ROUTER) {
            float part[2][4][4];
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                    for (int e = 0; e < 4; ++e) part[mi][nj][e] = 0.f;
            tile_mma(part, kt % MG_STAGES);
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int nj = 0; nj < 4; ++nj)
#pragma unroll
                    for (int e = 0; e < 4; ++e) acc[mi][nj][e] = __fadd_rn(acc[mi][nj][e], part[mi][nj][e]);
        } else {
            tile_mma(acc, kt % MG_STAGES);
        }
    }
    cp_async_wait<0>();

    // Epilogue straight from the accumulators: thread (g, c) of warp (wm, wn)
    // holds rows wm*32 + mi*16 + g (+8) and columns wn*32 + nj*8 + 2c (+1).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int r = wm * 32 + mi * 16 + g + 8 * hr;
            if (r >= m_rows) continue;
            const size_t p = (size_t)(row0 + r);
            if (MODE == MG_GATE_UP) {
                __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + p * ldo;
#pragma unroll
                for (int nj = 0; nj < 2; ++nj) {
                    const int col = nt * 64 + wn * 16 + nj * 8 + 2 * c;  // n % 8 == 0: col + 1 < n too
                    if (col >= n) continue;
                    const float v0 = siluf_exact(acc[mi][nj][2 * hr]) * acc[mi][nj + 2][2 * hr];
                    const float v1 = siluf_exact(acc[mi][nj][2 * hr + 1]) * acc[mi][nj + 2][2 * hr + 1];
                    *reinterpret_cast<uint32_t*>(o + col) = pack_bf16(v0, v1);
                }
            } else if (MODE == MG_DOWN) {
                __nv_bfloat16* o = static_cast<__nv_bfloat16*>(out) + p * ldo;
#pragma unroll
                for (int nj = 0; nj < 4; ++nj) {
                    const int col = nt * MG_BN + wn * 32 + nj * 8 + 2 * c;  // n % 8 == 0: col + 1 < n too
                    if (col >= n) continue;
                    *reinterpret_cast<uint32_t*>(o + col) = pack_bf16(acc[mi][nj][2 * hr], acc[mi][nj][2 * hr + 1]);
                }
            } else {
                float* o = static_cast<float*>(out) + p * ldo;
#pragma unroll
                for (int nj = 0; nj < 4; ++nj) {
                    const int col = nt * MG_BN + wn * 32 + nj * 8 + 2 * c;
                    if (col < n) o[col] = acc[mi][nj][2 * hr];
                    if (col + 1 < n) o[col + 1] = acc[mi][nj][2 * hr + 1];
                }
            }
        }
}

#define MOE_GEMM_KERNEL(NAME, MODE)                                                                              \
    KESTREL_EXTERN void __launch_bounds__(MG_THREADS, 2)                                                         \
        NAME(void* __restrict__ out, int ldo, const __nv_bfloat16* __restrict__ a, int lda,                      \
             const int* __restrict__ a_rows, const __nv_bfloat16* __restrict__ w, long long w_stride,            \
             const __nv_bfloat16* __restrict__ w_extra, const int* __restrict__ offsets,                         \
             const int* __restrict__ tile_off, int groups, int rows, int n, int k, int k_period, int n_tiles) { pdl_begin();  \
        moe_gemm<MODE>(out, ldo, a, lda, a_rows, w, w_stride, w_extra, offsets, tile_off, groups, rows, n, k,    \
                       k_period, n_tiles);                                                                       \
    }

// Launch (all three): grid n_tiles * row tiles (1-D), block 256, dynamic
// shared memory MG_SMEM_BYTES.
MOE_GEMM_KERNEL(moe_router_gemm, MG_ROUTER)
MOE_GEMM_KERNEL(moe_gate_up_gemm, MG_GATE_UP)
MOE_GEMM_KERNEL(moe_down_gemm, MG_DOWN)

// ---- activations in ---------------------------------------------------------

// xs[t] = [hi | mid | lo] (3H bf16) with hi = bf16(x), mid = bf16(x - hi),
// lo = bf16(x - hi - mid): both differences are exact in f32, and hi + mid + lo
// is x to within 2^-27 relative, so products with bf16 weights summed over the
// three parts give the f32 product. Eight values per thread; hidden % 8 == 0.
// Grid ceil(T * H / 8 / 256), block 256.
// The three parts of 8 values, stored as chunk cidx of token row `row` of xs.
__device__ __forceinline__ void split_store(__nv_bfloat16* __restrict__ row, int hidden, int cidx, const float (&v)[8]) {
    uint32_t hi[4], mid[4], lo[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float h2[2], m2[2], l2[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float xv = v[2 * j + e];
            const __nv_bfloat16 h = __float2bfloat16_rn(xv);
            const float r1 = __fsub_rn(xv, __bfloat162float(h));
            const __nv_bfloat16 m = __float2bfloat16_rn(r1);
            const float r2 = __fsub_rn(r1, __bfloat162float(m));
            h2[e] = __bfloat162float(h);
            m2[e] = __bfloat162float(m);
            l2[e] = r2;
        }
        hi[j] = pack_bf16(h2[0], h2[1]);  // already bf16 values: exact
        mid[j] = pack_bf16(m2[0], m2[1]);
        lo[j] = pack_bf16(l2[0], l2[1]);
    }
    uint4* dst = reinterpret_cast<uint4*>(row) + cidx;
    const int part = hidden >> 3;  // chunks per part
    dst[0] = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    dst[part] = make_uint4(mid[0], mid[1], mid[2], mid[3]);
    dst[2 * part] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
}

KESTREL_EXTERN void moe_split_x(__nv_bfloat16* __restrict__ xs, const float* __restrict__ x, int tokens,
                                int hidden) { pdl_begin();
    const int chunks = hidden >> 3;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * chunks) return;
    const int t = (int)(i / chunks), cidx = (int)(i % chunks);
    const float4* src = reinterpret_cast<const float4*>(x + (size_t)t * hidden) + 2 * cidx;
    const float4 v0 = src[0], v1 = src[1];
    const float v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    split_store(xs + (size_t)t * 3 * hidden, hidden, cidx, v);
}

// The block's pre-norm with the split (and the shared-expert gate logit)
// in one pass over each row, instead of add_rms_norm_f32 (f32 rows and their
// bf16 copy out), moe_split_x and moe_gate_logit reading them back. Row t:
//   residual[t] += delta[t] (delta null: the residual is the input as is),
//   y = rms_norm(residual[t]) * norm_w (the arithmetic of add_rms_norm_f32),
//   xs[t] = [hi | mid | lo] of y (moe_split_x), and with gate_w,
//   logits[t * logits_ld + gate_col] = y . gate_w.
// hidden % 8 == 0 and hidden <= 8 * NORM_SPLIT_CHUNKS * blockDim.x (ops/moe).
// Grid T, block 256.
constexpr int NORM_SPLIT_CHUNKS = 2;  // chunks of 8 values per thread; mirrored in ops/moe
KESTREL_EXTERN void moe_norm_split(__nv_bfloat16* __restrict__ xs, float* __restrict__ residual,
                                   const float* __restrict__ delta, const float* __restrict__ norm_w, float eps,
                                   const uint16_t* __restrict__ gate_w, float* __restrict__ logits, int logits_ld,
                                   int gate_col, int hidden) {
    pdl_begin();
    __shared__ float scratch[32];
    const size_t t = blockIdx.x;
    float4* rr = reinterpret_cast<float4*>(residual + t * hidden);
    const float4* dr = delta != nullptr ? reinterpret_cast<const float4*>(delta + t * hidden) : nullptr;
    const int chunks = hidden >> 3;
    float v[NORM_SPLIT_CHUNKS][8];
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_SPLIT_CHUNKS; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        if (c < chunks) {
            a = rr[2 * c];
            b = rr[2 * c + 1];
            if (dr != nullptr) {
                const float4 da = dr[2 * c], db = dr[2 * c + 1];
                a = make_float4(a.x + da.x, a.y + da.y, a.z + da.z, a.w + da.w);
                b = make_float4(b.x + db.x, b.y + db.y, b.z + db.z, b.w + db.w);
            }
        }
        const float r[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            v[j][e] = r[e];
            ss += r[e] * r[e];
        }
        if (dr != nullptr && c < chunks) {
            rr[2 * c] = a;
            rr[2 * c + 1] = b;
        }
    }
    const float inv = rsqrtf(block_sum(ss, scratch) / hidden + eps);
    float gate = 0.f;
    __nv_bfloat16* row = xs + t * 3 * hidden;
#pragma unroll
    for (int j = 0; j < NORM_SPLIT_CHUNKS; ++j) {
        const int c = threadIdx.x + j * blockDim.x;
        if (c >= chunks) continue;
        const float4 w0 = reinterpret_cast<const float4*>(norm_w)[2 * c], w1 = reinterpret_cast<const float4*>(norm_w)[2 * c + 1];
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = v[j][e] * inv * w[e];
        split_store(row, hidden, c, y);
        if (gate_w != nullptr) {
            const uint4 g = reinterpret_cast<const uint4*>(gate_w)[c];
            const uint32_t gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                gate = fmaf(y[2 * e], __uint_as_float(gw[e] << 16), gate);
                gate = fmaf(y[2 * e + 1], __uint_as_float(gw[e] & 0xffff0000u), gate);
            }
        }
    }
    if (gate_w != nullptr) {
        gate = block_sum(gate, scratch);
        if (threadIdx.x == 0) logits[t * logits_ld + gate_col] = gate;
    }
}

// ---- routing -----------------------------------------------------------------

// Most experts the plan takes (as moe_topk).
#define MP_MAX_EXPERTS 512

// Inclusive sum over the lanes of a warp.
__device__ __forceinline__ int warp_inclusive_scan(int v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o) v += u;
    }
    return v;
}

// From the picks ids [pairs] (pairs = T * k): offsets[e] = picks of experts
// below e (offsets[E] = pairs), tile_off[e] = tiles of tile_rows rows of
// experts below e (tile_off[E] = all tiles). Integer counts: deterministic.
// Grid 1, block 1024; experts <= 512.
KESTREL_EXTERN void __launch_bounds__(1024)
    moe_route_plan(int* __restrict__ offsets, int* __restrict__ tile_off, const int* __restrict__ ids, int pairs,
                   int experts, int tile_rows) { pdl_begin();
    __shared__ int cnt[MP_MAX_EXPERTS];
    const int tid = threadIdx.x;
    for (int e = tid; e < experts; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < pairs; i += blockDim.x) atomicAdd(&cnt[ids[i]], 1);
    __syncthreads();
    if (tid >= 32) return;
    // Lane l scans experts l*per .. l*per + per - 1.
    const int lane = tid, per = (experts + 31) / 32;
    int rows = 0, tiles = 0;
    for (int i = 0; i < per; ++i) {
        const int e = lane * per + i;
        if (e < experts) {
            rows += cnt[e];
            tiles += (cnt[e] + tile_rows - 1) / tile_rows;
        }
    }
    const int rows_incl = warp_inclusive_scan(rows), tiles_incl = warp_inclusive_scan(tiles);
    int r = rows_incl - rows, tl = tiles_incl - tiles;
    for (int i = 0; i < per; ++i) {
        const int e = lane * per + i;
        if (e < experts) {
            offsets[e] = r;
            tile_off[e] = tl;
            r += cnt[e];
            tl += (cnt[e] + tile_rows - 1) / tile_rows;
        }
    }
    if (lane == 31) {
        offsets[experts] = rows_incl;
        tile_off[experts] = tiles_incl;
    }
}

constexpr int RF_THREADS = 512;
constexpr int RF_TOKENS = 16;  // consecutive tokens per thread and pass (a 32-bit mask)

// Block e lists expert e's picks in ascending token order: grouped row
// p = offsets[e] + i is token pair_token[p], and pos[t * k + j] = p for the
// pick (t, j). Thread i of a pass looks at tokens base + 16 i .. + 15; a
// block-wide exclusive scan of the per-thread counts gives each its first
// row. A token picks an expert at most once (the top-k). Every (t, j) lands
// in exactly one block, so pos is written in full.
// Grid E, block 512.
KESTREL_EXTERN void __launch_bounds__(RF_THREADS)
    moe_route_fill(int* __restrict__ pair_token, int* __restrict__ pos, const int* __restrict__ ids,
                   const int* __restrict__ offsets, int tokens, int k) { pdl_begin();
    __shared__ int warp_total[RF_THREADS / 32];
    const int e = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    constexpr int nwarps = RF_THREADS / 32;
    int run = offsets[e];
    for (int base = 0; base < tokens; base += RF_THREADS * RF_TOKENS) {
        const int t0 = base + tid * RF_TOKENS;
        // The thread's tokens' picks are n consecutive ids, read 32 at a time
        // with every load issued before any is compared (one load and compare
        // at a time left this kernel waiting on L2). t0 * k ints from the start: 16-byte aligned.
        unsigned mask = 0;
        const int n = t0 < tokens ? min(RF_TOKENS, tokens - t0) * k : 0;
        const int* run_ids = ids + (size_t)t0 * k;
        for (int c = 0; c < n; c += 32) {
            int4 v[8];
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int i = c + 4 * q;
                if (i + 3 < n) {
                    v[q] = *reinterpret_cast<const int4*>(run_ids + i);
                } else {
                    v[q].x = i < n ? run_ids[i] : -1;
                    v[q].y = i + 1 < n ? run_ids[i + 1] : -1;
                    v[q].z = i + 2 < n ? run_ids[i + 2] : -1;
                    v[q].w = -1;
                }
            }
#pragma unroll
            for (int q = 0; q < 8; ++q) {
                const int i = c + 4 * q;
                if (v[q].x == e) mask |= 1u << (i / k);
                if (v[q].y == e) mask |= 1u << ((i + 1) / k);
                if (v[q].z == e) mask |= 1u << ((i + 2) / k);
                if (v[q].w == e) mask |= 1u << ((i + 3) / k);
            }
        }
        const int mine = __popc(mask);
        const int incl = warp_inclusive_scan(mine);
        if (lane == 31) warp_total[warp] = incl;
        __syncthreads();
        int before = 0, total = 0;
        for (int w = 0; w < nwarps; ++w) {
            const int v = warp_total[w];
            before += w < warp ? v : 0;
            total += v;
        }
        int p = run + before + incl - mine;
        while (mask) {
            const int u = __ffs(mask) - 1;
            mask &= mask - 1;
            const int t = t0 + u;
            const int* row = ids + (size_t)t * k;
            int jj = 0;
            for (int j = 0; j < k; ++j)
                if (row[j] == e) jj = j;
            pair_token[p] = t;
            pos[(size_t)t * k + jj] = p;
            ++p;
        }
        run += total;
        __syncthreads();  // warp_total is rewritten by the next pass
    }
}

// ---- combine -----------------------------------------------------------------

// out[t, h] = sum_j w[t, j] * y[pos[t, j], h] (y, ys bf16) over the picks in their order
// (ascending expert id, as the top-k writes them), then + g * ys[t, h] with
// g = sigmoid(logits[t, gate_col]) (1 when gate_col < 0) when ys is not null.
// Each product rounded, then added, as the reference does. Four columns per
// thread; hidden % 4 == 0. Grid ceil(T * H / 4 / 256), block 256.
KESTREL_EXTERN void moe_combine(float* __restrict__ out, const __nv_bfloat16* __restrict__ y,
                                const __nv_bfloat16* __restrict__ ys, const int* __restrict__ pos,
                                const float* __restrict__ weights, const float* __restrict__ logits, int logits_ld,
                                int gate_col, int tokens, int hidden, int k) { pdl_begin();
    const int quads = hidden >> 2;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)tokens * quads) return;
    const int t = (int)(i / quads), q = (int)(i % quads);
    // Four bf16 values: element 0 in the low half of the first word.
    auto quad = [](const __nv_bfloat16* row, int q) {
        const uint2 b = reinterpret_cast<const uint2*>(row)[q];
        return make_float4(__uint_as_float(b.x << 16), __uint_as_float(b.x & 0xffff0000u),
                           __uint_as_float(b.y << 16), __uint_as_float(b.y & 0xffff0000u));
    };
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < k; ++j) {
        const float wj = weights[(size_t)t * k + j];
        const float4 v = quad(y + (size_t)pos[(size_t)t * k + j] * hidden, q);
        o.x = __fadd_rn(o.x, __fmul_rn(wj, v.x));
        o.y = __fadd_rn(o.y, __fmul_rn(wj, v.y));
        o.z = __fadd_rn(o.z, __fmul_rn(wj, v.z));
        o.w = __fadd_rn(o.w, __fmul_rn(wj, v.w));
    }
    if (ys != nullptr) {
        const float gt = gate_col >= 0 ? sigmoidf_exact(logits[(size_t)t * logits_ld + gate_col]) : 1.f;
        const float4 v = quad(ys + (size_t)t * hidden, q);
        o.x = __fadd_rn(o.x, __fmul_rn(gt, v.x));
        o.y = __fadd_rn(o.y, __fmul_rn(gt, v.y));
        o.z = __fadd_rn(o.z, __fmul_rn(gt, v.z));
        o.w = __fadd_rn(o.w, __fmul_rn(gt, v.w));
    }
    reinterpret_cast<float4*>(out + (size_t)t * hidden)[q] = o;
}

// ---- shared-expert gate ------------------------------------------------------

// logits[t, col] = x[t, :] . w[:] in f32 (x f32, w bf16), the shared-expert
// gate's logit. Kept out of moe_router_gemm: as its 257th column it cost a
// third column tile of 128 (and a second wave of blocks) for one useful
// column. One warp per token; hidden % 4 == 0.
// Grid ceil(T / 8), block 256.
KESTREL_EXTERN void moe_gate_logit(float* __restrict__ logits, int logits_ld, int col, const float* __restrict__ x,
                                   const uint16_t* __restrict__ w, int tokens, int hidden) {
    pdl_begin();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= tokens) return;
    const float4* xr = reinterpret_cast<const float4*>(x + (size_t)t * hidden);
    const uint2* wr = reinterpret_cast<const uint2*>(w);
    float acc = 0.f;
    for (int q = lane; q < (hidden >> 2); q += 32) {
        const float4 a = xr[q];
        const uint2 b = wr[q];
        acc = fmaf(a.x, __uint_as_float(b.x << 16), acc);
        acc = fmaf(a.y, __uint_as_float(b.x & 0xffff0000u), acc);
        acc = fmaf(a.z, __uint_as_float(b.y << 16), acc);
        acc = fmaf(a.w, __uint_as_float(b.y & 0xffff0000u), acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) logits[(size_t)t * logits_ld + col] = acc;
}

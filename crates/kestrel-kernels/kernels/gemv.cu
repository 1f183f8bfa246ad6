// Decode-time matrix product y[m, n] = sum_k x[m, k] * w[n, k] for 1..8 (or
// 16) rows of f32 x and w [N, K] in bf16 or f16 (K % 8 == 0) or block-FP8
// (K % 16 == 0, a scale per 128 x 128 block), f32 accumulation and output.
// Weight-bandwidth bound: see gemv.cuh for the inner loop.
#include "gemv.cuh"

// The RMSNorm a gemv_norm computes before its product: the block forms its
// activation rows itself, x = rms_norm(residual + delta) * weight, in shared
// memory, while its first weights are on their way. That takes the norm's
// own launch (a single-block kernel on the critical path of every decode
// layer) out of the chain; every block repeats the norm (a few KB from L2).
// Block 0 also writes residual + delta and x for the kernels that follow.
struct NormIn {
    float* x_out;           // [M, k] the normalised rows (null: not needed later)
    float* residual_out;    // [M, k] residual + delta (null without a delta)
    const float* residual;  // [M, k]
    const float* delta;     // [M, k], or null: x = rms_norm(residual)
    const float* weight;    // [k]
    float eps;
};

// Rows of up to NORM_REGS * 4 * blockDim.x values are loaded in one pass
// (2,048 at 256 threads).
constexpr int NORM_REGS = 2;

template <int M>
__device__ __forceinline__ void norm_prologue(float* __restrict__ xs, const NormIn& n, int k) {
    __shared__ float scratch[32];
    const int k4 = k >> 2, tid = threadIdx.x;
    const int threads = blockDim.x;
    const bool writer = blockIdx.x == 0;
    float4* xs4 = reinterpret_cast<float4*>(xs);
    // Rows of up to NORM_REGS float4s per thread keep the norm weights in
    // registers, loaded with the rows: one round trip to L2 for the prologue.
    const float4* w4 = reinterpret_cast<const float4*>(n.weight);
    const bool weights_held = k4 <= NORM_REGS * threads;
    float4 g[NORM_REGS];
    if (weights_held) {
#pragma unroll
        for (int j = 0; j < NORM_REGS; ++j) {
            const int i = j * threads + tid;
            g[j] = i < k4 ? w4[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float4* r4 = reinterpret_cast<const float4*>(n.residual + (size_t)m * k);
        const float4* d4 = n.delta != nullptr ? reinterpret_cast<const float4*>(n.delta + (size_t)m * k) : nullptr;
        float4* o4 = writer && n.residual_out != nullptr ? reinterpret_cast<float4*>(n.residual_out + (size_t)m * k)
                                                        : nullptr;
        ss[m] = 0.f;
        for (int base = 0; base < k4; base += NORM_REGS * threads) {
            float4 h[NORM_REGS];
#pragma unroll
            for (int j = 0; j < NORM_REGS; ++j) {
                const int i = base + j * threads + tid;
                h[j] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (i < k4) {
                    h[j] = r4[i];
                    if (d4 != nullptr) {
                        const float4 d = d4[i];
                        h[j].x += d.x;
                        h[j].y += d.y;
                        h[j].z += d.z;
                        h[j].w += d.w;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NORM_REGS; ++j) {
                const int i = base + j * threads + tid;
                if (i < k4) {
                    xs4[m * k4 + i] = h[j];
                    if (o4 != nullptr) o4[i] = h[j];
                }
                ss[m] = sum_sq4(ss[m], h[j]);
            }
        }
    }
    // block_sum, as the norm kernels reduce (norm.cu), so that a row gets
    // the same scale here as from them.
    float inv[M];
#pragma unroll
    for (int m = 0; m < M; ++m) inv[m] = rsqrtf(block_sum(ss[m], scratch) / k + n.eps);
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float s = inv[m];
        for (int base = 0; base < k4; base += NORM_REGS * threads) {
#pragma unroll
            for (int j = 0; j < NORM_REGS; ++j) {
                const int i = base + j * threads + tid;
                if (i >= k4) break;
                const float4 h = xs4[m * k4 + i], gw = weights_held ? g[j] : w4[i];
                const float4 y = make_float4(h.x * s * gw.x, h.y * s * gw.y, h.z * s * gw.z, h.w * s * gw.w);
                xs4[m * k4 + i] = y;
                if (writer && n.x_out != nullptr) reinterpret_cast<float4*>(n.x_out + (size_t)m * k)[i] = y;
            }
        }
    }
    __syncthreads();
}

// Block: 256 threads = 8 warps = (8 / split) row groups x `split` warps that
// share one group's rows and interleave over its 16-byte chunks of K (so
// short, wide matrices still spread over enough warps). A group owns R rows.
// The split warps' partial sums meet in shared memory and are added in warp
// order. Grid: ceil(N / ((8 / split) * R)).
//
// `w_last`, when not null, replaces row N-1 of `w`: the MoE router appends the
// shared expert's gate to the E router rows without a second launch.
//
// NORM: the rows x come from norm_prologue (gemv_norm), x is ignored. Such a
// block pays for the norm once, so its grid is sized to the resident blocks
// and each block takes row groups blockIdx.x, + gridDim.x, ... (a plain gemv
// launches one block per group and takes one).
//
// `ldy`: floats between y's rows (-1: N). A weight stacked from parts of
// several formats (a Gated DeltaNet in_proj: block-FP8 q/k/v and z, bf16 b
// and a) runs one launch per part, each writing its columns of the rows, or
// (gemv_norm_fp8_bf16) one launch whose blocks split between the parts:
// `block` and `grid` are then the block's place among its part's blocks
// (-1: blockIdx.x and gridDim.x).
template <int M, int R, int U, typename WT, bool NORM = false, bool AHEAD = false>
__device__ __forceinline__ void gemv_body(float* __restrict__ y, const float* __restrict__ x,
                                          const void* __restrict__ w, const void* __restrict__ w_last,
                                          int n_rows, int k, int split, const NormIn* norm = nullptr,
                                          const float* __restrict__ scales = nullptr, int ldy = -1,
                                          int block = -1, int grid = -1) {
    if (ldy < 0) ldy = n_rows;
    if (block < 0) block = blockIdx.x;
    if (grid < 0) grid = gridDim.x;
    constexpr int V = M * R, SLOTS = (V + 31) / 32;  // sums per warp, per lane
    __shared__ float part[8][V];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = 8 / split;
    const int g = warp / split, s = warp % split;
    const int first = lane + 32 * s, stride = 32 * split, chunks = k / WT::ELEMS;
    const int block_groups = (n_rows + groups * R - 1) / (groups * R);

    // Rows past the end re-read the last row (always valid) and are not stored.
    const uint4* rows[R];
    const float* sc[R];
    auto set_rows = [&](int row0) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int n = min(row0 + r, n_rows - 1);
            rows[r] = (w_last != nullptr && n == n_rows - 1) ? weight_row<WT>(w_last, 0, k) : weight_row<WT>(w, n, k);
            sc[r] = scale_row<WT>(scales, n, k);
        }
    };
    int bg = block;
    set_rows((bg * groups + g) * R);
    // Weights are never written by a kernel, so the first U chunks of every
    // row are requested before waiting for the previous kernel (the producer
    // of x): under programmatic dependent launch they stream in while it
    // finishes; in gemv_norm, while the block computes its rows. The sums run
    // in the same chunk order as dot_chunks alone.
    pdl_launch_dependents();
    uint4 wv0[U][R];
    load_chunks<R, U>(wv0, rows, first, stride, chunks);
    pdl_wait();
    if constexpr (NORM) {
        extern __shared__ float4 norm_rows[];  // [M, k]
        x = reinterpret_cast<const float*>(norm_rows);
        norm_prologue<M>(reinterpret_cast<float*>(norm_rows), *norm, k);
    }
    while (true) {
        const int row0 = (bg * groups + g) * R;
        float acc[M][R];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
        if constexpr (AHEAD) {
            dot_chunks_ahead<M, R, U, WT, NORM>(acc, wv0, rows, x, k, first, stride, chunks, sc);
        } else {
            use_chunks<M, R, U, WT, NORM>(acc, wv0, x, k, first, stride, chunks, sc);
            dot_chunks<M, R, U, WT, NORM>(acc, rows, x, k, first + U * stride, stride, chunks, sc);
        }

        // Every lane ends with every sum; sum v = m * R + r is kept by lane v % 32.
        float mine[SLOTS];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float v = warp_sum(acc[m][r]);
                if (lane == (m * R + r) % 32) mine[(m * R + r) / 32] = v;
            }
        if (split == 1) {
#pragma unroll
            for (int slot = 0; slot < SLOTS; ++slot) {
                const int v = slot * 32 + lane, m = v / R, r = v % R;
                if (v < V && row0 + r < n_rows) y[(size_t)m * ldy + row0 + r] = mine[slot];
            }
        } else {
#pragma unroll
            for (int slot = 0; slot < SLOTS; ++slot)
                if (slot * 32 + lane < V) part[warp][slot * 32 + lane] = mine[slot];
            __syncthreads();
            for (int i = threadIdx.x; i < groups * V; i += blockDim.x) {
                const int gg = i / V, mr = i % V, m = mr / R, r = mr % R;
                const int n = (bg * groups + gg) * R + r;
                float v = part[gg * split][mr];
                for (int ss = 1; ss < split; ++ss) v += part[gg * split + ss][mr];
                if (n < n_rows) y[(size_t)m * ldy + n] = v;
            }
        }
        if (!NORM) return;
        bg += grid;
        if (bg >= block_groups) return;
        if (split != 1) __syncthreads();  // `part` is rewritten next round
        set_rows((bg * groups + g) * R);
        load_chunks<R, U>(wv0, rows, first, stride, chunks);
    }
}

// One entry point per row count. Rows per group R: every chunk re-reads the M
// x rows from L1, so larger M shares each x load over more weight rows to keep
// L1 traffic well under the HBM traffic; U keeps 8 or 16 loads in flight per
// lane. Chosen by timing variants (R 1..8, U 1..8, 1..3 blocks per SM) over
// K 512..4096 and N 512..248320. AHEAD: each step's next chunks are requested
// before the current ones are used (dot_chunks_ahead), so a warp never waits
// with no loads in flight; it and R, U only shape the loads, never a row's
// sums. Retimed at Qwen3.6's shapes with the split a verify step takes
// (docs/benchmarks/2026-12-06-h100-gemv-tiles/): bf16 at 8 rows, 8 rows one
// chunk ahead; FP8 at one row, 4 rows two chunks deep, and at 4 rows, 4 rows
// one chunk ahead.
// `gemv_f16_m*` take f16 weights (the reference precision's f16 checkpoints),
// `gemv_fp8_m*` and `gemv_norm_fp8_m*` block-FP8 weights with their scales
// (no w_last: the router, the only user, stays bf16);
// `gemv_norm_m*` compute their rows with norm_prologue (dynamic shared
// memory: M * k floats); at one row, capped at 85 registers so that three
// blocks share an SM, since each block streams many row groups.
#define KESTREL_GEMV(M, R, U, AHEAD, MIN_BLOCKS)                                                              \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_m##M(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w,         \
                  const uint16_t* __restrict__ w_last, int n_rows, int k, int split, int ldy) {               \
        gemv_body<M, R, U, Bf16W, false, AHEAD>(y, x, w, w_last, n_rows, k, split, nullptr, nullptr, ldy);    \
    }                                                                                                         \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_f16_m##M(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w,     \
                      const uint16_t* __restrict__ w_last, int n_rows, int k, int split, int ldy) {           \
        gemv_body<M, R, U, F16W, false, AHEAD>(y, x, w, w_last, n_rows, k, split, nullptr, nullptr, ldy);     \
    }
// Block-FP8 weights convert each chunk before the x rows meet it, which
// needs registers for the converted chunks: at 5..8 rows, 6 rows per warp
// with one chunk of each in flight (8 rows spilled); an FP8 chunk holds
// twice the weights of a bf16 one, so fewer rows per warp would read each
// x row from L1 more often per weight byte. From 5 rows on (WT = Fp8F32W)
// each chunk becomes f32 values once for all x rows, which leaves the FMAs
// alone per row; at 16 rows that leaves registers for 4 weight rows a warp
// (255 registers, no spills).
#define KESTREL_GEMV_FP8(M, R, U, AHEAD, MIN_BLOCKS, WT)                                                      \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_fp8_m##M(float* __restrict__ y, const float* __restrict__ x, const uint8_t* __restrict__ w,      \
                      const float* __restrict__ scales, int n_rows, int k, int split, int ldy) {              \
        gemv_body<M, R, U, WT, false, AHEAD>(y, x, w, nullptr, n_rows, k, split, nullptr, scales, ldy);       \
    }
// Only for the row counts the fused norm takes (`NORM_MAX_ROWS` in ops/linear/gemv.rs).
#define KESTREL_GEMV_NORM(M, R, U, MIN_BLOCKS)                                                                \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_norm_m##M(float* __restrict__ y, float* __restrict__ x_out, float* __restrict__ residual_out,    \
                       const float* __restrict__ residual, const float* __restrict__ delta,                   \
                       const float* __restrict__ norm_w, float eps, const uint16_t* __restrict__ w,           \
                       const uint16_t* __restrict__ w_last, int n_rows, int k, int split, int ldy) {          \
        const NormIn n{x_out, residual_out, residual, delta, norm_w, eps};                                    \
        gemv_body<M, R, U, Bf16W, true>(y, nullptr, w, w_last, n_rows, k, split, &n, nullptr, ldy);           \
    }                                                                                                         \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_norm_fp8_m##M(float* __restrict__ y, float* __restrict__ x_out, float* __restrict__ residual_out, \
                           const float* __restrict__ residual, const float* __restrict__ delta,               \
                           const float* __restrict__ norm_w, float eps, const uint8_t* __restrict__ w,        \
                           const float* __restrict__ scales, int n_rows, int k, int split, int ldy) {         \
        const NormIn n{x_out, residual_out, residual, delta, norm_w, eps};                                    \
        gemv_body<M, R, U, Fp8W, true>(y, nullptr, w, nullptr, n_rows, k, split, &n, scales, ldy);            \
    }
// A weight of a block-FP8 head and a bf16 tail (a Gated DeltaNet in_proj of
// an FP8 checkpoint: q/k/v and z, then b and a) in one launch: blocks below
// `head_grid` take the head's rows into y's first n_rows columns, the others
// the tail's into the next tail_rows, each part with its own split, so every
// row gets the sums of its part's own gemv_norm; the tail's few blocks run
// beside the head's instead of after them. Block 0 writes the residual and x.
#define KESTREL_GEMV_NORM_FP8_BF16(M, R, U, MIN_BLOCKS)                                                       \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS) gemv_norm_fp8_bf16_m##M(                           \
        float* __restrict__ y, float* __restrict__ x_out, float* __restrict__ residual_out,                   \
        const float* __restrict__ residual, const float* __restrict__ delta, const float* __restrict__ norm_w, \
        float eps, const uint8_t* __restrict__ w, const float* __restrict__ scales, int n_rows, int split,    \
        const uint16_t* __restrict__ tail, int tail_rows, int tail_split, int head_grid, int k) {             \
        const NormIn n{x_out, residual_out, residual, delta, norm_w, eps};                                    \
        const int ldy = n_rows + tail_rows;                                                                   \
        if ((int)blockIdx.x < head_grid)                                                                      \
            gemv_body<M, R, U, Fp8W, true>(y, nullptr, w, nullptr, n_rows, k, split, &n, scales, ldy,         \
                                           blockIdx.x, head_grid);                                            \
        else                                                                                                  \
            gemv_body<M, R, U, Bf16W, true>(y + n_rows, nullptr, tail, nullptr, tail_rows, k, tail_split, &n, \
                                            nullptr, ldy, blockIdx.x - head_grid, gridDim.x - head_grid);     \
    }

// (M, R, U, AHEAD, MIN_BLOCKS); R must match `gemv_rows_per_warp` in ops/linear/gemv.rs
// (its tests read these lines).
KESTREL_GEMV(1, 2, 4, false, 1)
KESTREL_GEMV(2, 4, 2, false, 1)
KESTREL_GEMV(3, 4, 2, false, 1)
KESTREL_GEMV(4, 4, 2, false, 1)
KESTREL_GEMV(5, 8, 2, false, 1)
KESTREL_GEMV(6, 8, 2, false, 1)
KESTREL_GEMV(7, 8, 2, false, 1)
KESTREL_GEMV(8, 8, 1, true, 1)
// 16 rows: the passes of a decode-shaped step with more rows than 8 (verify
// steps of several sequences, or of one with 15 drafts), whose rows must
// take gemv's sums. Each weight chunk meets 16 x rows, so the pass is bound
// by the FMAs and the x loads from L1, not by HBM: 6 weight rows per warp
// with one chunk each in flight (240 registers, no spills) share each x
// load over more rows than 4 rows two chunks deep, and took 16-row verify
// steps 2 % faster; 8 rows spill (docs/benchmarks/2026-12-06-h100-dflash-block-attention/).
KESTREL_GEMV(16, 6, 1, false, 1)
// R must match `norm_rows_per_warp` in ops/linear/gemv.rs.
KESTREL_GEMV_NORM(1, 2, 4, 3)
KESTREL_GEMV_NORM(2, 4, 2, 1)
KESTREL_GEMV_NORM_FP8_BF16(1, 2, 4, 3)
KESTREL_GEMV_NORM_FP8_BF16(2, 4, 2, 1)
KESTREL_GEMV_FP8(1, 4, 2, false, 1, Fp8W)
KESTREL_GEMV_FP8(2, 4, 2, false, 1, Fp8W)
KESTREL_GEMV_FP8(3, 4, 2, false, 1, Fp8W)
KESTREL_GEMV_FP8(4, 4, 1, true, 1, Fp8W)
KESTREL_GEMV_FP8(5, 6, 1, false, 1, Fp8F32W)
KESTREL_GEMV_FP8(6, 6, 1, false, 1, Fp8F32W)
KESTREL_GEMV_FP8(7, 6, 1, false, 1, Fp8F32W)
KESTREL_GEMV_FP8(8, 6, 1, false, 1, Fp8F32W)
KESTREL_GEMV_FP8(16, 4, 1, false, 1, Fp8F32W)

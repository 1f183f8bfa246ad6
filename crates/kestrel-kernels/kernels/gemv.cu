// Decode-time matrix product y[m, n] = sum_k x[m, k] * w[n, k] for 1..8 rows of
// f32 x and bf16 w [N, K] (K % 8 == 0), f32 accumulation and output.
// Weight-bandwidth bound: see gemv.cuh for the inner loop.
#include "gemv.cuh"

// Block: 256 threads = 8 warps = (8 / split) row groups x `split` warps that
// share one group's rows and interleave over its 16-byte chunks of K (so
// short, wide matrices still spread over enough warps). A group owns R rows.
// The split warps' partial sums meet in shared memory and are added in warp
// order. Grid: ceil(N / ((8 / split) * R)).
//
// `w_last`, when not null, replaces row N-1 of `w`: the MoE router appends the
// shared expert's gate to the E router rows without a second launch.
template <int M, int R, int U, typename WT>
__device__ __forceinline__ void gemv_body(float* __restrict__ y, const float* __restrict__ x,
                                          const uint16_t* __restrict__ w, const uint16_t* __restrict__ w_last,
                                          int n_rows, int k, int split) {
    constexpr int V = M * R, SLOTS = (V + 31) / 32;  // sums per warp, per lane
    __shared__ float part[8][V];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = 8 / split;
    const int g = warp / split, s = warp % split;
    const int row0 = (blockIdx.x * groups + g) * R;

    // Rows past the end re-read the last row (always valid) and are not stored.
    const uint4* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int n = min(row0 + r, n_rows - 1);
        const uint16_t* p = (w_last != nullptr && n == n_rows - 1) ? w_last : w + (size_t)n * k;
        rows[r] = reinterpret_cast<const uint4*>(p);
    }
    // Weights are never written by a kernel, so the first U chunks of every
    // row are requested before waiting for the previous kernel (the producer
    // of x): under programmatic dependent launch they stream in while it
    // finishes. The sums run in the same chunk order as dot_chunks alone.
    pdl_launch_dependents();
    const int first = lane + 32 * s, stride = 32 * split, chunks = k >> 3;
    uint4 wv0[U][R];
    load_chunks<R, U>(wv0, rows, first, stride, chunks);
    pdl_wait();
    float acc[M][R];
#pragma unroll
    for (int m = 0; m < M; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    use_chunks<M, R, U, WT>(acc, wv0, x, k, first, stride, chunks);
    dot_chunks<M, R, U, WT>(acc, rows, x, k, first + U * stride, stride, chunks);

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
            if (v < V && row0 + r < n_rows) y[(size_t)m * n_rows + row0 + r] = mine[slot];
        }
        return;
    }
#pragma unroll
    for (int slot = 0; slot < SLOTS; ++slot)
        if (slot * 32 + lane < V) part[warp][slot * 32 + lane] = mine[slot];
    __syncthreads();
    for (int i = threadIdx.x; i < groups * V; i += blockDim.x) {
        const int gg = i / V, mr = i % V, m = mr / R, r = mr % R;
        const int n = (blockIdx.x * groups + gg) * R + r;
        float v = part[gg * split][mr];
        for (int ss = 1; ss < split; ++ss) v += part[gg * split + ss][mr];
        if (n < n_rows) y[(size_t)m * n_rows + n] = v;
    }
}

// One entry point per row count. Rows per group R: every chunk re-reads the M
// x rows from L1, so larger M shares each x load over more weight rows to keep
// L1 traffic well under the HBM traffic; U keeps 8 or 16 loads in flight per
// lane. Chosen by timing variants on an H200 (R 1..8, U 1..8, 1..3 blocks per
// SM) over K 512..4096 and N 512..248320.
// `gemv_f16_m*` take f16 weights (the reference precision's f16 checkpoints).
#define KESTREL_GEMV(M, R, U, MIN_BLOCKS)                                                                      \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_m##M(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w,         \
                  const uint16_t* __restrict__ w_last, int n_rows, int k, int split) {                        \
        gemv_body<M, R, U, Bf16W>(y, x, w, w_last, n_rows, k, split);                                         \
    }                                                                                                         \
    KESTREL_EXTERN void __launch_bounds__(256, MIN_BLOCKS)                                                    \
        gemv_f16_m##M(float* __restrict__ y, const float* __restrict__ x, const uint16_t* __restrict__ w,     \
                      const uint16_t* __restrict__ w_last, int n_rows, int k, int split) {                    \
        gemv_body<M, R, U, F16W>(y, x, w, w_last, n_rows, k, split);                                          \
    }

KESTREL_GEMV(1, 2, 4, 1)
KESTREL_GEMV(2, 4, 2, 1)
KESTREL_GEMV(3, 4, 2, 1)
KESTREL_GEMV(4, 4, 2, 1)
KESTREL_GEMV(5, 8, 2, 1)
KESTREL_GEMV(6, 8, 2, 1)
KESTREL_GEMV(7, 8, 2, 1)
KESTREL_GEMV(8, 8, 2, 1)

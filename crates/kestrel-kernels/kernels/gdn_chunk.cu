// Gated DeltaNet prefill in chunks of 64 tokens (the WY/UT form of the CPU
// reference's chunked.rs), Dk = Dv = 128.
//
// Per chunk of L tokens with cumulative log decay cum_i (i < L):
//   A[i][j]  = beta_i (k_i . k_j) exp(cum_i - cum_j)  for j < i  (strictly lower)
//   intra    = (q_i . k_j) exp(cum_i - cum_j)         for j <= i
//   U = (I + A)^-1 (v * beta),  W = (I + A)^-1 (k * beta * exp(cum))
// and then, in chunk order, with the state S [Dk, Dv]:
//   V = U - W S;  O = (q * exp(cum)) S + intra V;
//   S = exp(cum_last) S + (k * exp(cum_last - cum))^T V.
// The first part depends only on the chunk's inputs, so gdn_chunk_prep runs
// it for all chunks of all heads at once and leaves the results in a scratch
// buffer. The second part is sequential over chunks but independent per
// column of S: gdn_chunk_state runs one block per (sequence, head, 32-column
// tile), each warp holding 16 rows of the tile of S in registers. A last
// partial chunk is padded with zero rows, which equals the reference's
// true-length chunk.
//
// The dense products run on tensor cores (mma.m16n8k8.tf32, tf32_mma.cuh):
// k k^T and q k^T in the prep kernel, and all four products of the state
// pass (W S, q S, intra V, k^T V). `tc` selects the arithmetic (ops/gdn/kernels.rs):
// 1 = 3xTF32 (each f32 operand split in two tf32 halves, three products: to
// ~1e-6 relative of f32 FMA; the reference precision), 2 = one TF32 pass per
// product (the serving precision: operands rounded to 10 mantissa bits,
// finer than the bf16 of other servers' GDN kernels). With one pass the prep
// stores the state pass's operands already rounded, and the state pass
// rounds S and V as it stores them, so its fragments go from shared memory
// to the tensor cores with one ldmatrix and no conversion. The forward
// substitution goes by blocks of 16 rows: the products with earlier blocks
// on tensor cores, the 16x16 diagonal blocks in f32 FMA.
//
// Work per (chunk, head) at Dk = Dv = 128, C = 64, in multiply-adds:
//   prep:  k k^T and q k^T lower halves ~0.5 M (tensor cores, 20 of 32
//          16x8 tiles per product), forward substitution 256 columns x
//          C(C-1)/2 = 0.52 M (0.39 M on tensor cores, 0.12 M in FMA);
//   state: W S 1 M, q S 1 M, intra V 0.5 M, k^T V 1 M = 3.5 M.
// For an 8,192-token prefill with 32 value heads (4,096 chunk-heads) that is
// ~4.3 G (prep) + ~14.3 G (state) multiply-adds. Memory: the scratch record
// is 147 KB per chunk-head, 604 MB written by the prep and read by the state
// pass (each record by its head's 4 column-tile blocks, which run side by
// side, so DRAM sees it about once: ~2 GB through L2), plus 268 MB of qkv
// rows (the conv's input, which the prep convolves itself) and 134 MB of
// core output: the memory floor of a layer. The state pass is a chain of 128 dependent chunks per block on
// 128 blocks (one per SM), so its time is the chain's latency, while the
// next chunk's record streams in behind the current chunk's products.
#include "gdn.cuh"
#include "kestrel_abi.h"
#include "mbarrier.cuh"
#include "tf32_mma.cuh"
#include "wgmma.cuh"

namespace {

constexpr int CH = GDN_CHUNK;  // chunk length
constexpr int DK = GDN_HEAD_DIM;
constexpr int DV = GDN_HEAD_DIM;

// Layout of one (chunk, head) record in the scratch buffer, in floats. The
// matrices are stored as the state pass's tensor-core fragments read them:
// A operands row-major (rows of the product's output), so W and q by token
// and k by state row.
constexpr int OFF_W = 0;                    // W [CH][DK]
constexpr int OFF_U = OFF_W + CH * DK;      // U [CH][DV]
constexpr int OFF_Q = OFF_U + CH * DV;      // q * exp(cum) [CH][DK]
constexpr int OFF_KT = OFF_Q + CH * DK;     // (k * exp(cum_last - cum))^T [DK][CH]
constexpr int OFF_I = OFF_KT + DK * CH;     // intra [CH][CH]
constexpr int OFF_DECAY = OFF_I + CH * CH;  // exp(cum_last), then 3 zeros
// Mirrored as CHUNK_FLOATS in ops/gdn/.
// Padded to whole rows of 128 floats: the state pass reads records by TMA
// as rows of 128 (and 64) floats.
constexpr int CHUNK_FLOATS = OFF_DECAY + 128;
static_assert(CHUNK_FLOATS == GDN_CHUNK_FLOATS, "src/abi.rs states the record size");
static_assert(CHUNK_FLOATS % 128 == 0 && OFF_KT % 128 == 0 && OFF_I % 64 == 0 && OFF_U % 128 == 0, "TMA rows");

// Index of sequence s's first chunk among all chunks of the step.
__device__ __forceinline__ int chunk_base(const int* seq_start, int s) {
    int base = 0;
    for (int i = 0; i < s; ++i) base += (seq_start[i + 1] - seq_start[i] + CH - 1) / CH;
    return base;
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float2 ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ void st2(float* p, float2 v) { *reinterpret_cast<float2*>(p) = v; }
__device__ __forceinline__ float get(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// 16-byte asynchronous global -> shared copy (sm_80+), waited for with
// cp_wait (everything) or cp_wait_groups<N> (all but the newest N groups).
__device__ __forceinline__ void cp16(float* smem_dst, const float* src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait_groups() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

constexpr int PREP_THREADS = 256;
// Padded row of q and k in the prep's shared memory ([CH][QS], by token): a
// stride of 4 (mod 32) words makes the tensor-core fragment reads (rows g,
// columns c of a tile) hit 32 distinct banks.
constexpr int QS = DK + 4;
// Padded row of A: the tensor-core epilogue's stores (rows g, columns 2c of
// a fragment) conflict 2-way instead of 8-way with rows of CH.
constexpr int AS = CH + 4;
// Dynamic shared memory of gdn_chunk_prep (mirrored as PREP_SMEM_BYTES in ops/gdn/).
constexpr int PREP_SMEM_BYTES = (2 * CH * QS + CH * AS) * 4;
static_assert(PREP_SMEM_BYTES == GDN_PREP_SMEM_BYTES, "src/abi.rs states this");

}  // namespace

// The 8 rows i0 .. i0 + 7 of the chunk (zero from row L on) of the four
// channels col .. col + 3 of the conv output, for gdn_chunk_prep. With
// conv_w == nullptr, x is the conv output itself ([T, ld]); otherwise x is
// the conv's input (the in_proj output, rows ld floats apart) and the causal
// conv + SiLU is computed here with the arithmetic of gdn_conv_body
// (gdn.cu), so that the two paths agree bit for bit (under the serving
// precision the SiLU is the fast one, see conv_rows_n): inputs before the
// sequence's first new token come from conv_state (oldest first), which only
// rows i0 < kernel - 1 of chunk 0 read. Conv kernels of at most 4 taps.
struct ConvIn {
    const float* x;
    int ld;
    const __nv_bfloat16* w;  // [conv_dim, kernel], or null: x is the conv output
    const float* state;      // [conv_dim, kernel - 1] of this sequence's slot
    int kernel;
};
constexpr int CONV_FUSED_MAX_KERNEL = GDN_CONV_FUSED_MAX_KERNEL;

// HIST: the conv's history length kernel - 1 when known at compile time
// (conv_rows dispatches Qwen3.5's 4 taps: fewer predicated instructions in
// the prep, which issues an instruction every other cycle), or -1 to read it
// from `in`.
// FAST: SiLU with the hardware exp and an approximate division (a few ulp;
// the serving precision, tc 2), in place of siluf_exact. The conv + SiLU is
// about a fifth of this issue-bound kernel's instructions, and the exact
// exp and IEEE division were most of those.
template <int HIST, bool FAST>
__device__ __forceinline__ void conv_rows_n(float4 (&out)[8], const ConvIn& in, int start, int seq_row0, int i0,
                                            int L, int col, int lane_col) {
    const float* x = in.x + col + lane_col;
    auto row = [&](int i) { return ld4(x + (size_t)(start + seq_row0 + i) * in.ld); };
    if (in.w == nullptr) {
#pragma unroll
        for (int u = 0; u < 8; ++u) out[u] = i0 + u < L ? row(i0 + u) : make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    constexpr int KMAX = CONV_FUSED_MAX_KERNEL;
    const int hist = HIST >= 0 ? HIST : in.kernel - 1;
    // w_new[e]: the tap of the current input (a register: w[e][hist] with a
    // runtime index would put w in local memory).
    float w[4][KMAX - 1], w_new[4], window[4][KMAX - 1];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int ch = col + lane_col + e;
        w_new[e] = bf16_to_f32(in.w[(size_t)ch * in.kernel + hist]);
#pragma unroll
        for (int j = 0; j < KMAX - 1; ++j) {
            if (j < hist) w[e][j] = bf16_to_f32(in.w[(size_t)ch * in.kernel + j]);
            if (j < hist) {
                const int i = seq_row0 + i0 - hist + j;  // index among the sequence's new tokens
                window[e][j] = i >= 0 ? x[(size_t)(start + i) * in.ld + e] : in.state[(size_t)ch * hist + hist + i];
            }
        }
    }
    // The inputs, all requested before any is used, then replaced by the outputs.
#pragma unroll
    for (int u = 0; u < 8; ++u) out[u] = i0 + u < L ? row(i0 + u) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int u = 0; u < 8; ++u) {
        float res[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float xe = get(out[u], e);
            float acc = 0.f;
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j)
                if (j < hist) acc += w[e][j] * window[e][j];
            acc += w_new[e] * xe;
            res[e] = FAST ? __fdividef(acc, 1.f + __expf(-acc)) : siluf_exact(acc);
#pragma unroll
            for (int j = 0; j < KMAX - 1; ++j)
                if (j < hist) window[e][j] = j + 1 < hist ? window[e][j + 1] : xe;
        }
        out[u] = i0 + u < L ? make_float4(res[0], res[1], res[2], res[3]) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

template <bool FAST>
__device__ __forceinline__ void conv_rows(float4 (&out)[8], const ConvIn& in, int start, int seq_row0, int i0,
                                          int L, int col, int lane_col) {
    if (in.w != nullptr && in.kernel == 4) conv_rows_n<3, FAST>(out, in, start, seq_row0, i0, L, col, lane_col);
    else conv_rows_n<-1, FAST>(out, in, start, seq_row0, i0, L, col, lane_col);
}

// The conv state after this step's n new tokens, for channels col + lane_col
// .. + 3: the last kernel - 1 inputs of [old state ; new inputs], the inputs
// x[start + i] rows ld floats apart. Run by gdn_chunk_state, after every
// block of gdn_chunk_prep has read the old state (two value heads read the q
// and k channels of their key head).
__device__ __forceinline__ void conv_state_update(float* state, const float* x, int ld, int kernel, int start, int n,
                                                  int col, int lane_col) {
    constexpr int KMAX = CONV_FUSED_MAX_KERNEL;
    const int hist = kernel - 1;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int ch = col + lane_col + e;
        float* st = state + (size_t)ch * hist;
        float next[KMAX - 1];
#pragma unroll
        for (int j = 0; j < KMAX - 1; ++j) {
            if (j < hist) {
                const int i = n - hist + j;
                next[j] = i >= 0 ? x[(size_t)(start + i) * ld + ch] : st[hist + i];
            }
        }
#pragma unroll
        for (int j = 0; j < KMAX - 1; ++j)
            if (j < hist) st[j] = next[j];
    }
}

// Per (chunk, value head, sequence): the state-independent part of the chunk.
// The conv output comes from x (see ConvIn: the conv output [T, conv_dim],
// or the in_proj output with conv_w, whose conv + SiLU this kernel computes
// and whose conv state chunk 0 advances); proj supplies b and a. k k^T and
// q k^T on tensor cores (tc 1: 3xTF32, 2: one pass, and the record's matrix
// operands stored rounded to tf32).
// Grid (max chunks of a sequence, Hv, S), block 256, dynamic shared memory
// PREP_SMEM_BYTES: q, k [CH][QS] and A [CH][AS].
template <int TC>
__device__ __forceinline__ void prep_body(float* __restrict__ scratch, const float* __restrict__ x, int x_stride,
                                          const __nv_bfloat16* __restrict__ conv_w,
                                          const float* __restrict__ conv_state, int conv_kernel,
                                          const float* __restrict__ proj, int proj_stride, int b_offset, int a_offset,
                                          const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                                          const int* __restrict__ seq_start, const int* __restrict__ seq_slot, int hk,
                                          int hv, float q_scale) {
    extern __shared__ float4 smem4[];
    float* qS = reinterpret_cast<float*>(smem4);  // [CH][QS], normalised and scaled
    float* kS = qS + CH * QS;                     // [CH][QS], normalised
    float* A = kS + CH * QS;                      // [CH][AS]
    __shared__ float cum[CH], ecum[CH], etail[CH], beta[CH];

    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    if (c * CH >= n) return;
    const int L = min(CH, n - c * CH);
    const int t0 = start + c * CH;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int kh = h / (hv / hk);
    const int conv_dim = 2 * hk * DK + hv * DV;
    constexpr bool round = TC == 2;
    auto operand = [&](float x) { return round ? tf32_operand<1>(x) : x; };
    float* rec = scratch + ((size_t)(chunk_base(seq_start, s) + c) * hv + h) * CHUNK_FLOATS;
    // The conv state before this step (chunk 0 reads it; gdn_chunk_state,
    // the next kernel, advances it).
    const float* state = conv_w != nullptr ? conv_state + (size_t)seq_slot[s] * conv_dim * (conv_kernel - 1) : nullptr;
    const ConvIn in{x, x_stride, conv_w, state, conv_kernel};

    // 1. The q and k rows (zero past L), L2-normalised (q also scaled) into
    //    shared memory: warp w takes rows 8w .. 8w + 7 of q, then of k, a
    //    row per warp-wide 16-byte load.
#pragma unroll 1
    for (int which = 0; which < 2; ++which) {
        const int col = which * hk * DK + kh * DK;
        float4 v[8];
        conv_rows<TC == 2>(v, in, start, c * CH, 8 * warp, L, col, 4 * lane);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = 8 * warp + u;
            const float inv = gdn_l2_inv(warp_sum(v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w));
            float4 y = make_float4(v[u].x * inv, v[u].y * inv, v[u].z * inv, v[u].w * inv);
            if (!which) y = make_float4(y.x * q_scale, y.y * q_scale, y.z * q_scale, y.w * q_scale);
            st4((which ? kS : qS) + i * QS + 4 * lane, y);
        }
    }
    if (tid < CH) {
        float g = 0.f, b = 0.f;
        if (tid < L) {
            const float* pr = proj + (size_t)(t0 + tid) * proj_stride;
            g = gdn_log_decay(pr[a_offset + h], a_log[h], dt_bias[h]);
            b = sigmoidf_exact(pr[b_offset + h]);
        }
        cum[tid] = g;  // summed below
        beta[tid] = b;
    }
    __syncthreads();
    if (tid == 0) {
        // Sequential, as the reference's cumulative sum; padded rows keep the last value.
        float acc = 0.f;
        for (int i = 0; i < CH; ++i) {
            acc += cum[i];
            cum[i] = acc;
        }
    }
    __syncthreads();
    if (tid < CH) {
        ecum[tid] = expf(cum[tid]);
        etail[tid] = expf(cum[CH - 1] - cum[tid]);
    }

    // 2. A (strictly lower) and intra (lower with diagonal) on tensor cores:
    //    warp w covers rows 16 (w / 2) .. +15 and columns 32 (w % 2) .. +31
    //    (four 16x8 tiles) of both k k^T and q k^T, skipping the products of
    //    tiles entirely above the diagonal (stored as zeros).
    {
        const int g = lane >> 2, cq = lane & 3;
        const int m0 = (warp >> 1) * 16, nb = (warp & 1) * 32;
        float ak[4][4], aq[4][4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) ak[t][e] = aq[t][e] = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < DK; k0 += 8) {
            // A operands: element (i, d) of k and q is kS[i][d].
            const Tf32A fk = tf32_frag_a(kS + m0 * QS + k0, QS, 1);
            const Tf32A fq = tf32_frag_a(qS + m0 * QS + k0, QS, 1);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int n0 = nb + 8 * t;
                if (n0 > m0 + 15) continue;  // warp-uniform
                // B operand: element (d, j) of k^T is kS[j][d].
                const Tf32B fb = tf32_frag_b(kS + n0 * QS + k0, 1, QS);
                if constexpr (TC == 2) {
                    mma_tf32x<1>(ak[t], fk, fb);
                    mma_tf32x<1>(aq[t], fq, fb);
                } else {
                    mma_tf32x<3>(ak[t], fk, fb);
                    mma_tf32x<3>(aq[t], fq, fb);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 4; ++t) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int i = m0 + g + 8 * hr, j = nb + 8 * t + 2 * cq;
                float a2[2], q2[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float decay = j + e <= i ? expf(cum[i] - cum[j + e]) : 0.f;
                    a2[e] = j + e < i ? ak[t][2 * hr + e] * beta[i] * decay : 0.f;
                    q2[e] = operand(aq[t][2 * hr + e] * decay);
                }
                st2(A + i * AS + j, make_float2(a2[0], a2[1]));
                st2(rec + OFF_I + i * CH + j, make_float2(q2[0], q2[1]));
            }
        }
    }
    __syncthreads();

    // 3. The decayed q (by token) and k (transposed) for the state pass.
    for (int idx = tid * 4; idx < CH * DK; idx += PREP_THREADS * 4) {
        const int i = idx / DK, d = idx % DK;
        const float4 q = ld4(qS + i * QS + d);
        const float e = ecum[i];
        st4(rec + OFF_Q + idx, make_float4(operand(q.x * e), operand(q.y * e), operand(q.z * e), operand(q.w * e)));
    }
    for (int idx = tid; idx < DK * CH; idx += PREP_THREADS) {
        const int d = idx / CH, i = idx % CH;
        rec[OFF_KT + idx] = operand(kS[i * QS + d] * etail[i]);
    }
    __syncthreads();  // q's tile is free; k's is rewritten in place below

    // 4. The right-hand sides of (I + A) X = B, X = [Xv | Xk]: Xv = v * beta
    //    over q's tile, Xk = k * beta * exp(cum) in place of k. Rows past L
    //    are zero in A and B, so they stay zero in X.
    float* Xv = qS;
    float* Xk = kS;
    {
        const int col = 2 * hk * DK + h * DV;
        float4 v[8];
        conv_rows<TC == 2>(v, in, start, c * CH, 8 * warp, L, col, 4 * lane);
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int i = 8 * warp + u;
            const float b = beta[i], e = ecum[i];
            st4(Xv + i * QS + 4 * lane, make_float4(v[u].x * b, v[u].y * b, v[u].z * b, v[u].w * b));
            const float4 k = ld4(Xk + i * QS + 4 * lane);
            st4(Xk + i * QS + 4 * lane, make_float4(k.x * b * e, k.y * b * e, k.z * b * e, k.w * b * e));
        }
    }
    __syncthreads();

    // 5. Forward substitution by blocks of 16 rows: block b's rows first take
    //    -A[b][<b] X[<b] on tensor cores (warp w: columns 32 (w % 4) .. +31 of
    //    Xv for w < 4, of Xk otherwise), then every thread solves its column's
    //    16 rows against the diagonal block in FMA (256 threads, 256 columns).
    //    The sequential part is 4 x 120 multiply-adds per column instead of
    //    the 2,016 of a whole-chunk substitution.
    for (int rb = 0; rb < CH; rb += 16) {
        if (rb > 0) {
            const int g = lane >> 2, cq = lane & 3, n0 = (warp & 3) * 32;
            float* X = warp < 4 ? Xv : Xk;
            float acc[4][4];
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[t][e] = 0.f;
            for (int k0 = 0; k0 < rb; k0 += 8) {
                const Tf32A fa = tf32_frag_a(A + rb * AS + k0, AS, 1);
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const Tf32B fb = tf32_frag_b(X + k0 * QS + n0 + 8 * t, QS, 1);
                    if constexpr (TC == 2) mma_tf32x<1>(acc[t], fa, fb);
                    else mma_tf32x<3>(acc[t], fa, fb);
                }
            }
#pragma unroll
            for (int t = 0; t < 4; ++t)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr) {
                    float* x = X + (rb + g + 8 * hr) * QS + n0 + 8 * t + 2 * cq;
                    const float2 old = ld2(x);
                    st2(x, make_float2(old.x - acc[t][2 * hr], old.y - acc[t][2 * hr + 1]));
                }
            __syncthreads();
        }
        {
            float* X = (tid < DV ? Xv : Xk) + tid % DV;
            float x[16];
#pragma unroll
            for (int r = 0; r < 16; ++r) x[r] = X[(rb + r) * QS];
#pragma unroll
            for (int r = 1; r < 16; ++r) {
                const float* ar = A + (rb + r) * AS + rb;
#pragma unroll
                for (int j4 = 0; j4 < r; j4 += 4) {
                    const float4 w = ld4(ar + j4);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        if (j4 + e < r) x[r] -= get(w, e) * x[j4 + e];
                }
            }
#pragma unroll
            for (int r = 0; r < 16; ++r) X[(rb + r) * QS] = x[r];
        }
        __syncthreads();
    }

    // 6. U and W by token, consecutive threads on consecutive columns.
    for (int idx = tid * 4; idx < CH * DK; idx += PREP_THREADS * 4) {
        const int i = idx / DK, d = idx % DK;
        st4(rec + OFF_U + idx, ld4(Xv + i * QS + d));
        const float4 w = ld4(Xk + i * QS + d);
        st4(rec + OFF_W + idx, make_float4(operand(w.x), operand(w.y), operand(w.z), operand(w.w)));
    }
    if (tid < 4) rec[OFF_DECAY + tid] = tid == 0 ? expf(cum[CH - 1]) : 0.f;
}

// One body per arithmetic (tc 2: one TF32 pass and the fast SiLU; tc 1:
// 3xTF32 and the exact SiLU).
// Positional parameters, not a record (src/abi.rs): this body sits at its
// 128-register cap, and reading its pointers from a record parameter made it
// spill.
KESTREL_EXTERN void __launch_bounds__(PREP_THREADS, 2)
    gdn_chunk_prep(float* __restrict__ scratch, const float* __restrict__ x, int x_stride,
                   const __nv_bfloat16* __restrict__ conv_w, const float* __restrict__ conv_state, int conv_kernel,
                   const float* __restrict__ proj, int proj_stride, int b_offset, int a_offset,
                   const float* __restrict__ a_log, const float* __restrict__ dt_bias,
                   const int* __restrict__ seq_start, const int* __restrict__ seq_slot, int hk, int hv,
                   float q_scale, int tc) {
    pdl_begin();
    if (tc == 2) prep_body<2>(scratch, x, x_stride, conv_w, conv_state, conv_kernel, proj, proj_stride, b_offset,
                              a_offset, a_log, dt_bias, seq_start, seq_slot, hk, hv, q_scale);
    else prep_body<1>(scratch, x, x_stride, conv_w, conv_state, conv_kernel, proj, proj_stride, b_offset, a_offset,
                      a_log, dt_bias, seq_start, seq_slot, hk, hv, q_scale);
}

namespace {
constexpr int STATE_THREADS = GDN_STATE_THREADS;
constexpr int TC = 32;  // state columns per block

// Shared memory of the state pass, in floats. Every matrix a fragment is
// loaded from with ldmatrix has rows 4 (mod 32) words apart, so that the 8
// row addresses of each 8x8 matrix hit distinct 16-byte bank groups:
// W, q [CH][RK] and S^T [TC][RK] (rows of DK), k^T [DK][RJ], intra [CH][RJ]
// and V^T [TC][RJ] (rows of CH). U [CH][RU] is read by the phase-1 epilogue
// as float2 (conflict-free per half warp at 8 mod 32).
constexpr int RK = DK + 4;
constexpr int RJ = CH + 4;
constexpr int RU = TC + 8;
constexpr int SM_W = 0;
constexpr int SM_Q = SM_W + CH * RK;
constexpr int SM_KT = SM_Q + CH * RK;
constexpr int SM_I = SM_KT + DK * RJ;
constexpr int SM_U = SM_I + CH * RJ;
constexpr int SM_ST = SM_U + CH * RU;
constexpr int SM_VT = SM_ST + TC * RK;
constexpr int STATE_SMEM_FLOATS = SM_VT + TC * RJ;
// Mirrored as STATE_SMEM_BYTES in ops/gdn/.
constexpr int STATE_SMEM_BYTES = 4 * STATE_SMEM_FLOATS;
static_assert(STATE_SMEM_BYTES == GDN_STATE_SMEM_BYTES, "src/abi.rs states this");
static_assert(SM_Q % 4 == 0 && SM_KT % 4 == 0 && SM_I % 4 == 0 && SM_U % 4 == 0 && SM_ST % 4 == 0 &&
                  SM_VT % 4 == 0 && RK % 32 == 4 && RJ % 32 == 4 && RU % 4 == 0,
              "16-byte aligned rows for cp.async and ldmatrix");

// The chunks of one (sequence, head, column tile). Warp w holds state rows
// 16 w .. +15 (all TC columns) in registers for the whole pass, and stores
// them after each update as S^T into shared memory, where phase 1 of the next
// chunk reads them as B operands. Per chunk, two phases, each fed by its own
// cp.async group so that the next chunk's inputs stream in while this chunk
// computes:
//   phase 1 (W, q, U): V = U - W S and O = q S; warp w owns rows
//     16 (w / 2) .. +15 and columns 16 (w % 2) .. +15 of both, and stores V
//     as V^T;
//   phase 2 (k^T, intra): O += intra V, and S = decay S + k^T V.
// Groups are committed in the order G1(c), G2(c), G1(c+1), G2(c+1), ...; G1(c+1)
// is issued once phase 1 of chunk c has consumed its buffers, G2(c+1) once
// phase 2 has, and every wait leaves exactly the newest group in flight.
// (A third load group, so that each buffer is refilled right after its own
// phase, and 16 warps per block, each half of this work, were both slower.)
template <int PASSES>
__device__ __forceinline__ void state_pass(float* __restrict__ core, const float* __restrict__ scratch,
                                           float* __restrict__ st, float* smem, int start, int n, int base,
                                           int col0, int h, int hv, float* __restrict__ snap_st, int snap_chunk) {
    float* W = smem + SM_W;
    float* Q = smem + SM_Q;
    float* KT = smem + SM_KT;
    float* I = smem + SM_I;
    float* U = smem + SM_U;
    float* ST = smem + SM_ST;
    float* VT = smem + SM_VT;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, cq = lane & 3;
    const int chunks = (n + CH - 1) / CH;
    auto record = [&](int c) { return scratch + ((size_t)(base + c) * hv + h) * CHUNK_FLOATS; };
    auto load_g1 = [&](const float* rec) {
        for (int idx = tid * 4; idx < CH * DK; idx += STATE_THREADS * 4) {
            const int r = idx / DK, cc = idx % DK;
            cp16(W + r * RK + cc, rec + OFF_W + idx);
            cp16(Q + r * RK + cc, rec + OFF_Q + idx);
        }
        for (int idx = tid * 4; idx < CH * TC; idx += STATE_THREADS * 4) {
            const int i = idx / TC, cc = idx % TC;
            cp16(U + i * RU + cc, rec + OFF_U + i * DV + col0 + cc);
        }
    };
    auto load_g2 = [&](const float* rec) {
        for (int idx = tid * 4; idx < DK * CH; idx += STATE_THREADS * 4)
            cp16(KT + (idx / CH) * RJ + idx % CH, rec + OFF_KT + idx);
        for (int idx = tid * 4; idx < CH * CH; idx += STATE_THREADS * 4)
            cp16(I + (idx / CH) * RJ + idx % CH, rec + OFF_I + idx);
    };

    // This warp's state rows r0 + g (+ 8): s[t][e] is S[r0 + g + 8 (e / 2)][8 t + 2 cq + e % 2].
    const int r0 = warp * 16;
    float s[TC / 8][4];
    auto store_st = [&]() {
#pragma unroll
        for (int t = 0; t < TC / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                ST[(8 * t + 2 * cq + (e & 1)) * RK + r0 + g + 8 * (e >> 1)] = tf32_operand<PASSES>(s[t][e]);
    };
#pragma unroll
    for (int t = 0; t < TC / 8; ++t)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const float2 v = ld2(st + (size_t)(r0 + g + 8 * hr) * DV + 8 * t + 2 * cq);
            s[t][2 * hr] = v.x;
            s[t][2 * hr + 1] = v.y;
        }
    store_st();
    load_g1(record(0));
    cp_commit();
    load_g2(record(0));
    cp_commit();

    const int m0 = (warp >> 1) * 16, nb = (warp & 1) * 16;  // phase-1 / intra V tiles
    // The chunk's total decay, loaded a chunk ahead.
    float decay_next = record(0)[OFF_DECAY];
    for (int c = 0; c < chunks; ++c) {
        const bool more = c + 1 < chunks;
        const float decay = decay_next;
        if (more) decay_next = record(c + 1)[OFF_DECAY];
        cp_wait_groups<1>();  // G1(c) has landed
        __syncthreads();      // ... for every thread; S^T of the previous chunk is written

        // Phase 1: V = U - W S, O = q S.
        float av[2][4], ao[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) av[t][e] = ao[t][e] = 0.f;
#pragma unroll
        for (int k0 = 0; k0 < DK; k0 += 8) {
            const Tf32A fw = tf32_frag_a_ldm<PASSES>(W, RK, m0, k0);
            const Tf32A fq = tf32_frag_a_ldm<PASSES>(Q, RK, m0, k0);
            Tf32B fs[2];
            tf32_frag_b2_ldm<PASSES>(fs, ST, RK, nb, k0);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                mma_tf32x<PASSES>(av[t], fw, fs[t]);
                mma_tf32x<PASSES>(ao[t], fq, fs[t]);
            }
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int i = m0 + g + 8 * hr, col = nb + 8 * t + 2 * cq;
                const float2 u = ld2(U + i * RU + col);
                VT[col * RJ + i] = tf32_operand<PASSES>(u.x - av[t][2 * hr]);
                VT[(col + 1) * RJ + i] = tf32_operand<PASSES>(u.y - av[t][2 * hr + 1]);
            }
        }
        __syncthreads();  // V is complete; W, q and U are free
        if (more) load_g1(record(c + 1));
        cp_commit();
        cp_wait_groups<1>();  // G2(c) has landed
        __syncthreads();

        // Phase 2a: O += intra V.
#pragma unroll
        for (int j0 = 0; j0 < CH; j0 += 8) {
            const Tf32A fa = tf32_frag_a_ldm<PASSES>(I, RJ, m0, j0);
            Tf32B fv[2];
            tf32_frag_b2_ldm<PASSES>(fv, VT, RJ, nb, j0);
#pragma unroll
            for (int t = 0; t < 2; ++t) mma_tf32x<PASSES>(ao[t], fa, fv[t]);
        }
        // Phase 2b: S = decay S + k^T V for this warp's 16 state rows.
#pragma unroll
        for (int t = 0; t < TC / 8; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[t][e] *= decay;
#pragma unroll
        for (int j0 = 0; j0 < CH; j0 += 8) {
            const Tf32A fk = tf32_frag_a_ldm<PASSES>(KT, RJ, r0, j0);
#pragma unroll
            for (int half = 0; half < TC / 16; ++half) {
                Tf32B fv[2];
                tf32_frag_b2_ldm<PASSES>(fv, VT, RJ, 16 * half, j0);
#pragma unroll
                for (int t = 0; t < 2; ++t) mma_tf32x<PASSES>(s[2 * half + t], fk, fv[t]);
            }
        }
        store_st();  // phase 1 of every warp is past (barrier above)
        if (c == snap_chunk) {
#pragma unroll
            for (int t = 0; t < TC / 8; ++t)
#pragma unroll
                for (int hr = 0; hr < 2; ++hr)
                    st2(snap_st + (size_t)(r0 + g + 8 * hr) * DV + 8 * t + 2 * cq,
                        make_float2(s[t][2 * hr], s[t][2 * hr + 1]));
        }

        const int L = min(CH, n - c * CH);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
            const int i = m0 + g + 8 * hr;
            if (i < L) {
                float* o = core + (size_t)(start + c * CH + i) * hv * DV + h * DV + col0 + nb + 2 * cq;
#pragma unroll
                for (int t = 0; t < 2; ++t) st2(o + 8 * t, make_float2(ao[t][2 * hr], ao[t][2 * hr + 1]));
            }
        }
        __syncthreads();  // k^T, intra and V^T are free
        if (more) load_g2(record(c + 1));
        cp_commit();
    }
    cp_wait();

#pragma unroll
    for (int t = 0; t < TC / 8; ++t)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
            st2(st + (size_t)(r0 + g + 8 * hr) * DV + 8 * t + 2 * cq, make_float2(s[t][2 * hr], s[t][2 * hr + 1]));
}

// A CUDA tensor map (CUtensorMap, built on the host), passed by value as a
// __grid_constant__ kernel parameter so that TMA copies can name it.
struct alignas(128) TmaMap {
    uint64_t opaque[16];
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// ---- the state pass on wgmma and TMA (one TF32 pass, Hopper) ---------------
//
// The same chunks and arithmetic as state_pass<1> (bit for bit on the
// benchmark shapes), with
// - the products as warpgroup instructions (wgmma m64n32k8 tf32) reading
//   both operands from shared memory, in place of ldmatrix + mma.sync;
// - each chunk's 120 KB of inputs as 15 TMA boxes of 8 KB issued by one
//   thread, completing on an mbarrier per load group, in place of ~7,700
//   16-byte cp.async copies from every thread.
// Under ncu the mma.sync pass spent its stall samples issuing those copies
// (their queue full), on ldmatrix -> mma dependencies and on the MIO queue;
// either change alone was no faster, together they make the layer (prep,
// state and gated norm) faster (docs/benchmarks/2026-11-30-h200-gdn-prefill/).
// Every operand is K-major, as TF32
// wgmma requires:
//   V = U - W S and O = q S: A = W or q [CH][DK], B = S^T [TC][DK];
//   O += intra V:            A = intra [CH][CH],  B = V^T [TC][CH];
//   S = decay S + k^T V:     A = k^T [DK][CH],    B = V^T.
// Tiles are stored in blocks of 32 floats of K (128-byte rows, the 128-byte
// swizzle of wgmma.cuh, which is also TMA's), blocks R * 128 bytes apart for
// an R-row tile. Warpgroup 0 computes V (and its epilogue) and S rows
// 0..63, warpgroup 1 O and S rows 64..127.

// TMA: the box at (column x, row y) of a 2-D tensor map to shared memory
// (1,024-byte aligned: the map's 128-byte swizzle is the tiles' layout).
__device__ __forceinline__ void tma_box(float* dst, const TmaMap* map, int x, int y, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(smem_addr(bar))
        : "memory");
}
// Boxes of both maps: 32 floats (128 bytes) by 64 rows.
constexpr int BOX_BYTES = 32 * 64 * 4;

// Float index of element (r, k) of an R-row K-major tile in that layout.
template <int R>
__device__ __forceinline__ int wg_tile(int r, int k) {
    return (k >> 5) * (R * 32) + r * 32 + ((((k & 31) >> 2) ^ (r & 7)) << 2) + (k & 3);
}

// d (+)= A[64 x 8] B[8 x 32], tf32, both K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n32k8_tf32(float (&d)[16], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, 1, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(da), "l"(db));
}

// d += A B over K in steps of 8: A and B K-major tiles at shared addresses
// a and b, their 32-float column blocks a_block and b_block bytes apart.
template <int K>
__device__ __forceinline__ void wgmma_tf32_tiles(float (&d)[16], uint32_t a, uint32_t a_block, uint32_t b,
                                                 uint32_t b_block) {
#pragma unroll
    for (int ks = 0; ks < K / 8; ++ks) {
        const uint32_t off = (ks & 3) * 32;  // 8 floats = 32 bytes along the row
        wgmma_m64n32k8_tf32(d, wgmma_desc(a + (ks >> 2) * a_block + off), wgmma_desc(b + (ks >> 2) * b_block + off));
    }
}

// Shared memory of state_pass_wg, in floats from a 1,024-byte boundary
// (within STATE_SMEM_BYTES with the alignment slack).
constexpr int WG_W = 0;                // [CH][DK] tile
constexpr int WG_Q = WG_W + CH * DK;   // [CH][DK] tile
constexpr int WG_KT = WG_Q + CH * DK;  // [DK][CH] tile
constexpr int WG_I = WG_KT + DK * CH;  // [CH][CH] tile
constexpr int WG_ST = WG_I + CH * CH;  // [TC][DK] tile
constexpr int WG_VT = WG_ST + TC * DK; // [TC][CH] tile
constexpr int WG_U = WG_VT + TC * CH;  // [CH][TC] tile
static_assert((WG_U + CH * TC) * 4 + 1024 <= STATE_SMEM_BYTES, "fits the state pass's shared memory");
static_assert(WG_Q % 256 == 0 && WG_KT % 256 == 0 && WG_I % 256 == 0 && WG_ST % 256 == 0 && WG_VT % 256 == 0 &&
                  WG_U % 256 == 0,
              "tiles on 1,024-byte boundaries");

// Accumulator element e (< 16) of this thread in an m64n32 tile: row (of
// the warpgroup's 64) and column.
__device__ __forceinline__ int acc_row(int e) { return 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2) + 8 * ((e >> 1) & 1); }
__device__ __forceinline__ int acc_col(int e) { return 8 * (e >> 2) + 2 * (threadIdx.x & 3) + (e & 1); }

__device__ __forceinline__ void state_pass_wg(float* __restrict__ core, const float* __restrict__ scratch,
                                              float* __restrict__ st, float* smem_raw, int start, int n, int base,
                                              int col0, int h, int hv, const TmaMap* rows128,
                                              const TmaMap* rows64, float* __restrict__ snap_st, int snap_chunk) {
    const uint32_t raw = smem_addr(smem_raw);
    float* smem = smem_raw + (((raw + 1023u) & ~1023u) - raw) / 4;
    float* W = smem + WG_W;
    float* Q = smem + WG_Q;
    float* KT = smem + WG_KT;
    float* I = smem + WG_I;
    float* ST = smem + WG_ST;
    float* VT = smem + WG_VT;
    float* U = smem + WG_U;
    const int tid = threadIdx.x, wg = tid >> 7;
    const int chunks = (n + CH - 1) / CH;
    auto record_index = [&](int c) { return (base + c) * hv + h; };
    auto record = [&](int c) { return scratch + (size_t)record_index(c) * CHUNK_FLOATS; };
    // The chunk's inputs by TMA, 8 KB boxes issued by one thread: G1 (W, q
    // and U, 9 boxes) and G2 (k^T and intra, 6), each completing on its
    // mbarrier. The scratch is seen as rows of 128 floats (W, q, U) and of
    // 64 (k^T, intra); CHUNK_FLOATS keeps records on whole rows.
    __shared__ __align__(8) uint64_t bar[2];
    if (tid == 0) {
        mbar_init1(&bar[0]);
        mbar_init1(&bar[1]);
        mbar_init_fence();
    }
    __syncthreads();
    auto load_g1 = [&](int c) {
        if (tid != 0) return;
        const int row = record_index(c) * (CHUNK_FLOATS / 128);
        mbar_expect(&bar[0], 9 * BOX_BYTES);
#pragma unroll
        for (int b = 0; b < DK / 32; ++b) {
            tma_box(W + b * CH * 32, rows128, 32 * b, row + OFF_W / 128, &bar[0]);
            tma_box(Q + b * CH * 32, rows128, 32 * b, row + OFF_Q / 128, &bar[0]);
        }
        tma_box(U, rows128, col0, row + OFF_U / 128, &bar[0]);
    };
    auto load_g2 = [&](int c) {
        if (tid != 0) return;
        const int row = record_index(c) * (CHUNK_FLOATS / 64);
        mbar_expect(&bar[1], 6 * BOX_BYTES);
#pragma unroll
        for (int b = 0; b < CH / 32; ++b) {
            tma_box(KT + b * DK * 32, rows64, 32 * b, row + OFF_KT / 64, &bar[1]);
            tma_box(KT + b * DK * 32 + 64 * 32, rows64, 32 * b, row + OFF_KT / 64 + 64, &bar[1]);
            tma_box(I + b * CH * 32, rows64, 32 * b, row + OFF_I / 64, &bar[1]);
        }
    };

    // This warpgroup's 64 rows of S (rows 64 wg + acc_row(e), columns acc_col(e)).
    float s[16];
    auto store_st = [&]() {
#pragma unroll
        for (int e = 0; e < 16; ++e) ST[wg_tile<TC>(acc_col(e), 64 * wg + acc_row(e))] = tf32_operand<1>(s[e]);
    };
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = st[(size_t)(64 * wg + acc_row(e)) * DV + acc_col(e)];
    store_st();
    load_g1(0);
    load_g2(0);

    const uint32_t w_or_q = smem_addr(wg == 0 ? W : Q), st_addr = smem_addr(ST), vt_addr = smem_addr(VT),
                   i_addr = smem_addr(I), kt_addr = smem_addr(KT) + wg * 64 * 128;
    float decay_next = record(0)[OFF_DECAY];
    for (int c = 0; c < chunks; ++c) {
        const bool more = c + 1 < chunks;
        const float decay = decay_next;
        if (more) decay_next = record(c + 1)[OFF_DECAY];
        mbar_wait_parity(&bar[0], c & 1);  // G1(c) has landed
        fence_proxy_async();                 // S^T (plain stores) is visible to wgmma
        __syncthreads();

        // Phase 1: warpgroup 0 W S, warpgroup 1 q S (K = DK in 16 steps of 8).
        float acc[16];
#pragma unroll
        for (int e = 0; e < 16; ++e) acc[e] = 0.f;
        pin(acc);
        wgmma_fence();
        wgmma_tf32_tiles<DK>(acc, w_or_q, CH * 128, st_addr, TC * 128);
        wgmma_commit();
        wgmma_wait<0>();
        pin(acc);
        if (wg == 0) {
            // V = U - W S, stored as V^T.
#pragma unroll
            for (int e = 0; e < 16; ++e) {
                const int i = acc_row(e), col = acc_col(e);
                VT[wg_tile<TC>(col, i)] = tf32_operand<1>(U[wg_tile<CH>(i, col)] - acc[e]);
            }
            fence_proxy_async();
        }
        __syncthreads();  // V is complete; W, q and U are free
        if (more) load_g1(c + 1);
        mbar_wait_parity(&bar[1], c & 1);  // G2(c) has landed

        // Phase 2: warpgroup 1 O += intra V; both S = decay S + k^T V (K = CH in 8 steps).
#pragma unroll
        for (int e = 0; e < 16; ++e) s[e] *= decay;
        pin(s);
        wgmma_fence();
        // (Warpgroup 0 computes intra V too, into its spent V sums: a
        // product in a branch would serialize every wgmma of the pass.)
        wgmma_tf32_tiles<CH>(acc, i_addr, CH * 128, vt_addr, TC * 128);
        wgmma_tf32_tiles<CH>(s, kt_addr, DK * 128, vt_addr, TC * 128);
        wgmma_commit();
        wgmma_wait<0>();
        pin(s);
        pin(acc);
        store_st();  // phase 1 of both warpgroups is past (barrier above)
        if (c == snap_chunk) {
#pragma unroll
            for (int e = 0; e < 16; e += 2)
                st2(snap_st + (size_t)(64 * wg + acc_row(e)) * DV + acc_col(e), make_float2(s[e], s[e + 1]));
        }
        if (wg == 1) {
            const int L = min(CH, n - c * CH);
#pragma unroll
            for (int e = 0; e < 16; e += 2) {
                const int i = acc_row(e);
                if (i < L)
                    st2(core + (size_t)(start + c * CH + i) * hv * DV + h * DV + col0 + acc_col(e),
                        make_float2(acc[e], acc[e + 1]));
            }
        }
        fence_proxy_async();
        __syncthreads();  // k^T, intra and V^T are free; S^T is written
        if (more) load_g2(c + 1);
    }
#pragma unroll
    for (int e = 0; e < 16; e += 2)
        st2(st + (size_t)(64 * wg + acc_row(e)) * DV + acc_col(e), make_float2(s[e], s[e + 1]));
}
#endif  // __CUDA_ARCH_FEAT_SM90_ALL
}  // namespace

// Per (column tile, value head, sequence): the chunks in order, carrying the
// tile S[DK][TC] of the state. core is [T, Hv*Dv]. tc: 2 one TF32 pass per
// product, 1 3xTF32.
// Grid (Dv/32, Hv, S), block 256, dynamic shared memory STATE_SMEM_BYTES (ops/gdn/kernels.rs).
// One block per SM (its shared memory), so the bounds let it take up to 255
// registers: with the product loops fully unrolled it uses ~194 (3xTF32
// faster, one TF32 pass unchanged).
// gdn_chunk_state_wg (the same arguments plus two tensor maps over the
// scratch, as rows of 128 and of 64 floats with boxes of 32 x 64; one TF32
// pass only): state_pass_wg, on sm_90a; it traps elsewhere, where
// ops/gdn/ never launches it.
template <bool WG>
__device__ __forceinline__ void chunk_state(float* __restrict__ core, const float* __restrict__ scratch,
                                            float* __restrict__ state, const int* __restrict__ seq_start,
                                            const int* __restrict__ seq_slot, int hv, int tc,
                                            const float* __restrict__ conv_x, int conv_x_stride,
                                            float* __restrict__ conv_state, int conv_kernel, int hk,
                                            const int* __restrict__ token_ckpt, const TmaMap* rows128,
                                            const TmaMap* rows64) {
    extern __shared__ float4 state_smem[];
    float* smem = reinterpret_cast<float*>(state_smem);
    const int col0 = blockIdx.x * TC, h = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    if (n == 0) return;
    // A prefix-cache snapshot inside the run (SeqChunk::state_snapshot): the
    // state after a chunk boundary, at most one per sequence. Every thread
    // finds it (the same few loads); no checkpoints, no loads.
    int snap_chunk = -1, snap_slot = -1;
    if (token_ckpt != nullptr) {
        for (int c = 0; (c + 1) * CH < n; ++c) {
            const int slot = token_ckpt[start + (c + 1) * CH - 1];
            if (slot >= 0) snap_chunk = c, snap_slot = slot;
        }
    }
    if (conv_state != nullptr && blockIdx.x == 0 && threadIdx.x < 32) {
        // gdn_chunk_prep computed the conv: advance its state here (warp 0 of
        // column tile 0): q and k channels from the first value head of their
        // key head, v channels from every head.
        const int conv_dim = 2 * hk * DK + hv * DV, lane = threadIdx.x;
        float* st = conv_state + (size_t)seq_slot[s] * conv_dim * (conv_kernel - 1);
        float* snap = snap_slot >= 0 ? conv_state + (size_t)snap_slot * conv_dim * (conv_kernel - 1) : nullptr;
        auto update = [&](int col) {
            // The snapshot's window first: its tokens are all new (a chunk or
            // more), so it never reads the live state that the next line advances.
            if (snap != nullptr)
                conv_state_update(snap, conv_x, conv_x_stride, conv_kernel, start, (snap_chunk + 1) * CH, col,
                                  4 * lane);
            conv_state_update(st, conv_x, conv_x_stride, conv_kernel, start, n, col, 4 * lane);
        };
        if (h % (hv / hk) == 0) {
            const int kh = h / (hv / hk);
            update(kh * DK);
            update(hk * DK + kh * DK);
        }
        update(2 * hk * DK + h * DV);
    }
    const int base = chunk_base(seq_start, s);
    float* st = state + ((size_t)seq_slot[s] * hv + h) * DK * DV + col0;
    float* snap_st = snap_slot >= 0 ? state + ((size_t)snap_slot * hv + h) * DK * DV + col0 : nullptr;
    if constexpr (WG) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
        state_pass_wg(core, scratch, st, smem, start, n, base, col0, h, hv, rows128, rows64, snap_st, snap_chunk);
#else
        __trap();
#endif
    } else {
        if (tc == 2) state_pass<1>(core, scratch, st, smem, start, n, base, col0, h, hv, snap_st, snap_chunk);
        else state_pass<3>(core, scratch, st, smem, start, n, base, col0, h, hv, snap_st, snap_chunk);
    }
}

KESTREL_EXTERN void __launch_bounds__(STATE_THREADS, 1)
    gdn_chunk_state(const __grid_constant__ GdnChunkStateArgs a) {
    pdl_begin();
    chunk_state<false>(a.core, a.scratch, a.state, a.seq_start, a.seq_slot, a.hv, a.tc, a.conv_x, a.conv_x_stride,
                       a.conv_state, a.conv_kernel, a.hk, a.token_ckpt, nullptr, nullptr);
}

KESTREL_EXTERN void __launch_bounds__(STATE_THREADS, 1)
    gdn_chunk_state_wg(const __grid_constant__ GdnChunkStateArgs a, const __grid_constant__ TmaMap rows128,
                       const __grid_constant__ TmaMap rows64) {
    pdl_begin();
    chunk_state<true>(a.core, a.scratch, a.state, a.seq_start, a.seq_slot, a.hv, a.tc, a.conv_x, a.conv_x_stride,
                      a.conv_state, a.conv_kernel, a.hk, a.token_ckpt, &rows128, &rows64);
}

// Gated DeltaNet prefill in chunks of 64 tokens (the WY/UT form of the CPU
// reference's chunked.rs), Dk = Dv = 128, to f32 accuracy.
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
// tile) with the tile of S in shared memory. A last partial chunk is padded
// with zero rows, which equals the reference's true-length chunk.
//
// The dense products run on tensor cores, as 3xTF32 in the reference
// precision (tf32_mma.cuh: each f32 operand split into two tf32 halves, three
// mma.sync products, f32 accumulation), which stays within ~1e-6 relative of
// f32 FMA: k k^T and q k^T in the prep kernel, and all four products of the
// state pass (W S, q S, intra V, k^T V). The forward substitution stays in
// f32 FMA: it is a sequential recurrence over the chunk's rows with little
// work per step.
// `tc` selects the arithmetic (ops/gdn.rs): 1 = 3xTF32 (the reference
// precision), 2 = plain TF32, one tensor-core pass per product (the serving
// precision: its operands are rounded to 10 mantissa bits, finer than the
// bf16 of other servers' GDN kernels, and the state pass's chain of dependent
// products is a third as long), 0 = the older all-FMA code.
//
// Work per (chunk, head) at Dk = Dv = 128, C = 64, in multiply-adds:
//   prep:  k k^T and q k^T lower halves ~0.5 M (tensor cores, 20 of 32
//          16x8 tiles per product), forward substitution 256 columns x
//          C(C-1)/2 = 0.52 M (FMA);
//   state: W S 1 M, q S 1 M, intra V 0.5 M, k^T V 1 M = 3.5 M.
// For an 8,192-token prefill with 32 value heads (4,096 chunk-heads) that is
// ~4.3 G (prep) + ~14.3 G (state) multiply-adds, ~37 GFLOP (x3 tensor-core
// instructions for the split products). Memory: the scratch record is 147 KB
// per chunk-head, 604 MB written by the prep and read by the state pass
// (each record by its head's 4 column-tile blocks, which run side by side, so
// DRAM sees it about once: ~2 GB through L2), plus 268 MB of conv output and
// 134 MB of core output: a memory floor of ~0.3 ms per layer on an H200.
// The state pass is a chain of 128 dependent chunks per block on 128 blocks
// (one per SM), so its time is the chain's latency: ~2.75 M tf32 MACs per
// chunk per SM with 3xTF32, a few microseconds, while the next chunk's
// record streams in behind the current chunk's products.
#include "gdn.cuh"
#include "tf32_mma.cuh"

namespace {

constexpr int CH = 64;  // chunk length
constexpr int DK = 128;
constexpr int DV = 128;

// Layout of one (chunk, head) record in the scratch buffer, in floats.
constexpr int OFF_WT = 0;                  // W^T [DK][CH]
constexpr int OFF_U = OFF_WT + DK * CH;    // U [CH][DV]
constexpr int OFF_QT = OFF_U + CH * DV;    // (q * exp(cum))^T [DK][CH]
constexpr int OFF_KT = OFF_QT + DK * CH;   // (k * exp(cum_last - cum))^T [DK][CH]
constexpr int OFF_IT = OFF_KT + DK * CH;   // intra^T [CH][CH]
constexpr int OFF_DECAY = OFF_IT + CH * CH;  // exp(cum_last), then 3 zeros
// Mirrored as CHUNK_FLOATS in ops/gdn.rs.
constexpr int CHUNK_FLOATS = OFF_DECAY + 4;

// Index of sequence s's first chunk among all chunks of the step.
__device__ __forceinline__ int chunk_base(const int* seq_start, int s) {
    int base = 0;
    for (int i = 0; i < s; ++i) base += (seq_start[i + 1] - seq_start[i] + CH - 1) / CH;
    return base;
}

__device__ __forceinline__ void fma4(float4& acc, float a, const float4& b) {
    acc.x += a * b.x;
    acc.y += a * b.y;
    acc.z += a * b.z;
    acc.w += a * b.w;
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
// Padded row of q^T and k^T in the prep's shared memory: a stride of 8 (mod
// 32) words makes the tensor-core fragment reads (rows c, columns g of a
// tile) hit 32 distinct banks.
constexpr int KS = CH + 8;
// Padded row of A: the tensor-core epilogue's stores (rows g, columns 2c of
// a fragment) conflict 2-way instead of 8-way with rows of CH.
constexpr int AS = CH + 4;

}  // namespace

// Per (chunk, value head, sequence): the state-independent part of the chunk.
// qkv is the conv output [T, conv_dim]; proj supplies b and a. tc != 0: k k^T
// and q k^T on tensor cores (tc 1: 3xTF32, 2: one pass).
// Grid (max chunks of a sequence, Hv, S), block 256, dynamic shared memory
// PREP_SMEM_BYTES (ops/gdn.rs): q^T, k^T [DK][KS] and A [CH][AS].
KESTREL_EXTERN void __launch_bounds__(PREP_THREADS)
    gdn_chunk_prep(float* __restrict__ scratch, const float* __restrict__ qkv, const float* __restrict__ proj,
                   int proj_stride, int b_offset, int a_offset, const float* __restrict__ a_log,
                   const float* __restrict__ dt_bias, const int* __restrict__ seq_start, int hk, int hv,
                   float q_scale, int tc) { pdl_begin();
    extern __shared__ float4 smem4[];
    float* qT = reinterpret_cast<float*>(smem4);  // [DK][KS], normalised and scaled
    float* kT = qT + DK * KS;                     // [DK][KS], normalised
    float* A = kT + DK * KS;                      // [CH][AS]
    __shared__ float part[4][CH];
    __shared__ float cum[CH], ecum[CH], etail[CH], beta[CH], inv_norm[2][CH];

    const int c = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    if (c * CH >= n) return;
    const int L = min(CH, n - c * CH);
    const int t0 = start + c * CH;
    const int tid = threadIdx.x;
    const int kh = h / (hv / hk);
    const int conv_dim = 2 * hk * DK + hv * DV;
    float* rec = scratch + ((size_t)(chunk_base(seq_start, s) + c) * hv + h) * CHUNK_FLOATS;

    // 1. q and k rows, transposed into shared memory (zero rows past L), with
    //    their sums of squares: thread (row i, quarter p) covers half a row of q or k.
    {
        const int i = tid % CH, p = tid / CH;
        const int which = p >> 1, half = p & 1;
        const float* src = qkv + (size_t)(t0 + i) * conv_dim + which * hk * DK + kh * DK + half * (DK / 2);
        float* dst = (which ? kT : qT) + half * (DK / 2) * KS + i;
        float ss = 0.f;
#pragma unroll 4
        for (int d = 0; d < DK / 2; d += 4) {
            const float4 v = i < L ? ld4(src + d) : make_float4(0.f, 0.f, 0.f, 0.f);
            dst[(d + 0) * KS] = v.x;
            dst[(d + 1) * KS] = v.y;
            dst[(d + 2) * KS] = v.z;
            dst[(d + 3) * KS] = v.w;
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        part[p][i] = ss;
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
    if (tid < 2 * CH) {
        const int which = tid / CH, i = tid % CH;
        inv_norm[which][i] = gdn_l2_inv(part[2 * which][i] + part[2 * which + 1][i]);
    }
    if (tid == 0) {
        // Sequential, as the reference's cumulative sum; padded rows keep the last value.
        float acc = 0.f;
        for (int i = 0; i < CH; ++i) {
            acc += cum[i];
            cum[i] = acc;
        }
    }
    __syncthreads();
    {
        // Normalise in place; each thread owns the half row it loaded.
        const int i = tid % CH, p = tid / CH;
        const int which = p >> 1, half = p & 1;
        float* dst = (which ? kT : qT) + half * (DK / 2) * KS + i;
        const float inv = inv_norm[which][i];
        for (int d = 0; d < DK / 2; ++d) dst[d * KS] = which ? dst[d * KS] * inv : dst[d * KS] * inv * q_scale;
        if (tid < CH) {
            ecum[tid] = expf(cum[tid]);
            etail[tid] = expf(cum[CH - 1] - cum[tid]);
        }
    }
    __syncthreads();

    // 2. A (strictly lower) and intra (lower with diagonal).
    if (tc) {
        // Tensor cores: warp w covers rows 16 (w / 2) .. +15 and columns
        // 32 (w % 2) .. +31 (four 16x8 tiles) of both k k^T and q k^T,
        // skipping tiles entirely above the diagonal (left zero).
        const int warp = tid / 32, lane = tid % 32, g = lane >> 2, cq = lane & 3;
        const int m0 = (warp >> 1) * 16, nb = (warp & 1) * 32;
        float ak[4][4], aq[4][4];
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) ak[t][e] = aq[t][e] = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < DK; k0 += 8) {
            // A operands: element (i, d) of k and q is kT[d][i].
            const Tf32A fk = tf32_frag_a(kT + k0 * KS + m0, 1, KS);
            const Tf32A fq = tf32_frag_a(qT + k0 * KS + m0, 1, KS);
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int n0 = nb + 8 * t;
                if (n0 > m0 + 15) continue;  // warp-uniform
                // B operand: element (d, j) of k^T is kT[d][j].
                const Tf32B fb = tf32_frag_b(kT + k0 * KS + n0, KS);
                if (tc == 2) {
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
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + g + (e >> 1) * 8, j = nb + 8 * t + 2 * cq + (e & 1);
                const float decay = j <= i ? expf(cum[i] - cum[j]) : 0.f;
                A[i * AS + j] = j < i ? ak[t][e] * beta[i] * decay : 0.f;
                rec[OFF_IT + j * CH + i] = aq[t][e] * decay;
            }
        }
    } else {
        // f32 FMA: 4x4 tiles, one per thread.
        const int ti = tid / 16, tj = tid % 16;
        const int i0 = ti * 4, j0 = tj * 4;
        float4 a[4], b[4];  // a[r]: row i0+r, columns j0..j0+3
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = b[r] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (tj <= ti) {
#pragma unroll 4
            for (int d = 0; d < DK; ++d) {
                const float4 qi = ld4(qT + d * KS + i0), ki = ld4(kT + d * KS + i0), kj = ld4(kT + d * KS + j0);
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    fma4(a[r], get(ki, r), kj);
                    fma4(b[r], get(qi, r), kj);
                }
            }
        }
        float it[4][4];  // intra^T tile: it[cc][r] = intra[i0+r][j0+cc]
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = i0 + r;
            float av[4];
#pragma unroll
            for (int cc = 0; cc < 4; ++cc) {
                const int j = j0 + cc;
                const float decay = j <= i ? expf(cum[i] - cum[j]) : 0.f;
                av[cc] = j < i ? get(a[r], cc) * beta[i] * decay : 0.f;
                it[cc][r] = get(b[r], cc) * decay;
            }
            st4(A + i * AS + j0, make_float4(av[0], av[1], av[2], av[3]));
        }
#pragma unroll
        for (int cc = 0; cc < 4; ++cc)
            st4(rec + OFF_IT + (j0 + cc) * CH + i0, make_float4(it[cc][0], it[cc][1], it[cc][2], it[cc][3]));
    }
    __syncthreads();

    // 3. Forward substitution (I + A) X = B, one column of B per thread:
    //    threads 0..127 the v columns (B = v * beta), 128..255 the k columns
    //    (B = k * beta * exp(cum)). Rows past L are zero in A and B.
    {
        float x[CH];
        const bool is_v = tid < DV;
        const int col = is_v ? tid : tid - DV;
        if (is_v) {
            const float* v = qkv + (size_t)t0 * conv_dim + 2 * hk * DK + h * DV + col;
#pragma unroll
            for (int i = 0; i < CH; ++i) x[i] = i < L ? v[(size_t)i * conv_dim] * beta[i] : 0.f;
        } else {
#pragma unroll
            for (int i = 0; i < CH; i += 4) {
                const float4 kv = ld4(kT + col * KS + i);
#pragma unroll
                for (int e = 0; e < 4; ++e) x[i + e] = get(kv, e) * beta[i + e] * ecum[i + e];
            }
        }
#pragma unroll
        for (int i = 1; i < CH; ++i) {
            const float* ai = A + i * AS;
#pragma unroll
            for (int j4 = 0; j4 < i; j4 += 4) {
                const float4 w = ld4(ai + j4);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (j4 + e < i) x[i] -= get(w, e) * x[j4 + e];
            }
        }
        if (is_v) {
#pragma unroll
            for (int i = 0; i < CH; ++i) rec[OFF_U + i * DV + col] = x[i];
        } else {
#pragma unroll
            for (int i = 0; i < CH; i += 4)
                st4(rec + OFF_WT + col * CH + i, make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]));
        }
    }

    // 4. The decayed q and k for the state pass, and the chunk's total decay.
    for (int idx = tid * 4; idx < DK * CH; idx += PREP_THREADS * 4) {
        const int d = idx / CH, i = idx % CH;
        const float4 q = ld4(qT + d * KS + i), k = ld4(kT + d * KS + i);
        st4(rec + OFF_QT + idx, make_float4(q.x * ecum[i], q.y * ecum[i + 1], q.z * ecum[i + 2], q.w * ecum[i + 3]));
        st4(rec + OFF_KT + idx,
            make_float4(k.x * etail[i], k.y * etail[i + 1], k.z * etail[i + 2], k.w * etail[i + 3]));
    }
    if (tid < 4) rec[OFF_DECAY + tid] = tid == 0 ? expf(cum[CH - 1]) : 0.f;
}

namespace {
constexpr int STATE_THREADS = 256;
constexpr int TC = 32;  // state columns per block

// ---- the f32 FMA state pass (tc == 0) ----
constexpr int SP = TC + 4;  // padded row of the S tile (conflict-free column reads)
constexpr int KP = CH + 4;  // padded row of k^T (conflict-free row reads)
// Shared floats: S [DK][SP], W^T, q^T [DK][CH], k^T [DK][KP], intra^T [CH][CH], V, PART [CH][TC].
constexpr int F32_SMEM_FLOATS = DK * SP + 2 * DK * CH + DK * KP + CH * CH + 2 * CH * TC;

// ---- the tensor-core state pass ----
// Padded rows: 8 (mod 32) words for the matrices read as k-major A operands
// and as B operands (fragment element (c, g) at c * stride + g: 32 banks),
// 4 (mod 32) for k^T, read as a row-major A operand (g * stride + c).
constexpr int TS = CH + 8;  // W^T, q^T [DK][TS], intra^T [CH][TS]
constexpr int SS = TC + 8;  // S [DK][SS], U and V [CH][SS]
constexpr int TK = CH + 4;  // k^T [DK][TK]
constexpr int TM_S = 0;
constexpr int TM_WT = TM_S + DK * SS;
constexpr int TM_QT = TM_WT + DK * TS;
constexpr int TM_KT = TM_QT + DK * TS;
constexpr int TM_IT = TM_KT + DK * TK;
constexpr int TM_U = TM_IT + CH * TS;
constexpr int TM_V = TM_U + CH * SS;
constexpr int TC_SMEM_FLOATS = TM_V + CH * SS;
// Dynamic shared memory of gdn_chunk_state: the larger of the two layouts
// (mirrored as STATE_SMEM_BYTES in ops/gdn.rs).
constexpr int STATE_SMEM_BYTES = 4 * (TC_SMEM_FLOATS > F32_SMEM_FLOATS ? TC_SMEM_FLOATS : F32_SMEM_FLOATS);
static_assert(STATE_SMEM_BYTES == 167936, "ops/gdn.rs assumes 164 KiB");
static_assert(TM_WT % 4 == 0 && TM_QT % 4 == 0 && TM_KT % 4 == 0 && TM_IT % 4 == 0 && TM_U % 4 == 0 &&
                  TM_V % 4 == 0 && TS % 4 == 0 && SS % 4 == 0 && TK % 4 == 0,
              "16-byte aligned rows for cp.async");

// The chunks of one (sequence, head, column tile) on tensor cores. Per chunk,
// two phases, each fed by its own cp.async group so that the next chunk's
// inputs stream in while this chunk computes:
//   phase 1 (W^T, q^T, U): V = U - W S and O = q S; warp w owns rows
//     16 (w / 2) .. +15 and columns 16 (w % 2) .. +15 of both;
//   phase 2 (k^T, intra^T): O += intra V, and S = decay S + k^T V, warp w
//     owning state rows 16 w .. +15 (all 32 columns), updated in place: no
//     other warp reads S in phase 2.
// Groups are committed in the order G1(c), G2(c), G1(c+1), G2(c+1), ...; G1(c+1)
// is issued once phase 1 of chunk c has consumed its buffers, G2(c+1) once
// phase 2 has, and every wait leaves exactly the newest group in flight.
template <int PASSES>
__device__ __forceinline__ void state_tc(float* __restrict__ core, const float* __restrict__ scratch,
                                         float* __restrict__ st, float* smem, int start, int n, int base,
                                         int col0, int h, int hv) {
    float* S = smem + TM_S;
    float* WT = smem + TM_WT;
    float* QT = smem + TM_QT;
    float* KT = smem + TM_KT;
    float* IT = smem + TM_IT;
    float* U = smem + TM_U;
    float* V = smem + TM_V;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, cq = lane & 3;
    const int chunks = (n + CH - 1) / CH;
    auto record = [&](int c) { return scratch + ((size_t)(base + c) * hv + h) * CHUNK_FLOATS; };
    auto load_g1 = [&](const float* rec) {
        for (int idx = tid * 4; idx < DK * CH; idx += STATE_THREADS * 4) {
            const int r = idx / CH, cc = idx % CH;
            cp16(WT + r * TS + cc, rec + OFF_WT + idx);
            cp16(QT + r * TS + cc, rec + OFF_QT + idx);
        }
        for (int idx = tid * 4; idx < CH * TC; idx += STATE_THREADS * 4) {
            const int i = idx / TC, cc = idx % TC;
            cp16(U + i * SS + cc, rec + OFF_U + i * DV + col0 + cc);
        }
    };
    auto load_g2 = [&](const float* rec) {
        for (int idx = tid * 4; idx < DK * CH; idx += STATE_THREADS * 4)
            cp16(KT + (idx / CH) * TK + idx % CH, rec + OFF_KT + idx);
        for (int idx = tid * 4; idx < CH * CH; idx += STATE_THREADS * 4)
            cp16(IT + (idx / CH) * TS + idx % CH, rec + OFF_IT + idx);
    };

    for (int idx = tid; idx < DK * TC / 4; idx += STATE_THREADS) {
        const int r = idx / (TC / 4), cc = (idx % (TC / 4)) * 4;
        st4(S + r * SS + cc, ld4(st + (size_t)r * DV + cc));
    }
    load_g1(record(0));
    cp_commit();
    load_g2(record(0));
    cp_commit();

    const int m0 = (warp >> 1) * 16, nb = (warp & 1) * 16;  // phase-1 / intra V tiles
    const int r0 = warp * 16;                                // phase-2 state rows
    for (int c = 0; c < chunks; ++c) {
        const float* rec = record(c);
        const bool more = c + 1 < chunks;
        const float decay = rec[OFF_DECAY];
        cp_wait_groups<1>();  // G1(c) has landed
        __syncthreads();      // ... for every thread; S of the previous chunk is written

        // Phase 1: V = U - W S, O = q S (element (i, k) of W and q is WT[k][i]).
        float av[2][4], ao[2][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) av[t][e] = ao[t][e] = 0.f;
#pragma unroll 2
        for (int k0 = 0; k0 < DK; k0 += 8) {
            const Tf32A fw = tf32_frag_a(WT + k0 * TS + m0, 1, TS);
            const Tf32A fq = tf32_frag_a(QT + k0 * TS + m0, 1, TS);
#pragma unroll
            for (int t = 0; t < 2; ++t) {
                const Tf32B fs = tf32_frag_b(S + k0 * SS + nb + 8 * t, SS);
                mma_tf32x<PASSES>(av[t], fw, fs);
                mma_tf32x<PASSES>(ao[t], fq, fs);
            }
        }
#pragma unroll
        for (int t = 0; t < 2; ++t) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const int off = (m0 + g + 8 * hr) * SS + nb + 8 * t + 2 * cq;
                const float2 u = ld2(U + off);
                st2(V + off, make_float2(u.x - av[t][2 * hr], u.y - av[t][2 * hr + 1]));
            }
        }
        __syncthreads();  // V is complete; W^T, q^T and U are free
        if (more) load_g1(record(c + 1));
        cp_commit();
        cp_wait_groups<1>();  // G2(c) has landed
        __syncthreads();

        // Phase 2a: O += intra V (element (i, j) of intra is IT[j][i]).
#pragma unroll 2
        for (int j0 = 0; j0 < CH; j0 += 8) {
            const Tf32A fa = tf32_frag_a(IT + j0 * TS + m0, 1, TS);
#pragma unroll
            for (int t = 0; t < 2; ++t) mma_tf32x<PASSES>(ao[t], fa, tf32_frag_b(V + j0 * SS + nb + 8 * t, SS));
        }
        // Phase 2b: S = decay S + k^T V for this warp's 16 state rows.
        float as[4][4];
#pragma unroll
        for (int t = 0; t < 4; ++t) {
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
                const float2 old = ld2(S + (r0 + g + 8 * hr) * SS + 8 * t + 2 * cq);
                as[t][2 * hr] = old.x * decay;
                as[t][2 * hr + 1] = old.y * decay;
            }
        }
#pragma unroll 2
        for (int j0 = 0; j0 < CH; j0 += 8) {
            const Tf32A fk = tf32_frag_a(KT + r0 * TK + j0, TK, 1);
#pragma unroll
            for (int t = 0; t < 4; ++t) mma_tf32x<PASSES>(as[t], fk, tf32_frag_b(V + j0 * SS + 8 * t, SS));
        }
#pragma unroll
        for (int t = 0; t < 4; ++t)
#pragma unroll
            for (int hr = 0; hr < 2; ++hr)
                st2(S + (r0 + g + 8 * hr) * SS + 8 * t + 2 * cq, make_float2(as[t][2 * hr], as[t][2 * hr + 1]));

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
        __syncthreads();  // k^T, intra^T and V are free
        if (more) load_g2(record(c + 1));
        cp_commit();
    }
    cp_wait();

    for (int idx = tid; idx < DK * TC / 4; idx += STATE_THREADS) {
        const int r = idx / (TC / 4), cc = (idx % (TC / 4)) * 4;
        st4(st + (size_t)r * DV + cc, ld4(S + r * SS + cc));
    }
}

// The same in f32 FMA.
__device__ __forceinline__ void state_f32(float* __restrict__ core, const float* __restrict__ scratch,
                                          float* __restrict__ st, float* smem, int start, int n, int base,
                                          int col0, int h, int hv) {
    float* S = smem;              // [DK][SP]
    float* WT = S + DK * SP;      // [DK][CH]
    float* QT = WT + DK * CH;     // [DK][CH]
    float* KT = QT + DK * CH;     // [DK][KP]
    float* IT = KT + DK * KP;     // [CH][CH]
    float* V = IT + CH * CH;      // [CH][TC]: U, then V in place
    float* PART = V + CH * TC;    // [CH][TC]: half sums of V and O
    __shared__ float chunk_decay;

    const int tid = threadIdx.x;
    const int chunks = (n + CH - 1) / CH;

    for (int idx = tid; idx < DK * TC / 4; idx += STATE_THREADS) {
        const int r = idx / (TC / 4), c = (idx % (TC / 4)) * 4;
        st4(S + r * SP + c, ld4(st + (size_t)r * DV + c));
    }

    // Thread tiles: V and O are [CH][TC], 4 rows x 4 columns per thread of
    // each half of the block; the state update is [DK][TC] with rows
    // kg + 32e (e < 4) x 4 columns.
    const int half = tid / 128, ti0 = (tid % 128 / 8) * 4, tc0 = (tid % 8) * 4;
    const int warp = tid / 32, lane = tid % 32;
    const int kg = lane % 8 + 8 * (warp % 4), sc0 = (lane / 8 + 4 * (warp / 4)) * 4;

    for (int c = 0; c < chunks; ++c) {
        const float* rec = scratch + ((size_t)(base + c) * hv + h) * CHUNK_FLOATS;
        for (int idx = tid * 4; idx < DK * CH; idx += STATE_THREADS * 4) {
            cp16(WT + idx, rec + OFF_WT + idx);
            cp16(QT + idx, rec + OFF_QT + idx);
            cp16(KT + (idx / CH) * KP + idx % CH, rec + OFF_KT + idx);
        }
        for (int idx = tid * 4; idx < CH * CH; idx += STATE_THREADS * 4) cp16(IT + idx, rec + OFF_IT + idx);
        for (int idx = tid * 4; idx < CH * TC; idx += STATE_THREADS * 4)
            cp16(V + idx, rec + OFF_U + (idx / TC) * DV + col0 + idx % TC);
        if (tid == 0) chunk_decay = rec[OFF_DECAY];
        cp_wait();
        __syncthreads();

        // V = U - W S. Each output is reduced over k in two halves by two
        // threads (k < 64 and k >= 64), added in that order by the first.
        {
            float4 acc[4] = {};
            const int k0 = half * (DK / 2);
#pragma unroll 8
            for (int k = k0; k < k0 + DK / 2; ++k) {
                const float4 w = ld4(WT + k * CH + ti0), sv = ld4(S + k * SP + tc0);
#pragma unroll
                for (int r = 0; r < 4; ++r) fma4(acc[r], get(w, r), sv);
            }
            if (half == 1) {
#pragma unroll
                for (int r = 0; r < 4; ++r) st4(PART + (ti0 + r) * TC + tc0, acc[r]);
            }
            __syncthreads();
            if (half == 0) {
#pragma unroll
                for (int r = 0; r < 4; ++r) {
                    const float4 p = ld4(PART + (ti0 + r) * TC + tc0);
                    float* u = V + (ti0 + r) * TC + tc0;
                    const float4 uv = ld4(u);
                    st4(u, make_float4(uv.x - (acc[r].x + p.x), uv.y - (acc[r].y + p.y), uv.z - (acc[r].z + p.z),
                                       uv.w - (acc[r].w + p.w)));
                }
            }
        }
        __syncthreads();

        // O = Q S + intra V: 192 reduction steps, split 96/96 between the
        // two threads of an output as above; the sum is written after the
        // state update below has been computed.
        float4 o[4] = {};
        {
            const int k0 = half == 0 ? 0 : 3 * DK / 4, k1 = half == 0 ? 3 * DK / 4 : DK;
#pragma unroll 8
            for (int k = k0; k < k1; ++k) {
                const float4 q = ld4(QT + k * CH + ti0), sv = ld4(S + k * SP + tc0);
#pragma unroll
                for (int r = 0; r < 4; ++r) fma4(o[r], get(q, r), sv);
            }
            if (half == 1) {
#pragma unroll 8
                for (int j = 0; j < CH; ++j) {
                    const float4 a = ld4(IT + j * CH + ti0), vv = ld4(V + j * TC + tc0);
#pragma unroll
                    for (int r = 0; r < 4; ++r) fma4(o[r], get(a, r), vv);
                }
#pragma unroll
                for (int r = 0; r < 4; ++r) st4(PART + (ti0 + r) * TC + tc0, o[r]);
            }
        }

        // S = decay S + K^T V (into registers; S is still read by O above).
        float4 nS[4];
        {
            const float decay = chunk_decay;
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float4 old = ld4(S + (kg + 32 * e) * SP + sc0);
                nS[e] = make_float4(old.x * decay, old.y * decay, old.z * decay, old.w * decay);
            }
#pragma unroll 2
            for (int j = 0; j < CH; j += 4) {
                float4 vv[4];
#pragma unroll
                for (int jj = 0; jj < 4; ++jj) vv[jj] = ld4(V + (j + jj) * TC + sc0);
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float4 kk = ld4(KT + (kg + 32 * e) * KP + j);
#pragma unroll
                    for (int jj = 0; jj < 4; ++jj) fma4(nS[e], get(kk, jj), vv[jj]);
                }
            }
        }
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 4; ++e) st4(S + (kg + 32 * e) * SP + sc0, nS[e]);
        if (half == 0) {
            const int L = min(CH, n - c * CH);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                if (ti0 + r < L) {
                    const float4 p = ld4(PART + (ti0 + r) * TC + tc0);
                    const size_t t = start + c * CH + ti0 + r;
                    st4(core + t * hv * DV + h * DV + col0 + tc0,
                        make_float4(o[r].x + p.x, o[r].y + p.y, o[r].z + p.z, o[r].w + p.w));
                }
            }
        }
        // The next chunk's copies overwrite WT..V, which were read above;
        // S is written before its next read behind the barrier after the copies.
        __syncthreads();
    }

    for (int idx = tid; idx < DK * TC / 4; idx += STATE_THREADS) {
        const int r = idx / (TC / 4), c = (idx % (TC / 4)) * 4;
        st4(st + (size_t)r * DV + c, ld4(S + r * SP + c));
    }
}
}  // namespace

// Per (column tile, value head, sequence): the chunks in order, carrying the
// tile S[DK][TC] of the state in shared memory. core is [T, Hv*Dv]. tc: 1 or
// 2, the products on tensor cores (state_tc, 3 or 1 passes), 0 in f32 FMA
// (state_f32).
// Grid (Dv/32, Hv, S), block 256, dynamic shared memory STATE_SMEM_BYTES (ops/gdn.rs).
KESTREL_EXTERN void __launch_bounds__(STATE_THREADS)
    gdn_chunk_state(float* __restrict__ core, const float* __restrict__ scratch, float* __restrict__ state,
                    const int* __restrict__ seq_start, const int* __restrict__ seq_slot, int hv, int tc) {
    pdl_begin();
    extern __shared__ float4 smem4[];
    float* smem = reinterpret_cast<float*>(smem4);
    const int col0 = blockIdx.x * TC, h = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    if (n == 0) return;
    const int base = chunk_base(seq_start, s);
    float* st = state + ((size_t)seq_slot[s] * hv + h) * DK * DV + col0;
    if (tc == 2) state_tc<1>(core, scratch, st, smem, start, n, base, col0, h, hv);
    else if (tc) state_tc<3>(core, scratch, st, smem, start, n, base, col0, h, hv);
    else state_f32(core, scratch, st, smem, start, n, base, col0, h, hv);
}

// Gated DeltaNet prefill in chunks of 64 tokens (the WY/UT form of the CPU
// reference's chunked.rs), Dk = Dv = 128, all in f32.
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
#include "gdn.cuh"

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
__device__ __forceinline__ float get(const float4& v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

// 16-byte asynchronous global -> shared copy (sm_80+), waited for with cp_wait.
__device__ __forceinline__ void cp16(float* smem_dst, const float* src) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

constexpr int PREP_THREADS = 256;

}  // namespace

// Per (chunk, value head, sequence): the state-independent part of the chunk.
// qkv is the conv output [T, conv_dim]; proj supplies b and a.
// Grid (max chunks of a sequence, Hv, S), block 256, dynamic shared memory
// PREP_SMEM_BYTES (ops/gdn.rs): q^T, k^T [DK][CH] and A [CH][CH].
KESTREL_EXTERN void __launch_bounds__(PREP_THREADS)
    gdn_chunk_prep(float* __restrict__ scratch, const float* __restrict__ qkv, const float* __restrict__ proj,
                   int proj_stride, int b_offset, int a_offset, const float* __restrict__ a_log,
                   const float* __restrict__ dt_bias, const int* __restrict__ seq_start, int hk, int hv,
                   float q_scale) { pdl_begin();
    extern __shared__ float4 smem4[];
    float* qT = reinterpret_cast<float*>(smem4);  // [DK][CH], normalised and scaled
    float* kT = qT + DK * CH;                     // [DK][CH], normalised
    float* A = kT + DK * CH;                      // [CH][CH]
    __shared__ float part[4][CH];
    __shared__ float cum[CH], ecum[CH], beta[CH], inv_norm[2][CH];

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
        float* dst = (which ? kT : qT) + half * (DK / 2) * CH + i;
        float ss = 0.f;
#pragma unroll 4
        for (int d = 0; d < DK / 2; d += 4) {
            const float4 v = i < L ? ld4(src + d) : make_float4(0.f, 0.f, 0.f, 0.f);
            dst[(d + 0) * CH] = v.x;
            dst[(d + 1) * CH] = v.y;
            dst[(d + 2) * CH] = v.z;
            dst[(d + 3) * CH] = v.w;
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
        float* dst = (which ? kT : qT) + half * (DK / 2) * CH + i;
        const float inv = inv_norm[which][i];
        for (int d = 0; d < DK / 2; ++d) dst[d * CH] = which ? dst[d * CH] * inv : dst[d * CH] * inv * q_scale;
        if (tid < CH) ecum[tid] = expf(cum[tid]);
    }
    __syncthreads();

    // 2. A (strictly lower) and intra (lower with diagonal): 4x4 tiles, one per thread.
    {
        const int ti = tid / 16, tj = tid % 16;
        const int i0 = ti * 4, j0 = tj * 4;
        float4 a[4], b[4];  // a[r]: row i0+r, columns j0..j0+3
#pragma unroll
        for (int r = 0; r < 4; ++r) a[r] = b[r] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (tj <= ti) {
#pragma unroll 4
            for (int d = 0; d < DK; ++d) {
                const float4 qi = ld4(qT + d * CH + i0), ki = ld4(kT + d * CH + i0), kj = ld4(kT + d * CH + j0);
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
            st4(A + i * CH + j0, make_float4(av[0], av[1], av[2], av[3]));
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
            for (int i = 0; i < CH; ++i) x[i] = kT[col * CH + i] * beta[i] * ecum[i];
        }
#pragma unroll
        for (int i = 1; i < CH; ++i) {
            const float* ai = A + i * CH;
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
    const float cum_last = cum[CH - 1];
    for (int idx = tid; idx < DK * CH; idx += PREP_THREADS) {
        const int i = idx % CH;
        rec[OFF_QT + idx] = qT[idx] * ecum[i];
        rec[OFF_KT + idx] = kT[idx] * expf(cum_last - cum[i]);
    }
    if (tid < 4) rec[OFF_DECAY + tid] = tid == 0 ? expf(cum_last) : 0.f;
}

namespace {
constexpr int STATE_THREADS = 256;
constexpr int TC = 32;       // state columns per block
constexpr int SP = TC + 4;   // padded row of the S tile (conflict-free column reads)
constexpr int KP = CH + 4;   // padded row of k^T (conflict-free row reads)
}  // namespace

// Per (column tile, value head, sequence): the chunks in order, carrying the
// tile S[DK][TC] of the state in shared memory. core is [T, Hv*Dv].
// Grid (Dv/32, Hv, S), block 256, dynamic shared memory STATE_SMEM_BYTES (ops/gdn.rs).
KESTREL_EXTERN void __launch_bounds__(STATE_THREADS)
    gdn_chunk_state(float* __restrict__ core, const float* __restrict__ scratch, float* __restrict__ state,
                    const int* __restrict__ seq_start, const int* __restrict__ seq_slot, int hv) { pdl_begin();
    extern __shared__ float4 smem4[];
    float* S = reinterpret_cast<float*>(smem4);  // [DK][SP]
    float* WT = S + DK * SP;                     // [DK][CH]
    float* QT = WT + DK * CH;                    // [DK][CH]
    float* KT = QT + DK * CH;                    // [DK][KP]
    float* IT = KT + DK * KP;                    // [CH][CH]
    float* V = IT + CH * CH;                     // [CH][TC]: U, then V in place
    float* PART = V + CH * TC;                   // [CH][TC]: half sums of V and O
    __shared__ float chunk_decay;

    const int col0 = blockIdx.x * TC, h = blockIdx.y, s = blockIdx.z;
    const int start = seq_start[s], n = seq_start[s + 1] - start;
    if (n == 0) return;
    const int tid = threadIdx.x;
    const int chunks = (n + CH - 1) / CH;
    const int base = chunk_base(seq_start, s);
    float* st = state + ((size_t)seq_slot[s] * hv + h) * DK * DV + col0;

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

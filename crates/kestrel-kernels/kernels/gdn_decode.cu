// Gated DeltaNet decode: one kernel per layer for steps where every sequence
// has a few new tokens (one in a decode step, up to 1 + drafts in a verify
// step), taken one after another with the state kept in registers. It does the conv update, SiLU, q/k L2 norm,
// decay and beta, the delta-rule state update, the output and the gated
// RMSNorm. Dk = Dv = 128.
//
// A cluster of 8 blocks serves one (sequence, key head): the GROUP = Hv/Hk
// value heads that share the key head, each split into 8/GROUP column tiles of
// the state. The cluster is what makes the fusion possible:
// - every block needs the conv outputs of the shared q/k channels, so each
//   computes them from the old conv state, and the new state is written only
//   after a cluster barrier (no block can then still read the old one), by
//   one block per channel;
// - the gated RMSNorm needs the sum of squares over all Dv columns of a head:
//   each block of the head stores its part into every block of the head
//   (st.async), which waits on its own barrier for the parts to land. In a
//   verify step no barrier over the cluster stands between tokens, so a
//   token's output and checkpoint stores are never waited for.
// Each thread keeps RPT rows x 4 columns of the f32 state in registers, read
// and written as float4 (coalesced 16-byte accesses), loaded before anything
// else so that the state's HBM latency overlaps the conv. Reductions run in a
// fixed order (shuffles, then warps in order): results are deterministic.
#include <cooperative_groups.h>

#include "gdn.cuh"
#include "kestrel_abi.h"
#include "mbarrier.cuh"

namespace cg = cooperative_groups;

namespace {

constexpr int DK = GDN_HEAD_DIM;
constexpr int DV = GDN_HEAD_DIM;
constexpr int THREADS = 128;
constexpr int NWARPS = THREADS / 32;
constexpr int CLUSTER = 8;

// The conv kernel size of the Qwen3.5/3.6/Next models; fixing it keeps the
// conv straight-line code (other sizes take the general kernels).
constexpr int KSIZE = GDN_DECODE_CONV_KERNEL;
constexpr int HIST = KSIZE - 1;

// One channel's conv inputs: the carried inputs (oldest first), the new one,
// and the weights.
struct Taps {
    float prev[HIST];
    float x;
    float w[KSIZE];
};

__device__ __forceinline__ Taps load_taps(const float* st, const __nv_bfloat16* conv_w, int c, float x) {
    Taps tp;
#pragma unroll
    for (int j = 0; j < HIST; ++j) tp.prev[j] = st[j];
    tp.x = x;
    // Four bf16 weights in one 8-byte load.
    const uint2 raw = *reinterpret_cast<const uint2*>(conv_w + (size_t)c * KSIZE);
    const __nv_bfloat162 w01 = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 w23 = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    tp.w[0] = __low2float(w01);
    tp.w[1] = __high2float(w01);
    tp.w[2] = __low2float(w23);
    tp.w[3] = __high2float(w23);
    return tp;
}

// Copies 4 bytes from global to shared memory without passing registers.
__device__ __forceinline__ void cp_async_4(void* dst, const float* src) {
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}

// silu of the conv, summed oldest input first as the CPU reference does.
__device__ __forceinline__ float conv_silu(const Taps& tp) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < HIST; ++j) acc += tp.w[j] * tp.prev[j];
    acc += tp.w[HIST] * tp.x;
    return siluf_exact(acc);
}

// The carried inputs after this token: [prev[1..], x].
__device__ __forceinline__ void next_state(float (&dst)[HIST], const Taps& tp) {
#pragma unroll
    for (int j = 0; j + 1 < HIST; ++j) dst[j] = tp.prev[j + 1];
    dst[HIST - 1] = tp.x;
}


template <int GROUP>
__device__ __forceinline__ void decode(const GdnDecodeArgs& a) {
    constexpr int TILES = CLUSTER / GROUP;  // column tiles per value head
    constexpr int COLS = DV / TILES;        // columns per block
    constexpr int TPR = COLS / 4;           // threads per state row (float4 each)
    constexpr int RPP = THREADS / TPR;      // rows per pass of the block
    constexpr int RPT = DK / RPP;           // rows per thread
    static_assert(TPR <= 32 && 32 % TPR == 0 && DK % RPP == 0, "tile shape");

    __shared__ float qs[DK], ks[DK], vs[COLS];
    // Per-warp column sums of S^T k and of S'^T q: two buffers, so that
    // neither needs a barrier after it is read (the next writes of each come
    // past the barriers of the other stages).
    __shared__ float red_kv[NWARPS][COLS], red_o[NWARPS][COLS];
    __shared__ float scratch[2][NWARPS];
    __shared__ float gate[2];
    // The head's sum of squares, by token parity: this block's warps' parts,
    // and the parts of the head's blocks, stored here by them, with the
    // barrier that counts their bytes. A buffer is written again two tokens
    // on, which no block reaches before every block of the head has sent its
    // part of the token in between (each sends after reading this token's).
    __shared__ float ss_part[2][NWARPS];
    __shared__ float ss_in[2][TILES];
    __shared__ __align__(8) uint64_t ss_bar[2];
    // The channels' carried conv inputs after the latest token, held until the
    // cluster barrier allows writing them (in shared memory rather than
    // registers, for occupancy). Each thread only touches its own channels.
    __shared__ float next_q[DK][HIST], next_k[DK][HIST], next_v[COLS][HIST];
    __shared__ float tok_in[2][4][THREADS];
    __shared__ float tok_gates[2][2];

    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank();
    const int kh = blockIdx.y, s = blockIdx.z;
    const int h = kh * GROUP + rank / TILES;
    const int col0 = (rank % TILES) * COLS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // (All three loads issued together: they head the kernel's latency chain.)
    const int t_first = a.seq_start[s], t_end = a.seq_start[s + 1], slot = a.seq_slot[s];
    // A sequence without a new token keeps its state; the whole cluster leaves.
    if (t_end == t_first) return;
    const int key_dim = a.hk * DK;
    const int conv_dim = 2 * key_dim + a.hv * DV;

    // 1. Start the state loads: rows rp + i*RPP, columns col0 + c4*4 ..+4.
    const int c4 = tid % TPR, rp = tid / TPR;
    auto state_tile = [&](int at) {
        return reinterpret_cast<float4*>(a.state + ((size_t)at * a.hv + h) * DK * DV + col0) + c4;
    };
    float4* st = state_tile(slot);
    float4 S[RPT];
#pragma unroll
    for (int i = 0; i < RPT; ++i) S[i] = st[(size_t)(rp + i * RPP) * (DV / 4)];
    if (tid == 0) {
        mbar_init1(&ss_bar[0]);
        mbar_init1(&ss_bar[1]);
        mbar_init_fence();
    }

    const int cq = kh * DK + tid, ck = key_dim + kh * DK + tid;
    const int cv = 2 * key_dim + h * DV + col0 + tid;
    auto conv_at = [&](int at, int c) { return a.conv_state + ((size_t)at * conv_dim + c) * HIST; };
    // The carried conv inputs and the state after a token are stored in the
    // live slot after the last token, and in a verify step's checkpoint slot
    // after each token that has one: q/k channel tid by one block per
    // channel, this tile's v channels by this block.
    auto store = [&](int at) {
        float4* dst = state_tile(at);
#pragma unroll
        for (int i = 0; i < RPT; ++i) dst[(size_t)(rp + i * RPP) * (DV / 4)] = S[i];
        float *dq = conv_at(at, cq), *dk = conv_at(at, ck), *dv = conv_at(at, cv);
#pragma unroll
        for (int j = 0; j < HIST; ++j) {
            if (tid / (DK / CLUSTER) == rank) {
                dq[j] = next_q[tid][j];
                dk[j] = next_k[tid][j];
            }
            if (tid < COLS) dv[j] = next_v[tid][j];
        }
    };

    // A token's inputs from its projection row (each thread's conv inputs,
    // z, and thread 0's decay and beta inputs), staged in shared memory by
    // token parity. Those of the next token are copied while this one is
    // computed: in a verify step the tokens form one chain, and a load at the
    // head of each link would lengthen it by a memory round trip per token.
    auto fetch_token = [&](int t, int buf) {
        const float* x = a.proj + (size_t)t * a.proj_stride;
        cp_async_4(&tok_in[buf][0][tid], x + cq);
        cp_async_4(&tok_in[buf][1][tid], x + ck);
        if (tid < COLS) {
            cp_async_4(&tok_in[buf][2][tid], x + cv);
            cp_async_4(&tok_in[buf][3][tid], x + conv_dim + h * DV + col0 + tid);
        }
        if (tid == 0) {
            cp_async_4(&tok_gates[buf][0], x + conv_dim + a.hv * DV + a.hv + h);
            cp_async_4(&tok_gates[buf][1], x + conv_dim + a.hv * DV + h);
        }
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    fetch_token(t_first, 0);

    // Tokens in order, each with the arithmetic of a one-token step: a verify
    // chunk's rows come out as consecutive decode steps would give them.
    for (int t = t_first; t < t_end; ++t) {
        // 2. Conv of q and k channel `tid` of key head kh, and of this tile's
        //    v channels, the carried inputs read from the slot for the first
        //    token and from shared memory after it.
        const bool first = t == t_first;
        const int par = (t - t_first) & 1;
        // Arms this token's buffer (its previous use, two tokens back, is
        // complete: thread 0 waited for it).
        if (tid == 0) mbar_expect(&ss_bar[par], TILES * sizeof(float));
        // Start the next token's copy (an empty group after the last), then
        // wait for this token's: each thread reads only what it copied.
        if (t + 1 < t_end) {
            fetch_token(t + 1, par ^ 1);
        } else {
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        Taps tq = load_taps(first ? conv_at(slot, cq) : next_q[tid], a.conv_w, cq, tok_in[par][0][tid]);
        Taps tk = load_taps(first ? conv_at(slot, ck) : next_k[tid], a.conv_w, ck, tok_in[par][1][tid]), tv{};
        float z = 0.f;
        if (tid < COLS) {
            tv = load_taps(first ? conv_at(slot, cv) : next_v[tid], a.conv_w, cv, tok_in[par][2][tid]);
            z = tok_in[par][3][tid];
        }
        float ga = 0.f, gb = 0.f, al = 0.f, dt = 0.f;
        if (tid == 0) {
            ga = tok_gates[par][0];
            gb = tok_gates[par][1];
            al = a.a_log[h];
            dt = a.dt_bias[h];
        }
        const float q = conv_silu(tq), k = conv_silu(tk);
        next_state(next_q[tid], tq);
        next_state(next_k[tid], tk);
        if (tid < COLS) {
            vs[tid] = conv_silu(tv);
            next_state(next_v[tid], tv);
        }
        if (tid == 0) {
            gate[0] = expf(gdn_log_decay(ga, al, dt));
            gate[1] = sigmoidf_exact(gb);
        }
        // Past the cluster barrier this arrival opens (waited for before the
        // first part is sent), every block has read the old conv state and
        // initialised its barriers. Only the last store writes the live
        // slot's conv state, and the only other cluster barrier is the
        // kernel's last: none stands between two tokens.
        if (first) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

        // 3. L2 norms of q and k over the head (both sums in one block reduction).
        {
            const float qq = warp_sum(q * q), kk = warp_sum(k * k);
            if (lane == 0) {
                scratch[0][warp] = qq;
                scratch[1][warp] = kk;
            }
            __syncthreads();
            float sq = 0.f, sk = 0.f;
#pragma unroll
            for (int w = 0; w < NWARPS; ++w) {
                sq += scratch[0][w];
                sk += scratch[1][w];
            }
            qs[tid] = q * gdn_l2_inv(sq) * a.q_scale;
            ks[tid] = k * gdn_l2_inv(sk);
        }

        __syncthreads();

        // 4. Delta rule on the tile: kv = S^T k; d = (v - decay*kv) * beta;
        //    S' = decay*S + k d^T; o = S'^T q.
        const float decay = gate[0], beta = gate[1];
        // Each warp's sums of a float4 per column group over its rows (lanes
        // of one column group differ by multiples of TPR), into red[warp].
        auto warp_column_sums = [&](float4 v, float (*red)[COLS]) {
#pragma unroll
            for (int o = TPR; o < 32; o <<= 1) {
                v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
                v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
                v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
                v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
            }
            if (lane < TPR) *reinterpret_cast<float4*>(&red[warp][lane * 4]) = v;
        };

        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const float kr = ks[rp + i * RPP];
            acc.x += S[i].x * kr;
            acc.y += S[i].y * kr;
            acc.z += S[i].z * kr;
            acc.w += S[i].w * kr;
        }
        // Every thread takes its column group's totals, warps in order.
        warp_column_sums(acc, red_kv);
        __syncthreads();
        float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int w = 0; w < NWARPS; ++w) {
            const float4 p = *reinterpret_cast<const float4*>(&red_kv[w][c4 * 4]);
            kv.x += p.x;
            kv.y += p.y;
            kv.z += p.z;
            kv.w += p.w;
        }
        const float4 v4 = *reinterpret_cast<const float4*>(&vs[c4 * 4]);
        const float4 d = make_float4((v4.x - decay * kv.x) * beta, (v4.y - decay * kv.y) * beta,
                                     (v4.z - decay * kv.z) * beta, (v4.w - decay * kv.w) * beta);
        acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int i = 0; i < RPT; ++i) {
            const float kr = ks[rp + i * RPP], qr = qs[rp + i * RPP];
            float4 n;
            n.x = S[i].x * decay + kr * d.x;
            n.y = S[i].y * decay + kr * d.y;
            n.z = S[i].z * decay + kr * d.z;
            n.w = S[i].w * decay + kr * d.w;
            S[i] = n;
            acc.x += n.x * qr;
            acc.y += n.y * qr;
            acc.z += n.z * qr;
            acc.w += n.w * qr;
        }
        // Thread tid < COLS takes column tid's total, warps in order.
        warp_column_sums(acc, red_o);
        __syncthreads();
        float o = 0.f;
        if (tid < COLS) {
#pragma unroll
            for (int w = 0; w < NWARPS; ++w) o += red_o[w][tid];
        }

        // 5. Gated RMSNorm over the head's Dv columns, spread over TILES
        //    blocks: thread j < TILES sends this block's part to the head's
        //    block j.
        const int first_block = (rank / TILES) * TILES;
        {
            const float ss = warp_sum(o * o);
            if (lane == 0) ss_part[par][warp] = ss;
            __syncthreads();
            if (first) asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
            if (tid < TILES) {
                float sum = 0.f;
#pragma unroll
                for (int w = 0; w < NWARPS; ++w) sum += ss_part[par][w];
                st_async_f32(&ss_in[par][rank % TILES], &ss_bar[par], first_block + tid, sum);
            }
        }

        // 6. The output, once the head's parts are in (parts summed in block
        //    order).
        if (tid < COLS) {
            mbar_wait_parity(&ss_bar[par], ((t - t_first) >> 1) & 1);
            float total = 0.f;
#pragma unroll
            for (int j = 0; j < TILES; ++j) total += ss_in[par][j];
            const float inv = 1.f / sqrtf(total / DV + a.eps);
            const int col = col0 + tid;
            a.out[(size_t)t * a.hv * DV + h * DV + col] =
                a.norm_w[col] * (o * inv) * (a.sigmoid_gate ? sigmoidf_exact(z) : siluf_exact(z));
        }
        const int ckpt = a.token_ckpt[t];
        if (ckpt >= 0) store(ckpt);
    }
    // No block leaves while a part it sent may still be on its way. The
    // arrive is relaxed (it does not wait for this block's stores); the wait
    // comes after the last stores are issued.
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    store(slot);
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

}  // namespace

// Grid (8, Hk, S), cluster (8, 1, 1), block 128; Dk = Dv = 128, Hv = GROUP * Hk,
// conv kernel 4.
// MIN_BLOCKS per SM caps registers: as many blocks as the state tile allows
// without spilling, since resident blocks are what keep HBM busy at large batches.
#define GDN_DECODE(GROUP, MIN_BLOCKS)                                                                 \
    KESTREL_EXTERN void __cluster_dims__(CLUSTER, 1, 1) __launch_bounds__(THREADS, MIN_BLOCKS)         \
        gdn_decode_g##GROUP(const __grid_constant__ GdnDecodeArgs a) {                                     \
        pdl_begin();                                                                                   \
        decode<GROUP>(a);                                                                              \
    }

GDN_DECODE(1, 8)
GDN_DECODE(2, 6)
GDN_DECODE(4, 4)

// Mixture-of-experts pieces. Exact math: the router decides which experts
// run, so it must agree with the reference.
//
// Two paths. Prefill (many tokens): f32 router logits, softmax + top-k, and
// the row gathers/scatters around per-expert cuBLAS products, routed on the
// host. Decode (1..8 tokens): routing stays on the device (inside
// moe_gate_up) and the experts run as streaming dot products (gemv.cuh) that
// read the selected experts' weights by id, so the whole block is a fixed
// sequence of launches.
#include "gemv.cuh"
#include "kestrel_abi.h"

// logits[t, e] = x[t, :] . w[e, :] with f32 accumulation (bf16 weights).
// One warp per (t, e): grid ceil(T*E / 8), block 256.
KESTREL_EXTERN void router_logits(float* __restrict__ logits, const float* __restrict__ x,
                                  const __nv_bfloat16* __restrict__ w, int tokens, int experts, int hidden) { pdl_begin();
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= tokens * experts) return;
    const int t = warp / experts, e = warp % experts;
    const float* xr = x + (size_t)t * hidden;
    const __nv_bfloat16* wr = w + (size_t)e * hidden;
    float acc = 0.f;
    for (int i = lane; i < hidden; i += 32) acc += xr[i] * bf16_to_f32(wr[i]);
    acc = warp_sum(acc);
    if (lane == 0) logits[warp] = acc;
}

// Softmax over E logits, then the k largest probabilities (lowest index wins
// ties), optionally renormalised to sum to one. One thread per token.
KESTREL_EXTERN void router_topk(int* __restrict__ ids, float* __restrict__ weights, const float* __restrict__ logits,
                                int tokens, int experts, int k, int renormalize) { pdl_begin();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* l = logits + (size_t)t * experts;
    float mx = -INFINITY;
    for (int e = 0; e < experts; ++e) mx = fmaxf(mx, l[e]);
    float sum = 0.f;
    for (int e = 0; e < experts; ++e) sum += expf(l[e] - mx);
    float chosen_sum = 0.f;
    int prev = -1;
    float prev_val = INFINITY;
    for (int j = 0; j < k; ++j) {
        // next largest strictly after (prev_val, prev) in (value desc, index asc) order
        int best = -1;
        float best_val = -INFINITY;
        for (int e = 0; e < experts; ++e) {
            const float v = l[e];
            const bool after_prev = v < prev_val || (v == prev_val && e > prev);
            if (after_prev && (best < 0 || v > best_val)) {
                best = e;
                best_val = v;
            }
        }
        const float p = expf(best_val - mx) / sum;
        ids[t * k + j] = best;
        weights[t * k + j] = p;
        chosen_sum += p;
        prev = best;
        prev_val = best_val;
    }
    if (renormalize)
        for (int j = 0; j < k; ++j) weights[t * k + j] /= chosen_sum;
}

// out[i, :] = bf16(x[rows[i], :]). Grid (ceil(cols/256), n).
KESTREL_EXTERN void gather_rows_to_bf16(__nv_bfloat16* __restrict__ out, const float* __restrict__ x,
                                        const int* __restrict__ rows, int cols) { pdl_begin();
    const int i = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)i * cols + c] = f32_to_bf16(x[(size_t)rows[i] * cols + c]);
}

// out[i, j] = bf16(silu(gu[i, j]) * gu[i, inter + j]). Grid (ceil(inter/256), n).
KESTREL_EXTERN void swiglu_to_bf16(__nv_bfloat16* __restrict__ out, const float* __restrict__ gu, int inter) { pdl_begin();
    const int i = blockIdx.y;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= inter) return;
    const float* row = gu + (size_t)i * 2 * inter;
    out[(size_t)i * inter + j] = f32_to_bf16(siluf_exact(row[j]) * row[inter + j]);
}

// out[rows[i], :] += weights[i] * y[i, :]. Rows must be distinct within one
// launch (each token appears once per expert). Grid (ceil(cols/256), n).
KESTREL_EXTERN void scatter_add_weighted(float* __restrict__ out, const float* __restrict__ y,
                                         const int* __restrict__ rows, const float* __restrict__ weights, int cols) { pdl_begin();
    const int i = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    out[(size_t)rows[i] * cols + c] += weights[i] * y[(size_t)i * cols + c];
}

// out[t, :] += sigmoid(gate[t]) * y[t, :] (gate == nullptr: plain add).
// Grid (ceil(cols/256), T).
KESTREL_EXTERN void add_gated_rows(float* __restrict__ out, const float* __restrict__ y,
                                   const float* __restrict__ gate, int cols) { pdl_begin();
    const int t = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    const float g = gate ? sigmoidf_exact(gate[t]) : 1.f;
    out[(size_t)t * cols + c] += g * y[(size_t)t * cols + c];
}

// ---- top-k, and the decode path (1..8 tokens) -----------------------------

// Largest expert count the decode top-k takes (one thread per expert).
#define MOE_MAX_EXPERTS 512

// Softmax over the E logits of one token, the k largest probabilities (lowest
// index wins ties), optional renormalisation (summed in selection order, as
// the reference does), and the k picks written in ascending expert id so that
// the combine adds them in the reference's order. Logit rows are `ld` apart
// (the router may append the shared-expert gate as column E).
//
// Each expert's rank (how many experts come before it) is counted against all
// others at once rather than in k sequential arg-max rounds: one warp doing k
// rounds of shuffles took about three times as long as this with its launch,
// a latency the whole decode step waits for. Splitting the count over more
// threads per expert measured slower. A NaN probability sorts below every
// number, so the ranks stay a permutation.
// Decode at 3..8 tokens launches this and a prefill moe_topk_warps (below, the
// same numbers); at 1..2 tokens moe_gate_up computes them itself (moe_route
// below): a change here must be made in both.
// Grid T, block 32 * ceil(E / 32); E <= 512, k <= 32.
KESTREL_EXTERN void __launch_bounds__(MOE_MAX_EXPERTS)
    moe_topk(int* __restrict__ ids, float* __restrict__ weights, const float* __restrict__ logits, int ld,
             int experts, int top_k, int renormalize) { pdl_begin();
    __shared__ float key[MOE_MAX_EXPERTS];  // order key per expert; padding sorts last
    __shared__ float by_rank[32];           // picked probabilities, best first
    __shared__ int picks_before[MOE_MAX_EXPERTS / 32];
    __shared__ float scratch[32];
    __shared__ float total;
    const int t = blockIdx.x, e = threadIdx.x, lane = e & 31, warp = e >> 5;
    const bool valid = e < experts;
    const float l = valid ? logits[(size_t)t * ld + e] : -INFINITY;
    const float mx = block_max(l, scratch);
    const float ex = valid ? expf(l - mx) : 0.f;
    const float p = ex / block_sum(ex, scratch);
    const float mine = valid ? (isnan(p) ? -1.f : p) : -2.f;
    key[e] = mine;
    __syncthreads();

    // rank = #{o : key[o] > mine, or equal and o < e}; past k the exact value
    // does not matter, so a thread stops counting there.
    int rank = 0;
    for (int o0 = 0; o0 < (int)blockDim.x && rank < top_k; o0 += 32) {
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const float other = key[o0 + j];
            rank += (other > mine) || (other == mine && o0 + j < e);
        }
    }
    const bool picked = valid && rank < top_k;
    if (picked) by_rank[rank] = p;
    // Position among the picks by ascending id: picks in earlier warps, then
    // picks in earlier lanes of this warp.
    const unsigned ballot = __ballot_sync(0xffffffffu, picked);
    if (lane == 0) picks_before[warp] = __popc(ballot);
    __syncthreads();
    if (e == 0) {
        float sum = 0.f;
        for (int r = 0; r < top_k; ++r) sum += by_rank[r];
        total = sum;
        int run = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
            const int n = picks_before[w];
            picks_before[w] = run;
            run += n;
        }
    }
    __syncthreads();
    if (picked) {
        const int pos = picks_before[warp] + __popc(ballot & ((1u << lane) - 1u));
        ids[t * top_k + pos] = e;
        weights[t * top_k + pos] = renormalize ? p / total : p;
    }
}

// moe_topk for many tokens (a prefill): one warp per token instead of one
// block, the same numbers bit for bit. Lane l holds experts l, l + 32, ...:
// slot g of every lane is warp g of moe_topk's block, and each slot's max and
// sum use the same shuffle tree over the same lanes, combined the way
// block_max / block_sum combine per-warp values (lanes < groups, padding
// -inf / 0), so mx, the sum and every probability are moe_topk's bits. The k
// picks are then taken one at a time (largest key, lowest id on ties:
// moe_topk's order), summed in that order, and sorted by id. One warp's k
// serial rounds take longer than moe_topk's block (a decode step was slower
// with it in moe_gate_up), which is why decode keeps the block; but 8,192
// tokens' warps all fit on the GPU at once, where moe_topk's 8,192 blocks ran
// in eight waves of barrier-bound blocks.
//
// SLOTS (4, 8 or 16, at least ceil(E / 32)) bounds the unrolled loops over a
// lane's experts: every slot's predicated instructions are issued, and an
// 8K-token prefill's warps are bound by that issue. Sized to the experts, the
// kernel takes about half the time at 256 and 128 experts. Slots past the groups take no part, so every SLOTS
// gives the same bits.
constexpr int ROUTE_WARP_SLOTS = MOE_MAX_EXPERTS / 32;

template <int SLOTS>
__device__ __forceinline__ void moe_route_warp(const float* __restrict__ l, int experts, int top_k,
                                               int renormalize, int& pick_id, float& pick_w) {
    static_assert(SLOTS <= ROUTE_WARP_SLOTS && SLOTS <= 32, "one taken bit per slot");
    const int lane = threadIdx.x & 31;
    const int groups = (experts + 31) >> 5;
    float key[SLOTS], p[SLOTS];
    float mine_max = -INFINITY;
#pragma unroll
    for (int g = 0; g < SLOTS; ++g) {
        const int e = g * 32 + lane;
        p[g] = g < groups && e < experts ? l[e] : -INFINITY;
    }
#pragma unroll
    for (int g = 0; g < SLOTS; ++g)
        if (g < groups) {
            const float m = warp_max(p[g]);
            if (lane == g) mine_max = m;
        }
    const float mx = warp_max(lane < groups ? mine_max : -INFINITY);
    float mine_sum = 0.f;
#pragma unroll
    for (int g = 0; g < SLOTS; ++g)
        if (g < groups) {
            const int e = g * 32 + lane;
            p[g] = e < experts ? expf(p[g] - mx) : 0.f;
            const float s = warp_sum(p[g]);
            if (lane == g) mine_sum = s;
        }
    const float sum = warp_sum(lane < groups ? mine_sum : 0.f);
#pragma unroll
    for (int g = 0; g < SLOTS; ++g) {
        const int e = g * 32 + lane;
        p[g] = p[g] / sum;
        // Padding past the experts sorts last; slots past the groups never compete.
        key[g] = g >= groups ? -INFINITY : e < experts ? (isnan(p[g]) ? -1.f : p[g]) : -2.f;
    }
    float total = 0.f;
    pick_id = -1;
    pick_w = 0.f;
    // Slots already picked, one bit each: key[] itself stays read-only, which
    // keeps it in registers (marking picks in it put it in local memory).
    unsigned taken = 0;
    for (int r = 0; r < top_k; ++r) {
        // This lane's best (slots in ascending id order: strict > keeps the lowest id).
        float best = -INFINITY, best_p = 0.f;
        int best_id = 0x7fffffff;
#pragma unroll
        for (int g = 0; g < SLOTS; ++g)
            if (!((taken >> g) & 1u) && key[g] > best) {
                best = key[g];
                best_p = p[g];
                best_id = g * 32 + lane;
            }
        // The warp's best: larger key, then lower id.
        float wk = best;
        int wid = best_id;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ok = __shfl_xor_sync(0xffffffffu, wk, o);
            const int oid = __shfl_xor_sync(0xffffffffu, wid, o);
            if (ok > wk || (ok == wk && oid < wid)) {
                wk = ok;
                wid = oid;
            }
        }
        const float wp = __shfl_sync(0xffffffffu, best_p, wid & 31);
        total += wp;
        if (lane == (wid & 31)) taken |= 1u << (wid >> 5);
        if (lane == r) {
            pick_id = wid;
            pick_w = wp;
        }
    }
    // Position among the picks by ascending id.
    int pos = 0;
    for (int r = 0; r < top_k; ++r) pos += __shfl_sync(0xffffffffu, pick_id, r) < pick_id;
    // Scatter (id, weight) to lane pos through shuffles: lane i takes the pick
    // whose position is i.
    int out_id = -1;
    float out_w = 0.f;
    for (int r = 0; r < top_k; ++r) {
        const int pr = __shfl_sync(0xffffffffu, pos, r);
        const int ir = __shfl_sync(0xffffffffu, pick_id, r);
        const float wr = __shfl_sync(0xffffffffu, pick_w, r);
        if (lane == pr) {
            out_id = ir;
            out_w = renormalize ? wr / total : wr;
        }
    }
    pick_id = lane < top_k ? out_id : -1;
    pick_w = lane < top_k ? out_w : 0.f;
}

// Grid ceil(T / 8), block 256; E <= 512, k <= 32.
KESTREL_EXTERN void moe_topk_warps(int* __restrict__ ids, float* __restrict__ weights,
                                   const float* __restrict__ logits, int ld, int tokens, int experts, int top_k,
                                   int renormalize) { pdl_begin();
    const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= tokens) return;
    int id;
    float w;
    const float* l = logits + (size_t)t * ld;
    const int groups = (experts + 31) >> 5;  // block-uniform
    if (groups <= 4) moe_route_warp<4>(l, experts, top_k, renormalize, id, w);
    else if (groups <= 8) moe_route_warp<8>(l, experts, top_k, renormalize, id, w);
    else moe_route_warp<ROUTE_WARP_SLOTS>(l, experts, top_k, renormalize, id, w);
    if (lane < top_k) {
        ids[(size_t)t * top_k + lane] = id;
        weights[(size_t)t * top_k + lane] = w;
    }
}

// Most warps (items) of a decode block; moe_gate_up / moe_down launch bounds.
#define MOE_MAX_ITEMS 16

// One token's routing, computed by a whole block in shared memory: the same
// numbers as moe_topk, so that the decode path need not launch it (a launch
// on the critical path of every MoE layer, where the arithmetic itself is a small part of that). Experts are taken in groups of 32, group g standing for
// warp g of moe_topk's block: each group's max and sum use the same shuffle
// tree over the same lanes, and the group partials are combined the way
// block_max / block_sum combine per-warp values (lanes < groups, padding
// -inf / 0), so mx, the sum and every probability are bit-identical to
// moe_topk's. A block may have fewer warps than groups: warps loop.
struct MoeRoute {
    float val[MOE_MAX_EXPERTS];  // logits, then exp(l - mx), then probabilities
    float key[MOE_MAX_EXPERTS];  // order key per expert, as moe_topk's
    float part_max[MOE_MAX_EXPERTS / 32];
    float part_sum[MOE_MAX_EXPERTS / 32];
    unsigned picked[MOE_MAX_EXPERTS / 32];  // per group: ballot of its picks
    float by_rank[MOE_MAX_ITEMS];           // picked probabilities, best first
    int id[MOE_MAX_ITEMS];                  // picks in ascending expert id
    float p[MOE_MAX_ITEMS];                 // their probabilities (not renormalised)
};

// Fills r.id / r.p (top_k <= MOE_MAX_ITEMS entries) and r.by_rank from the E
// logits at l. Every thread of the block must call it; it ends with a
// barrier, so the results are visible to all on return.
__device__ __forceinline__ void moe_route(MoeRoute& r, const float* __restrict__ l, int experts, int top_k) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    const int groups = (experts + 31) >> 5;
    for (int g = warp; g < groups; g += warps) {
        const int e = g * 32 + lane;
        const float v = e < experts ? l[e] : -INFINITY;
        r.val[e] = v;
        const float m = warp_max(v);
        if (lane == 0) r.part_max[g] = m;
    }
    __syncthreads();
    // Every warp reduces the partials itself (same tree, same value): no
    // further barrier or broadcast needed.
    const float mx = warp_max(lane < groups ? r.part_max[lane] : -INFINITY);
    for (int g = warp; g < groups; g += warps) {
        const int e = g * 32 + lane;
        const float ex = e < experts ? expf(r.val[e] - mx) : 0.f;
        r.val[e] = ex;
        const float s = warp_sum(ex);
        if (lane == 0) r.part_sum[g] = s;
    }
    __syncthreads();
    const float sum = warp_sum(lane < groups ? r.part_sum[lane] : 0.f);
    for (int g = warp; g < groups; g += warps) {
        const int e = g * 32 + lane;
        const float p = r.val[e] / sum;
        r.val[e] = p;
        r.key[e] = e < experts ? (isnan(p) ? -1.f : p) : -2.f;
    }
    __syncthreads();
    // Ranks exactly as moe_topk counts them (exact integers, so the loop
    // order does not matter); a pick's rank is exact, others stop past k.
    for (int g = warp; g < groups; g += warps) {
        const int e = g * 32 + lane;
        const float mine = r.key[e];
        int rank = 0;
        for (int o0 = 0; o0 < groups * 32 && rank < top_k; o0 += 32) {
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const float other = r.key[o0 + j];
                rank += (other > mine) || (other == mine && o0 + j < e);
            }
        }
        const bool picked = e < experts && rank < top_k;
        if (picked) r.by_rank[rank] = r.val[e];
        const unsigned ballot = __ballot_sync(0xffffffffu, picked);
        if (lane == 0) r.picked[g] = ballot;
    }
    __syncthreads();
    // Position among the picks by ascending id: picks of earlier groups, then
    // of earlier lanes of this one.
    for (int g = warp; g < groups; g += warps) {
        const unsigned mask = r.picked[g];
        if ((mask >> lane) & 1u) {
            int pos = __popc(mask & ((1u << lane) - 1u));
            for (int b = 0; b < g; ++b) pos += __popc(r.picked[b]);
            r.id[pos] = g * 32 + lane;
            r.p[pos] = r.val[g * 32 + lane];
        }
    }
    __syncthreads();
}

// Per token, its "items": the k routed experts and then, when present, the
// shared expert. Warp j of a block serves item j; blocks of the same row
// range for all T tokens are adjacent (token = blockIdx.x), so an expert
// chosen by several tokens, and the shared expert, are read from HBM about
// once and served to the others by L2.

// act[t, j, a] = silu(gate[a]) * up[a] with gate/up = W_gate_up[item] . x[t]
// (rows a and I + a of the item's [2I, H] matrix; I differs for the shared
// expert). Each warp step produces two act rows from four weight rows.
//
// The routing comes first: every block computes its token's softmax + top-k
// from the router logits (rows `logits_ld` apart, E = experts <= 512) with
// moe_route, bit-identical to moe_topk, and the blocks with blockIdx.y == 0
// write ids / weights [T, k] (ascending id, renormalised when asked) for
// moe_down, which runs after this kernel. Every block recomputes it (128
// blocks per token for Qwen3.6 at T = 1) rather than waiting on another
// launch: the logits are 1 KB from L2 and the blocks run side by side.
// That pays at one or two tokens; with more, the repeated routing costs more
// than the launch it saves, so `logits == nullptr` means moe_topk has already
// written ids / weights and the block only reads its ids.
// Grid (T, ceil(max(I, SI) / rows_per_block)), block 32 * items (items <=
// MOE_MAX_ITEMS, top_k <= items); rows_per_block even. act rows are
// `act_ld` floats apart.
template <typename WT>
__device__ __forceinline__ void moe_gate_up_body(float* __restrict__ act, int* __restrict__ ids,
                                                 float* __restrict__ weights, const float* __restrict__ logits,
                                                 int logits_ld, int experts, int renormalize,
                                                 const float* __restrict__ x, const void* __restrict__ w_gate_up,
                                                 const void* __restrict__ w_shared, int hidden, int inter,
                                                 int shared_inter, int top_k, int act_ld, int rows_per_block,
                                                 const float* __restrict__ s_gate_up,
                                                 const float* __restrict__ s_shared) {
    __shared__ MoeRoute route;
    const int t = blockIdx.x, j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (logits == nullptr) {
        // Routed beforehand by moe_topk: ids [T, k] are in global memory.
        if (threadIdx.x < top_k) route.id[threadIdx.x] = ids[t * top_k + threadIdx.x];
        __syncthreads();
    } else {
        moe_route(route, logits + (size_t)t * logits_ld, experts, top_k);
    }
    if (logits != nullptr && blockIdx.y == 0 && threadIdx.x < top_k) {
        const int i = threadIdx.x;
        // Summed in selection order (best first), as moe_topk and the reference.
        float total = 0.f;
        for (int r = 0; r < top_k; ++r) total += route.by_rank[r];
        ids[t * top_k + i] = route.id[i];
        weights[t * top_k + i] = renormalize ? route.p[i] / total : route.p[i];
    }

    const int items = blockDim.x >> 5;
    const bool shared = j >= top_k;
    const int rows = shared ? shared_inter : inter;
    // The item's matrix: rows `base ..` of the expert stack (or the shared
    // expert's own), whose FP8 scale rows then follow from the row index.
    const void* w = shared ? w_shared : w_gate_up;
    const float* scales = shared ? s_shared : s_gate_up;
    const size_t base = shared ? 0 : (size_t)route.id[j] * 2 * inter;
    const float* xt = x + (size_t)t * hidden;
    float* out = act + ((size_t)t * items + j) * act_ld;
    const int a_end = min((int)(blockIdx.y + 1) * rows_per_block, rows);
    for (int a = blockIdx.y * rows_per_block; a < a_end; a += 2) {
        const int a1 = min(a + 1, rows - 1);
        const size_t n[4] = {base + a, base + a1, base + rows + a, base + rows + a1};
        const uint4* wr[4];
        const float* sc[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            wr[i] = weight_row<WT>(w, n[i], hidden);
            sc[i] = scale_row<WT>(scales, n[i], hidden);
        }
        float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
        dot_chunks<1, 4, 4, WT>(acc, wr, xt, 0, lane, 32, hidden / WT::ELEMS, sc);
        const float g0 = warp_sum(acc[0][0]), g1 = warp_sum(acc[0][1]);
        const float u0 = warp_sum(acc[0][2]), u1 = warp_sum(acc[0][3]);
        if (lane == 0) out[a] = siluf_exact(g0) * u0;
        if (lane == 1 && a + 1 < a_end) out[a + 1] = siluf_exact(g1) * u1;
    }
}

// bf16 weights, f16 weights (`_f16`: the reference precision's f16
// checkpoints) and block-FP8 weights (`_fp8`, with their scales).
#define KESTREL_MOE_GATE_UP(NAME, WT)                                                                          \
    KESTREL_EXTERN void __launch_bounds__(32 * MOE_MAX_ITEMS) NAME(const __grid_constant__ MoeGateUpArgs a) { \
        pdl_begin();                                                                                          \
        moe_gate_up_body<WT>(a.act, a.ids, a.weights, a.logits, a.logits_ld, a.experts, a.renormalize, a.x,  \
                             a.w_gate_up, a.w_shared, a.hidden, a.inter, a.shared_inter, a.top_k, a.act_ld,  \
                             a.rows_per_block, a.s_gate_up, a.s_shared);                                      \
    }
KESTREL_MOE_GATE_UP(moe_gate_up, Bf16W)
KESTREL_MOE_GATE_UP(moe_gate_up_f16, F16W)
KESTREL_MOE_GATE_UP(moe_gate_up_fp8, Fp8W)

// Weight rows per down-kernel warp step: with I = 512 each lane holds two
// chunks per row, so 8 rows keep 16 loads in flight.
#define MOE_DOWN_R 8

// out[t, h] = sum_j w[t, j] * (W_down[e_j] . act[t, j])[h] over the routed
// experts in ascending id order, then + g * (shared down . act[t, k])[h] with
// g = sigmoid(gate logit) (1 without a gate): each product rounded, then
// added, as the reference does. The expert outputs of a block's rows meet in
// shared memory, so the combine needs no atomics and no extra launch.
// Grid (T, ceil(H / rows_per_block)), block 32 * items, dynamic shared memory
// items * rows_per_block floats; rows_per_block a multiple of MOE_DOWN_R.
// gate_col < 0: no shared-expert gate; else its logit is logits[t, gate_col].
template <typename WT>
__device__ __forceinline__ void moe_down_body(float* __restrict__ out, const float* __restrict__ act,
                                              const int* __restrict__ ids, const float* __restrict__ weights,
                                              const float* __restrict__ logits, int logits_ld, int gate_col,
                                              const void* __restrict__ w_down,
                                              const void* __restrict__ w_shared, int hidden, int inter,
                                              int shared_inter, int top_k, int act_ld, int rows_per_block,
                                              const float* __restrict__ s_down,
                                              const float* __restrict__ s_shared) {
    extern __shared__ float ys[];  // [items][rows_per_block]
    const int t = blockIdx.x, j = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int items = blockDim.x >> 5;
    const bool shared = j >= top_k;
    const int k_len = shared ? shared_inter : inter;
    const void* w = shared ? w_shared : w_down;
    const float* scales = shared ? s_shared : s_down;
    const size_t base = shared ? 0 : (size_t)ids[t * top_k + j] * hidden;
    const float* a = act + ((size_t)t * items + j) * act_ld;
    const int h0 = blockIdx.y * rows_per_block;
    for (int r0 = 0; r0 < rows_per_block; r0 += MOE_DOWN_R) {
        const uint4* wr[MOE_DOWN_R];
        const float* sc[MOE_DOWN_R];
#pragma unroll
        for (int r = 0; r < MOE_DOWN_R; ++r) {
            const size_t n = base + min(h0 + r0 + r, hidden - 1);
            wr[r] = weight_row<WT>(w, n, k_len);
            sc[r] = scale_row<WT>(scales, n, k_len);
        }
        float acc[1][MOE_DOWN_R];
#pragma unroll
        for (int r = 0; r < MOE_DOWN_R; ++r) acc[0][r] = 0.f;
        dot_chunks<1, MOE_DOWN_R, 2, WT>(acc, wr, a, 0, lane, 32, k_len / WT::ELEMS, sc);
#pragma unroll
        for (int r = 0; r < MOE_DOWN_R; ++r) {
            const float v = warp_sum(acc[0][r]);
            if (lane == r) ys[j * rows_per_block + r0 + r] = v;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < rows_per_block; i += blockDim.x) {
        const int h = h0 + i;
        if (h >= hidden) break;
        float o = 0.f;
        for (int jj = 0; jj < top_k; ++jj)
            o = __fadd_rn(o, __fmul_rn(weights[t * top_k + jj], ys[jj * rows_per_block + i]));
        if (items > top_k) {
            const float g = gate_col >= 0 ? sigmoidf_exact(logits[(size_t)t * logits_ld + gate_col]) : 1.f;
            o = __fadd_rn(o, __fmul_rn(g, ys[top_k * rows_per_block + i]));
        }
        out[(size_t)t * hidden + h] = o;
    }
}

#define KESTREL_MOE_DOWN(NAME, WT)                                                                              \
    KESTREL_EXTERN void __launch_bounds__(512) NAME(const __grid_constant__ MoeDownArgs a) {                    \
        pdl_begin();                                                                                           \
        moe_down_body<WT>(a.out, a.act, a.ids, a.weights, a.logits, a.logits_ld, a.gate_col, a.w_down,         \
                          a.w_shared, a.hidden, a.inter, a.shared_inter, a.top_k, a.act_ld, a.rows_per_block,  \
                          a.s_down, a.s_shared);                                                                 \
    }
KESTREL_MOE_DOWN(moe_down, Bf16W)
KESTREL_MOE_DOWN(moe_down_f16, F16W)
KESTREL_MOE_DOWN(moe_down_fp8, Fp8W)

//! Mixture of experts, two paths.
//!
//! Decode (1..=8 tokens, [`decode_fits`]): four launches whose shapes depend
//! only on T and the spec, with the routing never leaving the device, so a
//! step can be recorded in a CUDA graph: router logits (a `gemv`, the
//! shared-expert gate appended as one more row), a per-token softmax + top-k
//! that also sorts the picks by expert id, then `moe_gate_up` and `moe_down`,
//! which read each pick's weights by its id. Every (token, expert) pair runs
//! its own dot products; pairs of one row range run side by side, so an expert
//! picked by several tokens is served from L2 after the first read.
//!
//! Prefill: the router runs on the GPU; the routing is then read back and each
//! selected expert runs as two cuBLAS products over its gathered rows, its
//! output scattered back with the routing weight.
//!
//! Both paths add a token's experts in ascending id order, as the reference
//! does, and the shared expert last.

use kestrel_core::{MoeSpec, MoeWeights};

use crate::device::{Arg, Gpu, blocks, ptr};
use crate::ops::linear::{gemm_bf16, gemv};
use crate::tensor::{CudaTensor, CudaWeight};

const THREADS: u32 = 256;

/// Most tokens the decode path takes (the `gemv` router's row limit).
const DECODE_MAX_TOKENS: usize = 8;
/// Most experts the decode top-k holds (`MOE_MAX_EXPERTS` in moe.cu).
const DECODE_MAX_EXPERTS: usize = 512;
/// Most warps (experts per token, shared one included) in a decode block:
/// the kernels' launch bounds allow 512 threads.
const DECODE_MAX_ITEMS: usize = 16;

/// Intermediate rows per `moe_gate_up` block (even). A lone token needs small
/// blocks to spread its few experts over all SMs; with more tokens there are
/// blocks enough, and longer ones waste less on start-up (measured on an H200
/// with Qwen3.6 and Qwen3-30B shapes).
fn gate_up_rows(tokens: usize) -> usize {
    if tokens == 1 { 4 } else { 8 }
}

/// Hidden rows per `moe_down` block (a multiple of `MOE_DOWN_R` = 8): 8, 16,
/// then 32 from 3 tokens on, for the same reason.
fn down_rows(tokens: usize) -> usize {
    8 * tokens.next_power_of_two().min(4)
}

/// `logits[t, e] = x[t] . w[e]` in f32 (bf16 weights), `rows` experts.
fn router_logits(
    gpu: &Gpu,
    x: &CudaTensor,
    w: &CudaWeight,
    rows: usize,
) -> cudarc::driver::CudaSlice<f32> {
    let s = &gpu.stream;
    let logits = gpu.alloc::<f32>(x.rows * rows);
    let warps = x.rows * rows;
    gpu.launch(
        &gpu.k.router_logits,
        (blocks(warps * 32, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&logits, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(w.bf16("router"), s)),
            Arg::I32(x.rows as i32),
            Arg::I32(rows as i32),
            Arg::I32(x.cols as i32),
        ],
    );
    logits
}

/// `rows` of `x` (by index) through one expert: `down(silu(gate) * up)`, into `y [n, H]`.
#[allow(clippy::too_many_arguments)]
fn expert_mlp(
    gpu: &Gpu,
    x: &CudaTensor,
    rows: u64,
    n: usize,
    gate_up: u64,
    down: u64,
    inter: usize,
    y: u64,
) {
    let s = &gpu.stream;
    let h = x.cols;
    let xe = gpu.alloc::<u16>(n * h);
    gpu.launch(
        &gpu.k.gather_rows_to_bf16,
        (blocks(h, THREADS as usize), n as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&xe, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(rows),
            Arg::I32(h as i32),
        ],
    );
    let gu = gpu.alloc::<f32>(n * 2 * inter);
    gemm_bf16(gpu, ptr(&xe, s), n, h, gate_up, 2 * inter, ptr(&gu, s));
    let act = gpu.alloc::<u16>(n * inter);
    gpu.launch(
        &gpu.k.swiglu_to_bf16,
        (blocks(inter, THREADS as usize), n as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&act, s)),
            Arg::Ptr(ptr(&gu, s)),
            Arg::I32(inter as i32),
        ],
    );
    gemm_bf16(gpu, ptr(&act, s), n, inter, down, h, y);
}

/// Whether the graph-capturable decode path takes this block: 1..=8 tokens,
/// rows of a multiple of 8 values (16-byte loads), at most 512 experts, and
/// at most 16 experts per token counting the shared one.
pub fn decode_fits(tokens: usize, hidden: usize, spec: &MoeSpec) -> bool {
    let items = spec.top_k + usize::from(spec.shared_intermediate.is_some());
    (1..=DECODE_MAX_TOKENS).contains(&tokens)
        && hidden.is_multiple_of(8)
        && spec.intermediate.is_multiple_of(8)
        && spec
            .shared_intermediate
            .is_none_or(|si| si.is_multiple_of(8))
        && spec.num_experts <= DECODE_MAX_EXPERTS
        && items <= DECODE_MAX_ITEMS
}

/// The decode path (see the module docs). Shapes are checked by the caller.
fn moe_decode(gpu: &Gpu, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
    let (ne, k, inter) = (spec.num_experts, spec.top_k, spec.intermediate);
    let s = &gpu.stream;
    let shared = match (&w.shared_gate_up, &w.shared_down, spec.shared_intermediate) {
        (Some(gu), Some(dn), Some(si)) => Some((
            ptr(gu.bf16("shared gate_up"), s),
            ptr(dn.bf16("shared down"), s),
            si,
        )),
        _ => None,
    };
    // The gate only matters with a shared expert (as in the reference).
    let gate = shared
        .and(w.shared_gate.as_ref())
        .map(|g| ptr(g.bf16("shared expert gate"), s));
    let (sgu, sdn, si) = shared.unwrap_or((0, 0, inter));
    let items = k + usize::from(shared.is_some());
    let act_ld = inter.max(si);

    // Router logits [T, E], plus the gate logit as column E when there is one.
    let ld = ne + usize::from(gate.is_some());
    let logits = gpu.alloc::<f32>(t * ld);
    let router = ptr(w.router.bf16("router"), s);
    let x_ptr = ptr(&x.buf, s);
    gemv(
        gpu,
        ptr(&logits, s),
        x_ptr,
        t,
        h,
        router,
        ld,
        gate.unwrap_or(0),
    );

    // Top-k: a block per token, a thread per expert.
    let ids = gpu.alloc::<i32>(t * k);
    let weights = gpu.alloc::<f32>(t * k);
    gpu.launch(
        &gpu.k.moe_topk,
        (t as u32, 1, 1),
        32 * ne.div_ceil(32) as u32,
        0,
        &[
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(&weights, s)),
            Arg::Ptr(ptr(&logits, s)),
            Arg::I32(ld as i32),
            Arg::I32(ne as i32),
            Arg::I32(k as i32),
            Arg::I32(spec.norm_topk_prob as i32),
        ],
    );

    // act[t, item, :] = silu(gate) * up of each picked expert (and the shared one).
    let act = gpu.alloc::<f32>(t * items * act_ld);
    let gu_rows = gate_up_rows(t);
    gpu.launch(
        &gpu.k.moe_gate_up,
        (t as u32, blocks(act_ld, gu_rows), 1),
        32 * items as u32,
        0,
        &[
            Arg::Ptr(ptr(&act, s)),
            Arg::Ptr(x_ptr),
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(w.gate_up.bf16("experts' gate_up"), s)),
            Arg::Ptr(sgu),
            Arg::I32(h as i32),
            Arg::I32(inter as i32),
            Arg::I32(si as i32),
            Arg::I32(k as i32),
            Arg::I32(act_ld as i32),
            Arg::I32(gu_rows as i32),
        ],
    );

    // out = down projections, weighted and added in ascending expert order.
    let out = gpu.alloc::<f32>(t * h);
    let dn_rows = down_rows(t);
    gpu.launch(
        &gpu.k.moe_down,
        (t as u32, blocks(h, dn_rows), 1),
        32 * items as u32,
        (items * dn_rows * 4) as u32,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&act, s)),
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(&weights, s)),
            Arg::Ptr(ptr(&logits, s)),
            Arg::I32(ld as i32),
            Arg::I32(if gate.is_some() { ne as i32 } else { -1 }),
            Arg::Ptr(ptr(w.down.bf16("experts' down"), s)),
            Arg::Ptr(sdn),
            Arg::I32(h as i32),
            Arg::I32(inter as i32),
            Arg::I32(si as i32),
            Arg::I32(k as i32),
            Arg::I32(act_ld as i32),
            Arg::I32(dn_rows as i32),
        ],
    );
    CudaTensor {
        rows: t,
        cols: h,
        buf: out,
    }
}

pub fn moe(gpu: &Gpu, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
    w.check_shapes(h, spec, |x| x.numel());
    if decode_fits(t, h, spec) {
        return moe_decode(gpu, x, w, spec);
    }
    let (ne, k, inter) = (spec.num_experts, spec.top_k, spec.intermediate);
    let s = &gpu.stream;

    let logits = router_logits(gpu, x, &w.router, ne);
    let ids = gpu.alloc::<i32>(t * k);
    let weights = gpu.alloc::<f32>(t * k);
    gpu.launch(
        &gpu.k.router_topk,
        (blocks(t, 128), 1, 1),
        128,
        0,
        &[
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(&weights, s)),
            Arg::Ptr(ptr(&logits, s)),
            Arg::I32(t as i32),
            Arg::I32(ne as i32),
            Arg::I32(k as i32),
            Arg::I32(spec.norm_topk_prob as i32),
        ],
    );

    // Group (token, weight) by expert, tokens ascending within an expert.
    let ids_h = gpu.download(&ids, t * k);
    let weights_h = gpu.download(&weights, t * k);
    let mut counts = vec![0usize; ne + 1];
    for &e in &ids_h {
        counts[e as usize + 1] += 1;
    }
    for e in 0..ne {
        counts[e + 1] += counts[e];
    }
    let offsets = counts.clone();
    let mut fill = counts;
    let mut order = vec![0i32; t * k];
    let mut order_w = vec![0f32; t * k];
    for (j, (&e, &wt)) in ids_h.iter().zip(&weights_h).enumerate() {
        let slot = &mut fill[e as usize];
        order[*slot] = (j / k) as i32;
        order_w[*slot] = wt;
        *slot += 1;
    }
    let order_dev = gpu.upload(&order);
    let order_w_dev = gpu.upload(&order_w);

    let out = gpu.alloc_zeros::<f32>(t * h);
    let max_rows = (0..ne)
        .map(|e| offsets[e + 1] - offsets[e])
        .max()
        .unwrap_or(0);
    let y = gpu.alloc::<f32>(max_rows * h);
    let (gate_up, down) = (
        ptr(w.gate_up.bf16("experts' gate_up"), s),
        ptr(w.down.bf16("experts' down"), s),
    );
    for e in 0..ne {
        let (o, n) = (offsets[e], offsets[e + 1] - offsets[e]);
        if n == 0 {
            continue;
        }
        let rows = ptr(&order_dev, s) + (o * 4) as u64;
        let gu_e = gate_up + (e * 2 * inter * h * 2) as u64;
        let down_e = down + (e * h * inter * 2) as u64;
        expert_mlp(gpu, x, rows, n, gu_e, down_e, inter, ptr(&y, s));
        gpu.launch(
            &gpu.k.scatter_add_weighted,
            (blocks(h, THREADS as usize), n as u32, 1),
            THREADS,
            0,
            &[
                Arg::Ptr(ptr(&out, s)),
                Arg::Ptr(ptr(&y, s)),
                Arg::Ptr(rows),
                Arg::Ptr(ptr(&order_w_dev, s) + (o * 4) as u64),
                Arg::I32(h as i32),
            ],
        );
    }

    if let (Some(sgu), Some(sdn), Some(si)) =
        (&w.shared_gate_up, &w.shared_down, spec.shared_intermediate)
    {
        let all: Vec<i32> = (0..t as i32).collect();
        let all_dev = gpu.upload(&all);
        let ys = gpu.alloc::<f32>(t * h);
        let (sgu, sdn) = (
            ptr(sgu.bf16("shared gate_up"), s),
            ptr(sdn.bf16("shared down"), s),
        );
        expert_mlp(gpu, x, ptr(&all_dev, s), t, sgu, sdn, si, ptr(&ys, s));
        let gate = w.shared_gate.as_ref().map(|g| router_logits(gpu, x, g, 1));
        gpu.launch(
            &gpu.k.add_gated_rows,
            (blocks(h, THREADS as usize), t as u32, 1),
            THREADS,
            0,
            &[
                Arg::Ptr(ptr(&out, s)),
                Arg::Ptr(ptr(&ys, s)),
                Arg::Ptr(gate.as_ref().map_or(0, |g| ptr(g, s))),
                Arg::I32(h as i32),
            ],
        );
    }
    CudaTensor {
        rows: t,
        cols: h,
        buf: out,
    }
}

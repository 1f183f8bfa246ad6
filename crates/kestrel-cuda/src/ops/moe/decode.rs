//! The decode path (1..=8 tokens, or every token of a decode-shaped step):
//! routing and experts on the device in three (T <= 2) or four launches
//! (plus a router pass per 16 tokens beyond 8) whose shapes depend only on T
//! and the spec. Each token's expert sums do not depend on T.

use kestrel_core::{MoeSpec, MoeWeights};
use kestrel_kernels::abi::{MoeDownArgs, MoeGateUpArgs};

use super::routing::{DECODE_MAX_TOKENS, MoeInput, SharedExpert, top_k};
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::ops::linear::gemv::{gemv_norm, gemv_passes};
use crate::tensor::{CudaTensor, CudaWeight, Half};

/// Intermediate rows per `moe_gate_up` block (even). A lone token needs small
/// blocks to spread its few experts over all SMs; with more tokens there are
/// blocks enough, and longer ones waste less on start-up (measured with
/// Qwen3.6 and Qwen3-30B shapes).
fn gate_up_rows(tokens: usize) -> usize {
    if tokens == 1 { 4 } else { 8 }
}

/// Most tokens whose routing `moe_gate_up` computes itself. Every block of a
/// token repeats it: at one or two tokens that costs about what the saved
/// `moe_topk` launch did, beyond it costs more
/// (docs/benchmarks/2026-12-01-code-comment-measurements.md).
const ROUTE_IN_GATE_UP_MAX_TOKENS: usize = 2;

/// Hidden rows per `moe_down` block (a multiple of `MOE_DOWN_R` = 8): 8, 16,
/// then 32 from 3 tokens on, for the same reason.
fn down_rows(tokens: usize) -> usize {
    8 * tokens.next_power_of_two().min(4)
}

/// The decode path (see the [module docs](super)). Shapes are checked by the
/// caller.
pub fn moe_decode(
    cx: &Cx,
    input: MoeInput<'_>,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let gpu = cx.gpu;
    let (t, h) = input.shape();
    let (ne, k, inter) = (spec.num_experts, spec.top_k, spec.intermediate);
    let s = &gpu.stream;
    let shared = SharedExpert::of(gpu, w, spec);
    let gate = shared.and_then(|e| e.gate);
    let (sgu, sdn, si) = shared.map_or((0, 0, inter), |e| (e.gate_up, e.down, e.inter));
    let items = k + usize::from(shared.is_some());
    let act_ld = inter.max(si);

    // Router logits [T, E], plus the gate logit as column E when there is one.
    let ld = ne + usize::from(gate.is_some());
    let (router, router_half) = w.router.matrix("router");
    let router = (ptr(router, s), router_half);
    // `_normed` keeps the rows the router's product normalised alive until
    // the experts, launched below, have read them.
    let (logits, x_ptr, _normed) = match input {
        MoeInput::Rows(x) => {
            let logits = gpu.alloc::<f32>(t * ld);
            let x_ptr = ptr(&x.buf, s);
            gemv_passes(
                cx,
                ptr(&logits, s),
                x_ptr,
                t,
                h,
                router,
                ld,
                gate.unwrap_or(0),
            );
            (logits, x_ptr, None)
        }
        MoeInput::Norm(pre) => {
            let (logits, x) = gemv_norm(cx, pre, router, ld, gate.unwrap_or(0), true);
            let x = x.expect("gemv_norm keeps the rows when asked");
            (logits, ptr(&x.buf, s), Some(x))
        }
    };
    // One format for the whole block (one checkpoint): the kernels take one.
    let (gate_up, half) = w.gate_up.matrix("experts' gate_up");
    let (down, down_half) = w.down.matrix("experts' down");
    let shared_half = shared.map_or(half, |e| e.half);
    assert!(
        [router_half, down_half, shared_half]
            .iter()
            .all(|&x| x == half),
        "MoE weights of one block mix bf16 and f16"
    );
    let (gate_up_kernel, down_kernel) = match half {
        Half::Bf16 => (&cx.k.moe.gate_up, &cx.k.moe.down),
        Half::F16 => (&cx.k.moe.gate_up_f16, &cx.k.moe.down_f16),
    };

    // act[t, item, :] = silu(gate) * up of each picked expert (and the shared
    // one). Up to `ROUTE_IN_GATE_UP_MAX_TOKENS` tokens the kernel routes each
    // token itself (softmax + top-k, as `moe_topk` would, bit for bit)
    // instead of a separate launch on the critical path, and leaves the picks
    // in ids / weights for `moe_down`; with more tokens `moe_topk` runs first.
    // The batch-invariant mode takes one launch shape for every token count
    // (the routing always in `moe_topk`), so that no choice a row's result
    // might depend on follows the size of its step.
    let bi = cx.plan.batch_invariant;
    let (ids, weights, route_logits) = if t <= ROUTE_IN_GATE_UP_MAX_TOKENS && !bi {
        let ids = gpu.alloc::<i32>(t * k);
        let weights = gpu.alloc::<f32>(t * k);
        (ids, weights, ptr(&logits, s))
    } else {
        let (ids, weights) = top_k(cx, &logits, ld, t, spec);
        (ids, weights, 0)
    };
    let act = gpu.alloc::<f32>(t * items * act_ld);
    let gu_rows = gate_up_rows(if bi { DECODE_MAX_TOKENS } else { t });
    let as_i32 = |v: usize| v as i32;
    gpu.launch(
        gate_up_kernel,
        (t as u32, blocks(act_ld, gu_rows), 1),
        32 * items as u32,
        0,
        &[Arg::record(&MoeGateUpArgs {
            act: ptr(&act, s),
            ids: ptr(&ids, s),
            weights: ptr(&weights, s),
            logits: route_logits,
            x: x_ptr,
            w_gate_up: ptr(gate_up, s),
            w_shared: sgu,
            logits_ld: as_i32(ld),
            experts: as_i32(ne),
            renormalize: i32::from(spec.norm_topk_prob),
            hidden: as_i32(h),
            inter: as_i32(inter),
            shared_inter: as_i32(si),
            top_k: as_i32(k),
            act_ld: as_i32(act_ld),
            rows_per_block: as_i32(gu_rows),
        })],
    );

    // out = down projections, weighted and added in ascending expert order.
    let out = gpu.alloc::<f32>(t * h);
    let dn_rows = down_rows(if bi { DECODE_MAX_TOKENS } else { t });
    gpu.launch(
        down_kernel,
        (t as u32, blocks(h, dn_rows), 1),
        32 * items as u32,
        (items * dn_rows * 4) as u32,
        &[Arg::record(&MoeDownArgs {
            out: ptr(&out, s),
            act: ptr(&act, s),
            ids: ptr(&ids, s),
            weights: ptr(&weights, s),
            logits: ptr(&logits, s),
            w_down: ptr(down, s),
            w_shared: sdn,
            logits_ld: as_i32(ld),
            gate_col: if gate.is_some() { as_i32(ne) } else { -1 },
            hidden: as_i32(h),
            inter: as_i32(inter),
            shared_inter: as_i32(si),
            top_k: as_i32(k),
            act_ld: as_i32(act_ld),
            rows_per_block: as_i32(dn_rows),
        })],
    );
    CudaTensor {
        bf16: None,
        rows: t,
        cols: h,
        buf: out,
    }
}

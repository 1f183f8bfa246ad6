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
use crate::ops::fp8::bf16_matrix;
use crate::ops::linear::gemv::{Out, gemv_norm, gemv_passes};
use crate::tensor::{CudaTensor, CudaWeight, Format, Matrix};

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
    let si = shared.map_or(inter, |e| e.inter);
    let items = k + usize::from(shared.is_some());
    let act_ld = inter.max(si);

    // Router logits [T, E], plus the gate logit as column E when there is one.
    let ld = ne + usize::from(gate.is_some());
    let router = w.router.matrix("router", s);
    // `_normed` keeps the rows the router's product normalised alive until
    // the experts, launched below, have read them.
    let (logits, x_ptr, _normed) = match input {
        MoeInput::Rows(x) => {
            let logits = gpu.alloc::<f32>(t * ld);
            let x_ptr = ptr(&x.buf, s);
            gemv_passes(
                cx,
                Out {
                    ptr: ptr(&logits, s),
                    ld,
                },
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
    // The kernels take one format for all experts. A checkpoint's FP8
    // experts are all FP8 when their matrices are whole 128-row blocks; a
    // block whose weights mix formats (a tiny model's cut blocks went bf16)
    // runs on bf16 copies of its FP8 parts, made for the call.
    let mut gate_up = w.gate_up.matrix("experts' gate_up", s);
    let mut down = w.down.matrix("experts' down", s);
    let mut shared_m = shared.map(|e| (e.gate_up, e.down));
    let formats = [down.format]
        .into_iter()
        .chain(shared_m.iter().flat_map(|(g, d)| [g.format, d.format]));
    let mut copies = Vec::new();
    if formats.into_iter().any(|f| f != gate_up.format) {
        let mut bf16 = |wt: &CudaWeight, what| {
            let c = bf16_matrix(cx, wt, what);
            let m = Matrix::half(c.ptr, Format::Bf16);
            copies.push(c);
            m
        };
        gate_up = bf16(&w.gate_up, "experts' gate_up");
        down = bf16(&w.down, "experts' down");
        if let (Some(gu), Some(dn)) = (&w.shared_gate_up, &w.shared_down) {
            shared_m = Some((bf16(gu, "shared gate_up"), bf16(dn, "shared down")));
        }
    }
    let (sgu, sdn) = shared_m.map_or((Default::default(), Default::default()), |(g, d)| {
        ((g.ptr, g.scales), (d.ptr, d.scales))
    });
    let (gate_up_kernel, down_kernel) = match gate_up.format {
        Format::Bf16 => (&cx.k.moe.gate_up, &cx.k.moe.down),
        Format::F16 => (&cx.k.moe.gate_up_f16, &cx.k.moe.down_f16),
        Format::Fp8 => (&cx.k.moe.gate_up_fp8, &cx.k.moe.down_fp8),
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
            w_gate_up: gate_up.ptr,
            w_shared: sgu.0,
            s_gate_up: gate_up.scales,
            s_shared: sgu.1,
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
            w_down: down.ptr,
            w_shared: sdn.0,
            s_down: down.scales,
            s_shared: sdn.1,
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

//! The host-routed prefill path: the routing is read back and each selected
//! expert runs as two cuBLAS products over its gathered rows. It serves the
//! block shapes the device-routed kernels refuse (and, with the
//! `experiments` feature, every prefill block when the plan forces it).

use kestrel_core::{MoeSpec, MoeWeights};

use super::routing::THREADS;
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::ops::fp8::bf16_matrix;
use crate::ops::linear::gemm::gemm_bf16;
use crate::tensor::{CudaTensor, CudaWeight};

/// `logits[t, e] = x[t] . w[e]` in f32 (bf16 weights), `rows` experts.
fn router_logits(
    cx: &Cx,
    x: &CudaTensor,
    w: &CudaWeight,
    rows: usize,
) -> cudarc::driver::CudaSlice<f32> {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let logits = gpu.alloc::<f32>(x.rows * rows);
    let warps = x.rows * rows;
    gpu.launch(
        &cx.k.moe.router_logits,
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
    cx: &Cx,
    x: &CudaTensor,
    rows: u64,
    n: usize,
    gate_up: u64,
    down: u64,
    inter: usize,
    y: u64,
) {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let h = x.cols;
    let xe = gpu.alloc::<u16>(n * h);
    gpu.launch(
        &cx.k.moe.gather_rows_to_bf16,
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
    gemm_bf16(cx, ptr(&xe, s), n, h, gate_up, 2 * inter, ptr(&gu, s));
    let act = gpu.alloc::<u16>(n * inter);
    gpu.launch(
        &cx.k.moe.swiglu_to_bf16,
        (blocks(inter, THREADS as usize), n as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&act, s)),
            Arg::Ptr(ptr(&gu, s)),
            Arg::I32(inter as i32),
        ],
    );
    gemm_bf16(cx, ptr(&act, s), n, inter, down, h, y);
}

/// The host-routed prefill path (see the [module docs](super)).
pub fn moe_host_routed(
    cx: &Cx,
    x: &CudaTensor,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
    let (ne, k, inter) = (spec.num_experts, spec.top_k, spec.intermediate);
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);

    let logits = router_logits(cx, x, &w.router, ne);
    let ids = gpu.alloc::<i32>(t * k);
    let weights = gpu.alloc::<f32>(t * k);
    gpu.launch(
        &cx.k.moe.router_topk,
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
    // FP8 experts: bf16 copies for the call (kept alive to its end).
    let (gate_up_b, down_b) = (
        bf16_matrix(cx, &w.gate_up, "experts' gate_up"),
        bf16_matrix(cx, &w.down, "experts' down"),
    );
    let (gate_up, down) = (gate_up_b.ptr, down_b.ptr);
    for e in 0..ne {
        let (o, n) = (offsets[e], offsets[e + 1] - offsets[e]);
        if n == 0 {
            continue;
        }
        let rows = ptr(&order_dev, s) + (o * 4) as u64;
        let gu_e = gate_up + (e * 2 * inter * h * 2) as u64;
        let down_e = down + (e * h * inter * 2) as u64;
        expert_mlp(cx, x, rows, n, gu_e, down_e, inter, ptr(&y, s));
        gpu.launch(
            &cx.k.moe.scatter_add_weighted,
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
            bf16_matrix(cx, sgu, "shared gate_up"),
            bf16_matrix(cx, sdn, "shared down"),
        );
        expert_mlp(
            cx,
            x,
            ptr(&all_dev, s),
            t,
            sgu.ptr,
            sdn.ptr,
            si,
            ptr(&ys, s),
        );
        let gate = w.shared_gate.as_ref().map(|g| router_logits(cx, x, g, 1));
        gpu.launch(
            &cx.k.moe.add_gated_rows,
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
        bf16: None,
        rows: t,
        cols: h,
        buf: out,
    }
}

//! The device-routed prefill path (more than 8 tokens): split x, router GEMM,
//! top-k, grouping by expert, grouped tensor-core GEMMs and a combine
//! (`kernels/moe_prefill.cu`). Each stage is one function below.

use cudarc::driver::CudaSlice;
use kestrel_core::{MoeSpec, MoeWeights};

use super::expert_weight::ExpertWeight;
use super::gemm::{Gemm, grouped_row_tiles, launch_expert_gemm, launch_gemm, tile_rows};
use super::kernels::{ExpertGemmKernels, GEMM_COLS, GEMM_ROWS, sm90_smem_bytes, sm90_threads};
use super::routing::{MoeInput, SharedExpert, THREADS, top_k};
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::plan::Mma;
use crate::tensor::{CudaTensor, CudaWeight};

/// Threads of `moe_route_plan` and `moe_route_fill`.
const PLAN_THREADS: u32 = 1024;
const FILL_THREADS: u32 = 512;

/// Chunks of 8 values per thread of `moe_norm_split` (`NORM_SPLIT_CHUNKS`
/// in moe_prefill.cu), at 256 threads a row.
const NORM_SPLIT_CHUNKS: usize = 2;

/// Whether `moe_norm_split` takes rows of `h` values.
pub fn norm_split_fits(h: usize) -> bool {
    h.is_multiple_of(8) && h <= 8 * NORM_SPLIT_CHUNKS * THREADS as usize
}

/// The block's sizes, and its logits' row length (the experts, plus the
/// shared expert's gate logit as column E when there is one).
struct Block {
    t: usize,
    h: usize,
    ne: usize,
    ld: usize,
    gate: Option<u64>,
}

/// x as `[hi | mid | lo]` bf16 per row (hi feeds the experts), and the gate
/// logit written into column E of `logits` (its own kernel, or the norm's:
/// as one more GEMM column it cost a whole tile).
fn split_input(cx: &Cx, input: MoeInput<'_>, b: &Block, logits: &CudaSlice<f32>) -> CudaSlice<u16> {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let (t, h) = (b.t, b.h);
    let xs = gpu.alloc::<u16>(t * 3 * h);
    match input {
        MoeInput::Rows(x) => {
            gpu.launch(
                &cx.k.moe.split_x,
                (blocks(t * h / 8, THREADS as usize), 1, 1),
                THREADS,
                0,
                &[
                    Arg::Ptr(ptr(&xs, s)),
                    Arg::Ptr(ptr(&x.buf, s)),
                    Arg::I32(t as i32),
                    Arg::I32(h as i32),
                ],
            );
            if let Some(gate_w) = b.gate {
                gpu.launch(
                    &cx.k.moe.gate_logit,
                    (blocks(t, 8), 1, 1),
                    256,
                    0,
                    &[
                        Arg::Ptr(ptr(logits, s)),
                        Arg::I32(b.ld as i32),
                        Arg::I32(b.ne as i32),
                        Arg::Ptr(ptr(&x.buf, s)),
                        Arg::Ptr(gate_w),
                        Arg::I32(t as i32),
                        Arg::I32(h as i32),
                    ],
                );
            }
        }
        MoeInput::Norm(pre) => {
            assert!(norm_split_fits(h), "moe_norm_split: rows of {h}");
            // The residual changes in place: a bf16 copy of it would be stale.
            pre.residual.bf16 = None;
            gpu.launch(
                &cx.k.moe.norm_split,
                (t as u32, 1, 1),
                THREADS,
                0,
                &[
                    Arg::Ptr(ptr(&xs, s)),
                    Arg::Ptr(ptr(&pre.residual.buf, s)),
                    Arg::Ptr(pre.delta.map_or(0, |d| ptr(&d.buf, s))),
                    Arg::Ptr(ptr(pre.weight.f32("moe_norm_split"), s)),
                    Arg::F32(pre.eps),
                    Arg::Ptr(b.gate.unwrap_or(0)),
                    Arg::Ptr(ptr(logits, s)),
                    Arg::I32(b.ld as i32),
                    Arg::I32(b.ne as i32),
                    Arg::I32(h as i32),
                ],
            );
        }
    }
    xs
}

/// Router logits `[T, E]` as a tensor-core product over the three parts of x
/// (f32-accurate).
fn router(cx: &Cx, b: &Block, xs: u64, router_w: u64, logits: &CudaSlice<f32>) {
    let gpu = cx.gpu;
    let g = Gemm {
        out: ptr(logits, &gpu.stream),
        ldo: b.ld,
        a: xs,
        lda: 3 * b.h,
        a_rows: 0,
        w: router_w,
        w_stride: 0,
        w_scales: None,
        w_extra: 0,
        groups: None,
        rows: b.t,
        row_tiles: b.t.div_ceil(GEMM_ROWS),
        n: b.ne,
        k: 3 * b.h,
        k_period: b.h,
    };
    match cx.plan.moe.expert_gemm {
        // One warpgroup per 64-row tile.
        Mma::Wgmma => {
            let (n_tiles, grid) = g.grid(GEMM_COLS);
            gpu.launch(
                &cx.k.moe.router_gemm_sm90,
                (grid, 1, 1),
                sm90_threads(GEMM_ROWS),
                sm90_smem_bytes(GEMM_ROWS, GEMM_COLS, false),
                &g.args(n_tiles, false),
            );
        }
        Mma::MmaSync => launch_gemm(gpu, &cx.k.moe.router_gemm, GEMM_COLS, &g),
    }
}

/// The (token, pick) pairs grouped by expert in ascending token order.
struct Grouping {
    /// Each expert's first grouped row, and its first row tile.
    offsets: CudaSlice<i32>,
    tile_off: CudaSlice<i32>,
    /// Each grouped row's token, and each pair's grouped row.
    pair_token: CudaSlice<i32>,
    pos: CudaSlice<i32>,
}

/// Rows per expert and their tiles (`moe_route_plan`), then each expert's
/// pairs and every pair's grouped row (`moe_route_fill`).
fn group(cx: &Cx, b: &Block, k: usize, ids: &CudaSlice<i32>, tile_rows: usize) -> Grouping {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let pairs = b.t * k;
    let offsets = gpu.alloc::<i32>(b.ne + 1);
    let tile_off = gpu.alloc::<i32>(b.ne + 1);
    gpu.launch(
        &cx.k.moe.route_plan,
        (1, 1, 1),
        PLAN_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&offsets, s)),
            Arg::Ptr(ptr(&tile_off, s)),
            Arg::Ptr(ptr(ids, s)),
            Arg::I32(pairs as i32),
            Arg::I32(b.ne as i32),
            Arg::I32(tile_rows as i32),
        ],
    );
    let pair_token = gpu.alloc::<i32>(pairs);
    let pos = gpu.alloc::<i32>(pairs);
    gpu.launch(
        &cx.k.moe.route_fill,
        (b.ne as u32, 1, 1),
        FILL_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&pair_token, s)),
            Arg::Ptr(ptr(&pos, s)),
            Arg::Ptr(ptr(ids, s)),
            Arg::Ptr(ptr(&offsets, s)),
            Arg::I32(b.t as i32),
            Arg::I32(k as i32),
        ],
    );
    Grouping {
        offsets,
        tile_off,
        pair_token,
        pos,
    }
}

/// One expert MLP over grouped (or all) rows: gate_up with SiLU * up in the
/// epilogue into bf16 activations, then down with bf16 output `[rows, H]`.
struct Mlp<'w> {
    /// Grouped row -> row of x (0: the identity).
    a_rows: u64,
    gate_up: &'w ExpertWeight,
    down: &'w ExpertWeight,
    /// Elements between two experts' gate_up matrices (0: one expert).
    gate_up_stride: usize,
    down_stride: usize,
    inter: usize,
    /// `(offsets, tile_off, groups)`; `None`: one group of all rows.
    groups: Option<(u64, u64, usize)>,
    rows: usize,
    row_tiles: usize,
    tile_rows: usize,
}

fn mlp(cx: &Cx, b: &Block, xs: u64, m: &Mlp) -> CudaSlice<u16> {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let gemm = |out: u64, ldo, a, lda, a_rows, w: &ExpertWeight, w_stride, n, k| Gemm {
        out,
        ldo,
        a,
        lda,
        a_rows,
        w: w.ptr(),
        w_stride,
        w_scales: w.scales(),
        w_extra: 0,
        groups: m.groups,
        rows: m.rows,
        row_tiles: m.row_tiles,
        n,
        k,
        k_period: k,
    };
    let act = gpu.alloc::<u16>(m.rows * m.inter);
    let gate_up = gemm(
        ptr(&act, s),
        m.inter,
        xs,
        3 * b.h,
        m.a_rows,
        m.gate_up,
        m.gate_up_stride,
        m.inter,
        b.h,
    );
    let kernels: (&ExpertGemmKernels, &ExpertGemmKernels) =
        (&cx.k.moe.gate_up_gemm, &cx.k.moe.down_gemm);
    launch_expert_gemm(cx, kernels.0, m.tile_rows, GEMM_COLS / 2, &gate_up);
    // bf16 expert outputs (see MG_DOWN in moe_prefill.cu).
    let y = gpu.alloc::<u16>(m.rows * b.h);
    let down = gemm(
        ptr(&y, s),
        b.h,
        ptr(&act, s),
        m.inter,
        0,
        m.down,
        m.down_stride,
        b.h,
        m.inter,
    );
    launch_expert_gemm(cx, kernels.1, m.tile_rows, GEMM_COLS, &down);
    y
}

/// The device-routed prefill path (see the [module docs](super)). Shapes are
/// checked by the caller ([`prefill_fits`](super::routing::prefill_fits)).
pub fn moe_prefill(
    cx: &Cx,
    input: MoeInput<'_>,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let (t, h) = input.shape();
    let (ne, k) = (spec.num_experts, spec.top_k);
    let shared = SharedExpert::of(gpu, w, spec);
    let gate = shared.and_then(|e| e.gate);
    let b = Block {
        t,
        h,
        ne,
        ld: ne + usize::from(gate.is_some()),
        gate,
    };
    let pairs = t * k;

    let logits = gpu.alloc::<f32>(t * b.ld);
    let xs = split_input(cx, input, &b, &logits);
    let xs_ptr = ptr(&xs, s);
    router(cx, &b, xs_ptr, ptr(w.router.bf16("router"), s), &logits);
    let (ids, weights) = top_k(cx, &logits, b.ld, t, spec);

    // The routed experts, in grouped row order. FP8 experts are read as
    // they are on wgmma, else through bf16 copies made for the call (kept
    // alive to its end).
    let gate_up = ExpertWeight::of(cx, &w.gate_up, "experts' gate_up");
    let down = ExpertWeight::of(cx, &w.down, "experts' down");
    let routed_rows = tile_rows(cx, pairs, ne);
    let g = group(cx, &b, k, &ids, routed_rows);
    let y = mlp(
        cx,
        &b,
        xs_ptr,
        &Mlp {
            a_rows: ptr(&g.pair_token, s),
            gate_up: &gate_up,
            down: &down,
            gate_up_stride: 2 * spec.intermediate * h,
            down_stride: h * spec.intermediate,
            inter: spec.intermediate,
            groups: Some((ptr(&g.offsets, s), ptr(&g.tile_off, s), ne)),
            rows: pairs,
            row_tiles: grouped_row_tiles(pairs, ne, routed_rows),
            tile_rows: routed_rows,
        },
    );

    // The shared expert: the same kernels, one dense group of all tokens.
    let shared_copies = shared.map(|_| {
        let (gu, dn) = (w.shared_gate_up.as_ref(), w.shared_down.as_ref());
        let copy =
            |m: Option<&CudaWeight>, what| ExpertWeight::of(cx, m.expect("shared expert"), what);
        (copy(gu, "shared gate_up"), copy(dn, "shared down"))
    });
    let ys = shared.zip(shared_copies.as_ref()).map(|(e, (sgu, sdn))| {
        let shared_rows = tile_rows(cx, t, 1);
        mlp(
            cx,
            &b,
            xs_ptr,
            &Mlp {
                a_rows: 0,
                gate_up: sgu,
                down: sdn,
                gate_up_stride: 0,
                down_stride: 0,
                inter: e.inter,
                groups: None,
                rows: t,
                row_tiles: t.div_ceil(shared_rows),
                tile_rows: shared_rows,
            },
        )
    });
    combine(cx, &b, k, &y, ys.as_ref(), &g.pos, &weights, &logits)
}

/// Each token's picks added in ascending expert order, the shared expert
/// (scaled by its gate) last.
#[allow(clippy::too_many_arguments)]
fn combine(
    cx: &Cx,
    b: &Block,
    k: usize,
    y: &CudaSlice<u16>,
    ys: Option<&CudaSlice<u16>>,
    pos: &CudaSlice<i32>,
    weights: &CudaSlice<f32>,
    logits: &CudaSlice<f32>,
) -> CudaTensor {
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    let (t, h) = (b.t, b.h);
    let out = gpu.alloc::<f32>(t * h);
    gpu.launch(
        &cx.k.moe.combine,
        (blocks(t * h / 4, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(y, s)),
            Arg::Ptr(ys.map_or(0, |b| ptr(b, s))),
            Arg::Ptr(ptr(pos, s)),
            Arg::Ptr(ptr(weights, s)),
            Arg::Ptr(ptr(logits, s)),
            Arg::I32(b.ld as i32),
            Arg::I32(if b.gate.is_some() { b.ne as i32 } else { -1 }),
            Arg::I32(t as i32),
            Arg::I32(h as i32),
            Arg::I32(k as i32),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: t,
        cols: h,
        buf: out,
    }
}

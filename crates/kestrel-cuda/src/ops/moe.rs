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
//! Prefill (more than 8 tokens, [`prefill_fits`]): also routed on the device
//! with shapes that depend only on T and the spec (`kernels/moe_prefill.cu`):
//! x split into three bf16 parts that sum to it, router logits as a
//! tensor-core product over the three parts (f32-accurate), the same top-k,
//! a count / scan / stable fill that groups the (token, pick) pairs by expert
//! in ascending token order, then two grouped GEMMs on tensor cores (gate_up
//! with SiLU * up in the epilogue, bf16 activations; down with f32 output) over
//! a fixed upper bound of 64-row tiles, and a combine that adds each token's
//! picks in ascending expert order and the shared expert last. The shared
//! expert runs through the same GEMMs as one dense group.
//!
//! The older prefill path remains for shapes the kernels do not take and on
//! request (`KESTREL_MOE_PREFILL=host`, `Gpu::moe_prefill_host`): the routing
//! is read back and each selected expert runs as two cuBLAS products over its
//! gathered rows, its output scattered back with the routing weight.
//!
//! All paths add a token's experts in ascending id order, as the reference
//! does, and the shared expert last.

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule};
use kestrel_core::{BackendError, MoeSpec, MoeWeights, Result};

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

/// Mirror `kernels/moe_prefill.cu`: rows per GEMM tile (`MG_BM`), weight
/// rows per tile (`MG_BN`; a gate_up tile is 64 act columns, their gate and
/// up rows), threads, and dynamic shared memory (`MG_SMEM_BYTES`).
const GEMM_ROWS: usize = 64;
const GEMM_COLS: usize = 128;
const GEMM_THREADS: u32 = 256;
pub const GEMM_SMEM_BYTES: u32 = 96 * 1024;
// Two blocks per SM on Hopper (228 KiB), one within sm_121's 99 KiB.
const _: () = assert!(2 * GEMM_SMEM_BYTES <= 224 * 1024 && GEMM_SMEM_BYTES <= 97 * 1024);
/// Threads of `moe_route_plan` and `moe_route_fill`.
const PLAN_THREADS: u32 = 1024;
const FILL_THREADS: u32 = 512;
/// Most (token, pick) pairs of the prefill path (32-bit row indices with room
/// to spare in every product).
const PREFILL_MAX_PAIRS: usize = 1 << 24;

/// A prefill GEMM kernel, allowed the dynamic shared memory it needs (above
/// the default 48 KiB).
pub fn prefill_gemm(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    let f = m
        .load_function(name)
        .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        GEMM_SMEM_BYTES as i32,
    )
    .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
    Ok(f)
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

/// Whether the device-routed prefill path takes this block: rows of a
/// multiple of 8 values (16-byte copies; K tails are zero-filled), at most 512
/// experts and 32 picks (`moe_topk`), and at most 2^24 (token, pick) pairs.
pub fn prefill_fits(tokens: usize, hidden: usize, spec: &MoeSpec) -> bool {
    hidden > 0
        && hidden.is_multiple_of(8)
        && spec.intermediate > 0
        && spec.intermediate.is_multiple_of(8)
        && spec
            .shared_intermediate
            .is_none_or(|si| si > 0 && si.is_multiple_of(8))
        && spec.num_experts <= DECODE_MAX_EXPERTS
        && spec.top_k <= 32
        && tokens * spec.top_k <= PREFILL_MAX_PAIRS
}

/// One launch of a prefill GEMM kernel (`moe_gemm` in moe_prefill.cu, whose
/// comment describes the fields).
struct Gemm {
    out: u64,
    ldo: usize,
    a: u64,
    lda: usize,
    /// Grouped row -> A row (0: the identity).
    a_rows: u64,
    w: u64,
    /// Elements between two groups' weight matrices.
    w_stride: usize,
    /// The router's last row (the shared-expert gate), or 0.
    w_extra: u64,
    /// `(offsets, tile_off, groups)` from `moe_route_plan`; `None`: one group
    /// of all `rows` rows.
    groups: Option<(u64, u64, usize)>,
    rows: usize,
    /// Row tiles launched: exact for one group, an upper bound when grouped.
    row_tiles: usize,
    n: usize,
    k: usize,
    k_period: usize,
}

/// Launch `f` over `n` output columns in tiles of `cols_per_tile` (64 act
/// columns for gate_up, 128 otherwise).
fn launch_gemm(gpu: &Gpu, f: &CudaFunction, cols_per_tile: usize, g: &Gemm) {
    let n_tiles = g.n.div_ceil(cols_per_tile);
    let (offsets, tile_off, groups) = g.groups.unwrap_or((0, 0, 1));
    let grid = n_tiles * g.row_tiles;
    assert!(
        grid <= i32::MAX as usize,
        "moe prefill: grid of {grid} blocks"
    );
    gpu.launch(
        f,
        (grid as u32, 1, 1),
        GEMM_THREADS,
        GEMM_SMEM_BYTES,
        &[
            Arg::Ptr(g.out),
            Arg::I32(g.ldo as i32),
            Arg::Ptr(g.a),
            Arg::I32(g.lda as i32),
            Arg::Ptr(g.a_rows),
            Arg::Ptr(g.w),
            Arg::U64(g.w_stride as u64),
            Arg::Ptr(g.w_extra),
            Arg::Ptr(offsets),
            Arg::Ptr(tile_off),
            Arg::I32(groups as i32),
            Arg::I32(g.rows as i32),
            Arg::I32(g.n as i32),
            Arg::I32(g.k as i32),
            Arg::I32(g.k_period as i32),
            Arg::I32(n_tiles as i32),
        ],
    );
}

/// Upper bound on the 64-row tiles of `pairs` rows split over `groups`
/// groups: each non-empty group rounds up once.
fn grouped_row_tiles(pairs: usize, groups: usize) -> usize {
    (pairs + (GEMM_ROWS - 1) * groups.min(pairs)) / GEMM_ROWS
}

/// The device-routed prefill path (see the module docs). Shapes are checked
/// by the caller ([`prefill_fits`]).
fn moe_prefill(
    gpu: &Gpu,
    x: &CudaTensor,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
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
    let ld = ne + usize::from(gate.is_some());
    let pairs = t * k;

    // x as [hi | mid | lo] bf16 per row; hi feeds the experts.
    let xs = gpu.alloc::<u16>(t * 3 * h);
    gpu.launch(
        &gpu.k.moe_split_x,
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
    let xs_ptr = ptr(&xs, s);

    // Router logits [T, E], plus the gate logit as column E when there is one.
    let logits = gpu.alloc::<f32>(t * ld);
    launch_gemm(
        gpu,
        &gpu.k.moe_router_gemm,
        GEMM_COLS,
        &Gemm {
            out: ptr(&logits, s),
            ldo: ld,
            a: xs_ptr,
            lda: 3 * h,
            a_rows: 0,
            w: ptr(w.router.bf16("router"), s),
            w_stride: 0,
            w_extra: gate.unwrap_or(0),
            groups: None,
            rows: t,
            row_tiles: t.div_ceil(GEMM_ROWS),
            n: ld,
            k: 3 * h,
            k_period: h,
        },
    );

    // Top-k, picks in ascending expert id: a block per token.
    let ids = gpu.alloc::<i32>(pairs);
    let weights = gpu.alloc::<f32>(pairs);
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

    // Grouping: rows per expert and their tiles, then each expert's pairs in
    // ascending token order and every pair's grouped row.
    let offsets = gpu.alloc::<i32>(ne + 1);
    let tile_off = gpu.alloc::<i32>(ne + 1);
    gpu.launch(
        &gpu.k.moe_route_plan,
        (1, 1, 1),
        PLAN_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&offsets, s)),
            Arg::Ptr(ptr(&tile_off, s)),
            Arg::Ptr(ptr(&ids, s)),
            Arg::I32(pairs as i32),
            Arg::I32(ne as i32),
            Arg::I32(GEMM_ROWS as i32),
        ],
    );
    let pair_token = gpu.alloc::<i32>(pairs);
    let pos = gpu.alloc::<i32>(pairs);
    gpu.launch(
        &gpu.k.moe_route_fill,
        (ne as u32, 1, 1),
        FILL_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&pair_token, s)),
            Arg::Ptr(ptr(&pos, s)),
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(&offsets, s)),
            Arg::I32(t as i32),
            Arg::I32(k as i32),
        ],
    );

    // The routed experts, in grouped row order.
    let grouped = Some((ptr(&offsets, s), ptr(&tile_off, s), ne));
    let row_tiles = grouped_row_tiles(pairs, ne);
    let act = gpu.alloc::<u16>(pairs * inter);
    launch_gemm(
        gpu,
        &gpu.k.moe_gate_up_gemm,
        GEMM_COLS / 2,
        &Gemm {
            out: ptr(&act, s),
            ldo: inter,
            a: xs_ptr,
            lda: 3 * h,
            a_rows: ptr(&pair_token, s),
            w: ptr(w.gate_up.bf16("experts' gate_up"), s),
            w_stride: 2 * inter * h,
            w_extra: 0,
            groups: grouped,
            rows: pairs,
            row_tiles,
            n: inter,
            k: h,
            k_period: h,
        },
    );
    let y = gpu.alloc::<f32>(pairs * h);
    launch_gemm(
        gpu,
        &gpu.k.moe_down_gemm,
        GEMM_COLS,
        &Gemm {
            out: ptr(&y, s),
            ldo: h,
            a: ptr(&act, s),
            lda: inter,
            a_rows: 0,
            w: ptr(w.down.bf16("experts' down"), s),
            w_stride: h * inter,
            w_extra: 0,
            groups: grouped,
            rows: pairs,
            row_tiles,
            n: h,
            k: inter,
            k_period: inter,
        },
    );
    drop(act);

    // The shared expert: the same kernels, one dense group of all tokens.
    let ys = shared.map(|(sgu, sdn, si)| {
        let act_s = gpu.alloc::<u16>(t * si);
        launch_gemm(
            gpu,
            &gpu.k.moe_gate_up_gemm,
            GEMM_COLS / 2,
            &Gemm {
                out: ptr(&act_s, s),
                ldo: si,
                a: xs_ptr,
                lda: 3 * h,
                a_rows: 0,
                w: sgu,
                w_stride: 0,
                w_extra: 0,
                groups: None,
                rows: t,
                row_tiles: t.div_ceil(GEMM_ROWS),
                n: si,
                k: h,
                k_period: h,
            },
        );
        let ys = gpu.alloc::<f32>(t * h);
        launch_gemm(
            gpu,
            &gpu.k.moe_down_gemm,
            GEMM_COLS,
            &Gemm {
                out: ptr(&ys, s),
                ldo: h,
                a: ptr(&act_s, s),
                lda: si,
                a_rows: 0,
                w: sdn,
                w_stride: 0,
                w_extra: 0,
                groups: None,
                rows: t,
                row_tiles: t.div_ceil(GEMM_ROWS),
                n: h,
                k: si,
                k_period: si,
            },
        );
        ys
    });

    let out = gpu.alloc::<f32>(t * h);
    gpu.launch(
        &gpu.k.moe_combine,
        (blocks(t * h / 4, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&y, s)),
            Arg::Ptr(ys.as_ref().map_or(0, |b| ptr(b, s))),
            Arg::Ptr(ptr(&pos, s)),
            Arg::Ptr(ptr(&weights, s)),
            Arg::Ptr(ptr(&logits, s)),
            Arg::I32(ld as i32),
            Arg::I32(if gate.is_some() { ne as i32 } else { -1 }),
            Arg::I32(t as i32),
            Arg::I32(h as i32),
            Arg::I32(k as i32),
        ],
    );
    CudaTensor {
        rows: t,
        cols: h,
        buf: out,
    }
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
    if !gpu.moe_prefill_host && prefill_fits(t, h, spec) {
        return moe_prefill(gpu, x, w, spec);
    }
    moe_host_routed(gpu, x, w, spec)
}

/// The host-routed prefill path (see the module docs).
fn moe_host_routed(
    gpu: &Gpu,
    x: &CudaTensor,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(e: usize, k: usize, i: usize, si: Option<usize>) -> MoeSpec {
        MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: i,
            norm_topk_prob: true,
            shared_intermediate: si,
        }
    }

    #[test]
    fn prefill_takes_the_target_models_and_refuses_odd_shapes() {
        assert!(prefill_fits(8192, 2048, &spec(256, 8, 512, Some(512))));
        assert!(prefill_fits(8192, 2048, &spec(128, 8, 768, None)));
        assert!(prefill_fits(9, 200, &spec(20, 3, 40, Some(24))));
        assert!(!prefill_fits(100, 2044, &spec(128, 8, 768, None)));
        assert!(!prefill_fits(100, 2048, &spec(128, 8, 764, None)));
        assert!(!prefill_fits(100, 2048, &spec(128, 8, 768, Some(20))));
        assert!(!prefill_fits(100, 2048, &spec(1024, 8, 768, None)));
        assert!(!prefill_fits(100, 2048, &spec(128, 33, 768, None)));
    }

    /// The launched tile count covers every routing of the pairs.
    #[test]
    fn grouped_row_tiles_bound_every_routing() {
        for (pairs, groups) in [(72, 64), (800, 32), (65536, 256), (5, 300), (0, 8)] {
            let bound = grouped_row_tiles(pairs, groups);
            // Worst cases: one row in each of min(E, P) - 1 groups, the rest
            // in one; and spread as evenly as possible.
            let used = groups.min(pairs);
            let one_each = if used == 0 {
                0
            } else {
                (used - 1) + (pairs - (used - 1)).div_ceil(GEMM_ROWS)
            };
            let even: usize = (0..used)
                .map(|g| (pairs / used + usize::from(g < pairs % used)).div_ceil(GEMM_ROWS))
                .sum();
            assert!(bound >= one_each && bound >= even, "{pairs} {groups}");
        }
    }
}

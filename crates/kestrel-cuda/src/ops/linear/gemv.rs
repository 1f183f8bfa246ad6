//! Products of up to 8 rows (decode steps): the `gemv` kernels read the
//! weights once with the activations in f32, and `gemv_norm` computes the
//! rows' RMSNorm itself. Only kernel launches, whose shapes depend only on
//! the operands' shapes: safe to record in a CUDA graph.

use cudarc::driver::{CudaFunction, CudaSlice};
use kestrel_core::PreNorm;

use super::kernels::{GEMV_MAX_ROWS, GEMV_PASS_ROWS, NORM_MAX_ROWS, NORM_SMEM_MAX};
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::plan::DecodeSplits;
use crate::tensor::{CudaTensor, CudaWeight, Format, Matrix};

/// Weight rows a `gemv` launch aims to have in flight, in warps x rows per
/// warp: about 16 warps of 4 rows per SM of a large GPU cover HBM latency.
/// Below it, K is split over more warps.
const GEMV_TARGET_ROWS: usize = 8192;

/// Whether `gemv` takes `rows` rows of length `k`: its loads are 16 bytes
/// (8 bf16) wide, so K must be a multiple of 8. (Block-FP8 weights, 16
/// codes a load, are only kept as FP8 with K a multiple of 16:
/// `ops::fp8::kept_as_fp8`.)
pub fn gemv_fits(rows: usize, k: usize) -> bool {
    (1..=GEMV_MAX_ROWS).contains(&rows) && k > 0 && k.is_multiple_of(8)
}

/// Weights per 16-byte load of `format`.
fn chunk_elems(format: Format) -> usize {
    match format {
        Format::Bf16 | Format::F16 => 8,
        Format::Fp8 => 16,
    }
}

/// The kernels' fourth operand: the FP8 kernels take the block scales where
/// the 16-bit ones take `w_last` (the router's appended row, never FP8).
fn last_or_scales(w: Matrix, w_last: u64) -> u64 {
    match w.format {
        Format::Fp8 => {
            assert_eq!(w_last, 0, "an FP8 product has no appended row");
            w.scales
        }
        Format::Bf16 | Format::F16 => w_last,
    }
}

/// Whether one `gemv` launch takes `rows` rows of length `k`: [`gemv_fits`],
/// or a full pass of [`GEMV_PASS_ROWS`].
fn launch_fits(rows: usize, k: usize) -> bool {
    gemv_fits(rows, k) || (rows == GEMV_PASS_ROWS && gemv_fits(1, k))
}

/// Weight rows per warp in `gemv_m{rows}` (must match `KESTREL_GEMV` and
/// `KESTREL_GEMV_FP8` in gemv.cu): the kernels' tiles, which do not change
/// any row's sums (the split does). Chosen by timing the kernels at Qwen3.6's
/// shapes (docs/benchmarks/2026-12-06-h100-gemv-tiles/).
fn gemv_rows_per_warp(rows: usize, format: Format) -> usize {
    match (rows, format) {
        (1, Format::Fp8) | (2..=4, _) | (GEMV_PASS_ROWS, Format::Fp8) => 4,
        (1, _) => 2,
        (GEMV_PASS_ROWS, _) => 6,
        (_, Format::Fp8) => 6,
        _ => 8,
    }
}

/// Weight rows per warp in `gemv_norm_m{rows}` (must match `KESTREL_GEMV_NORM`
/// in gemv.cu; bf16 and FP8 alike).
fn norm_rows_per_warp(rows: usize) -> usize {
    if rows == 1 { 2 } else { 4 }
}

/// Weight rows per warp that [`gemv_split`] sizes a launch by: the tiles the
/// split heuristic was tuned with, kept apart from the kernels' own tiles so
/// that retiling a kernel never changes a product's split, so its sums.
fn split_rows_per_warp(rows: usize, format: Format) -> usize {
    match (rows, format) {
        (1, _) | (GEMV_PASS_ROWS, Format::Fp8) => 2,
        (2..=4, _) => 4,
        (GEMV_PASS_ROWS, _) => 6,
        (_, Format::Fp8) => 6,
        _ => 8,
    }
}

/// Warps that share one row group's K (1, 2, 4 or 8): split while the launch
/// has too few rows in flight (at most 2048 warps) and every lane still gets
/// a 16-byte chunk of each row. Over K 512..4096 and N 512..248320 this
/// picked the best split or one within a few percent (docs/benchmarks/).
/// The split sets each lane's share of K, so the order of a dot product, so
/// it is never chosen from the launch's row count alone:
/// - the batch-invariant mode takes the split of a full 8-row launch for
///   every row count;
/// - otherwise, inside a step, the split of one row per sequence: a verify
///   step's k + 1 rows per sequence then take the split of the plain decode
///   step of the same sequences, so each row's product is the one decode
///   would compute, and speculation leaves greedy output unchanged.
fn gemv_split(cx: &Cx, rows: usize, k: usize, n: usize, format: Format) -> usize {
    let rows = if cx.plan.batch_invariant {
        GEMV_MAX_ROWS
    } else {
        split_rows(cx, rows)
    };
    let per_warp = split_rows_per_warp(rows, format);
    let target = (GEMV_TARGET_ROWS / per_warp).min(2048);
    let groups = n.div_ceil(per_warp);
    let mut split = 1;
    while split < 8 && groups * split < target && k / (chunk_elems(format) * 32 * 2 * split) >= 1 {
        split *= 2;
    }
    split
}

/// The row count a decode-sized launch of `rows` rows is split for: the
/// step's sequence count when it has fewer (see [`gemv_split`]), or one
/// with the plan's [`DecodeSplits::OneSequence`].
fn split_rows(cx: &Cx, rows: usize) -> usize {
    if cx.plan.decode_splits == DecodeSplits::OneSequence {
        return 1;
    }
    cx.step
        .as_ref()
        .map_or(rows, |step| step.layout.seqs.clamp(1, rows))
}

/// Where a product's rows go: f32 rows `ld` floats apart from `ptr`, a
/// device address. `ld` is the product's width, or wider when the product
/// fills some columns of a wider output (one part of a [`Stacked`] weight).
///
/// [`Stacked`]: crate::tensor::WeightData::Stacked
#[derive(Clone, Copy, Debug)]
pub struct Out {
    pub ptr: u64,
    pub ld: usize,
}

/// `y[rows, n] = x[rows, k] . w[n, k]^T` with f32 `x` and `y` and matrix
/// `w`, all raw device addresses (16-byte aligned). `w_last` (0 for none,
/// else a 16-bit row of `w`'s format) replaces row `n - 1` of `w`, which
/// lets the MoE router append the shared-expert gate.
/// Only kernel launches: safe to record in a CUDA graph.
#[allow(clippy::too_many_arguments)]
pub fn gemv(cx: &Cx, y: Out, x: u64, rows: usize, k: usize, w: Matrix, n: usize, w_last: u64) {
    assert!(
        launch_fits(rows, k),
        "gemv: {rows} rows of {k} not supported"
    );
    assert!(
        (x | w.ptr | w_last).is_multiple_of(16),
        "gemv: operands must be 16-byte aligned"
    );
    assert!(y.ld >= n, "gemv: output rows of {} for {n} columns", y.ld);
    if n == 0 {
        return;
    }
    let split = gemv_split(cx, rows, k, n, w.format);
    let rows_per_block = (8 / split) * gemv_rows_per_warp(rows, w.format);
    let lk = &cx.k.linear;
    let f = match (w.format, rows) {
        (Format::Bf16, GEMV_PASS_ROWS) => &lk.gemv_pass,
        (Format::F16, GEMV_PASS_ROWS) => &lk.gemv_pass_f16,
        (Format::Fp8, GEMV_PASS_ROWS) => &lk.gemv_pass_fp8,
        (Format::Bf16, _) => &lk.gemv[rows - 1],
        (Format::F16, _) => &lk.gemv_f16[rows - 1],
        (Format::Fp8, _) => &lk.gemv_fp8[rows - 1],
    };
    let last_or_scales = last_or_scales(w, w_last);
    cx.gpu.launch(
        f,
        (blocks(n, rows_per_block), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(y.ptr),
            Arg::Ptr(x),
            Arg::Ptr(w.ptr),
            Arg::Ptr(last_or_scales),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(split as i32),
            Arg::I32(y.ld as i32),
        ],
    );
}

/// Whether `gemv_norm` forms `rows` normalised rows of length `k` itself for
/// a product with weights of `format` (its kernels read bf16 and FP8),
/// unless the plan leaves the fusion out (`norm_fusion`).
pub fn norm_fits(cx: &Cx, rows: usize, k: usize, format: Format) -> bool {
    cx.plan.norm_fusion
        && format != Format::F16
        && gemv_fits(rows, k)
        && !cx.prompt_step()
        && rows <= NORM_MAX_ROWS
        && rows * k * 4 <= NORM_SMEM_MAX
}

/// Most weight rows `norm_matmul` runs through `gemv_norm`. Its resident
/// blocks loop over row groups, which streamed a 248,320-row lm_head slower
/// than `gemv`'s block per group plus the norm kernel. Only that size was
/// measured (docs/benchmarks/2026-12-01-code-comment-measurements.md); the
/// cap sits well above every other product fused this way (the largest, a
/// GDN in_proj, has 12,352 rows).
pub const NORM_MAX_N: usize = 65_536;

/// One product of [`gemv_norm_parts`]: the weight rows of a matrix, the
/// columns of y they fill, and `w_last` as for [`gemv`].
#[derive(Clone, Copy, Debug)]
pub struct NormPart {
    pub w: Matrix,
    pub n: usize,
    pub w_last: u64,
}

/// `y[rows, n] = x . w^T` where `x = pre`'s normalised rows, which every
/// block of the kernel computes itself (`gemv_norm`, gemv.cu); the kernel's
/// first block writes the updated residual, which replaces `pre.residual`,
/// and, when `keep_x`, `x` itself, returned for later kernels. The shapes
/// must pass [`norm_fits`]. Only kernel launches: safe to record in a graph.
pub fn gemv_norm(
    cx: &Cx,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    w: Matrix,
    n: usize,
    w_last: u64,
    keep_x: bool,
) -> (CudaSlice<f32>, Option<CudaTensor>) {
    gemv_norm_parts(cx, pre, &[NormPart { w, n, w_last }], keep_x)
}

/// [`gemv_norm`] of a weight stacked from parts of several formats, each
/// filling its columns of y (in order) with its own split: a block-FP8 head
/// and a bf16 tail (a Gated DeltaNet in_proj) in one launch whose blocks
/// split between the two (`gemv_norm_fp8_bf16`), other stacks in one launch
/// per part. Every launch normalises the same rows (the old residual and
/// delta), and the first writes the new residual and x.
pub fn gemv_norm_parts(
    cx: &Cx,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    parts: &[NormPart],
    keep_x: bool,
) -> (CudaSlice<f32>, Option<CudaTensor>) {
    let (rows, k) = (pre.residual.rows, pre.residual.cols);
    for part in parts {
        assert!(
            norm_fits(cx, rows, k, part.w.format),
            "gemv_norm: {rows} rows of {k} not supported"
        );
        assert!(
            (part.w.ptr | part.w_last).is_multiple_of(16),
            "gemv_norm: weights must be 16-byte aligned"
        );
    }
    if let Some(d) = pre.delta {
        assert_eq!(
            (d.rows, d.cols),
            (rows, k),
            "gemv_norm: residual and delta differ"
        );
    }
    assert_eq!(pre.weight.numel(), k, "gemv_norm: norm weight length");
    let gpu = cx.gpu;
    let s = &gpu.stream;
    let width: usize = parts.iter().map(|p| p.n).sum();
    let y = gpu.alloc::<f32>(rows * width);
    let x = keep_x.then(|| CudaTensor {
        bf16: None,
        rows,
        cols: k,
        buf: gpu.alloc::<f32>(rows * k),
    });
    // The other blocks still read the old residual while the first writes
    // the new one, so it goes to a fresh buffer. The old one is freed after
    // the launches (stream-ordered), never before.
    let residual_out = pre.delta.map(|_| gpu.alloc::<f32>(rows * k));
    let one_launch = matches!(
        parts,
        [head, tail] if head.w.format == Format::Fp8 && tail.w.format == Format::Bf16
            && tail.w_last == 0
    );
    if one_launch {
        let (head, tail) = (parts[0], parts[1]);
        let f = &cx.k.linear.gemv_norm_fp8_bf16[rows - 1];
        let smem = rows * k * 4;
        let resident = resident_blocks(cx, f, smem);
        let split = |n: usize, format: Format| gemv_split(cx, rows, k, n, format);
        let (head_split, tail_split) = (split(head.n, Format::Fp8), split(tail.n, Format::Bf16));
        let groups = |n: usize, split: usize| blocks(n, (8 / split) * norm_rows_per_warp(rows));
        // The tail's blocks first (a few), the head's in what stays resident.
        let tail_grid = groups(tail.n, tail_split).min(resident as u32 / 2).max(1);
        let head_grid = groups(head.n, head_split)
            .min((resident as u32).saturating_sub(tail_grid))
            .max(1);
        gpu.launch(
            f,
            (head_grid + tail_grid, 1, 1),
            256,
            smem as u32,
            &[
                Arg::Ptr(ptr(&y, s)),
                Arg::Ptr(x.as_ref().map_or(0, |x| ptr(&x.buf, s))),
                Arg::Ptr(residual_out.as_ref().map_or(0, |r| ptr(r, s))),
                Arg::Ptr(ptr(&pre.residual.buf, s)),
                Arg::Ptr(pre.delta.map_or(0, |d| ptr(&d.buf, s))),
                Arg::Ptr(ptr(pre.weight.f32("gemv_norm"), s)),
                Arg::F32(pre.eps),
                Arg::Ptr(head.w.ptr),
                Arg::Ptr(head.w.scales),
                Arg::I32(head.n as i32),
                Arg::I32(head_split as i32),
                Arg::Ptr(tail.w.ptr),
                Arg::I32(tail.n as i32),
                Arg::I32(tail_split as i32),
                Arg::I32(head_grid as i32),
                Arg::I32(k as i32),
            ],
        );
    }
    let mut column = 0;
    for (i, part) in parts.iter().enumerate().filter(|_| !one_launch) {
        let (w, n) = (part.w, part.n);
        let split = gemv_split(cx, rows, k, n, w.format);
        let rows_per_block = (8 / split) * norm_rows_per_warp(rows);
        // Each block normalises the rows once and then takes row groups in
        // turn: as many blocks as fit on the device at once.
        let f = match w.format {
            Format::Fp8 => &cx.k.linear.gemv_norm_fp8[rows - 1],
            Format::Bf16 | Format::F16 => &cx.k.linear.gemv_norm[rows - 1],
        };
        let smem = rows * k * 4;
        let resident = resident_blocks(cx, f, smem);
        let first = i == 0;
        gpu.launch(
            f,
            (blocks(n, rows_per_block).min(resident as u32), 1, 1),
            256,
            smem as u32,
            &[
                Arg::Ptr(ptr(&y, s) + (column * 4) as u64),
                Arg::Ptr(match &x {
                    Some(x) if first => ptr(&x.buf, s),
                    _ => 0,
                }),
                Arg::Ptr(match &residual_out {
                    Some(r) if first => ptr(r, s),
                    _ => 0,
                }),
                Arg::Ptr(ptr(&pre.residual.buf, s)),
                Arg::Ptr(pre.delta.map_or(0, |d| ptr(&d.buf, s))),
                Arg::Ptr(ptr(pre.weight.f32("gemv_norm"), s)),
                Arg::F32(pre.eps),
                Arg::Ptr(w.ptr),
                Arg::Ptr(last_or_scales(w, part.w_last)),
                Arg::I32(n as i32),
                Arg::I32(k as i32),
                Arg::I32(split as i32),
                Arg::I32(width as i32),
            ],
        );
        column += n;
    }
    if let Some(r) = residual_out {
        pre.residual.buf = r;
        pre.residual.bf16 = None;
    }
    (y, x)
}

/// Blocks of 256 threads with `smem` bytes of dynamic shared memory that
/// the device holds at once running `f`.
fn resident_blocks(cx: &Cx, f: &CudaFunction, smem: usize) -> usize {
    f.occupancy_max_active_blocks_per_multiprocessor(256, smem, None)
        .unwrap_or(1)
        .max(1) as usize
        * cx.gpu.sm_count()
}

/// `gemv` over any number of rows: passes of [`GEMV_PASS_ROWS`], then of at
/// most [`GEMV_MAX_ROWS`]. Every pass reads the weights once, and a row's
/// sums do not depend on its pass (only on the split).
#[allow(clippy::too_many_arguments)]
pub fn gemv_passes(
    cx: &Cx,
    y: Out,
    x: u64,
    rows: usize,
    k: usize,
    w: Matrix,
    n: usize,
    w_last: u64,
) {
    let mut first = 0;
    while first < rows {
        let left = rows - first;
        let r = if left >= GEMV_PASS_ROWS {
            GEMV_PASS_ROWS
        } else {
            left.min(GEMV_MAX_ROWS)
        };
        let (xo, yo) = ((first * k * 4) as u64, (first * y.ld * 4) as u64);
        let out = Out {
            ptr: y.ptr + yo,
            ld: y.ld,
        };
        gemv(cx, out, x + xo, r, k, w, n, w_last);
        first += r;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `(M, R)` of every `NAME(M, R, ...)` line in gemv.cu: the row count a
    /// kernel takes and the weight rows each of its warps owns.
    fn instantiations(source: &str, name: &str) -> Vec<(usize, usize)> {
        source
            .lines()
            .filter_map(|line| {
                let args = line.trim().strip_prefix(name)?.strip_prefix('(')?;
                let mut args = args.split(',').map(|a| a.trim().parse::<usize>());
                Some((args.next()?.ok()?, args.next()?.ok()?))
            })
            .collect()
    }

    /// A launch's grid comes from the rows per warp on this side, and a
    /// kernel built with other ones would leave rows uncomputed or compute
    /// them twice, with nothing on the CPU to notice.
    #[test]
    fn rows_per_warp_are_the_kernels_own() {
        let source = include_str!("../../../../kestrel-kernels/kernels/gemv.cu");
        let row_counts: Vec<usize> = (1..=GEMV_MAX_ROWS).chain([GEMV_PASS_ROWS]).collect();
        let bf16 = instantiations(source, "KESTREL_GEMV");
        let fp8 = instantiations(source, "KESTREL_GEMV_FP8");
        let norm = instantiations(source, "KESTREL_GEMV_NORM");
        assert_eq!(bf16.iter().map(|i| i.0).collect::<Vec<_>>(), row_counts);
        assert_eq!(fp8.iter().map(|i| i.0).collect::<Vec<_>>(), row_counts);
        assert_eq!(
            norm.iter().map(|i| i.0).collect::<Vec<_>>(),
            (1..=NORM_MAX_ROWS).collect::<Vec<_>>()
        );
        for (m, r) in bf16 {
            assert_eq!(gemv_rows_per_warp(m, Format::Bf16), r, "gemv_m{m}");
            assert_eq!(gemv_rows_per_warp(m, Format::F16), r, "gemv_f16_m{m}");
        }
        for (m, r) in fp8 {
            assert_eq!(gemv_rows_per_warp(m, Format::Fp8), r, "gemv_fp8_m{m}");
        }
        for (m, r) in norm {
            assert_eq!(norm_rows_per_warp(m), r, "gemv_norm_m{m}");
        }
        let stacked = instantiations(source, "KESTREL_GEMV_NORM_FP8_BF16");
        assert_eq!(
            stacked.iter().map(|i| i.0).collect::<Vec<_>>(),
            (1..=NORM_MAX_ROWS).collect::<Vec<_>>()
        );
        for (m, r) in stacked {
            assert_eq!(norm_rows_per_warp(m), r, "gemv_norm_fp8_bf16_m{m}");
        }
    }
}

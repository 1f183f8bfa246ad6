//! Qwen3.8-Flash-Next's operations (`FlashNextOps`) on the device: the
//! hyper-connection steps, the PLE gate and conv, and (in [`qsa`]) the QSA
//! indexer and the sparse attention it chooses.
//!
//! The hyper-connection steps run as small kernels around the products.
//! Fused forms (`hc_norm`: the pending sublayer output added, the grouped
//! norm and the inject logits in one pass; `hc_low_rank` and `hc_gate_mix`:
//! the gate and stream mean of a decode-shaped step) are exact but measured
//! slower, and only the plan of an `experiments` build takes them.

mod backend;
pub mod kernels;
pub mod qsa;

use kestrel_core::ForwardBatch;
use kestrel_core::flash_next::{Channels, HyperSpec, PleParams, PleSpec, RowEdit};

use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaTensor, CudaWeight, Format, Matrix};
use kernels::{CONV_THREADS, HC_GATE_MAX_ROWS, HC_MAX_STREAMS, PLE_MAX_STATE, THREADS};
use kestrel_kernels::abi::{HcGateArgs, HcNormArgs};

fn tensor(cx: &Cx, rows: usize, cols: usize) -> CudaTensor {
    CudaTensor {
        bf16: None,
        rows,
        cols,
        buf: cx.gpu.alloc::<f32>(rows * cols),
    }
}

fn channels<'a>(c: &'a Channels<CudaWeight>, len: usize, what: &str) -> &'a CudaWeight {
    assert_eq!(
        c.weight.numel(),
        len,
        "{what}: {} values for {len} channels",
        c.weight.numel()
    );
    &c.weight
}

pub fn repeat_streams(cx: &Cx, x: &CudaTensor, streams: usize) -> CudaTensor {
    let out = tensor(cx, x.rows, x.cols * streams);
    if x.rows == 0 {
        return out;
    }
    let s = &cx.gpu.stream;
    cx.gpu.launch(
        &cx.k.flash_next.repeat_streams,
        (blocks(x.cols, THREADS as usize), x.rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::I32(x.cols as i32),
            Arg::I32(streams as i32),
        ],
    );
    out
}

pub fn grouped_rms_norm(
    cx: &Cx,
    x: &CudaTensor,
    w: &Channels<CudaWeight>,
    group: usize,
    eps: f32,
) -> CudaTensor {
    let w = channels(w, x.cols, "grouped norm weight");
    assert!(
        group > 0 && x.cols.is_multiple_of(group),
        "row of {} is not groups of {group}",
        x.cols
    );
    let out = tensor(cx, x.rows, x.cols);
    if x.rows == 0 {
        return out;
    }
    let s = &cx.gpu.stream;
    cx.gpu.launch(
        &cx.k.flash_next.grouped_rms_norm,
        ((x.cols / group) as u32, x.rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(w.f32("grouped norm"), s)),
            Arg::I32(x.cols as i32),
            Arg::I32(group as i32),
            Arg::F32(eps),
        ],
    );
    out
}

/// See `FlashNextOps::hyper_norm`: `inject` is the inject projection as a
/// 16-bit matrix (`[streams, width]`).
pub fn hyper_norm(
    cx: &Cx,
    x: &mut CudaTensor,
    pending: Option<(&CudaTensor, &CudaTensor)>,
    norm: &Channels<CudaWeight>,
    inject: Option<Matrix>,
    spec: &HyperSpec,
) -> (CudaTensor, Option<CudaTensor>) {
    let w = channels(norm, spec.width(), "hyper-connection norm weight");
    assert_eq!(
        x.cols,
        spec.width(),
        "hyper_norm: streams [T, streams * hidden]"
    );
    assert!(
        (1..=HC_MAX_STREAMS).contains(&spec.streams),
        "hyper_norm: {} streams (1 to {HC_MAX_STREAMS})",
        spec.streams
    );
    if let Some((out, logits)) = pending {
        assert_eq!(
            (out.rows, out.cols, logits.rows, logits.cols),
            (x.rows, spec.hidden, x.rows, spec.streams),
            "hyper_norm: a pending output [T, hidden] with logits [T, streams]"
        );
    }
    let t = x.rows;
    let normed = tensor(cx, t, spec.width());
    let logits = inject.map(|_| tensor(cx, t, spec.streams));
    if t == 0 {
        return (normed, logits);
    }
    if pending.is_some() {
        x.bf16 = None;
    }
    let s = &cx.gpu.stream;
    let (inject_ptr, inject_f16) = match inject {
        None => (0, 0),
        Some(m) => {
            assert!(
                m.format != Format::Fp8,
                "hyper_norm: the inject projection must be 16-bit"
            );
            (m.ptr, i32::from(m.format == Format::F16))
        }
    };
    cx.gpu.launch(
        &cx.k.flash_next.norm,
        (t as u32, 1, 1),
        THREADS,
        0,
        &[Arg::record(&HcNormArgs {
            normed: ptr(&normed.buf, s),
            logits: logits.as_ref().map_or(0, |l| ptr(&l.buf, s)),
            x: ptr(&x.buf, s),
            out: pending.map_or(0, |(o, _)| ptr(&o.buf, s)),
            out_logits: pending.map_or(0, |(_, l)| ptr(&l.buf, s)),
            norm_w: ptr(w.f32("hyper-connection norm"), s),
            inject: inject_ptr,
            inject_f16,
            hidden: spec.hidden as i32,
            streams: spec.streams as i32,
            eps: spec.eps,
        })],
    );
    (normed, logits)
}

/// The hyper-connection gate and stream mean of a decode-shaped step in two
/// kernels (`hc_low_rank`, then `hc_gate_mix`), or `None` where they do not
/// apply (more rows than [`HC_GATE_MAX_ROWS`], widths not whole 8-element
/// chunks): see `FlashNextOps::hyper_gate_mix`. `down` is the `[rank,
/// width]` matrix with its rank, `up` the `[width, rank]` one, both 16-bit of
/// one format.
pub fn gate_mix_decode(
    cx: &Cx,
    normed: &CudaTensor,
    (down, rank): (Matrix, usize),
    up: Matrix,
    spec: &HyperSpec,
) -> Option<CudaTensor> {
    let (t, width) = (normed.rows, spec.width());
    assert_eq!(normed.cols, width, "hyper_gate_mix: normalised streams");
    let fits = (1..=HC_GATE_MAX_ROWS).contains(&t)
        && (1..=HC_MAX_STREAMS).contains(&spec.streams)
        && width.is_multiple_of(8)
        && rank.is_multiple_of(8);
    if !fits {
        return None;
    }
    let low = tensor(cx, t, rank);
    let mixed = tensor(cx, t, spec.hidden);
    let s = &cx.gpu.stream;
    let args = Arg::record(&HcGateArgs {
        normed: ptr(&normed.buf, s),
        low: ptr(&low.buf, s),
        down: down.ptr,
        up: up.ptr,
        mixed: ptr(&mixed.buf, s),
        f16: i32::from(down.format == Format::F16),
        rows: t as i32,
        rank: rank as i32,
        hidden: spec.hidden as i32,
        streams: spec.streams as i32,
    });
    let k = &cx.k.flash_next;
    cx.gpu.launch(
        &k.low_rank,
        (rank.div_ceil(2) as u32, 1, 1),
        THREADS,
        0,
        &[args],
    );
    cx.gpu.launch(
        &k.gate_mix,
        (blocks(spec.hidden, 8), 1, 1),
        THREADS,
        0,
        &[args],
    );
    Some(mixed)
}

pub fn scaled_silu(cx: &Cx, x: &CudaTensor, divisor: f32) -> CudaTensor {
    let out = tensor(cx, x.rows, x.cols);
    let n = x.rows * x.cols;
    if n == 0 {
        return out;
    }
    let s = &cx.gpu.stream;
    cx.gpu.launch(
        &cx.k.flash_next.scaled_silu,
        (blocks(n, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::I32(n as i32),
            Arg::F32(divisor),
        ],
    );
    out
}

pub fn mix(cx: &Cx, normed: &CudaTensor, gate: &CudaTensor, spec: &HyperSpec) -> CudaTensor {
    assert_eq!(
        (normed.cols, gate.cols, gate.rows),
        (spec.width(), spec.width(), normed.rows),
        "hyper_mix: inputs must both be [T, streams * hidden]"
    );
    let out = tensor(cx, normed.rows, spec.hidden);
    if normed.rows == 0 {
        return out;
    }
    let s = &cx.gpu.stream;
    cx.gpu.launch(
        &cx.k.flash_next.mix,
        (blocks(spec.hidden, THREADS as usize), normed.rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&normed.buf, s)),
            Arg::Ptr(ptr(&gate.buf, s)),
            Arg::I32(spec.hidden as i32),
            Arg::I32(spec.streams as i32),
        ],
    );
    out
}

pub fn inject(
    cx: &Cx,
    x: &mut CudaTensor,
    out: &CudaTensor,
    inject: &CudaTensor,
    spec: &HyperSpec,
) {
    assert_eq!(x.cols, spec.width(), "hyper_inject: stream width");
    assert_eq!(
        (out.rows, out.cols, inject.rows, inject.cols),
        (x.rows, spec.hidden, x.rows, spec.streams),
        "hyper_inject: one output row and one weight per stream for each row"
    );
    if x.rows == 0 {
        return;
    }
    x.bf16 = None;
    let s = &cx.gpu.stream;
    cx.gpu.launch(
        &cx.k.flash_next.inject,
        (blocks(spec.hidden, THREADS as usize), x.rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&inject.buf, s)),
            Arg::I32(spec.hidden as i32),
            Arg::I32(spec.streams as i32),
        ],
    );
}

/// See `FlashNextOps::ple_mix`: the two grouped norms, the per-stream gate,
/// the norm of the gated value, then the conv with its state and the sum.
#[allow(clippy::too_many_arguments)]
pub fn ple_mix(
    cx: &Cx,
    streams: &CudaTensor,
    key: &CudaTensor,
    value: &CudaTensor,
    p: &PleParams<CudaWeight>,
    spec: &PleSpec,
    state: &mut CudaTensor,
    batch: &ForwardBatch,
) -> CudaTensor {
    let hs = &spec.hyper;
    let (rows, width) = (batch.num_tokens(), hs.width());
    assert_eq!(
        (
            streams.rows,
            streams.cols,
            key.rows,
            key.cols,
            value.rows,
            value.cols
        ),
        (rows, width, rows, width, rows, hs.hidden),
        "ple_mix: streams and keys [T, streams * hidden], value [T, hidden]"
    );
    let len = spec.state_len();
    assert!(
        len <= PLE_MAX_STATE,
        "a PLE conv of {len} past inputs (at most {PLE_MAX_STATE})"
    );
    assert_eq!(state.cols, width, "ple_mix: conv state width");
    let taps = channels(&p.conv, width * spec.conv_kernel, "PLE conv taps");
    let out = tensor(cx, rows, width);
    if rows == 0 {
        return out;
    }
    let key_n = grouped_rms_norm(cx, key, &p.norm_key, hs.hidden, hs.eps);
    let query_n = grouped_rms_norm(cx, streams, &p.norm_query, hs.hidden, hs.eps);
    let gated = tensor(cx, rows, width);
    let (gpu, s) = (cx.gpu, &cx.gpu.stream);
    gpu.launch(
        &cx.k.flash_next.ple_gate,
        (hs.streams as u32, rows as u32, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&gated.buf, s)),
            Arg::Ptr(ptr(&key_n.buf, s)),
            Arg::Ptr(ptr(&query_n.buf, s)),
            Arg::Ptr(ptr(&value.buf, s)),
            Arg::I32(hs.hidden as i32),
            Arg::I32(hs.streams as i32),
        ],
    );
    let normed = grouped_rms_norm(cx, &gated, &p.norm_conv, hs.hidden, hs.eps);
    // Only the layout's sequence sections are read, which the block size
    // does not change: the step's own inside a step.
    let l = cx.layout(batch, cx.step.as_ref().map_or(1, |st| st.block_size));
    gpu.launch(
        &cx.k.flash_next.ple_conv_add,
        (
            blocks(width, CONV_THREADS as usize),
            batch.seqs.len() as u32,
            1,
        ),
        CONV_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out.buf, s)),
            Arg::Ptr(ptr(&gated.buf, s)),
            Arg::Ptr(ptr(&normed.buf, s)),
            Arg::Ptr(ptr(taps.f32("PLE conv taps"), s)),
            Arg::Ptr(ptr(&state.buf, s)),
            Arg::Ptr(l.seq_start()),
            Arg::Ptr(l.seq_slot()),
            Arg::Ptr(l.token_checkpoint()),
            Arg::I32(width as i32),
            Arg::I32(spec.conv_kernel as i32),
            Arg::I32(spec.conv_dilation as i32),
        ],
    );
    out
}

/// See `FlashNextOps::edit_rows`: device fills and copies.
pub fn edit_rows(cx: &Cx, t: &mut CudaTensor, edit: RowEdit) {
    let row_bytes = t.cols * 4;
    let base = ptr(&t.buf, &cx.gpu.stream);
    match edit {
        RowEdit::Zero(rows) => {
            assert!(rows.end <= t.rows, "zeroing rows {rows:?} of {}", t.rows);
            cx.gpu.fill_bytes(
                base + (rows.start * row_bytes) as u64,
                0,
                rows.len() * row_bytes,
            );
        }
        RowEdit::Copy { src, dst } => {
            assert!(
                src.end <= t.rows && dst + src.len() <= t.rows,
                "copying rows {src:?} to {dst} of {}",
                t.rows
            );
            if src.start != dst && !src.is_empty() {
                cx.gpu.copy_dtod(
                    base + (dst * row_bytes) as u64,
                    base + (src.start * row_bytes) as u64,
                    src.len() * row_bytes,
                );
            }
        }
    }
}

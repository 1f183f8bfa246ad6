//! The hyper-connection steps around each sublayer: the norm with its inject
//! logits (fused or composed), the low-rank gate and stream mean, and the
//! inject of a sublayer's output into the streams.

use kestrel_core::flash_next::{Channels, HyperSpec};

use super::kernels::{HC_GATE_MAX_ROWS, HC_MAX_STREAMS, THREADS};
use super::{channels, tensor};
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaTensor, CudaWeight, Format, Matrix};
use kestrel_kernels::abi::{HcGateArgs, HcNormArgs};

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

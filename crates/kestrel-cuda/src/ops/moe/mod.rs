//! Mixture of experts, two paths.
//!
//! Decode (1..=8 tokens, [`decode_fits`], or every token of a decode-shaped
//! step, [`Cx::decode_shaped`]): three or four launches whose
//! shapes depend only on T and the spec, with the routing never leaving the
//! device, so a step can be recorded in a CUDA graph: router logits (a
//! `gemv`, the shared-expert gate appended as one more row; `gemv_norm`
//! when the block's norm runs inside it, [`norm_moe`]), then at one or
//! two tokens `moe_gate_up`, whose blocks each compute their token's softmax
//! and top-k (the same numbers as `moe_topk`, picks sorted by expert id) before
//! reading each pick's weights by its id, and with more tokens `moe_topk`
//! first and `moe_gate_up` reading its picks; then `moe_down`, which reads
//! the picks. Every (token, expert) pair runs
//! its own dot products; pairs of one row range run side by side, so an expert
//! picked by several tokens is served from L2 after the first read.
//!
//! Prefill (more than 8 tokens, [`prefill_fits`]): also routed on the device
//! with shapes that depend only on T and the spec (`kernels/moe_prefill.cu`):
//! x split into three bf16 parts that sum to it, router logits as a
//! tensor-core product over the three parts (f32-accurate), the same top-k,
//! a count / scan / stable fill that groups the (token, pick) pairs by expert
//! in ascending token order, then two grouped GEMMs on tensor cores (gate_up
//! with SiLU * up in the epilogue, bf16 activations; down with bf16 output) over
//! a fixed upper bound of 64-row tiles, and a combine that adds each token's
//! picks in ascending expert order and the shared expert last. The shared
//! expert runs through the same GEMMs as one dense group.
//!
//! The older prefill path remains for shapes the kernels do not take (and,
//! with the `experiments` feature, on request): the routing is read back and
//! each selected expert runs as two cuBLAS products over its gathered rows,
//! its output scattered back with the routing weight.
//!
//! Under `Precision::F32` a prefill runs through the decode path 8 tokens at
//! a time, so its activations are never rounded to bf16. The plan's
//! `moe.prefill` names the prefill path; [`path`] adds the shape checks.
//!
//! All paths add a token's experts in ascending id order, as the reference
//! does, and the shared expert last.

mod decode;
mod expert_weight;
mod gemm;
mod host_routed;
pub mod kernels;
mod prefill;
mod routing;

use kestrel_core::{MoeSpec, MoeWeights, PreNorm};

use crate::context::Cx;
use crate::device::ptr;
use crate::ops::linear::gemv::norm_fits;
use crate::ops::norm::pre_norm;
use crate::plan::MoePrefill;
use crate::tensor::{CudaTensor, CudaWeight};
use decode::moe_decode;
use host_routed::moe_host_routed;
use prefill::{moe_prefill, norm_split_fits};
use routing::{DECODE_MAX_TOKENS, MoeInput, decode_fits, prefill_fits};

/// Which path a block of `t` tokens of `h` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    Decode,
    DecodeChunks,
    DeviceRouted,
    HostRouted,
}

/// The plan's prefill path, where the block's shape allows it.
fn path(cx: &Cx, t: usize, h: usize, spec: &MoeSpec) -> Path {
    // A decode-shaped step's tokens all take the decode path (each token's
    // sums are then those of its plain decode step).
    // A prompt step's tokens take the prefill path however few they are
    // (`Cx::prompt_step`).
    if (decode_fits(t, h, spec) && !cx.prompt_step())
        || (cx.decode_shaped() && decode_fits(1, h, spec))
    {
        return Path::Decode;
    }
    match cx.plan.moe.prefill {
        MoePrefill::DecodeChunks if decode_fits(DECODE_MAX_TOKENS, h, spec) => Path::DecodeChunks,
        MoePrefill::HostRouted => Path::HostRouted,
        _ if prefill_fits(t, h, spec) => Path::DeviceRouted,
        _ => Path::HostRouted,
    }
}

pub fn moe(cx: &Cx, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
    w.check_shapes(h, spec, |x| x.numel());
    match path(cx, t, h, spec) {
        Path::Decode => moe_decode(cx, MoeInput::Rows(x), w, spec),
        Path::DecodeChunks => moe_decode_chunked(cx, x, w, spec),
        Path::DeviceRouted => moe_prefill(cx, MoeInput::Rows(x), w, spec),
        Path::HostRouted => moe_host_routed(cx, x, w, spec),
    }
}

/// The block on `pre`'s normalised rows. On the decode path the router's
/// product computes the norm itself (`gemv_norm`) and leaves the rows for the
/// experts; on the device-routed prefill `moe_norm_split` does (with the
/// plan's norm fusion); elsewhere the norm runs first.
pub fn norm_moe(
    cx: &Cx,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (t, h) = (pre.residual.rows, pre.residual.cols);
    w.check_shapes(h, spec, |x| x.numel());
    match path(cx, t, h, spec) {
        Path::Decode if norm_fits(cx, t, h, w.router.matrix("router", &cx.gpu.stream).format) => {
            moe_decode(cx, MoeInput::Norm(pre), w, spec)
        }
        Path::DeviceRouted if cx.plan.norm_fusion && norm_split_fits(h) => {
            moe_prefill(cx, MoeInput::Norm(pre), w, spec)
        }
        _ => moe(cx, &pre_norm(cx, pre), w, spec),
    }
}

/// The decode path over any number of tokens, [`DECODE_MAX_TOKENS`] at a time.
fn moe_decode_chunked(
    cx: &Cx,
    x: &CudaTensor,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let gpu = cx.gpu;
    let (t, h, s) = (x.rows, x.cols, &gpu.stream);
    let out = gpu.alloc::<f32>(t * h);
    for first in (0..t).step_by(DECODE_MAX_TOKENS) {
        let rows = DECODE_MAX_TOKENS.min(t - first);
        let bytes = rows * h * 4;
        let offset = (first * h * 4) as u64;
        let chunk = CudaTensor {
            bf16: None,
            rows,
            cols: h,
            buf: gpu.alloc::<f32>(rows * h),
        };
        gpu.copy_dtod(ptr(&chunk.buf, s), ptr(&x.buf, s) + offset, bytes);
        let y = moe_decode(cx, MoeInput::Rows(&chunk), w, spec);
        gpu.copy_dtod(ptr(&out, s) + offset, ptr(&y.buf, s), bytes);
    }
    CudaTensor {
        bf16: None,
        rows: t,
        cols: h,
        buf: out,
    }
}

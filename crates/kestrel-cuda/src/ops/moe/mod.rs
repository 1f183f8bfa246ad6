//! Mixture of experts, two paths.
//!
//! Decode (1..=8 tokens, [`decode_fits`]): three or four launches whose
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
//! The older prefill path remains for shapes the kernels do not take and on
//! request (`KESTREL_MOE_PREFILL=host`, `Gpu::moe_prefill_host`): the routing
//! is read back and each selected expert runs as two cuBLAS products over its
//! gathered rows, its output scattered back with the routing weight.
//!
//! Under `Precision::F32` a prefill runs through the decode path 8 tokens at
//! a time, so its activations are never rounded to bf16.
//!
//! All paths add a token's experts in ascending id order, as the reference
//! does, and the shared expert last.

mod decode;
mod host_routed;
mod prefill;

use kestrel_core::{MoeSpec, MoeWeights, PreNorm};

use cudarc::driver::CudaSlice;

use crate::device::{Arg, Gpu, ptr};
use crate::ops::linear::norm_fits;
use crate::ops::norm::pre_norm;
use crate::precision::Precision;
use crate::tensor::{CudaTensor, CudaWeight, Half};
use decode::moe_decode;
use host_routed::moe_host_routed;
use prefill::{moe_prefill, norm_split_fits};

pub use prefill::{prefill_gemm, prefill_gemm_sm90};

/// Softmax and top-k of router logits `[t, ld]` (the first `num_experts`
/// columns): picked ids and weights `[t, top_k]`, in ascending expert id so
/// that every path adds them in the reference's order. A block per token, a
/// thread per expert, up to a decode's tokens (the shortest latency); a warp
/// per token beyond (the most tokens at once).
fn top_k(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    ld: usize,
    t: usize,
    spec: &MoeSpec,
) -> (CudaSlice<i32>, CudaSlice<f32>) {
    let (ne, k, s) = (spec.num_experts, spec.top_k, &gpu.stream);
    let ids = gpu.alloc::<i32>(t * k);
    let weights = gpu.alloc::<f32>(t * k);
    // Many tokens: a warp each (the same numbers), all on the GPU at once;
    // that kernel also takes the token count, after ld.
    let warps = t > DECODE_MAX_TOKENS;
    let per_block = THREADS as usize / 32;
    let (f, grid, block) = if warps {
        (&gpu.k.moe_topk_warps, t.div_ceil(per_block), THREADS)
    } else {
        (&gpu.k.moe_topk, t, 32 * ne.div_ceil(32) as u32)
    };
    let mut args = vec![
        Arg::Ptr(ptr(&ids, s)),
        Arg::Ptr(ptr(&weights, s)),
        Arg::Ptr(ptr(logits, s)),
        Arg::I32(ld as i32),
    ];
    if warps {
        args.push(Arg::I32(t as i32));
    }
    args.extend([
        Arg::I32(ne as i32),
        Arg::I32(k as i32),
        Arg::I32(spec.norm_topk_prob as i32),
    ]);
    gpu.launch(f, (grid as u32, 1, 1), block, 0, &args);
    (ids, weights)
}

/// The shared expert's weights as device addresses: `gate_up` `[2SI, H]`,
/// `down` `[H, SI]`, and its gate row when it has one.
#[derive(Clone, Copy)]
struct SharedExpert {
    gate_up: u64,
    down: u64,
    inter: usize,
    /// The format of all three matrices.
    half: Half,
    /// The `[1, H]` gate row (`None`: the expert is added ungated).
    gate: Option<u64>,
}

impl SharedExpert {
    /// `None` without a shared expert; a gate without one is ignored, as in
    /// the reference.
    fn of(gpu: &Gpu, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> Option<Self> {
        let s = &gpu.stream;
        match (&w.shared_gate_up, &w.shared_down, spec.shared_intermediate) {
            (Some(gu), Some(dn), Some(si)) => {
                let (gate_up, half) = gu.matrix("shared gate_up");
                let (down, down_half) = dn.matrix("shared down");
                let gate = w
                    .shared_gate
                    .as_ref()
                    .map(|g| g.matrix("shared expert gate"));
                assert!(
                    down_half == half && gate.is_none_or(|g| g.1 == half),
                    "the shared expert's weights mix bf16 and f16"
                );
                Some(SharedExpert {
                    gate_up: ptr(gate_up, s),
                    down: ptr(down, s),
                    inter: si,
                    half,
                    gate: gate.map(|g| ptr(g.0, s)),
                })
            }
            _ => None,
        }
    }
}

const THREADS: u32 = 256;

/// Most tokens the decode path takes (the `gemv` router's row limit).
const DECODE_MAX_TOKENS: usize = 8;
/// Most experts the decode top-k holds (`MOE_MAX_EXPERTS` in moe.cu).
const DECODE_MAX_EXPERTS: usize = 512;
/// Most warps (experts per token, shared one included) in a decode block:
/// the kernels' launch bounds allow 512 threads (`MOE_MAX_ITEMS` in moe.cu).
const DECODE_MAX_ITEMS: usize = 16;
/// Most (token, pick) pairs of the prefill path (32-bit row indices with room
/// to spare in every product).
const PREFILL_MAX_PAIRS: usize = 1 << 24;

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

/// What a path runs on: rows, or rows still to be normalised, which the
/// path's first kernel then normalises (decode: the router's product, which
/// keeps the rows for the experts; prefill: `moe_norm_split`).
enum MoeInput<'a> {
    Rows(&'a CudaTensor),
    Norm(PreNorm<'a, CudaTensor, CudaWeight>),
}

impl MoeInput<'_> {
    /// Tokens and hidden size.
    fn shape(&self) -> (usize, usize) {
        match self {
            MoeInput::Rows(x) => (x.rows, x.cols),
            MoeInput::Norm(pre) => (pre.residual.rows, pre.residual.cols),
        }
    }
}

/// Whether `moe` takes `t` tokens through the device-routed prefill path.
fn takes_prefill(gpu: &Gpu, t: usize, h: usize, spec: &MoeSpec) -> bool {
    !decode_fits(t, h, spec)
        && !(gpu.precision == Precision::F32 && decode_fits(DECODE_MAX_TOKENS, h, spec))
        && !gpu.moe_prefill_host
        && prefill_fits(t, h, spec)
}

pub fn moe(gpu: &Gpu, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
    let (t, h) = (x.rows, x.cols);
    w.check_shapes(h, spec, |x| x.numel());
    if decode_fits(t, h, spec) {
        return moe_decode(gpu, MoeInput::Rows(x), w, spec);
    }
    if gpu.precision == Precision::F32 && decode_fits(DECODE_MAX_TOKENS, h, spec) {
        return moe_decode_chunked(gpu, x, w, spec);
    }
    if takes_prefill(gpu, t, h, spec) {
        return moe_prefill(gpu, MoeInput::Rows(x), w, spec);
    }
    moe_host_routed(gpu, x, w, spec)
}

/// The block on `pre`'s normalised rows. On the decode path the router's
/// product computes the norm itself (`gemv_norm`) and leaves the rows for the
/// experts; elsewhere the norm runs first.
pub fn norm_moe(
    gpu: &Gpu,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (t, h) = (pre.residual.rows, pre.residual.cols);
    w.check_shapes(h, spec, |x| x.numel());
    if decode_fits(t, h, spec) && norm_fits(gpu, t, h, w.router.matrix("router").1) {
        return moe_decode(gpu, MoeInput::Norm(pre), w, spec);
    }
    if gpu.norm_fusion && takes_prefill(gpu, t, h, spec) && norm_split_fits(h) {
        return moe_prefill(gpu, MoeInput::Norm(pre), w, spec);
    }
    moe(gpu, &pre_norm(gpu, pre), w, spec)
}

/// The decode path over any number of tokens, [`DECODE_MAX_TOKENS`] at a time.
fn moe_decode_chunked(
    gpu: &Gpu,
    x: &CudaTensor,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
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
        let y = moe_decode(gpu, MoeInput::Rows(&chunk), w, spec);
        gpu.copy_dtod(ptr(&out, s) + offset, ptr(&y.buf, s), bytes);
    }
    CudaTensor {
        bf16: None,
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
}

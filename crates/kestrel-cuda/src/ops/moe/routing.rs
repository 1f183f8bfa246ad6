//! What every MoE path shares: its input, the shared expert's weights, the
//! top-k picks, and which block shapes the device paths take.

use cudarc::driver::CudaSlice;
use kestrel_core::{MoeSpec, MoeWeights, PreNorm};

use crate::context::Cx;
use crate::device::{Gpu, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaTensor, CudaWeight, Format, Matrix};

/// Softmax and top-k of router logits `[t, ld]` (the first `num_experts`
/// columns): picked ids and weights `[t, top_k]`, in ascending expert id so
/// that every path adds them in the reference's order. A block per token, a
/// thread per expert, up to a decode's tokens (the shortest latency); a warp
/// per token beyond (the most tokens at once).
pub fn top_k(
    cx: &Cx,
    logits: &CudaSlice<f32>,
    ld: usize,
    t: usize,
    spec: &MoeSpec,
) -> (CudaSlice<i32>, CudaSlice<f32>) {
    let gpu = cx.gpu;
    let (ne, k, s) = (spec.num_experts, spec.top_k, &gpu.stream);
    let ids = gpu.alloc::<i32>(t * k);
    let weights = gpu.alloc::<f32>(t * k);
    // Many tokens: a warp each (the same numbers), all on the GPU at once;
    // that kernel also takes the token count, after ld.
    let warps = t > DECODE_MAX_TOKENS;
    let per_block = THREADS as usize / 32;
    let (f, grid, block) = if warps {
        (&cx.k.moe.moe_topk_warps, t.div_ceil(per_block), THREADS)
    } else {
        (&cx.k.moe.moe_topk, t, 32 * ne.div_ceil(32) as u32)
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
/// `down` `[H, SI]`, and its gate row when it has one (a row
/// appended to the router's product, so in the router's format).
#[derive(Clone, Copy)]
pub struct SharedExpert {
    pub gate_up: Matrix,
    pub down: Matrix,
    pub inter: usize,
    /// The `[1, H]` gate row (`None`: the expert is added ungated).
    pub gate: Option<u64>,
}

impl SharedExpert {
    /// `None` without a shared expert; a gate without one is ignored, as in
    /// the reference.
    pub fn of(gpu: &Gpu, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> Option<Self> {
        let s = &gpu.stream;
        match (&w.shared_gate_up, &w.shared_down, spec.shared_intermediate) {
            (Some(gu), Some(dn), Some(si)) => {
                let gate_up = gu.matrix("shared gate_up", s);
                let down = dn.matrix("shared down", s);
                let router = w.router.format();
                let gate = w
                    .shared_gate
                    .as_ref()
                    .map(|g| g.matrix("shared expert gate", s));
                assert!(
                    gate.is_none_or(|g| Some(g.format) == router && g.format != Format::Fp8),
                    "the shared expert's gate must have the router's 16-bit format"
                );
                Some(SharedExpert {
                    gate_up,
                    down,
                    inter: si,
                    gate: gate.map(|g| g.ptr),
                })
            }
            _ => None,
        }
    }
}

pub const THREADS: u32 = 256;

/// Most tokens the decode path takes (the `gemv` router's row limit).
pub const DECODE_MAX_TOKENS: usize = 8;
/// Most experts the decode top-k holds (`MOE_MAX_EXPERTS` in moe.cu).
pub const DECODE_MAX_EXPERTS: usize = 512;
/// Most warps (experts per token, shared one included) in a decode block:
/// the kernels' launch bounds allow 512 threads (`MOE_MAX_ITEMS` in moe.cu).
pub const DECODE_MAX_ITEMS: usize = 16;
/// Most (token, pick) pairs of the prefill path (32-bit row indices with room
/// to spare in every product).
pub const PREFILL_MAX_PAIRS: usize = 1 << 24;

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
pub enum MoeInput<'a> {
    Rows(&'a CudaTensor),
    Norm(PreNorm<'a, CudaTensor, CudaWeight>),
}

impl MoeInput<'_> {
    /// Tokens and hidden size.
    pub fn shape(&self) -> (usize, usize) {
        match self {
            MoeInput::Rows(x) => (x.rows, x.cols),
            MoeInput::Norm(pre) => (pre.residual.rows, pre.residual.cols),
        }
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

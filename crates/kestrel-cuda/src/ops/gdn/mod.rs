//! Gated DeltaNet: conv1d with carried state, the delta-rule recurrence with
//! f32 state, and the gated RMSNorm.
//!
//! Three paths, chosen from shapes and the step's host hints only:
//! - decode (every sequence has at most [`DECODE_MAX_TOKENS`] new tokens:
//!   a decode step, or the verify step of speculative decoding; Dk = Dv =
//!   128, Hv/Hk in {1, 2, 4}, conv kernel 4): one fused kernel
//!   (`gdn_decode.cu`) that takes each sequence's tokens one after another.
//!   Its launch depends only on the number of sequences, so it is replayable;
//! - prefill (Dk = Dv = 128, no state checkpoints): token-tiled conv, the chunked form in two
//!   kernels (`gdn_chunk.cu`, products on tensor cores: one TF32 pass in the
//!   serving precision, f32-accurate 3xTF32 in the reference one: the
//!   plan's `gdn`), then the gated norm. Eager only: its grid follows the
//!   longest sequence;
//! - anything else: conv, the token-by-token recurrence, the gated norm.
//!
//! State checkpoints (`SeqChunk::state_checkpoints`) are written by the
//! decode kernel and by the conv and recurrence kernels, which is why a step
//! that has them never takes the chunked form: a verify step mixed with a
//! long prefill chunk runs its prefill through the recurrence. A prefix-cache
//! snapshot inside a pass (`SeqChunk::state_snapshot`) goes through the same
//! per-token slot list; the chunked form writes it where it falls on a chunk
//! boundary (the engine places it there: `state_snapshot_alignment`).

mod chunked;
mod io;
pub mod kernels;
mod recurrent;

use kestrel_core::{ForwardBatch, GdnSpec, GdnWeights};

use crate::cache::CudaCache;
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::ops::linear::gemm::bf16_copy_for;
use crate::tensor::{CudaTensor, CudaWeight};
use chunked::chunked;
use io::Io;
use kernels::{
    CHUNK, DECODE_CONV_KERNEL, DECODE_MAX_TOKENS, GATED_NORM_ROWS_PER_BLOCK, HEAD_DIM,
    MAX_CONV_KERNEL, MAX_HEAD_V_DIM,
};
use recurrent::{conv, decode, recurrent, sigmoid_gate};

pub fn gated_delta_net(
    cx: &Cx,
    proj: &CudaTensor,
    w: &GdnWeights<CudaWeight>,
    spec: &GdnSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) -> CudaTensor {
    validate(proj, w, spec, cache, layer, batch);
    let gpu = cx.gpu;
    let t = batch.num_tokens();
    let value_width = spec.value_width();
    if t == 0 {
        return CudaTensor {
            bf16: None,
            rows: 0,
            cols: value_width,
            buf: gpu.alloc(0),
        };
    }
    let l = cx.layout(batch, cache.spec.block_size);
    let io = Io {
        proj,
        w,
        spec,
        conv_state: ptr(&cache.conv[layer], &gpu.stream),
        state: ptr(&cache.recurrent[layer], &gpu.stream),
        l: &l,
        batch,
    };
    let square = spec.head_k_dim == HEAD_DIM && spec.head_v_dim == HEAD_DIM;
    // Per-token checkpoints (verify steps) need a token-at-a-time path; a
    // prefix-cache snapshot at a chunk boundary is one the chunked form has.
    let checkpoints = batch.seqs.iter().any(|q| !q.state_checkpoints.is_empty());
    let snapshots_on_chunks = batch.seqs.iter().all(|q| {
        q.state_snapshot
            .is_none_or(|s| s.after.is_multiple_of(CHUNK))
    });
    if (cx.few_rows(l.max_new, DECODE_MAX_TOKENS) || cx.plan.batch_invariant)
        && square
        && spec.conv_kernel == DECODE_CONV_KERNEL
        && let Some(f) = cx.k.gdn.decode(spec.num_v_heads / spec.num_k_heads)
    {
        return decode(cx, &io, f);
    }
    let core = if square && !checkpoints && snapshots_on_chunks && !cx.plan.batch_invariant {
        chunked(cx, &io)
    } else {
        recurrent(cx, &io, &conv(cx, &io))
    };
    let out = gpu.alloc::<f32>(t * value_width);
    // Prefill: also the bf16 copy out_proj (cuBLAS) reads.
    let out_bf16 = bf16_copy_for(cx, t, value_width);
    let s = &gpu.stream;
    let rows = t * spec.num_v_heads;
    gpu.launch(
        &cx.k.gdn.gated_norm,
        (blocks(rows, GATED_NORM_ROWS_PER_BLOCK), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(out_bf16.as_ref().map_or(0, |b| ptr(b, s))),
            Arg::Ptr(ptr(&core, s)),
            Arg::Ptr(ptr(&proj.buf, s)),
            Arg::I32(proj.cols as i32),
            Arg::I32(spec.conv_dim() as i32),
            Arg::Ptr(ptr(w.norm.f32("gated norm"), s)),
            Arg::I32(spec.num_v_heads as i32),
            Arg::I32(spec.head_v_dim as i32),
            Arg::F32(spec.norm_eps),
            Arg::I32(rows as i32),
            Arg::I32(sigmoid_gate(spec)),
        ],
    );
    CudaTensor {
        bf16: out_bf16,
        rows: t,
        cols: value_width,
        buf: out,
    }
}

fn validate(
    proj: &CudaTensor,
    w: &GdnWeights<CudaWeight>,
    spec: &GdnSpec,
    cache: &CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) {
    let t = batch.num_tokens();
    let (hk, hv, dk, dv) = (
        spec.num_k_heads,
        spec.num_v_heads,
        spec.head_k_dim,
        spec.head_v_dim,
    );
    let c = spec.conv_dim();
    assert_eq!(
        proj.rows, t,
        "gated_delta_net input has {} rows for {t} tokens",
        proj.rows
    );
    assert_eq!(
        proj.cols,
        spec.proj_width(),
        "gated_delta_net input width {} != {}",
        proj.cols,
        spec.proj_width()
    );
    assert!(
        layer < cache.conv.len(),
        "GDN layer {layer} out of range ({} layers)",
        cache.conv.len()
    );
    assert_eq!(
        cache.spec.gdn.as_ref(),
        Some(spec),
        "cache was built for another GdnSpec"
    );
    assert!(
        hk > 0 && hv % hk == 0,
        "{hv} value heads are not a multiple of {hk} key heads"
    );
    assert!(
        (1..=MAX_CONV_KERNEL).contains(&spec.conv_kernel),
        "conv kernel {} outside 1..={MAX_CONV_KERNEL}",
        spec.conv_kernel
    );
    assert!(dk <= 256, "head_k_dim {dk} above the supported 256");
    assert!(
        dv <= MAX_HEAD_V_DIM,
        "head_v_dim {dv} above the supported {MAX_HEAD_V_DIM}"
    );
    assert_eq!(
        w.conv.numel(),
        c * spec.conv_kernel,
        "conv weight must be [{c}, {}]",
        spec.conv_kernel
    );
    assert_eq!(w.a_log.numel(), hv, "A_log must have {hv} values");
    assert_eq!(w.dt_bias.numel(), hv, "dt_bias must have {hv} values");
    assert_eq!(
        w.norm.numel(),
        dv,
        "gated norm weight must have {dv} values"
    );
    cache.check_slots(batch);
}

//! Qwen3.8-Flash-Next's operations (`FlashNextOps`) on the device: here the
//! initial streams, the grouped norm and the PLE gate and conv; in `hyper`
//! the hyper-connection steps, in `pools` the tensors kept between steps,
//! and in [`qsa`] the QSA indexer and the sparse attention it chooses.
//!
//! The hyper-connection steps run as small kernels around the products.
//! Fused forms (`hc_norm`: the pending sublayer output added, the grouped
//! norm and the inject logits in one pass; `hc_low_rank` and `hc_gate_mix`:
//! the gate and stream mean of a decode-shaped step) are exact but measured
//! slower, and only the plan of an `experiments` build takes them.

mod backend;
mod hyper;
pub mod kernels;
mod pools;
pub mod qsa;

use kestrel_core::ForwardBatch;
use kestrel_core::flash_next::{Channels, PleParams, PleSpec};

use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::tensor::{CudaTensor, CudaWeight};
use kernels::{CONV_THREADS, PLE_MAX_STATE, THREADS};

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

//! The token-at-a-time GDN paths: the fused decode kernel, and conv plus
//! the recurrence for shapes without a chunked kernel.

use cudarc::driver::{CudaFunction, CudaSlice};
use kestrel_kernels::abi::{GdnDecodeArgs, GdnRecurrentArgs};

use super::io::{Io, query_scale};
use super::kernels::{COLS_PER_BLOCK, CONV_TOKENS, CONV_V4_MAX_KERNEL};
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::tensor::CudaTensor;

/// The kernels' flag for the gated norm's activation.
pub fn sigmoid_gate(spec: &kestrel_core::GdnSpec) -> i32 {
    (spec.output_gate == kestrel_core::GdnGate::Sigmoid) as i32
}

/// The fused decode kernel: clusters of 8 blocks per (sequence, key head),
/// each sequence's new tokens one after another (with their checkpoints).
pub fn decode(cx: &Cx, io: &Io, f: &CudaFunction) -> CudaTensor {
    let gpu = cx.gpu;
    let (spec, s) = (io.spec, &gpu.stream);
    let t = io.l.tokens;
    let out = gpu.alloc::<f32>(t * spec.value_width());
    gpu.launch_plain(
        f,
        (8, spec.num_k_heads as u32, io.l.seqs as u32),
        128,
        0,
        &[Arg::record(&GdnDecodeArgs {
            out: ptr(&out, s),
            proj: ptr(&io.proj.buf, s),
            proj_stride: io.proj.cols as i32,
            conv_w: ptr(io.w.conv.bf16("conv1d"), s),
            conv_state: io.conv_state,
            state: io.state,
            a_log: ptr(io.w.a_log.f32("A_log"), s),
            dt_bias: ptr(io.w.dt_bias.f32("dt_bias"), s),
            norm_w: ptr(io.w.norm.f32("gated norm"), s),
            seq_start: io.l.seq_start(),
            seq_slot: io.l.seq_slot(),
            token_ckpt: io.l.token_checkpoint(),
            hk: spec.num_k_heads as i32,
            hv: spec.num_v_heads as i32,
            q_scale: query_scale(spec.head_k_dim),
            eps: spec.norm_eps,
            sigmoid_gate: sigmoid_gate(spec),
        })],
    );
    CudaTensor {
        bf16: None,
        rows: t,
        cols: spec.value_width(),
        buf: out,
    }
}

/// Causal conv + SiLU of the qkv channels, `[T, conv_dim]`; advances the
/// conv state (and writes the checkpoints of a verify step).
pub fn conv(cx: &Cx, io: &Io) -> CudaSlice<f32> {
    let gpu = cx.gpu;
    let (c, s) = (io.spec.conv_dim(), &gpu.stream);
    let out = gpu.alloc::<f32>(io.l.tokens * c);
    // Four channels per thread when every row allows 16-byte accesses (the
    // buffers themselves are allocated 256-byte aligned) and the taps fit
    // its registers.
    let (f, per_thread) = if c.is_multiple_of(4)
        && io.proj.cols.is_multiple_of(4)
        && io.spec.conv_kernel <= CONV_V4_MAX_KERNEL
    {
        (&cx.k.gdn.conv_v4, 4)
    } else {
        (&cx.k.gdn.conv, 1)
    };
    gpu.launch(
        f,
        (
            blocks(c, 128 * per_thread),
            blocks(io.l.max_new, CONV_TOKENS),
            io.l.seqs as u32,
        ),
        128,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&io.proj.buf, s)),
            Arg::I32(io.proj.cols as i32),
            Arg::Ptr(ptr(io.w.conv.bf16("conv1d"), s)),
            Arg::Ptr(io.conv_state),
            Arg::Ptr(io.l.seq_start()),
            Arg::Ptr(io.l.seq_slot()),
            Arg::Ptr(io.l.token_checkpoint()),
            Arg::I32(c as i32),
            Arg::I32(io.spec.conv_kernel as i32),
        ],
    );
    out
}

/// The token-by-token recurrence, `[T, Hv*Dv]` before the gated norm (with
/// the checkpoints of a verify step).
pub fn recurrent(cx: &Cx, io: &Io, conv_out: &CudaSlice<f32>) -> CudaSlice<f32> {
    let gpu = cx.gpu;
    let (spec, s) = (io.spec, &gpu.stream);
    let (dk, dv) = (spec.head_k_dim, spec.head_v_dim);
    let core = gpu.alloc::<f32>(io.l.tokens * spec.value_width());
    gpu.launch(
        &cx.k.gdn.recurrent,
        (
            blocks(dv, COLS_PER_BLOCK),
            spec.num_v_heads as u32,
            io.l.seqs as u32,
        ),
        128,
        ((dk * COLS_PER_BLOCK + 2 * dk) * 4) as u32,
        &[Arg::record(&GdnRecurrentArgs {
            core: ptr(&core, s),
            qkv: ptr(conv_out, s),
            proj: ptr(&io.proj.buf, s),
            proj_stride: io.proj.cols as i32,
            b_offset: io.b_offset() as i32,
            a_offset: io.a_offset() as i32,
            a_log: ptr(io.w.a_log.f32("A_log"), s),
            dt_bias: ptr(io.w.dt_bias.f32("dt_bias"), s),
            state: io.state,
            seq_start: io.l.seq_start(),
            seq_slot: io.l.seq_slot(),
            token_ckpt: io.l.token_checkpoint(),
            hk: spec.num_k_heads as i32,
            hv: spec.num_v_heads as i32,
            dk: dk as i32,
            dv: dv as i32,
        })],
    );
    core
}

//! The chunked GDN prefill: per-chunk preparation for all chunks at once,
//! then the state pass over chunks (`gdn_chunk.cu`), products on tensor
//! cores in the plan's arithmetic (`gdn.chunk_math`, `gdn.state_pass`).

use cudarc::driver::CudaSlice;
use kestrel_kernels::abi::GdnChunkStateArgs;

use super::io::{Io, query_scale};
use super::kernels::{
    CHUNK, CHUNK_FLOATS, CONV_FUSED_MAX_KERNEL, HEAD_DIM, PREP_SMEM_BYTES, STATE_SMEM_BYTES,
    STATE_THREADS,
};
use super::recurrent::conv;
use crate::context::Cx;
use crate::device::{blocks, ptr};
use crate::launch::Arg;
use crate::plan::Mma;

/// The chunked form: per-chunk preparation for all chunks at once, then the
/// state pass over chunks per (sequence, head, 32 state columns). The
/// preparation computes the conv itself (and advances the conv state) where
/// the conv has at most `CONV_FUSED_MAX_KERNEL` taps and the input rows allow
/// 16-byte loads; otherwise the conv kernel runs first.
pub fn chunked(cx: &Cx, io: &Io) -> CudaSlice<f32> {
    let gpu = cx.gpu;
    let (spec, s, l) = (io.spec, &gpu.stream, io.l);
    let fused_conv = spec.conv_kernel <= CONV_FUSED_MAX_KERNEL && io.proj.cols.is_multiple_of(4);
    let conv_out = (!fused_conv).then(|| conv(cx, io));
    let (x, x_stride, conv_w, conv_state) = match &conv_out {
        Some(out) => (ptr(out, s), spec.conv_dim(), 0, 0),
        None => (
            ptr(&io.proj.buf, s),
            io.proj.cols,
            ptr(io.w.conv.bf16("conv1d"), s),
            io.conv_state,
        ),
    };
    let hv = spec.num_v_heads;
    // Every sequence's chunks, the last one partial (the batch is on the host).
    let chunks: usize = io
        .batch
        .seqs
        .iter()
        .map(|q| q.num_tokens.div_ceil(CHUNK))
        .sum();
    let scratch = gpu.alloc::<f32>(chunks * hv * CHUNK_FLOATS);
    let tc = cx.plan.gdn.chunk_math as i32;
    gpu.launch(
        &cx.k.gdn.chunk_prep,
        (blocks(l.max_new, CHUNK), hv as u32, l.seqs as u32),
        256,
        PREP_SMEM_BYTES as u32,
        &[
            Arg::Ptr(ptr(&scratch, s)),
            Arg::Ptr(x),
            Arg::I32(x_stride as i32),
            Arg::Ptr(conv_w),
            Arg::Ptr(conv_state),
            Arg::I32(spec.conv_kernel as i32),
            Arg::Ptr(ptr(&io.proj.buf, s)),
            Arg::I32(io.proj.cols as i32),
            Arg::I32(io.b_offset() as i32),
            Arg::I32(io.a_offset() as i32),
            Arg::Ptr(ptr(io.w.a_log.f32("A_log"), s)),
            Arg::Ptr(ptr(io.w.dt_bias.f32("dt_bias"), s)),
            Arg::Ptr(l.seq_start()),
            Arg::Ptr(l.seq_slot()),
            Arg::I32(spec.num_k_heads as i32),
            Arg::I32(hv as i32),
            Arg::F32(query_scale(spec.head_k_dim)),
            Arg::I32(tc),
        ],
    );
    let core = gpu.alloc::<f32>(l.tokens * spec.value_width());
    // The one-pass (serving) arithmetic on wgmma and TMA where the plan says
    // so: the same results.
    let wg = cx.plan.gdn.state_pass == Mma::Wgmma;
    let state_pass = if wg {
        &cx.k.gdn.chunk_state_wg
    } else {
        &cx.k.gdn.chunk_state
    };
    let mut args = vec![Arg::record(&GdnChunkStateArgs {
        core: ptr(&core, s),
        scratch: ptr(&scratch, s),
        state: io.state,
        seq_start: l.seq_start(),
        seq_slot: l.seq_slot(),
        hv: hv as i32,
        tc,
        // The conv state to advance when the preparation computed the conv.
        conv_x: x,
        conv_x_stride: x_stride as i32,
        conv_state,
        conv_kernel: spec.conv_kernel as i32,
        hk: spec.num_k_heads as i32,
        // Prefix-cache snapshots at chunk boundaries (none: no loads).
        token_ckpt: if io
            .batch
            .seqs
            .iter()
            .any(|q| q.state_snapshot.is_some_and(|s| s.slot.is_some()))
        {
            l.token_checkpoint()
        } else {
            0
        },
    })];
    if wg {
        // The records as rows of 128 and of 64 floats, for TMA.
        let floats = chunks * hv * CHUNK_FLOATS;
        args.push(Arg::TensorMap(scratch_map(ptr(&scratch, s), floats, 128)));
        args.push(Arg::TensorMap(scratch_map(ptr(&scratch, s), floats, 64)));
    }
    gpu.launch(
        state_pass,
        ((HEAD_DIM / 32) as u32, hv as u32, l.seqs as u32),
        STATE_THREADS,
        STATE_SMEM_BYTES as u32,
        &args,
    );
    core
}

/// A TMA tensor map over `floats` f32 at `base` seen as rows of `width`:
/// boxes of 32 floats (128 bytes) by 64 rows, in the 128-byte swizzle of
/// `gdn_chunk_state_wg`'s tiles.
fn scratch_map(base: u64, floats: usize, width: usize) -> [u64; 16] {
    use cudarc::driver::sys::{
        CUresult, CUtensorMap, CUtensorMapDataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave,
        CUtensorMapL2promotion, CUtensorMapSwizzle, cuTensorMapEncodeTiled,
    };
    assert!(floats.is_multiple_of(width), "records on whole rows");
    let dims = [width as u64, (floats / width) as u64];
    let strides = [(width * 4) as u64];
    let boxes = [32u32, 64];
    let element_strides = [1u32, 1];
    let mut map = CUtensorMap { opaque: [0; 16] };
    // SAFETY: the arrays outlive the call and have the lengths rank 2 asks for.
    let r = unsafe {
        cuTensorMapEncodeTiled(
            &mut map,
            CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            2,
            base as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            element_strides.as_ptr(),
            CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    assert_eq!(
        r,
        CUresult::CUDA_SUCCESS,
        "cuTensorMapEncodeTiled over {floats} floats in rows of {width}"
    );
    map.opaque
}

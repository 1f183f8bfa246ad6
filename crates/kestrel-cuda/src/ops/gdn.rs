//! Gated DeltaNet: conv1d with carried state, the delta-rule recurrence with
//! f32 state, and the gated RMSNorm.
//!
//! Three paths, chosen from shapes and the step's host hints only:
//! - decode (every sequence has at most one new token, Dk = Dv = 128,
//!   Hv/Hk in {1, 2, 4}, conv kernel 4): one fused kernel (`gdn_decode.cu`).
//!   Its launch depends only on the number of sequences, so it is replayable;
//! - prefill (Dk = Dv = 128): token-tiled conv, the chunked form in two
//!   kernels (`gdn_chunk.cu`, products on tensor cores: one TF32 pass in the
//!   serving precision, f32-accurate 3xTF32 in the reference one; see
//!   [`ChunkMath`]), then the gated norm. Eager only: its grid follows the
//!   longest sequence;
//! - anything else: conv, the token-by-token recurrence, the gated norm.

use cudarc::driver::CudaFunction;
use cudarc::driver::sys::CUfunction_attribute_enum;
use kestrel_core::{ForwardBatch, GdnSpec, GdnWeights};

use crate::cache::CudaCache;
use crate::device::{Arg, Gpu, blocks, check, ptr};
use crate::ops::linear::bf16_copy_for;
use crate::precision::Precision;
use crate::step::StepLayout;
use crate::switches::GdnMathChoice;
use crate::tensor::{CudaTensor, CudaWeight};

/// Mirror `GDN_MAX_KERNEL` (gdn.cuh), `GDN_CONV_TOKENS`, `GDN_COLS` and
/// `GATED_NORM_MAX_PER_LANE` (gdn.cu).
const MAX_CONV_KERNEL: usize = 8;
const CONV_TOKENS: usize = 64;
/// Most conv taps `gdn_chunk_prep` computes itself (`CONV_FUSED_MAX_KERNEL`
/// in `kernels/gdn_chunk.cu`).
const CONV_FUSED_MAX_KERNEL: usize = 4;
/// Most conv taps `gdn_conv_v4` takes (its `KMAX`).
const CONV_V4_MAX_KERNEL: usize = 4;
const COLS_PER_BLOCK: usize = 32;
/// Rows (token, value head) per block of `gdn_gated_norm`: one warp each.
const GATED_NORM_ROWS_PER_BLOCK: usize = 8;
/// Largest head_v_dim the gated norm keeps in registers (8 values per lane).
const MAX_HEAD_V_DIM: usize = 256;
/// The head size of the decode and chunked kernels.
const HEAD_DIM: usize = 128;
/// The conv kernel size the fused decode kernel is built for.
const DECODE_CONV_KERNEL: usize = 4;
/// Mirrors `CH` and `CHUNK_FLOATS` of `kernels/gdn_chunk.cu`: chunk length,
/// and the floats of one (chunk, head) record of the prefill scratch (padded
/// to whole rows of 128 floats for the state pass's TMA boxes).
const CHUNK: usize = 64;
const CHUNK_FLOATS: usize = 4 * HEAD_DIM * CHUNK + CHUNK * CHUNK + 128;
/// Dynamic shared memory of the chunked kernels (`PREP_SMEM_BYTES` and
/// `STATE_SMEM_BYTES` in gdn_chunk.cu): the prep's padded q and k rows
/// (`QS`) and A's (`AS`); the state pass's seven padded tiles.
const PREP_SMEM_BYTES: usize = (2 * CHUNK * (HEAD_DIM + 4) + CHUNK * (CHUNK + 4)) * 4;
const STATE_SMEM_BYTES: usize = 155_648;
/// Threads of a `gdn_chunk_state` block (its `STATE_THREADS`).
const STATE_THREADS: u32 = 256;

/// The arithmetic of the chunked kernels' dense products (the `tc` argument
/// of `gdn_chunk.cu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkMath {
    /// f32-accurate 3xTF32 on tensor cores: the reference precision's
    /// default (`KESTREL_GDN_PREFILL=3xtf32` forces it).
    Tf32x3 = 1,
    /// One TF32 pass per product: the serving (bf16) precision's default
    /// (`KESTREL_GDN_PREFILL=tf32` forces it).
    Tf32 = 2,
}

/// The chunked kernels' arithmetic under `precision`, unless
/// `KESTREL_GDN_PREFILL` (read once) names one.
fn chunk_math(precision: Precision, forced: GdnMathChoice) -> ChunkMath {
    match (forced, precision) {
        (GdnMathChoice::Tf32x3, _) | (GdnMathChoice::Auto, Precision::F32) => ChunkMath::Tf32x3,
        (GdnMathChoice::Tf32, _) | (GdnMathChoice::Auto, Precision::Bf16) => ChunkMath::Tf32,
    }
}

pub fn gated_delta_net(
    gpu: &Gpu,
    proj: &CudaTensor,
    w: &GdnWeights<CudaWeight>,
    spec: &GdnSpec,
    cache: &mut CudaCache,
    layer: usize,
    batch: &ForwardBatch,
) -> CudaTensor {
    validate(proj, w, spec, cache, layer, batch);
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
    let l = gpu.layout(batch, cache.spec.block_size);
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
    if l.max_new <= 1
        && square
        && spec.conv_kernel == DECODE_CONV_KERNEL
        && let Some(f) = decode_kernel(gpu, spec.num_v_heads / spec.num_k_heads)
    {
        return decode(gpu, &io, f);
    }
    let core = if square {
        chunked(gpu, &io)
    } else {
        recurrent(gpu, &io, &conv(gpu, &io))
    };
    let out = gpu.alloc::<f32>(t * value_width);
    // Prefill: also the bf16 copy out_proj (cuBLAS) reads.
    let out_bf16 = bf16_copy_for(gpu, t, value_width);
    let s = &gpu.stream;
    let rows = t * spec.num_v_heads;
    gpu.launch(
        &gpu.k.gdn_gated_norm,
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
        ],
    );
    CudaTensor {
        bf16: out_bf16,
        rows: t,
        cols: value_width,
        buf: out,
    }
}

/// What every path reads and writes.
struct Io<'a> {
    proj: &'a CudaTensor,
    w: &'a GdnWeights<CudaWeight>,
    spec: &'a GdnSpec,
    conv_state: u64,
    state: u64,
    l: &'a StepLayout,
    batch: &'a ForwardBatch,
}

impl Io<'_> {
    fn b_offset(&self) -> usize {
        self.spec.conv_dim() + self.spec.value_width()
    }
    fn a_offset(&self) -> usize {
        self.b_offset() + self.spec.num_v_heads
    }
}

/// `Dk^-0.5` as the CPU reference computes it (in double, rounded once).
fn query_scale(dk: usize) -> f32 {
    (dk as f64).powf(-0.5) as f32
}

fn decode_kernel(gpu: &Gpu, group: usize) -> Option<&CudaFunction> {
    match group {
        1 => Some(&gpu.k.gdn_decode_g1),
        2 => Some(&gpu.k.gdn_decode_g2),
        4 => Some(&gpu.k.gdn_decode_g4),
        _ => None,
    }
}

/// The fused decode kernel: clusters of 8 blocks per (sequence, key head).
fn decode(gpu: &Gpu, io: &Io, f: &CudaFunction) -> CudaTensor {
    let (spec, s) = (io.spec, &gpu.stream);
    let t = io.l.tokens;
    let out = gpu.alloc::<f32>(t * spec.value_width());
    gpu.launch_plain(
        f,
        (8, spec.num_k_heads as u32, io.l.seqs as u32),
        128,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&io.proj.buf, s)),
            Arg::I32(io.proj.cols as i32),
            Arg::Ptr(ptr(io.w.conv.bf16("conv1d"), s)),
            Arg::Ptr(io.conv_state),
            Arg::Ptr(io.state),
            Arg::Ptr(ptr(io.w.a_log.f32("A_log"), s)),
            Arg::Ptr(ptr(io.w.dt_bias.f32("dt_bias"), s)),
            Arg::Ptr(ptr(io.w.norm.f32("gated norm"), s)),
            Arg::Ptr(io.l.seq_start()),
            Arg::Ptr(io.l.seq_slot()),
            Arg::I32(spec.num_k_heads as i32),
            Arg::I32(spec.num_v_heads as i32),
            Arg::F32(query_scale(spec.head_k_dim)),
            Arg::F32(spec.norm_eps),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: t,
        cols: spec.value_width(),
        buf: out,
    }
}

/// Causal conv + SiLU of the qkv channels, `[T, conv_dim]`; advances the conv state.
fn conv(gpu: &Gpu, io: &Io) -> cudarc::driver::CudaSlice<f32> {
    let (c, s) = (io.spec.conv_dim(), &gpu.stream);
    let out = gpu.alloc::<f32>(io.l.tokens * c);
    // Four channels per thread when every row allows 16-byte accesses (the
    // buffers themselves are allocated 256-byte aligned) and the taps fit
    // its registers.
    let (f, per_thread) = if c.is_multiple_of(4)
        && io.proj.cols.is_multiple_of(4)
        && io.spec.conv_kernel <= CONV_V4_MAX_KERNEL
    {
        (&gpu.k.gdn_conv_v4, 4)
    } else {
        (&gpu.k.gdn_conv, 1)
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
            Arg::I32(c as i32),
            Arg::I32(io.spec.conv_kernel as i32),
        ],
    );
    out
}

/// The token-by-token recurrence, `[T, Hv*Dv]` before the gated norm.
fn recurrent(
    gpu: &Gpu,
    io: &Io,
    conv_out: &cudarc::driver::CudaSlice<f32>,
) -> cudarc::driver::CudaSlice<f32> {
    let (spec, s) = (io.spec, &gpu.stream);
    let (dk, dv) = (spec.head_k_dim, spec.head_v_dim);
    let core = gpu.alloc::<f32>(io.l.tokens * spec.value_width());
    gpu.launch(
        &gpu.k.gdn_recurrent,
        (
            blocks(dv, COLS_PER_BLOCK),
            spec.num_v_heads as u32,
            io.l.seqs as u32,
        ),
        128,
        ((dk * COLS_PER_BLOCK + 2 * dk) * 4) as u32,
        &[
            Arg::Ptr(ptr(&core, s)),
            Arg::Ptr(ptr(conv_out, s)),
            Arg::Ptr(ptr(&io.proj.buf, s)),
            Arg::I32(io.proj.cols as i32),
            Arg::I32(io.b_offset() as i32),
            Arg::I32(io.a_offset() as i32),
            Arg::Ptr(ptr(io.w.a_log.f32("A_log"), s)),
            Arg::Ptr(ptr(io.w.dt_bias.f32("dt_bias"), s)),
            Arg::Ptr(io.state),
            Arg::Ptr(io.l.seq_start()),
            Arg::Ptr(io.l.seq_slot()),
            Arg::I32(spec.num_k_heads as i32),
            Arg::I32(spec.num_v_heads as i32),
            Arg::I32(dk as i32),
            Arg::I32(dv as i32),
        ],
    );
    core
}

/// Lets `f` use `bytes` of dynamic shared memory (above the default 48 KiB).
fn allow_smem(gpu: &Gpu, f: &CudaFunction, bytes: usize) {
    check(gpu.ctx.bind_to_thread(), "bind context");
    check(
        f.set_attribute(
            CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        ),
        "setting a kernel's shared memory size",
    );
}

/// The chunked form: per-chunk preparation for all chunks at once, then the
/// state pass over chunks per (sequence, head, 32 state columns). The
/// preparation computes the conv itself (and advances the conv state) where
/// the conv has at most `CONV_FUSED_MAX_KERNEL` taps and the input rows allow
/// 16-byte loads; otherwise the conv kernel runs first.
fn chunked(gpu: &Gpu, io: &Io) -> cudarc::driver::CudaSlice<f32> {
    let (spec, s, l) = (io.spec, &gpu.stream, io.l);
    let fused_conv = spec.conv_kernel <= CONV_FUSED_MAX_KERNEL && io.proj.cols.is_multiple_of(4);
    let conv_out = (!fused_conv).then(|| conv(gpu, io));
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
    let tc = chunk_math(gpu.precision, gpu.overrides.gdn_math) as i32;
    allow_smem(gpu, &gpu.k.gdn_chunk_prep, PREP_SMEM_BYTES);
    gpu.launch(
        &gpu.k.gdn_chunk_prep,
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
    // The one-pass (serving) arithmetic on wgmma and TMA where the GPU has
    // them: the same results, and one 8K Qwen3.6 layer (prep, state, gated
    // norm) 1.29 -> 1.11 ms on an H200.
    let wg = tc == ChunkMath::Tf32 as i32 && gpu.gdn_state_wgmma;
    let state_pass = if wg {
        &gpu.k.gdn_chunk_state_wg
    } else {
        &gpu.k.gdn_chunk_state
    };
    allow_smem(gpu, state_pass, STATE_SMEM_BYTES);
    let mut args = vec![
        Arg::Ptr(ptr(&core, s)),
        Arg::Ptr(ptr(&scratch, s)),
        Arg::Ptr(io.state),
        Arg::Ptr(l.seq_start()),
        Arg::Ptr(l.seq_slot()),
        Arg::I32(hv as i32),
        Arg::I32(tc),
        // The conv state to advance when the preparation computed the conv.
        Arg::Ptr(x),
        Arg::I32(x_stride as i32),
        Arg::Ptr(conv_state),
        Arg::I32(spec.conv_kernel as i32),
        Arg::I32(spec.num_k_heads as i32),
    ];
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

//! The GPU context: one CUDA stream, a cuBLAS handle, the loaded kernels, and
//! small helpers for allocation, upload and launch.
//!
//! Every operation is enqueued on the one stream, so ordering between kernels,
//! copies and frees is the stream's order; cudarc's per-buffer event tracking is
//! switched off for that reason. Kernel arguments are passed as raw device
//! pointers, which lets one launch read and write buffers that Rust's borrow
//! rules would not let us borrow together (the residual stream, the caches).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, result, sys,
};
use cudarc::nvrtc::Ptx;
use kestrel_core::{BackendError, Result};

use crate::precision::Precision;

/// A kernel argument, by value.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A device pointer (0 for `nullptr`).
    Ptr(u64),
    I32(i32),
    F32(f32),
    U64(u64),
    /// A tensor map for TMA copies (`CUtensorMap`, 128 bytes), passed by value.
    TensorMap([u64; 16]),
}

/// Abort an operation on a CUDA failure. The `Backend` operations are
/// infallible by contract (inputs are validated by the caller); a failing
/// launch or copy means a lost device, which no caller can recover from.
pub fn check<T, E: std::fmt::Debug>(r: std::result::Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("CUDA error in {what}: {e:?}"),
    }
}

/// The kernels of every module, looked up once.
pub struct Kernels {
    pub embedding_bf16: CudaFunction,
    pub embedding_f16: CudaFunction,
    pub gather_rows_f32: CudaFunction,
    pub add_assign_f32: CudaFunction,
    pub swiglu_f32: CudaFunction,
    pub f32_to_bf16: CudaFunction,
    pub rms_norm: CudaFunction,
    pub add_rms_norm: CudaFunction,
    pub qk_norm_rope_kv_write: CudaFunction,
    pub paged_attention: CudaFunction,
    /// The same two over an f32 cache (`Precision::F32`).
    pub qk_norm_rope_kv_write_f32: CudaFunction,
    pub paged_attention_f32: CudaFunction,
    /// Tensor-core attention per head dim of `ops::attention::FAST_HEAD_DIMS`.
    pub attention_decode: [CudaFunction; 3],
    /// The same with the new token's q/k norm, RoPE and cache write inside,
    /// for head dims up to `ops::attention::FUSED_DECODE_MAX_HEAD_DIM`.
    pub attention_decode_fused: [Option<CudaFunction>; 3],
    pub attention_decode_combine: CudaFunction,
    pub attention_prefill: [CudaFunction; 3],
    /// The 128-query double-buffered prefill per head dim; `None` where its
    /// tiles exceed the device's shared memory per block (then the above runs).
    pub attention_prefill_v2: [Option<CudaFunction>; 3],
    /// The wgmma prefill per head dim (`kernels/attention_prefill_sm90.cu`):
    /// loaded on compute capability 9.0 only.
    pub attention_prefill_wg: [Option<CudaFunction>; 3],
    pub router_logits: CudaFunction,
    pub router_topk: CudaFunction,
    pub gather_rows_to_bf16: CudaFunction,
    pub swiglu_to_bf16: CudaFunction,
    pub scatter_add_weighted: CudaFunction,
    pub add_gated_rows: CudaFunction,
    pub gdn_conv: CudaFunction,
    pub gdn_conv_v4: CudaFunction,
    pub gdn_recurrent: CudaFunction,
    pub gdn_gated_norm: CudaFunction,
    /// Fused decode step per Hv/Hk group size (1, 2, 4).
    pub gdn_decode_g1: CudaFunction,
    pub gdn_decode_g2: CudaFunction,
    pub gdn_decode_g4: CudaFunction,
    pub gdn_chunk_prep: CudaFunction,
    pub gdn_chunk_state: CudaFunction,
    pub gdn_chunk_state_wg: CudaFunction,
    pub dummy_fill_bf16: CudaFunction,
    pub dummy_fill_f32: CudaFunction,
    /// `gemv[m - 1]`: the decode matrix product for `m` rows (1..=8).
    pub gemv: [CudaFunction; 8],
    /// The same for f16 weights (`Precision::F32` with an f16 checkpoint).
    pub gemv_f16: [CudaFunction; 8],
    /// `gemv` that computes its rows' RMSNorm itself (`ops::linear::gemv_norm`).
    pub gemv_norm: [CudaFunction; crate::ops::linear::NORM_MAX_ROWS],
    pub moe_topk: CudaFunction,
    /// The same picks with a warp per token, for many tokens.
    pub moe_topk_warps: CudaFunction,
    pub moe_gate_up: CudaFunction,
    pub moe_down: CudaFunction,
    pub moe_gate_up_f16: CudaFunction,
    pub moe_down_f16: CudaFunction,
    /// The device-routed prefill MoE (`kernels/moe_prefill.cu`, `ops::moe`).
    pub moe_split_x: CudaFunction,
    pub moe_norm_split: CudaFunction,
    pub moe_router_gemm: CudaFunction,
    pub moe_gate_up_gemm: CudaFunction,
    pub moe_down_gemm: CudaFunction,
    pub moe_route_plan: CudaFunction,
    pub moe_route_fill: CudaFunction,
    pub moe_combine: CudaFunction,
    pub moe_gate_logit: CudaFunction,
    /// The wgmma versions of the expert GEMMs (`kernels/moe_gemm_sm90.cu`),
    /// run on compute capability 9.0 only.
    pub moe_gate_up_gemm_sm90: CudaFunction,
    pub moe_down_gemm_sm90: CudaFunction,
    /// The same with 128-row tiles (two warpgroups).
    pub moe_gate_up_gemm_sm90_m128: CudaFunction,
    pub moe_down_gemm_sm90_m128: CudaFunction,
    /// The router GEMM on wgmma (64-row tiles, 128 logits wide).
    pub moe_router_gemm_sm90: CudaFunction,
    /// The same with 128 x 256 tiles (twice the weight rows).
    pub moe_gate_up_gemm_sm90_m128_n256: CudaFunction,
    pub moe_down_gemm_sm90_m128_n256: CudaFunction,
    pub argmax_parts: CudaFunction,
    pub argmax_merge: CudaFunction,
    pub top_candidates: CudaFunction,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let module = |bytes: &[u8], name: &str| {
            ctx.load_module(Ptx::from_binary(bytes.to_vec()))
                .map_err(|e| {
                    BackendError::Unavailable(format!("loading CUDA module {name}: {e:?}"))
                })
        };
        let elementwise = module(kestrel_kernels::ELEMENTWISE, "elementwise")?;
        let norm = module(kestrel_kernels::NORM, "norm")?;
        let attention = module(kestrel_kernels::ATTENTION, "attention")?;
        let attention_decode = module(kestrel_kernels::ATTENTION_DECODE, "attention_decode")?;
        let attention_prefill = module(kestrel_kernels::ATTENTION_PREFILL, "attention_prefill")?;
        let attention_prefill_sm90 = module(
            kestrel_kernels::ATTENTION_PREFILL_SM90,
            "attention_prefill_sm90",
        )?;
        let moe = module(kestrel_kernels::MOE, "moe")?;
        let moe_prefill = module(kestrel_kernels::MOE_PREFILL, "moe_prefill")?;
        let moe_gemm_sm90 = module(kestrel_kernels::MOE_GEMM_SM90, "moe_gemm_sm90")?;
        let gdn = module(kestrel_kernels::GDN, "gdn")?;
        let gdn_decode = module(kestrel_kernels::GDN_DECODE, "gdn_decode")?;
        let gdn_chunk = module(kestrel_kernels::GDN_CHUNK, "gdn_chunk")?;
        let dummy = module(kestrel_kernels::DUMMY, "dummy")?;
        let gemv = module(kestrel_kernels::GEMV, "gemv")?;
        let sample = module(kestrel_kernels::SAMPLE, "sample")?;
        let f = |m: &Arc<cudarc::driver::CudaModule>, name: &str| {
            m.load_function(name).map_err(|e| {
                BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}"))
            })
        };
        // `{prefix}1` .. `{prefix}8`: one entry point per activation row count.
        let per_row_count = |m: &Arc<cudarc::driver::CudaModule>, prefix: &str| {
            let mut all = Vec::with_capacity(8);
            for rows in 1..=8 {
                all.push(f(m, &format!("{prefix}{rows}"))?);
            }
            Ok::<_, BackendError>(all.try_into().unwrap_or_else(|_| unreachable!()))
        };
        Ok(Kernels {
            embedding_bf16: f(&elementwise, "embedding_bf16")?,
            embedding_f16: f(&elementwise, "embedding_f16")?,
            gather_rows_f32: f(&elementwise, "gather_rows_f32")?,
            add_assign_f32: f(&elementwise, "add_assign_f32")?,
            swiglu_f32: f(&elementwise, "swiglu_f32")?,
            f32_to_bf16: f(&elementwise, "f32_to_bf16_kernel")?,
            rms_norm: f(&norm, "rms_norm_f32")?,
            add_rms_norm: f(&norm, "add_rms_norm_f32")?,
            qk_norm_rope_kv_write: f(&attention, "qk_norm_rope_kv_write")?,
            paged_attention: f(&attention, "paged_attention")?,
            qk_norm_rope_kv_write_f32: f(&attention, "qk_norm_rope_kv_write_f32")?,
            paged_attention_f32: f(&attention, "paged_attention_f32")?,
            attention_decode: crate::ops::attention::fast_kernels(
                &attention_decode,
                "attention_decode",
                crate::ops::attention::decode_smem_bytes,
            )?,
            attention_decode_fused: crate::ops::attention::fused_decode_kernels(&attention_decode)?,
            attention_decode_combine: f(&attention_decode, "attention_decode_combine")?,
            attention_prefill: crate::ops::attention::fast_kernels(
                &attention_prefill,
                "attention_prefill",
                crate::ops::attention::prefill_smem_bytes,
            )?,
            attention_prefill_v2: crate::ops::attention::prefill_v2_kernels(
                ctx,
                &attention_prefill,
            )?,
            attention_prefill_wg: crate::ops::attention::prefill_wg_kernels(
                ctx,
                &attention_prefill_sm90,
            )?,
            router_logits: f(&moe, "router_logits")?,
            router_topk: f(&moe, "router_topk")?,
            gather_rows_to_bf16: f(&moe, "gather_rows_to_bf16")?,
            swiglu_to_bf16: f(&moe, "swiglu_to_bf16")?,
            scatter_add_weighted: f(&moe, "scatter_add_weighted")?,
            add_gated_rows: f(&moe, "add_gated_rows")?,
            gdn_conv: f(&gdn, "gdn_conv")?,
            gdn_conv_v4: f(&gdn, "gdn_conv_v4")?,
            gdn_recurrent: f(&gdn, "gdn_recurrent")?,
            gdn_gated_norm: f(&gdn, "gdn_gated_norm")?,
            gdn_decode_g1: f(&gdn_decode, "gdn_decode_g1")?,
            gdn_decode_g2: f(&gdn_decode, "gdn_decode_g2")?,
            gdn_decode_g4: f(&gdn_decode, "gdn_decode_g4")?,
            gdn_chunk_prep: f(&gdn_chunk, "gdn_chunk_prep")?,
            gdn_chunk_state: f(&gdn_chunk, "gdn_chunk_state")?,
            gdn_chunk_state_wg: f(&gdn_chunk, "gdn_chunk_state_wg")?,
            dummy_fill_bf16: f(&dummy, "dummy_fill_bf16")?,
            dummy_fill_f32: f(&dummy, "dummy_fill_f32")?,
            gemv: per_row_count(&gemv, "gemv_m")?,
            gemv_f16: per_row_count(&gemv, "gemv_f16_m")?,
            gemv_norm: crate::ops::linear::norm_kernels(&gemv)?,
            moe_topk: f(&moe, "moe_topk")?,
            moe_topk_warps: f(&moe, "moe_topk_warps")?,
            moe_gate_up: f(&moe, "moe_gate_up")?,
            moe_down: f(&moe, "moe_down")?,
            moe_gate_up_f16: f(&moe, "moe_gate_up_f16")?,
            moe_down_f16: f(&moe, "moe_down_f16")?,
            moe_split_x: f(&moe_prefill, "moe_split_x")?,
            moe_norm_split: f(&moe_prefill, "moe_norm_split")?,
            moe_router_gemm: crate::ops::moe::prefill_gemm(&moe_prefill, "moe_router_gemm")?,
            moe_gate_up_gemm: crate::ops::moe::prefill_gemm(&moe_prefill, "moe_gate_up_gemm")?,
            moe_down_gemm: crate::ops::moe::prefill_gemm(&moe_prefill, "moe_down_gemm")?,
            moe_route_plan: f(&moe_prefill, "moe_route_plan")?,
            moe_route_fill: f(&moe_prefill, "moe_route_fill")?,
            moe_combine: f(&moe_prefill, "moe_combine")?,
            moe_gate_logit: f(&moe_prefill, "moe_gate_logit")?,
            moe_gate_up_gemm_sm90: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_gate_up_gemm_sm90",
                64,
                128,
            )?,
            moe_down_gemm_sm90: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_down_gemm_sm90",
                64,
                128,
            )?,
            moe_gate_up_gemm_sm90_m128: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_gate_up_gemm_sm90_m128",
                128,
                128,
            )?,
            moe_down_gemm_sm90_m128: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_down_gemm_sm90_m128",
                128,
                128,
            )?,
            moe_router_gemm_sm90: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_router_gemm_sm90",
                64,
                128,
            )?,
            moe_gate_up_gemm_sm90_m128_n256: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_gate_up_gemm_sm90_m128_n256",
                128,
                256,
            )?,
            moe_down_gemm_sm90_m128_n256: crate::ops::moe::prefill_gemm_sm90(
                &moe_gemm_sm90,
                "moe_down_gemm_sm90_m128_n256",
                128,
                256,
            )?,
            argmax_parts: f(&sample, "argmax_parts")?,
            argmax_merge: f(&sample, "argmax_merge")?,
            top_candidates: f(&sample, "top_candidates")?,
        })
    }
}

/// Let the device's stream-ordered memory pool keep freed memory instead of
/// returning it to the driver at every synchronisation (its default): each
/// step frees and reallocates the same activation sizes, and giving the
/// memory back makes every step pay for fresh mappings (about 1-2 ms per 1 GB
/// on a long prefill).
fn keep_freed_memory(ctx: &Arc<CudaContext>) -> Result<()> {
    let fail = |what: &str, e: sys::CUresult| {
        BackendError::Unavailable(format!("configuring the CUDA memory pool ({what}): {e:?}"))
    };
    check(ctx.bind_to_thread(), "bind context");
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let r = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(fail("default pool", r));
    }
    let mut threshold = u64::MAX;
    let r = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &mut threshold as *mut u64 as *mut c_void,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS {
        return Err(fail("release threshold", r));
    }
    Ok(())
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub k: Kernels,
    /// Fill fresh outputs with NaN so that an unwritten element shows up in checks.
    pub poison: bool,
    /// The device's streaming multiprocessors, read once (launch shapes ask
    /// for it on every step).
    sm_count: usize,
    /// The layout of the step in progress (see `step.rs`).
    pub step: crate::step::SharedStep,
    /// Set while a step is being recorded into a graph: host copies would
    /// not be recorded, so they are refused with a clear message.
    pub capturing: std::sync::atomic::AtomicBool,
    /// Launch kernels with programmatic dependent launch (`KESTREL_CUDA_PDL=1`):
    /// a kernel's blocks may be scheduled while its predecessor finishes.
    /// Off by default: on an H200 it passed every check but changed replayed
    /// decode steps by less than the noise (2.770 vs 2.792 ms at batch 1),
    /// even with GEMVs requesting their weights before the wait.
    pub pdl: bool,
    /// Run the prefill MoE's expert GEMMs on wgmma (`moe_gemm_sm90.cu`):
    /// on compute capability 9.0 unless `KESTREL_MOE_GEMM=mma` asks for the
    /// mma.sync kernels every GPU runs.
    pub moe_gemm_wgmma: bool,
    /// Run the GDN chunked prefill's state pass on wgmma, its inputs loaded
    /// by TMA, in its one-TF32-pass form (`gdn_chunk_state_wg`): on compute
    /// capability 9.0 unless `KESTREL_GDN_STATE=mma` asks for the mma.sync
    /// kernel (the same results; what other GPUs and 3xTF32 run).
    pub gdn_state_wgmma: bool,
    /// Route prefill MoE blocks on the host with per-expert cuBLAS products
    /// (the older path) instead of the device-routed grouped GEMMs:
    /// `KESTREL_MOE_PREFILL=host`, read once here.
    pub moe_prefill_host: bool,
    /// Compute decode steps' RMSNorms inside the product that reads them
    /// (`gemv_norm`); `KESTREL_NORM_FUSION=off` runs the norm kernels instead.
    pub norm_fusion: bool,
    /// Decode attention computes the new token's q/k norm, RoPE and cache
    /// write itself (`attention_decode_fused`); `KESTREL_ATTN_DECODE=unfused`
    /// runs `qk_norm_rope_kv_write` first instead.
    pub attn_decode_fused: bool,
    /// bf16 (serving) or f32 (reference) arithmetic; caches take the KV
    /// element type of the precision they were created under.
    pub precision: Precision,
    /// The dense bf16 products through cuBLASLt instead of `cublasGemmEx`
    /// (`KESTREL_DENSE_GEMM=lt`; `blas_lt.rs`).
    pub blas_lt: Option<crate::blas_lt::BlasLt>,
    /// The switches as they were when the device opened.
    pub overrides: crate::switches::Overrides,
}

impl Gpu {
    pub fn new(ordinal: usize) -> Result<Self> {
        let o = crate::switches::Overrides::from_env()?;
        let precision = o.precision;
        // cudarc panics when libcuda is missing; ask first.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::Unavailable(
                "no CUDA driver found: libcuda.so could not be loaded".into(),
            ));
        }
        kestrel_kernels::available().map_err(|why| {
            BackendError::Unavailable(format!(
                "CUDA kernels were not compiled into this build: {why}"
            ))
        })?;
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(BackendError::Unavailable(
                "cuBLAS not found: libcublas could not be loaded".into(),
            ));
        }
        let count = CudaContext::device_count()
            .map_err(|e| BackendError::Unavailable(format!("no CUDA device: {e:?}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(BackendError::Unavailable(format!(
                "CUDA device {ordinal} requested but {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| {
            BackendError::Unavailable(format!("creating CUDA context on device {ordinal}: {e:?}"))
        })?;
        // One stream orders everything (see the module docs).
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx
            .new_stream()
            .map_err(|e| BackendError::Unavailable(format!("creating CUDA stream: {e:?}")))?;
        let blas = CudaBlas::new(stream.clone())
            .map_err(|e| BackendError::Unavailable(format!("creating cuBLAS handle: {e:?}")))?;
        keep_freed_memory(&ctx)?;
        let k = Kernels::load(&ctx)?;
        let hopper = ctx.compute_capability().is_ok_and(|cc| cc == (9, 0));
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1)
            .max(1) as usize;
        let blas_lt = if o.dense_gemm_lt {
            Some(
                crate::blas_lt::BlasLt::new(&stream, o.lt_algo).ok_or_else(|| {
                    BackendError::Unavailable(
                        "KESTREL_DENSE_GEMM=lt: cuBLASLt could not be loaded or set up".into(),
                    )
                })?,
            )
        } else {
            None
        };
        Ok(Gpu {
            sm_count,
            ctx,
            stream,
            blas,
            k,
            poison: false,
            step: Default::default(),
            capturing: Default::default(),
            pdl: o.pdl,
            moe_gemm_wgmma: hopper && o.moe_gemm_wgmma,
            gdn_state_wgmma: hopper && o.gdn_state_wgmma,
            moe_prefill_host: o.moe_prefill_host,
            norm_fusion: o.norm_fusion,
            attn_decode_fused: o.attn_decode_fused,
            overrides: o,
            precision,
            blas_lt,
        })
    }

    /// The device's streaming multiprocessors.
    pub fn sm_count(&self) -> usize {
        self.sm_count
    }

    /// Device memory for `n` elements (at least one, so empty tensors stay valid).
    pub fn alloc<T: DeviceRepr>(&self, n: usize) -> CudaSlice<T> {
        let buf = check(unsafe { self.stream.alloc::<T>(n.max(1)) }, "alloc");
        if self.poison {
            self.fill_bytes(ptr(&buf, &self.stream), 0xff, n.max(1) * size_of::<T>());
        }
        buf
    }

    pub fn alloc_zeros<T: DeviceRepr>(&self, n: usize) -> CudaSlice<T> {
        let buf = check(unsafe { self.stream.alloc::<T>(n.max(1)) }, "alloc");
        self.fill_bytes(ptr(&buf, &self.stream), 0, n.max(1) * size_of::<T>());
        buf
    }

    pub fn fill_bytes(&self, dst: u64, byte: u8, bytes: usize) {
        check(self.ctx.bind_to_thread(), "bind context");
        check(
            unsafe { result::memset_d8_async(dst, byte, bytes, self.stream.cu_stream()) },
            "memset",
        );
    }

    pub fn copy_dtod(&self, dst: u64, src: u64, bytes: usize) {
        check(self.ctx.bind_to_thread(), "bind context");
        check(
            unsafe { result::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) },
            "device copy",
        );
    }

    /// Panics when called while a step is recorded: the copy would not be
    /// part of the recording (an operation on the replayed path is missing
    /// its device-side input).
    fn assert_not_capturing(&self, what: &str) {
        if self.capturing.load(std::sync::atomic::Ordering::Relaxed) {
            panic!("{what} while recording a CUDA graph: this operation is not replayable");
        }
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> CudaSlice<T> {
        self.assert_not_capturing("host-to-device copy");
        if data.is_empty() {
            return self.alloc_zeros(1);
        }
        check(self.stream.clone_htod(data), "host-to-device copy")
    }

    pub fn download<T: DeviceRepr>(&self, buf: &CudaSlice<T>, n: usize) -> Vec<T> {
        self.assert_not_capturing("device-to-host copy");
        if n == 0 {
            return Vec::new();
        }
        let mut v = check(
            self.stream.clone_dtoh(&buf.slice(..n)),
            "device-to-host copy",
        );
        v.truncate(n);
        v
    }

    /// Launch `f` on the stream. Grids with a zero dimension are skipped.
    pub fn launch(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) {
        self.launch_with(f, grid, block, smem, args, false)
    }

    /// [`Gpu::launch`] without programmatic dependent launch, for kernels
    /// launched in clusters (kept on the plain path to stay on well-trodden
    /// ground).
    pub fn launch_plain(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) {
        self.launch_with(f, grid, block, smem, args, true)
    }

    fn launch_with(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
        no_early_launch: bool,
    ) {
        if grid.0 == 0 || grid.1 == 0 || grid.2 == 0 {
            return;
        }
        // Each parameter pointer must address a value of the kernel's parameter type.
        // (A tensor map takes 128 bytes; the other values the first 8.)
        let mut values: Vec<[u64; 16]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match *a {
                    Arg::Ptr(p) | Arg::U64(p) => v.copy_from_slice(&p.to_ne_bytes()),
                    Arg::I32(i) => v[..4].copy_from_slice(&i.to_ne_bytes()),
                    Arg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                    Arg::TensorMap(m) => return m,
                }
                let mut value = [0u64; 16];
                value[0] = u64::from_ne_bytes(v);
                value
            })
            .collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        check(self.ctx.bind_to_thread(), "bind context");
        if !self.pdl || no_early_launch {
            check(
                unsafe {
                    result::launch_kernel(
                        f.cu_function(),
                        grid,
                        (block, 1, 1),
                        smem,
                        self.stream.cu_stream(),
                        &mut params,
                    )
                },
                "kernel launch",
            );
            return;
        }
        // Programmatic dependent launch: the kernel may be scheduled while its
        // predecessor still runs; it waits for the predecessor's results in
        // `pdl_begin` (common.cuh), which every kernel calls first.
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        let r = unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            panic!("CUDA error in kernel launch (programmatic): {r:?}");
        }
    }
}

/// Raw device address of a buffer (event tracking is off, so no guard is kept).
pub fn ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    buf.device_ptr(stream).0
}

/// Blocks needed to cover `n` items with `per` items each.
pub fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

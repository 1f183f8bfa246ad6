//! The GPU context: one CUDA stream, a cuBLAS handle, and small helpers for
//! allocation, copies and loading kernels (launching is in `launch.rs`). It
//! knows no operation: each op family loads its own kernel table.
//!
//! Every operation is enqueued on the one stream, so ordering between kernels,
//! copies and frees is the stream's order; cudarc's per-buffer event tracking is
//! switched off for that reason. Kernel arguments are passed as raw device
//! pointers, which lets one launch read and write buffers that Rust's borrow
//! rules would not let us borrow together (the residual stream, the caches).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr, result,
    sys,
};
use cudarc::nvrtc::Ptx;
use kestrel_core::{BackendError, Result};

/// Abort an operation on a CUDA failure. The `Backend` operations are
/// infallible by contract (inputs are validated by the caller); a failing
/// launch or copy means a lost device, which no caller can recover from.
pub fn check<T, E: std::fmt::Debug>(r: std::result::Result<T, E>, what: &str) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("CUDA error in {what}: {e:?}"),
    }
}

/// Let the device's stream-ordered memory pool keep freed memory instead of
/// returning it to the driver at every synchronisation (its default): each
/// step frees and reallocates the same activation sizes, and giving the
/// memory back makes every step pay for fresh mappings, most on a long
/// prefill.
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
    /// Fill fresh outputs with NaN so that an unwritten element shows up in checks.
    pub poison: bool,
    /// The device's streaming multiprocessors, read once (launch shapes ask
    /// for it on every step).
    sm_count: usize,
    /// Set while a step is being recorded into a graph: host copies would
    /// not be recorded, so they are refused with a clear message.
    pub capturing: std::sync::atomic::AtomicBool,
    /// Launch kernels with programmatic dependent launch (`launch.rs`).
    #[cfg(feature = "experiments")]
    pub pdl: bool,
}

impl Gpu {
    pub fn new(ordinal: usize) -> Result<Self> {
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
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .unwrap_or(1)
            .max(1) as usize;
        Ok(Gpu {
            sm_count,
            ctx,
            stream,
            blas,
            poison: false,
            capturing: Default::default(),
            #[cfg(feature = "experiments")]
            pdl: false,
        })
    }

    /// The compute capability, `(0, 0)` when the driver does not say.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.ctx.compute_capability().unwrap_or((0, 0))
    }

    /// Shared memory a block may opt into, in bytes.
    pub fn smem_optin(&self) -> u32 {
        self.ctx
            .attribute(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .unwrap_or(0)
            .max(0) as u32
    }

    /// Load one of `kestrel_kernels`' embedded modules.
    pub fn module(&self, bytes: &[u8], name: &str) -> Result<Arc<CudaModule>> {
        self.ctx
            .load_module(Ptx::from_binary(bytes.to_vec()))
            .map_err(|e| BackendError::Unavailable(format!("loading CUDA module {name}: {e:?}")))
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
}

/// Raw device address of a buffer (event tracking is off, so no guard is kept).
pub fn ptr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    buf.device_ptr(stream).0
}

/// Blocks needed to cover `n` items with `per` items each.
pub fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// Kernel `name` of module `m`.
pub fn function(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    m.load_function(name)
        .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))
}

/// Kernel `name` of module `m`, allowed `bytes` of dynamic shared memory
/// (above the default 48 KiB).
pub fn function_with_smem(m: &Arc<CudaModule>, name: &str, bytes: u32) -> Result<CudaFunction> {
    let f = function(m, name)?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        bytes as i32,
    )
    .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
    Ok(f)
}

/// `{prefix}1` .. `{prefix}N`: one entry point per activation row count.
pub fn per_row_count<const N: usize>(
    m: &Arc<CudaModule>,
    prefix: &str,
    load: impl Fn(&Arc<CudaModule>, &str) -> Result<CudaFunction>,
) -> Result<[CudaFunction; N]> {
    let mut all = Vec::with_capacity(N);
    for rows in 1..=N {
        all.push(load(m, &format!("{prefix}{rows}"))?);
    }
    Ok(all.try_into().unwrap_or_else(|_| unreachable!()))
}

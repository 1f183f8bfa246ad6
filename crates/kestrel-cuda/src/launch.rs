//! Kernel launches: arguments by value, on the one stream.
//!
//! With the `experiments` feature a launch may also use programmatic
//! dependent launch (the plan's `launch`): a kernel's blocks may then be
//! scheduled while its predecessor finishes, and wait for its results in
//! `pdl_begin` (common.cuh). Measured as no faster (docs/cuda.md), so the
//! default build launches plainly.

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, result};

use crate::device::{Gpu, check};

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
    /// An argument record of `kestrel_kernels::abi` (at most 128 bytes),
    /// passed by value; see [`Arg::record`].
    Record([u64; 16]),
}

impl Arg {
    /// A kernel's argument record (a `#[repr(C)]` struct of
    /// `kestrel_kernels::abi`, which the kernel takes as its
    /// `const __grid_constant__` parameter of the same layout).
    pub fn record<T: Copy>(record: &T) -> Self {
        let size = std::mem::size_of::<T>();
        assert!(
            size <= 128,
            "an argument record of {size} bytes (at most 128)"
        );
        let mut words = [0u64; 16];
        // SAFETY: `T` is plain data of `size` bytes and `words` holds 128.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (record as *const T).cast::<u8>(),
                words.as_mut_ptr().cast::<u8>(),
                size,
            );
        }
        Arg::Record(words)
    }
}

impl Gpu {
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

    /// [`Gpu::launch`] that never launches early, for kernels launched in
    /// clusters (kept on the plain path to stay on well-trodden ground).
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
        // (A tensor map or a record takes up to 128 bytes; the other values the first 8.)
        let mut values: Vec<[u64; 16]> = args
            .iter()
            .map(|a| {
                let mut v = [0u8; 8];
                match *a {
                    Arg::Ptr(p) | Arg::U64(p) => v.copy_from_slice(&p.to_ne_bytes()),
                    Arg::I32(i) => v[..4].copy_from_slice(&i.to_ne_bytes()),
                    Arg::F32(x) => v[..4].copy_from_slice(&x.to_ne_bytes()),
                    Arg::TensorMap(m) | Arg::Record(m) => return m,
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
        #[cfg(feature = "experiments")]
        if self.pdl && !no_early_launch {
            return self.launch_programmatic(f, grid, block, smem, &mut params);
        }
        let _ = no_early_launch;
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
    }

    /// Programmatic dependent launch: the kernel may be scheduled while its
    /// predecessor still runs.
    #[cfg(feature = "experiments")]
    fn launch_programmatic(
        &self,
        f: &CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        params: &mut [*mut c_void],
    ) {
        use cudarc::driver::sys;
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

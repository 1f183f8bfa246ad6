//! The kernels of `norm.cu`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function};

/// The kernels of `norm.cu`.
pub struct NormKernels {
    pub rms_norm: CudaFunction,
    pub add_rms_norm: CudaFunction,
}

impl NormKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::NORM, "norm")?;
        Ok(NormKernels {
            rms_norm: function(&m, "rms_norm_f32")?,
            add_rms_norm: function(&m, "add_rms_norm_f32")?,
        })
    }
}

//! The kernels of `sample.cu`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function};

/// The kernels of `sample.cu`.
pub struct SampleKernels {
    pub argmax_parts: CudaFunction,
    pub argmax_merge: CudaFunction,
    pub top_candidates: CudaFunction,
    pub mask_logits: CudaFunction,
}

impl SampleKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::SAMPLE, "sample")?;
        Ok(SampleKernels {
            argmax_parts: function(&m, "argmax_parts")?,
            argmax_merge: function(&m, "argmax_merge")?,
            top_candidates: function(&m, "top_candidates")?,
            mask_logits: function(&m, "mask_logits")?,
        })
    }
}

//! The kernels of `elementwise.cu`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function};

/// The kernels of `elementwise.cu`.
pub struct ElementwiseKernels {
    pub embedding_bf16: CudaFunction,
    pub embedding_f16: CudaFunction,
    pub embedding_fp8: CudaFunction,
    pub gather_rows_f32: CudaFunction,
    pub add_assign_f32: CudaFunction,
    pub swiglu_f32: CudaFunction,
    pub f32_to_bf16: CudaFunction,
}

impl ElementwiseKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::ELEMENTWISE, "elementwise")?;
        Ok(ElementwiseKernels {
            embedding_bf16: function(&m, "embedding_bf16")?,
            embedding_f16: function(&m, "embedding_f16")?,
            embedding_fp8: function(&m, "embedding_fp8")?,
            gather_rows_f32: function(&m, "gather_rows_f32")?,
            add_assign_f32: function(&m, "add_assign_f32")?,
            swiglu_f32: function(&m, "swiglu_f32")?,
            f32_to_bf16: function(&m, "f32_to_bf16_kernel")?,
        })
    }
}

//! The kernels of `fp8.cu`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function};

/// The kernels of `fp8.cu`.
pub struct Fp8Kernels {
    /// Codes and block scales to a bf16 matrix (for products without an FP8 kernel).
    pub to_bf16: CudaFunction,
    /// Random codes for dummy FP8 weights, the host's draw bit for bit.
    pub dummy_codes: CudaFunction,
}

impl Fp8Kernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::FP8, "fp8")?;
        Ok(Fp8Kernels {
            to_bf16: function(&m, "fp8_to_bf16")?,
            dummy_codes: function(&m, "fp8_dummy_codes")?,
        })
    }
}

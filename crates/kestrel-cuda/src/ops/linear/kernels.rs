//! The kernels of `gemv.cu` and the row limits they are built for.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function, function_with_smem, per_row_count};

/// Most activation rows the `gemv` kernels take (one kernel per count).
pub const GEMV_MAX_ROWS: usize = 8;

/// Most shared memory a `gemv_norm` block holds its normalised rows in
/// (rows x k f32 values: 2 rows of 8,192); the kernels are configured for it
/// at load time. Within the opt-in limit of every target GPU (99 KB on sm_121).
pub const NORM_SMEM_MAX: usize = 64 << 10;

/// Most rows `gemv_norm` takes. Every block normalises all rows before its
/// first product, and from 4 rows on that cost more than the norm kernel's
/// launch it saves (docs/benchmarks/2026-11-30-h200-decode-fusion/).
pub const NORM_MAX_ROWS: usize = 2;

/// The kernels of `gemv.cu`.
pub struct LinearKernels {
    /// `gemv[m - 1]`: the decode matrix product for `m` rows (1..=8).
    pub gemv: [CudaFunction; GEMV_MAX_ROWS],
    /// The same for f16 weights (`Precision::F32` with an f16 checkpoint).
    pub gemv_f16: [CudaFunction; GEMV_MAX_ROWS],
    /// `gemv` that computes its rows' RMSNorm itself (`gemv::gemv_norm`), allowed
    /// [`NORM_SMEM_MAX`] of dynamic shared memory.
    pub gemv_norm: [CudaFunction; NORM_MAX_ROWS],
    /// `gemv_m16` / `gemv_f16_m16` / `gemv_fp8_m16`: passes of [`GEMV_PASS_ROWS`] rows.
    pub gemv_pass: CudaFunction,
    pub gemv_pass_f16: CudaFunction,
    pub gemv_pass_fp8: CudaFunction,
    /// `gemv` and `gemv_norm` for block-FP8 weights (`ops::fp8`).
    pub gemv_fp8: [CudaFunction; GEMV_MAX_ROWS],
    pub gemv_norm_fp8: [CudaFunction; NORM_MAX_ROWS],
    /// `gemv_norm` of a weight stacked from a block-FP8 head and a bf16
    /// tail, in one launch (`gemv::gemv_norm_parts`).
    pub gemv_norm_fp8_bf16: [CudaFunction; NORM_MAX_ROWS],
}

/// Rows of the widest `gemv` pass (over a decode-shaped step's rows beyond
/// [`GEMV_MAX_ROWS`]).
pub const GEMV_PASS_ROWS: usize = 16;

impl LinearKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::GEMV, "gemv")?;
        let with_norm_smem = |m: &_, name: &str| function_with_smem(m, name, NORM_SMEM_MAX as u32);
        Ok(LinearKernels {
            gemv: per_row_count(&m, "gemv_m", function)?,
            gemv_f16: per_row_count(&m, "gemv_f16_m", function)?,
            gemv_norm: per_row_count(&m, "gemv_norm_m", with_norm_smem)?,
            gemv_pass: function(&m, "gemv_m16")?,
            gemv_pass_f16: function(&m, "gemv_f16_m16")?,
            gemv_pass_fp8: function(&m, "gemv_fp8_m16")?,
            gemv_fp8: per_row_count(&m, "gemv_fp8_m", function)?,
            gemv_norm_fp8: per_row_count(&m, "gemv_norm_fp8_m", with_norm_smem)?,
            gemv_norm_fp8_bf16: per_row_count(&m, "gemv_norm_fp8_bf16_m", with_norm_smem)?,
        })
    }
}

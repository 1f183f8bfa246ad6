//! The kernels of `flash_next.cu`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function};

/// Threads of the elementwise and per-row kernels.
pub const THREADS: u32 = 256;
/// Threads (channels) per block of `ple_conv_add`.
pub const CONV_THREADS: u32 = 128;
pub use kestrel_kernels::abi::{
    HC_GATE_MAX_ROWS, HC_MAX_STREAMS, PLE_MAX_STATE, QSA_MAX_HEAD_DIM, QSA_WARPS,
};

pub struct FlashNextKernels {
    pub repeat_streams: CudaFunction,
    pub grouped_rms_norm: CudaFunction,
    pub norm: CudaFunction,
    pub low_rank: CudaFunction,
    pub gate_mix: CudaFunction,
    pub scaled_silu: CudaFunction,
    pub mix: CudaFunction,
    pub inject: CudaFunction,
    pub ple_gate: CudaFunction,
    pub ple_conv_add: CudaFunction,
    pub qsa_store_keys: CudaFunction,
    pub qsa_pool_blocks: CudaFunction,
    pub qsa_scores: CudaFunction,
}

impl FlashNextKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let m = gpu.module(kestrel_kernels::FLASH_NEXT, "flash_next")?;
        Ok(FlashNextKernels {
            repeat_streams: function(&m, "hc_repeat_streams")?,
            grouped_rms_norm: function(&m, "hc_grouped_rms_norm")?,
            norm: function(&m, "hc_norm")?,
            low_rank: function(&m, "hc_low_rank")?,
            gate_mix: function(&m, "hc_gate_mix")?,
            scaled_silu: function(&m, "hc_scaled_silu")?,
            mix: function(&m, "hc_mix")?,
            inject: function(&m, "hc_inject")?,
            ple_gate: function(&m, "ple_gate")?,
            ple_conv_add: function(&m, "ple_conv_add")?,
            qsa_store_keys: function(&m, "qsa_store_keys")?,
            qsa_pool_blocks: function(&m, "qsa_pool_blocks")?,
            qsa_scores: function(&m, "qsa_scores")?,
        })
    }
}

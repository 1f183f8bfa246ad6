//! The Gated DeltaNet family's kernels (`gdn.cu`, `gdn_decode.cu`,
//! `gdn_chunk.cu`); the constants their launches share with them come from
//! `kestrel_kernels::abi`.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function, function_with_smem};

/// Mirror `GDN_MAX_KERNEL` (gdn.cuh) and `GDN_CONV_TOKENS` (gdn.cu).
pub const MAX_CONV_KERNEL: usize = 8;
pub const CONV_TOKENS: usize = 64;
/// Most conv taps `gdn_conv_v4` takes (its `KMAX`).
pub const CONV_V4_MAX_KERNEL: usize = 4;
/// Rows (token, value head) per block of `gdn_gated_norm`: one warp each.
pub const GATED_NORM_ROWS_PER_BLOCK: usize = 8;
/// Largest head_v_dim the gated norm keeps in registers (8 values per lane).
pub const MAX_HEAD_V_DIM: usize = 256;
pub use kestrel_kernels::abi::{
    GDN_CHUNK as CHUNK, GDN_CHUNK_FLOATS as CHUNK_FLOATS, GDN_COLS_PER_BLOCK as COLS_PER_BLOCK,
    GDN_CONV_FUSED_MAX_KERNEL as CONV_FUSED_MAX_KERNEL,
    GDN_DECODE_CONV_KERNEL as DECODE_CONV_KERNEL, GDN_DECODE_MAX_TOKENS as DECODE_MAX_TOKENS,
    GDN_HEAD_DIM as HEAD_DIM, GDN_PREP_SMEM_BYTES as PREP_SMEM_BYTES,
    GDN_STATE_SMEM_BYTES as STATE_SMEM_BYTES,
};
/// Threads of a `gdn_chunk_state` block.
pub const STATE_THREADS: u32 = kestrel_kernels::abi::GDN_STATE_THREADS as u32;

/// The kernels, with the chunked ones allowed their dynamic shared memory.
pub struct GdnKernels {
    pub conv: CudaFunction,
    pub conv_v4: CudaFunction,
    pub recurrent: CudaFunction,
    pub gated_norm: CudaFunction,
    /// Fused decode step per Hv/Hk group size (1, 2, 4).
    pub decode_g1: CudaFunction,
    pub decode_g2: CudaFunction,
    pub decode_g4: CudaFunction,
    pub chunk_prep: CudaFunction,
    pub chunk_state: CudaFunction,
    /// The state pass on wgmma fed by TMA (compute capability 9.0).
    pub chunk_state_wg: CudaFunction,
}

impl GdnKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let gdn = gpu.module(kestrel_kernels::GDN, "gdn")?;
        let decode = gpu.module(kestrel_kernels::GDN_DECODE, "gdn_decode")?;
        let chunk = gpu.module(kestrel_kernels::GDN_CHUNK, "gdn_chunk")?;
        // Kernels whose tiles exceed the device's shared memory are loaded
        // without it; launching them fails as it always would.
        let limit = gpu.smem_optin() as usize;
        let fitted = |name: &str, bytes: usize| {
            if bytes <= limit {
                function_with_smem(&chunk, name, bytes as u32)
            } else {
                function(&chunk, name)
            }
        };
        let state = |name: &str| fitted(name, STATE_SMEM_BYTES);
        Ok(GdnKernels {
            conv: function(&gdn, "gdn_conv")?,
            conv_v4: function(&gdn, "gdn_conv_v4")?,
            recurrent: function(&gdn, "gdn_recurrent")?,
            gated_norm: function(&gdn, "gdn_gated_norm")?,
            decode_g1: function(&decode, "gdn_decode_g1")?,
            decode_g2: function(&decode, "gdn_decode_g2")?,
            decode_g4: function(&decode, "gdn_decode_g4")?,
            chunk_prep: fitted("gdn_chunk_prep", PREP_SMEM_BYTES)?,
            chunk_state: state("gdn_chunk_state")?,
            chunk_state_wg: state("gdn_chunk_state_wg")?,
        })
    }

    /// The fused decode kernel for `Hv / Hk = group`, if there is one.
    pub fn decode(&self, group: usize) -> Option<&CudaFunction> {
        match group {
            1 => Some(&self.decode_g1),
            2 => Some(&self.decode_g2),
            4 => Some(&self.decode_g4),
            _ => None,
        }
    }
}

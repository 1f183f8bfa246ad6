//! An expert weight (stack) in the form the prefill GEMMs read it.

use kestrel_core::fp8;

use crate::context::Cx;
use crate::device::ptr;
use crate::ops::fp8::{Bf16Matrix, bf16_matrix};
use crate::plan::Mma;
use crate::tensor::{CudaWeight, WeightData};

/// An expert weight (stack) as the GEMMs read it: bf16 (its own storage, or
/// a copy of FP8 weights made for the call, which the mma.sync kernels
/// need), or block-FP8 codes with their scales, which the wgmma kernels
/// convert in shared memory.
pub enum ExpertWeight {
    Bf16(Bf16Matrix),
    Fp8 {
        codes: u64,
        scales: u64,
        /// Scales between two experts' grids.
        scale_stride: usize,
    },
}

impl ExpertWeight {
    pub fn of(cx: &Cx, w: &CudaWeight, what: &str) -> ExpertWeight {
        let s = &cx.gpu.stream;
        match &w.data {
            WeightData::Fp8 { codes, scale_inv } if cx.plan.moe.expert_gemm == Mma::Wgmma => {
                let dims = w.shape.len();
                let (rows, cols) = (w.shape[dims - 2], w.shape[dims - 1]);
                let [br, bc] = fp8::BLOCK;
                ExpertWeight::Fp8 {
                    codes: ptr(codes, s),
                    scales: ptr(scale_inv, s),
                    scale_stride: rows.div_ceil(br) * cols.div_ceil(bc),
                }
            }
            _ => ExpertWeight::Bf16(bf16_matrix(cx, w, what)),
        }
    }

    pub fn ptr(&self) -> u64 {
        match self {
            ExpertWeight::Bf16(m) => m.ptr,
            ExpertWeight::Fp8 { codes, .. } => *codes,
        }
    }

    pub fn scales(&self) -> Option<(u64, usize)> {
        match self {
            ExpertWeight::Bf16(_) => None,
            ExpertWeight::Fp8 {
                scales,
                scale_stride,
                ..
            } => Some((*scales, *scale_stride)),
        }
    }
}

//! What every GDN path reads and writes.

use kestrel_core::{ForwardBatch, GdnSpec, GdnWeights};

use crate::step::StepLayout;
use crate::tensor::{CudaTensor, CudaWeight};

/// What every path reads and writes.
pub struct Io<'a> {
    pub proj: &'a CudaTensor,
    pub w: &'a GdnWeights<CudaWeight>,
    pub spec: &'a GdnSpec,
    pub conv_state: u64,
    pub state: u64,
    pub l: &'a StepLayout,
    pub batch: &'a ForwardBatch,
}

impl Io<'_> {
    pub fn b_offset(&self) -> usize {
        self.spec.conv_dim() + self.spec.value_width()
    }
    pub fn a_offset(&self) -> usize {
        self.b_offset() + self.spec.num_v_heads
    }
}

/// `Dk^-0.5` as the CPU reference computes it (in double, rounded once).
pub fn query_scale(dk: usize) -> f32 {
    (dk as f64).powf(-0.5) as f32
}

//! What an operation runs with: the device, every family's kernels, the plan
//! and the step in progress, handed to it explicitly by the backend.

use std::sync::Arc;

use kestrel_core::{ForwardBatch, Result};

use crate::device::Gpu;
use crate::ops::attention::kernels::AttentionKernels;
use crate::ops::elementwise::kernels::ElementwiseKernels;
use crate::ops::flash_next::kernels::FlashNextKernels;
use crate::ops::fp8::kernels::Fp8Kernels;
use crate::ops::gdn::kernels::GdnKernels;
use crate::ops::linear::kernels::LinearKernels;
use crate::ops::moe::kernels::MoeKernels;
use crate::ops::norm::kernels::NormKernels;
use crate::ops::sample::kernels::SampleKernels;
use crate::plan::{Device, Plan};
use crate::probe::ProbeKernels;
use crate::step::{ActiveStep, StepLayout, temporary_layout};

/// Every op family's kernel table, loaded when the backend opens.
pub struct Kernels {
    pub elementwise: ElementwiseKernels,
    pub norm: NormKernels,
    pub linear: LinearKernels,
    pub attention: AttentionKernels,
    pub gdn: GdnKernels,
    pub moe: MoeKernels,
    pub sample: SampleKernels,
    pub fp8: Fp8Kernels,
    pub flash_next: FlashNextKernels,
    pub probe: ProbeKernels,
}

impl Kernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Kernels {
            elementwise: ElementwiseKernels::load(gpu)?,
            norm: NormKernels::load(gpu)?,
            linear: LinearKernels::load(gpu)?,
            attention: AttentionKernels::load(gpu)?,
            gdn: GdnKernels::load(gpu)?,
            moe: MoeKernels::load(gpu)?,
            sample: SampleKernels::load(gpu)?,
            fp8: Fp8Kernels::load(gpu)?,
            flash_next: FlashNextKernels::load(gpu)?,
            probe: ProbeKernels::load(gpu)?,
        })
    }

    /// The device as the plan sees it: its capability and the kernels it loaded.
    pub fn device(&self, gpu: &Gpu) -> Device {
        let a = &self.attention;
        Device {
            compute_capability: gpu.compute_capability(),
            sms: gpu.sm_count(),
            attn_prefill_wgmma: a.prefill_wg.each_ref().map(Option::is_some),
            attn_prefill_v2: a.prefill_v2.each_ref().map(Option::is_some),
            attn_decode_fused: a.decode_fused.each_ref().map(Option::is_some),
        }
    }
}

/// Most sequences of a decode-shaped step ([`Cx::decode_shaped`]): the
/// batches whose plain decode steps take `gemv`.
pub const DECODE_SHAPED_MAX_SEQS: usize = crate::ops::linear::kernels::GEMV_MAX_ROWS;
/// Most new tokens per sequence in a decode-shaped step: the GDN decode
/// path's limit, 1 + 15 drafts.
pub const DECODE_SHAPED_MAX_NEW: usize = crate::ops::gdn::kernels::DECODE_MAX_TOKENS;

/// One operation's view of the backend.
pub struct Cx<'a> {
    pub gpu: &'a Gpu,
    pub k: &'a Kernels,
    pub plan: &'a Plan,
    /// The step in progress when the operation is part of one.
    pub step: Option<ActiveStep>,
    /// cuBLASLt, when the plan sends dense products there.
    pub blas_lt: Option<&'a crate::blas_lt::BlasLt>,
}

impl Cx<'_> {
    /// The layout of `batch`: the step's own inside a step, else one
    /// uploaded now.
    pub fn layout(&self, batch: &ForwardBatch, block_size: usize) -> Arc<StepLayout> {
        match &self.step {
            Some(step) => step.layout_for(batch, block_size),
            None => temporary_layout(self.gpu, batch, block_size),
        }
    }

    /// Whether the step in progress is decode-shaped: at most
    /// [`DECODE_SHAPED_MAX_SEQS`] sequences, each bringing at most
    /// [`DECODE_SHAPED_MAX_NEW`] tokens (plain decode and verify steps of
    /// small batches). Every row of such a step takes the decode kernels (the
    /// `gemv` products, the MoE decode path, decode-sized norms), however many
    /// rows the step has, so a verify row computes what the plain decode row
    /// of the same token would, and speculation leaves greedy output as it
    /// is. Larger steps take the prefill kernels (tensor cores, bf16
    /// activations).
    pub fn decode_shaped(&self) -> bool {
        !self.prompt_step()
            && self.step.as_ref().is_some_and(|s| {
                let l = &s.layout;
                l.seqs <= DECODE_SHAPED_MAX_SEQS && l.max_new <= DECODE_SHAPED_MAX_NEW
            })
    }

    /// Whether the step in progress has prompt rows that the plan computes
    /// alike whatever their count ([`Plan::invariant_prompts`]): then every
    /// row of the step takes the prefill kernels (tensor-core products,
    /// prefill attention, the chunked GDN form, the device-routed MoE),
    /// however few rows it has, as the long pass of the same prompt did.
    pub fn prompt_step(&self) -> bool {
        self.plan.invariant_prompts && self.step.as_ref().is_some_and(|s| s.layout.prompt)
    }

    /// Whether `rows` rows may take the kernels sized for few rows (`gemv`,
    /// the MoE decode path, the decode attention and GDN kernels): they are
    /// at most `most`, and not rows of a [`Cx::prompt_step`].
    pub fn few_rows(&self, rows: usize, most: usize) -> bool {
        rows <= most && !self.prompt_step()
    }

    /// Device address of the step's token ids inside a step (they must be
    /// read from there for the step to be replayable); `None` outside one.
    pub fn step_ids(&self, ids: &[u32]) -> Option<u64> {
        let step = self.step.as_ref()?;
        assert_eq!(
            ids.len(),
            step.layout.tokens,
            "an operation inside a step got {} token ids for the step's {}",
            ids.len(),
            step.layout.tokens
        );
        Some(step.layout.ids())
    }
}

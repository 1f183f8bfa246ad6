//! The CUDA backend: kestrel's fused operations on NVIDIA GPUs.
//!
//! This is the only crate that talks to CUDA (through cudarc, loading libcuda,
//! cuBLAS and NVRTC at run time, so it builds and links without a toolkit).
//! Kernels come precompiled from `kestrel-kernels`.
//!
//! Numerics: activations are f32 on the device; matrix weights are bf16
//! (F16/F32 checkpoints are rounded on upload) and vectors f32. Products of
//! up to 8 rows (decode) keep the activations in f32 (our GEMV kernels);
//! larger products round them to bf16 for cuBLAS; both accumulate in f32.
//! The KV cache is bf16; Gated DeltaNet state is f32. Everything else (norms,
//! router, softmax, recurrence) computes in f32. [`Precision::F32`]
//! (`KESTREL_CUDA_PRECISION=f32`) removes the bf16 roundings of activations
//! and the KV cache, at the cost of prefill speed.
//!
//! Every kernel-path choice is made once, when the backend opens
//! ([`Plan`], printed by the commands that open one); each op family loads
//! its own kernel table (`ops/*`), `backend.rs` maps the `Backend` trait onto
//! the families, and the device layer (`device.rs`,
//! `launch.rs`) knows no operation. Decode steps are recorded once as CUDA
//! graphs and replayed (`graph.rs`); the step's layout is uploaded once per
//! step (`step.rs`) and handed to the operations in their context
//! (`context.rs`).
//!
//! The `Backend` operations are infallible by contract: shapes are validated
//! with clear panics, and a CUDA failure inside an operation (a lost device)
//! panics too. Construction and uploads return errors.

mod backend;
mod blas_lt;
mod cache;
mod context;
mod device;
mod graph;
mod launch;
mod ops;
pub mod plan;
mod precision;
mod probe;
mod step;
pub mod switches;
mod tensor;
mod weights;

use kestrel_core::{BackendError, Result};

pub use cache::CudaCache;
pub use plan::Plan;
pub use precision::Precision;
pub use tensor::{CudaTensor, CudaWeight};

use std::sync::Mutex;

use context::{Cx, Kernels};
use device::Gpu;
use graph::Recordings;
use step::StepState;
use switches::Overrides;

pub struct CudaBackend {
    gpu: Gpu,
    kernels: Kernels,
    /// What the plan was resolved from, to resolve it again when a setter
    /// changes a choice.
    device: plan::Device,
    overrides: Overrides,
    plan: Plan,
    ordinal: usize,
    /// The persistent step buffer and the step in progress.
    step: Mutex<StepState>,
    recordings: Mutex<Recordings>,
    /// cuBLASLt, set up for the plan's dense products when they need it.
    blas_lt: Option<blas_lt::BlasLt>,
}

impl CudaBackend {
    /// Open device `ordinal`. Fails cleanly when there is no driver, no such
    /// device, or this build carries no compiled kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        let overrides = Overrides::from_env()?;
        let gpu = Gpu::new(ordinal)?;
        let kernels = Kernels::load(&gpu)?;
        let device = kernels.device(&gpu);
        let plan = Plan::resolve(&device, &overrides);
        let mut backend = CudaBackend {
            gpu,
            kernels,
            device,
            overrides,
            plan,
            ordinal,
            step: Mutex::new(StepState::default()),
            recordings: Mutex::new(Recordings::default()),
            blas_lt: None,
        };
        backend.apply_plan()?;
        Ok(backend)
    }

    /// Set up what the plan needs beyond kernels (after every resolve).
    fn apply_plan(&mut self) -> Result<()> {
        #[cfg(feature = "experiments")]
        {
            self.gpu.pdl = self.plan.launch == plan::Launch::ProgrammaticDependent;
        }
        let choice = match self.plan.dense_gemm {
            plan::DenseGemm::CublasGemmEx => None,
            plan::DenseGemm::CublasLtRowInvariant => Some(blas_lt::AlgoChoice::RowInvariant),
            #[cfg(feature = "experiments")]
            plan::DenseGemm::CublasLt { algo } => Some(blas_lt::AlgoChoice::PerShape(algo)),
        };
        if let Some(choice) = choice
            && self.blas_lt.as_ref().is_none_or(|lt| lt.choice() != choice)
        {
            self.blas_lt = Some(blas_lt::BlasLt::new(&self.gpu.stream, choice).ok_or_else(
                || {
                    BackendError::Unavailable(format!(
                        "the plan's dense products ({:?}) need cuBLASLt, which could not be loaded or set up",
                        self.plan.dense_gemm
                    ))
                },
            )?);
        }
        Ok(())
    }

    /// Resolve the plan again after a setter changed an override.
    fn resolve_plan(&mut self) {
        self.plan = Plan::resolve(&self.device, &self.overrides);
        if let Err(e) = self.apply_plan() {
            panic!("{e}");
        }
    }

    /// Every kernel-path choice, resolved when the backend opened.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Run Flash-Next's hyper-connection steps in the fused kernels, or in
    /// the separate ones (`KESTREL_HYPER_FUSION` sets it at start). Only a
    /// build with the `experiments` feature takes the fused ones.
    pub fn set_hyper_fusion(&mut self, on: bool) {
        self.overrides.hyper_fusion = on;
        self.plan.hyper_fusion = cfg!(feature = "experiments") && on;
    }

    /// Record and replay keyed steps as CUDA graphs (the default), or run
    /// every step eagerly. `KESTREL_CUDA_GRAPHS=0` turns them off at start.
    pub fn set_graphs(&mut self, on: bool) {
        self.overrides.graphs = on;
        self.plan.graphs = on;
    }

    /// The arithmetic of operations from now on (the plan is resolved again);
    /// caches keep the KV element type they were created with. Starts as
    /// `KESTREL_CUDA_PRECISION` says.
    pub fn set_precision(&mut self, precision: Precision) {
        self.overrides.precision = precision;
        self.resolve_plan();
    }

    /// Batch-invariant arithmetic from now on ([`Plan::batch_invariant`]);
    /// starts as `KESTREL_BATCH_INVARIANT` says.
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.overrides.batch_invariant = on;
        self.resolve_plan();
    }

    /// Mixed steps run as two passes (`true`) or one from now on
    /// ([`Plan::split_mixed_steps`]); starts as `KESTREL_MIXED_STEPS` says.
    pub fn set_split_mixed_steps(&mut self, on: bool) {
        self.overrides.split_mixed_steps = on;
        self.resolve_plan();
    }

    /// Prompt rows computed alike whatever their pass's row count from now
    /// on ([`Plan::invariant_prompts`]); starts as `KESTREL_PROMPT_ROWS` says.
    pub fn set_invariant_prompts(&mut self, on: bool) {
        self.overrides.invariant_prompts = on;
        self.resolve_plan();
    }

    pub fn precision(&self) -> Precision {
        self.plan.precision
    }

    /// The context operations run with: the step in progress, if any.
    fn cx(&self) -> Cx<'_> {
        Cx {
            gpu: &self.gpu,
            k: &self.kernels,
            plan: &self.plan,
            step: self.step.lock().unwrap().active(),
            blas_lt: self.blas_lt.as_ref(),
        }
    }

    /// Steps recorded and replayed so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        let r = self.recordings.lock().unwrap();
        (r.captures, r.replays)
    }

    /// Fill every freshly allocated output with NaN before the kernels run, so
    /// that an element a kernel forgets to write shows up in checks.
    pub fn set_poison_outputs(&mut self, on: bool) {
        self.gpu.poison = on;
    }

    /// Wait for all queued work; surfaces asynchronous kernel faults.
    pub fn synchronize(&self) -> Result<()> {
        self.gpu
            .stream
            .synchronize()
            .map_err(|e| BackendError::Unavailable(format!("CUDA stream failed: {e:?}")))
    }

    /// The device's name as the driver reports it.
    pub fn device_name(&self) -> String {
        self.gpu
            .ctx
            .name()
            .unwrap_or_else(|_| "unknown CUDA device".into())
    }
}

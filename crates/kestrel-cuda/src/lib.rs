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
//! its own kernel table (`ops/*`), and the device layer (`device.rs`,
//! `launch.rs`) knows no operation. Decode steps are recorded once as CUDA
//! graphs and replayed (`graph.rs`); the step's layout is uploaded once per
//! step (`step.rs`) and handed to the operations in their context
//! (`context.rs`).
//!
//! The `Backend` operations are infallible by contract: shapes are validated
//! with clear panics, and a CUDA failure inside an operation (a lost device)
//! panics too. Construction and uploads return errors.

#[cfg(feature = "experiments")]
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

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, BackendError, CacheSpec, DType, ForwardBatch,
    GdnSpec, GdnWeights, HostTensor, HostWeight, MoeSpec, MoeWeights, PreNorm, Result, StepKey,
};

pub use cache::CudaCache;
pub use plan::Plan;
pub use precision::Precision;
pub use tensor::{CudaTensor, CudaWeight};

use std::sync::Mutex;

use ops::attention::block::CudaBlockKeys;

use context::{Cx, Kernels};
use device::Gpu;
use graph::Recordings;
use step::StepState;
use switches::Overrides;
use tensor::{Converted, WeightData};

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
    #[cfg(feature = "experiments")]
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
            #[cfg(feature = "experiments")]
            blas_lt: None,
        };
        backend.apply_plan()?;
        Ok(backend)
    }

    /// Set up what the plan needs beyond kernels.
    fn apply_plan(&mut self) -> Result<()> {
        #[cfg(feature = "experiments")]
        {
            self.gpu.pdl = self.plan.launch == plan::Launch::ProgrammaticDependent;
            let lt = matches!(self.plan.dense_gemm, plan::DenseGemm::CublasLt { .. });
            if lt && self.blas_lt.is_none() {
                let algo = self.overrides.lt_algo;
                self.blas_lt =
                    Some(blas_lt::BlasLt::new(&self.gpu.stream, algo).ok_or_else(|| {
                        BackendError::Unavailable(
                            "KESTREL_DENSE_GEMM=lt: cuBLASLt could not be loaded or set up".into(),
                        )
                    })?);
            }
        }
        Ok(())
    }

    /// Every kernel-path choice, resolved when the backend opened.
    pub fn plan(&self) -> &Plan {
        &self.plan
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
        self.plan = Plan::resolve(&self.device, &self.overrides);
    }

    /// Batch-invariant arithmetic from now on ([`Plan::batch_invariant`]);
    /// starts as `KESTREL_BATCH_INVARIANT` says.
    pub fn set_batch_invariant(&mut self, on: bool) {
        self.overrides.batch_invariant = on;
        self.plan = Plan::resolve(&self.device, &self.overrides);
    }

    /// Mixed steps run as two passes (`true`) or one from now on
    /// ([`Plan::split_mixed_steps`]); starts as `KESTREL_MIXED_STEPS` says.
    pub fn set_split_mixed_steps(&mut self, on: bool) {
        self.overrides.split_mixed_steps = on;
        self.plan = Plan::resolve(&self.device, &self.overrides);
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
            #[cfg(feature = "experiments")]
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

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Cache = CudaCache;
    type BlockKeys = ops::attention::block::CudaBlockKeys;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name())
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaWeight> {
        let keep_f16 = self.plan.precision == Precision::F32;
        let data = match tensor::convert(t, keep_f16)? {
            Converted::Bf16(bits) => WeightData::Bf16(self.try_upload(&bits[..])?),
            Converted::F16(bits) => WeightData::F16(self.try_upload(&bits[..])?),
            Converted::F32(v) => WeightData::F32(self.try_upload(&v)?),
        };
        Ok(CudaWeight {
            shape: t.shape.clone(),
            data,
        })
    }

    /// Block-FP8 weights arrive as they are (codes and block scales): the
    /// decode kernels read them directly (`ops::fp8`).
    fn fp8_dequantize_to(&self) -> Option<DType> {
        None
    }

    fn upload_weight(&self, w: &HostWeight) -> Result<CudaWeight> {
        match w {
            HostWeight::Dense(t) => self.upload(t),
            HostWeight::BlockFp8(q) if ops::fp8::kept_as_fp8(&q.shape, q.block) => {
                ops::fp8::upload(&self.gpu, q)
            }
            // A layout the FP8 kernels do not take: bf16, as any matrix.
            HostWeight::BlockFp8(q) => self.upload(&q.dequantize()),
        }
    }

    fn dummy_fp8_weight(
        &self,
        shape: &[usize],
        seed: u64,
        scale_inv: &[f32],
    ) -> Option<Result<CudaWeight>> {
        ops::fp8::kept_as_fp8(shape, kestrel_core::fp8::BLOCK)
            .then(|| ops::fp8::dummy(&self.gpu, &self.kernels.fp8, shape, seed, scale_inv))
    }

    fn dummy_weight(
        &self,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        offset: f32,
        scale: f32,
    ) -> Result<CudaWeight> {
        if shape.len() <= 1 && dtype == DType::F16 {
            // An f16-rounded vector: rare enough to build on the host.
            let n: usize = shape.iter().product();
            let v: Vec<u8> = (0..n as u64)
                .flat_map(|i| {
                    let x = kestrel_core::dummy::dummy_value(seed, i, offset, scale);
                    half::f16::from_f32(x).to_le_bytes()
                })
                .collect();
            return self.upload(&HostTensor {
                dtype,
                shape: shape.to_vec(),
                data: v.into(),
            });
        }
        probe::dummy_weight(
            &self.gpu,
            &self.kernels.probe,
            shape,
            dtype,
            seed,
            offset,
            scale,
        )
    }

    fn synchronize(&self) -> Result<()> {
        CudaBackend::synchronize(self)
    }

    fn measure_bandwidth_gbs(&self) -> Option<f64> {
        probe::measure_bandwidth_gbs(&self.gpu)
    }

    fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> CudaTensor {
        assert_eq!(
            data.len(),
            rows * cols,
            "from_host: {} values for [{rows}, {cols}]",
            data.len()
        );
        CudaTensor {
            bf16: None,
            rows,
            cols,
            buf: self.gpu.upload(data),
        }
    }

    fn to_host(&self, t: &CudaTensor) -> Vec<f32> {
        self.gpu.download(&t.buf, t.rows * t.cols)
    }

    fn dims(&self, t: &CudaTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn supports_state_checkpoints(&self) -> bool {
        true
    }

    /// Only in the batch-invariant mode, and there anywhere (its GDN path
    /// takes a checkpoint after any token). In the default mode a pass's
    /// products and attention round a row differently with the pass's row
    /// count, so a prompt resumed from an in-pass snapshot would not compute
    /// what the cold pass computed after it: the engine ends a pass at the
    /// snapshot point there instead, and a cache hit repeats the miss's
    /// second pass exactly. (The chunked GDN form can write a snapshot at a
    /// chunk boundary, `gdn_chunk_state`, for when prefill products become
    /// row-invariant; the GPU checks cover it.)
    fn state_snapshot_alignment(&self) -> Option<usize> {
        self.plan.batch_invariant.then_some(1)
    }

    /// The decode-shaped chunks the engine puts first (decode and verify
    /// rows), apart from the prefill chunks after them, when the plan says
    /// so: those rows then take the decode kernels as in a step of their own.
    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        if !self.plan.split_mixed_steps {
            return None;
        }
        batch.short_prefix_cut(
            context::DECODE_SHAPED_MAX_SEQS,
            context::DECODE_SHAPED_MAX_NEW,
        )
    }

    /// One `gemv` pass: 16 rows, or 8 in the batch-invariant mode, whose
    /// products go eight rows at a time.
    fn decode_rows_hint(&self) -> Option<usize> {
        Some(if self.plan.batch_invariant {
            ops::linear::kernels::GEMV_MAX_ROWS
        } else {
            ops::linear::kernels::GEMV_PASS_ROWS
        })
    }

    fn device_memory(&self) -> Option<(usize, usize)> {
        self.gpu.ctx.mem_get_info().ok()
    }

    fn cache_bytes(&self, spec: &CacheSpec) -> usize {
        spec.bytes(self.plan.precision.kv_bytes())
    }

    fn new_cache(&self, spec: &CacheSpec) -> Result<CudaCache> {
        CudaCache::new(&self.gpu, spec, self.plan.precision)
    }

    fn zero_state(&self, cache: &mut CudaCache, slot: u32) {
        cache.zero_state(&self.gpu, slot);
    }

    fn copy_state(&self, cache: &mut CudaCache, src: u32, dst: u32) {
        cache.copy_state(&self.gpu, src, dst);
    }

    fn run_step(
        &self,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut CudaCache,
        key: Option<StepKey>,
        f: &mut dyn FnMut(&mut CudaCache) -> CudaTensor,
    ) -> CudaTensor {
        cache.check_batch(batch);
        let generation = {
            let mut step = self.step.lock().unwrap();
            step.begin(&self.gpu, ids, batch, cache.spec.block_size);
            step.generation
        };
        let out = match key {
            Some(key) if self.plan.graphs => self
                .recordings
                .lock()
                .unwrap()
                .run(&self.gpu, generation, key, cache, f),
            _ => f(cache),
        };
        self.step.lock().unwrap().end();
        out
    }

    fn argmax_rows(&self, x: &CudaTensor, cols: usize) -> Vec<u32> {
        ops::sample::argmax_rows_host(&self.cx(), x, cols)
    }

    fn top_candidates(
        &self,
        logits: &CudaTensor,
        rows: &[kestrel_core::CandidateRequest],
    ) -> Vec<kestrel_core::RowCandidates> {
        ops::sample::top_candidates(&self.cx(), logits, rows)
    }

    fn mask_rows(&self, logits: &mut CudaTensor, masks: &[kestrel_core::RowMask<'_>]) {
        ops::sample::mask_rows(&self.cx(), logits, masks)
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32]) -> CudaTensor {
        ops::elementwise::embedding(&self.cx(), table, ids)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
        ops::linear::matmul(&self.cx(), x, w)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32) -> CudaTensor {
        ops::norm::rms_norm(&self.cx(), x, w, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
    ) -> CudaTensor {
        ops::norm::add_rms_norm(&self.cx(), residual, x, w, eps)
    }

    fn add_assign(&self, a: &mut CudaTensor, b: &CudaTensor) {
        ops::elementwise::add_assign(&self.cx(), a, b)
    }

    fn swiglu(&self, gate_up: &CudaTensor) -> CudaTensor {
        ops::elementwise::swiglu(&self.cx(), gate_up)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
        ops::elementwise::gather_rows(&self.cx(), x, rows)
    }

    fn block_attention_batch(
        &self,
        qkv: &CudaTensor,
        q_norm: &CudaWeight,
        k_norm: &CudaWeight,
        keys: &mut [&mut CudaBlockKeys],
        spec: &AttentionSpec,
        first_positions: &[usize],
        block: usize,
    ) -> CudaTensor {
        let on_device = keys.iter().all(|k| matches!(**k, CudaBlockKeys::Device(_)));
        match keys {
            keys if on_device && keys.len() > 1 => {
                let mut device: Vec<_> = keys
                    .iter_mut()
                    .filter_map(|k| match &mut **k {
                        CudaBlockKeys::Device(d) => Some(d),
                        CudaBlockKeys::Host(_) => None,
                    })
                    .collect();
                ops::attention::block::attend_batch(
                    &self.cx(),
                    &mut device,
                    qkv,
                    q_norm,
                    k_norm,
                    spec,
                    first_positions,
                    block,
                )
            }
            _ => kestrel_core::block_attention::attend_each(
                self,
                qkv,
                q_norm,
                k_norm,
                keys,
                spec,
                first_positions,
                block,
            ),
        }
    }

    fn concat_rows(&self, a: &CudaTensor, b: &CudaTensor) -> CudaTensor {
        ops::elementwise::concat_rows(&self.cx(), a, b)
    }

    fn new_block_keys(&self, spec: &AttentionSpec) -> CudaBlockKeys {
        CudaBlockKeys::new(&self.cx(), spec)
    }

    fn block_keys_len(&self, keys: &CudaBlockKeys) -> usize {
        keys.len()
    }

    fn append_block_keys(
        &self,
        keys: &mut CudaBlockKeys,
        kv: &CudaTensor,
        k_norm: &CudaWeight,
        spec: &AttentionSpec,
        first_position: usize,
    ) {
        match keys {
            CudaBlockKeys::Device(d) => {
                ops::attention::block::append(&self.cx(), d, kv, k_norm, spec, first_position)
            }
            CudaBlockKeys::Host(h) => h.append(self, kv, k_norm, spec, first_position),
        }
    }

    fn keep_block_keys(&self, keys: &mut CudaBlockKeys, range: std::ops::Range<usize>) {
        keys.keep(range)
    }

    fn block_attention(
        &self,
        qkv: &CudaTensor,
        q_norm: &CudaWeight,
        k_norm: &CudaWeight,
        keys: &mut CudaBlockKeys,
        spec: &AttentionSpec,
        first_position: usize,
    ) -> CudaTensor {
        match keys {
            CudaBlockKeys::Device(d) => ops::attention::block::attend(
                &self.cx(),
                d,
                qkv,
                q_norm,
                k_norm,
                spec,
                first_position,
            ),
            CudaBlockKeys::Host(h) => h.attend(self, qkv, q_norm, k_norm, spec, first_position),
        }
    }

    fn attention(
        &self,
        proj: &CudaTensor,
        w: &AttentionWeights<CudaWeight>,
        spec: &AttentionSpec,
        cache: &mut CudaCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> CudaTensor {
        ops::attention::attention(&self.cx(), proj, w, spec, cache, layer, batch)
    }

    fn moe(&self, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
        ops::moe::moe(&self.cx(), x, w, spec)
    }

    fn norm_matmul(&self, pre: PreNorm<'_, CudaTensor, CudaWeight>, w: &CudaWeight) -> CudaTensor {
        ops::linear::norm_matmul(&self.cx(), pre, w)
    }

    fn norm_moe(
        &self,
        pre: PreNorm<'_, CudaTensor, CudaWeight>,
        w: &MoeWeights<CudaWeight>,
        spec: &MoeSpec,
    ) -> CudaTensor {
        ops::moe::norm_moe(&self.cx(), pre, w, spec)
    }

    fn gated_delta_net(
        &self,
        proj: &CudaTensor,
        w: &GdnWeights<CudaWeight>,
        spec: &GdnSpec,
        cache: &mut CudaCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> CudaTensor {
        ops::gdn::gated_delta_net(&self.cx(), proj, w, spec, cache, layer, batch)
    }
}

impl CudaBackend {
    /// Upload with an out-of-memory error instead of a panic.
    fn try_upload<T: cudarc::driver::DeviceRepr>(
        &self,
        data: &[T],
    ) -> Result<cudarc::driver::CudaSlice<T>> {
        if data.is_empty() {
            return Ok(self.gpu.alloc_zeros(1));
        }
        self.gpu.stream.clone_htod(data).map_err(|e| {
            BackendError::OutOfMemory(format!("uploading {} elements: {e:?}", data.len()))
        })
    }
}

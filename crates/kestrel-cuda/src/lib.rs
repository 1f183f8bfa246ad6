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
//! Decode steps are recorded once as CUDA graphs and replayed (`graph.rs`);
//! the step's layout is uploaded once per step (`step.rs`).
//!
//! The `Backend` operations are infallible by contract: shapes are validated
//! with clear panics, and a CUDA failure inside an operation (a lost device)
//! panics too. Construction and uploads return errors.

mod blas_lt;
mod cache;
mod device;
mod graph;
mod ops;
mod precision;
mod probe;
mod step;
pub mod switches;
mod tensor;

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, BackendError, CacheSpec, DType, ForwardBatch,
    GdnSpec, GdnWeights, HostTensor, MoeSpec, MoeWeights, PreNorm, Result, StepKey,
};

pub use cache::CudaCache;
pub use precision::Precision;
pub use tensor::{CudaTensor, CudaWeight};

use std::sync::Mutex;

use device::Gpu;
use graph::Recordings;
use tensor::{Converted, WeightData};

pub struct CudaBackend {
    gpu: Gpu,
    ordinal: usize,
    /// Replay recorded decode steps (CUDA graphs); on unless turned off.
    graphs: bool,
    recordings: Mutex<Recordings>,
}

impl CudaBackend {
    /// Open device `ordinal`. Fails cleanly when there is no driver, no such
    /// device, or this build carries no compiled kernels.
    pub fn new(ordinal: usize) -> Result<Self> {
        let gpu = Gpu::new(ordinal)?;
        Ok(CudaBackend {
            graphs: gpu.overrides.graphs,
            gpu,
            ordinal,
            recordings: Mutex::new(Recordings::default()),
        })
    }

    /// Record and replay keyed steps as CUDA graphs (the default), or run
    /// every step eagerly. `KESTREL_CUDA_GRAPHS=0` turns them off at start.
    pub fn set_graphs(&mut self, on: bool) {
        self.graphs = on;
    }

    /// The arithmetic of operations from now on; caches keep the KV element
    /// type they were created with. Starts as `KESTREL_CUDA_PRECISION` says.
    pub fn set_precision(&mut self, precision: Precision) {
        self.gpu.precision = precision;
    }

    pub fn precision(&self) -> Precision {
        self.gpu.precision
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

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name())
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaWeight> {
        let keep_f16 = self.gpu.precision == Precision::F32;
        let data = match tensor::convert(t, keep_f16)? {
            Converted::Bf16(bits) => WeightData::Bf16(self.try_upload(&bits)?),
            Converted::F16(bits) => WeightData::F16(self.try_upload(&bits)?),
            Converted::F32(v) => WeightData::F32(self.try_upload(&v)?),
        };
        Ok(CudaWeight {
            shape: t.shape.clone(),
            data,
        })
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
        probe::dummy_weight(&self.gpu, shape, dtype, seed, offset, scale)
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

    fn new_cache(&self, spec: &CacheSpec) -> Result<CudaCache> {
        CudaCache::new(&self.gpu, spec)
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
        self.gpu.begin_step(ids, batch, cache.spec.block_size);
        let out = match key {
            Some(key) if self.graphs => self
                .recordings
                .lock()
                .unwrap()
                .run(&self.gpu, key, cache, f),
            _ => f(cache),
        };
        self.gpu.end_step();
        out
    }

    fn argmax_rows(&self, x: &CudaTensor, cols: usize) -> Vec<u32> {
        ops::sample::argmax_rows_host(&self.gpu, x, cols)
    }

    fn top_candidates(
        &self,
        logits: &CudaTensor,
        rows: &[kestrel_core::CandidateRequest],
    ) -> Vec<kestrel_core::RowCandidates> {
        ops::sample::top_candidates(&self.gpu, logits, rows)
    }

    fn embedding(&self, table: &CudaWeight, ids: &[u32]) -> CudaTensor {
        ops::elementwise::embedding(&self.gpu, table, ids)
    }

    fn matmul(&self, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
        ops::linear::matmul(&self.gpu, x, w)
    }

    fn rms_norm(&self, x: &CudaTensor, w: &CudaWeight, eps: f32) -> CudaTensor {
        ops::norm::rms_norm(&self.gpu, x, w, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        x: &CudaTensor,
        w: &CudaWeight,
        eps: f32,
    ) -> CudaTensor {
        ops::norm::add_rms_norm(&self.gpu, residual, x, w, eps)
    }

    fn add_assign(&self, a: &mut CudaTensor, b: &CudaTensor) {
        ops::elementwise::add_assign(&self.gpu, a, b)
    }

    fn swiglu(&self, gate_up: &CudaTensor) -> CudaTensor {
        ops::elementwise::swiglu(&self.gpu, gate_up)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[usize]) -> CudaTensor {
        ops::elementwise::gather_rows(&self.gpu, x, rows)
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
        ops::attention::attention(&self.gpu, proj, w, spec, cache, layer, batch)
    }

    fn moe(&self, x: &CudaTensor, w: &MoeWeights<CudaWeight>, spec: &MoeSpec) -> CudaTensor {
        ops::moe::moe(&self.gpu, x, w, spec)
    }

    fn norm_matmul(&self, pre: PreNorm<'_, CudaTensor, CudaWeight>, w: &CudaWeight) -> CudaTensor {
        ops::linear::norm_matmul(&self.gpu, pre, w)
    }

    fn norm_moe(
        &self,
        pre: PreNorm<'_, CudaTensor, CudaWeight>,
        w: &MoeWeights<CudaWeight>,
        spec: &MoeSpec,
    ) -> CudaTensor {
        ops::moe::norm_moe(&self.gpu, pre, w, spec)
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
        ops::gdn::gated_delta_net(&self.gpu, proj, w, spec, cache, layer, batch)
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

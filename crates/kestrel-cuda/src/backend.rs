//! `Backend` for [`CudaBackend`]: each operation hands the step's context
//! to its op family (`ops/*`); uploads and caches go through the device
//! layer.

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, DType, ForwardBatch, GdnSpec, GdnWeights,
    HostTensor, HostWeight, MoeSpec, MoeWeights, PreNorm, Result, StepKey,
};

use crate::ops::attention::block::CudaBlockKeys;
use crate::{CudaBackend, CudaCache, CudaTensor, CudaWeight, context, ops, probe};

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;
    type Cache = CudaCache;
    type BlockKeys = ops::attention::block::CudaBlockKeys;

    fn name(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.device_name())
    }

    fn upload(&self, t: &HostTensor) -> Result<CudaWeight> {
        self.upload_tensor(t)
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

    fn stack_rows(&self, parts: Vec<CudaWeight>) -> Result<CudaWeight> {
        CudaWeight::stack_rows(parts)
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
        self.draw_dummy(shape, dtype, seed, offset, scale)
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

    /// In the batch-invariant mode anywhere (its GDN path takes a
    /// checkpoint after any token). With invariant prompt rows
    /// ([`Plan::invariant_prompts`], the default) at every GDN chunk
    /// boundary of the pass (`gdn_chunk_state` writes it): a hit resumes
    /// there and computes the prompt's last tokens as the cold pass did.
    /// Otherwise a pass's products and attention round a row differently
    /// with the pass's row count, so a prompt resumed from an in-pass
    /// snapshot would not compute what the cold pass computed after it: the
    /// engine ends a pass at the snapshot point instead, and a cache hit
    /// repeats the miss's second pass exactly.
    fn state_snapshot_alignment(&self) -> Option<usize> {
        if self.plan.batch_invariant {
            Some(1)
        } else {
            self.plan
                .invariant_prompts
                .then_some(ops::gdn::kernels::CHUNK)
        }
    }

    /// The decode-shaped chunks the engine puts first (decode and verify
    /// rows), apart from the prefill chunks after them, when the plan says
    /// so: those rows then take the decode kernels as in a step of their own.
    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        if !self.plan.split_mixed_steps {
            return None;
        }
        // Prompt rows under invariant prompts take the prefill kernels, so
        // they never join the decode rows' part.
        batch.short_prefix_cut(
            context::DECODE_SHAPED_MAX_SEQS,
            context::DECODE_SHAPED_MAX_NEW,
            self.plan.invariant_prompts,
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
        match CudaBlockKeys::batch_on_device(keys) {
            Some(mut device) => ops::attention::block::attend_batch(
                &self.cx(),
                &mut device,
                qkv,
                q_norm,
                k_norm,
                spec,
                first_positions,
                block,
            ),
            None => kestrel_core::block_attention::attend_each(
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

    fn append_block_keys_batch(
        &self,
        keys: &mut [&mut CudaBlockKeys],
        kv: &CudaTensor,
        k_norm: &CudaWeight,
        spec: &AttentionSpec,
        first_positions: &[usize],
        counts: &[usize],
    ) {
        if let Some(mut device) = CudaBlockKeys::batch_on_device(keys) {
            ops::attention::block::append_batch(
                &self.cx(),
                &mut device,
                kv,
                k_norm,
                spec,
                first_positions,
                counts,
            );
        } else {
            kestrel_core::block_attention::append_each(
                self,
                keys,
                kv,
                k_norm,
                spec,
                first_positions,
                counts,
            );
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

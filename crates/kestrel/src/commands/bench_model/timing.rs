//! A timing decorator: a `Backend` that forwards every call to an inner
//! backend and, while switched on, accumulates wall time per operation.
//!
//! Switched on, it synchronises the device before and after each operation
//! so that asynchronous (GPU) work is charged to the call that queued it.
//! That adds a host round trip per call, so instrumented steps run slower
//! than real ones: the breakdown tells where time goes, the plain timed
//! steps tell how long a step takes.
//!
//! Clones share the inner backend and the recording, so that the engine
//! runs (which take their backend by value) use the very backend the timed
//! steps use.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kestrel_core::flash_next::{
    Channels, FlashNextOps, HyperSpec, IndexerKeys, PleParams, PleSpec, QsaNorms, QsaSpec, RowEdit,
    TokenSelection,
};
use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, CandidateRequest, DType, ForwardBatch,
    GdnSpec, GdnWeights, HostTensor, MoeSpec, MoeWeights, PreNorm, Result, RowCandidates, StepKey,
};

#[derive(Clone, Copy, Debug, Default)]
pub struct OpTime {
    pub seconds: f64,
    pub calls: u64,
}

pub struct Timed<B: Backend> {
    inner: Arc<B>,
    on: Arc<AtomicBool>,
    times: Arc<Mutex<BTreeMap<String, OpTime>>>,
}

impl<B: Backend> Clone for Timed<B> {
    fn clone(&self) -> Self {
        Timed {
            inner: Arc::clone(&self.inner),
            on: Arc::clone(&self.on),
            times: Arc::clone(&self.times),
        }
    }
}

impl<B: Backend> Timed<B> {
    pub fn new(inner: B) -> Self {
        Timed {
            inner: Arc::new(inner),
            on: Arc::new(AtomicBool::new(false)),
            times: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// Start a fresh breakdown (`true`) or stop recording (`false`).
    pub fn record(&self, on: bool) {
        if on {
            self.times.lock().unwrap().clear();
        }
        self.on.store(on, Ordering::SeqCst);
    }

    /// Time per operation recorded since the last `record(true)`.
    pub fn breakdown(&self) -> BTreeMap<String, OpTime> {
        self.times.lock().unwrap().clone()
    }

    fn sync(&self) {
        if let Err(e) = self.inner.synchronize() {
            panic!("device failed during a timed operation: {e}");
        }
    }

    /// Run `f`, charging its time to the key `name()` builds (only when on).
    fn time<T>(&self, name: impl FnOnce(&T) -> String, f: impl FnOnce() -> T) -> T {
        if !self.on.load(Ordering::Relaxed) {
            return f();
        }
        self.sync();
        let start = Instant::now();
        let out = f();
        self.sync();
        let seconds = start.elapsed().as_secs_f64();
        let key = name(&out);
        let mut times = self.times.lock().unwrap();
        let t = times.entry(key).or_default();
        t.seconds += seconds;
        t.calls += 1;
        out
    }
}

fn fixed<T>(name: &'static str) -> impl FnOnce(&T) -> String {
    move |_| name.to_string()
}

impl<B: Backend> Backend for Timed<B> {
    type Tensor = B::Tensor;
    type Weight = B::Weight;
    type Cache = B::Cache;
    type BlockKeys = B::BlockKeys;

    fn name(&self) -> String {
        self.inner.name()
    }

    fn upload(&self, t: &HostTensor) -> Result<B::Weight> {
        self.inner.upload(t)
    }

    fn fp8_dequantize_to(&self) -> Option<DType> {
        self.inner.fp8_dequantize_to()
    }

    fn upload_weight(&self, w: &kestrel_core::HostWeight) -> Result<B::Weight> {
        self.inner.upload_weight(w)
    }

    fn stack_rows(&self, parts: Vec<B::Weight>) -> Result<B::Weight> {
        self.inner.stack_rows(parts)
    }

    fn dummy_weight(
        &self,
        shape: &[usize],
        dtype: DType,
        seed: u64,
        offset: f32,
        scale: f32,
    ) -> Result<B::Weight> {
        self.inner.dummy_weight(shape, dtype, seed, offset, scale)
    }

    fn dummy_fp8_weight(
        &self,
        shape: &[usize],
        seed: u64,
        scale_inv: &[f32],
    ) -> Option<Result<B::Weight>> {
        self.inner.dummy_fp8_weight(shape, seed, scale_inv)
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }

    fn measure_bandwidth_gbs(&self) -> Option<f64> {
        self.inner.measure_bandwidth_gbs()
    }

    fn supports_state_checkpoints(&self) -> bool {
        self.inner.supports_state_checkpoints()
    }

    fn state_snapshot_alignment(&self) -> Option<usize> {
        self.inner.state_snapshot_alignment()
    }

    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        self.inner.step_cut(batch)
    }

    fn device_memory(&self) -> Option<(usize, usize)> {
        self.inner.device_memory()
    }

    fn cache_bytes(&self, spec: &CacheSpec) -> usize {
        self.inner.cache_bytes(spec)
    }

    fn decode_rows_hint(&self) -> Option<usize> {
        self.inner.decode_rows_hint()
    }

    fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> B::Tensor {
        self.time(fixed("from_host"), || {
            self.inner.from_host(rows, cols, data)
        })
    }

    fn to_host(&self, t: &B::Tensor) -> Vec<f32> {
        self.time(fixed("to_host"), || self.inner.to_host(t))
    }

    fn dims(&self, t: &B::Tensor) -> (usize, usize) {
        self.inner.dims(t)
    }

    fn new_cache(&self, spec: &CacheSpec) -> Result<B::Cache> {
        self.inner.new_cache(spec)
    }

    fn zero_state(&self, cache: &mut B::Cache, slot: u32) {
        self.inner.zero_state(cache, slot)
    }

    fn copy_state(&self, cache: &mut B::Cache, src: u32, dst: u32) {
        self.inner.copy_state(cache, src, dst)
    }

    fn run_step(
        &self,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
        key: Option<StepKey>,
        f: &mut dyn FnMut(&mut B::Cache) -> B::Tensor,
    ) -> B::Tensor {
        if self.on.load(Ordering::Relaxed) {
            // Recorded work would hide the operations: time them one by one.
            self.inner.run_step(ids, batch, cache, None, f)
        } else {
            self.inner.run_step(ids, batch, cache, key, f)
        }
    }

    fn argmax_rows(&self, x: &B::Tensor, cols: usize) -> Vec<u32> {
        self.time(fixed("argmax_rows"), || self.inner.argmax_rows(x, cols))
    }

    fn top_candidates(&self, logits: &B::Tensor, rows: &[CandidateRequest]) -> Vec<RowCandidates> {
        self.time(fixed("top_candidates"), || {
            self.inner.top_candidates(logits, rows)
        })
    }

    fn embedding(&self, table: &B::Weight, ids: &[u32]) -> B::Tensor {
        self.time(fixed("embedding"), || self.inner.embedding(table, ids))
    }

    fn matmul(&self, x: &B::Tensor, w: &B::Weight) -> B::Tensor {
        let k = self.inner.dims(x).1;
        // Keyed by shape: the lm_head, projections and experts separate.
        self.time(
            |out| format!("matmul {k}->{}", self.inner.dims(out).1),
            || self.inner.matmul(x, w),
        )
    }

    fn rms_norm(&self, x: &B::Tensor, w: &B::Weight, eps: f32) -> B::Tensor {
        self.time(fixed("rms_norm"), || self.inner.rms_norm(x, w, eps))
    }

    fn add_rms_norm(
        &self,
        residual: &mut B::Tensor,
        x: &B::Tensor,
        w: &B::Weight,
        eps: f32,
    ) -> B::Tensor {
        self.time(fixed("add_rms_norm"), || {
            self.inner.add_rms_norm(residual, x, w, eps)
        })
    }

    fn add_assign(&self, a: &mut B::Tensor, b: &B::Tensor) {
        self.time(fixed("add_assign"), || self.inner.add_assign(a, b))
    }

    fn swiglu(&self, gate_up: &B::Tensor) -> B::Tensor {
        self.time(fixed("swiglu"), || self.inner.swiglu(gate_up))
    }

    fn gather_rows(&self, x: &B::Tensor, rows: &[usize]) -> B::Tensor {
        self.time(fixed("gather_rows"), || self.inner.gather_rows(x, rows))
    }

    fn concat_rows(&self, a: &B::Tensor, b: &B::Tensor) -> B::Tensor {
        self.time(fixed("concat_rows"), || self.inner.concat_rows(a, b))
    }

    fn new_block_keys(&self, spec: &AttentionSpec) -> B::BlockKeys {
        self.inner.new_block_keys(spec)
    }

    fn block_keys_len(&self, keys: &B::BlockKeys) -> usize {
        self.inner.block_keys_len(keys)
    }

    fn append_block_keys(
        &self,
        keys: &mut B::BlockKeys,
        kv: &B::Tensor,
        k_norm: &B::Weight,
        spec: &AttentionSpec,
        first_position: usize,
    ) {
        self.time(fixed("append_block_keys"), || {
            self.inner
                .append_block_keys(keys, kv, k_norm, spec, first_position)
        })
    }

    fn append_block_keys_batch(
        &self,
        keys: &mut [&mut B::BlockKeys],
        kv: &B::Tensor,
        k_norm: &B::Weight,
        spec: &AttentionSpec,
        first_positions: &[usize],
        counts: &[usize],
    ) {
        self.time(fixed("append_block_keys_batch"), || {
            self.inner
                .append_block_keys_batch(keys, kv, k_norm, spec, first_positions, counts)
        })
    }

    fn keep_block_keys(&self, keys: &mut B::BlockKeys, range: std::ops::Range<usize>) {
        self.inner.keep_block_keys(keys, range)
    }

    fn block_attention(
        &self,
        qkv: &B::Tensor,
        q_norm: &B::Weight,
        k_norm: &B::Weight,
        keys: &mut B::BlockKeys,
        spec: &AttentionSpec,
        first_position: usize,
    ) -> B::Tensor {
        self.time(fixed("block_attention"), || {
            self.inner
                .block_attention(qkv, q_norm, k_norm, keys, spec, first_position)
        })
    }

    fn block_attention_batch(
        &self,
        qkv: &B::Tensor,
        q_norm: &B::Weight,
        k_norm: &B::Weight,
        keys: &mut [&mut B::BlockKeys],
        spec: &AttentionSpec,
        first_positions: &[usize],
        block: usize,
    ) -> B::Tensor {
        self.time(fixed("block_attention_batch"), || {
            self.inner.block_attention_batch(
                qkv,
                q_norm,
                k_norm,
                keys,
                spec,
                first_positions,
                block,
            )
        })
    }

    fn mask_rows(&self, logits: &mut B::Tensor, masks: &[kestrel_core::RowMask<'_>]) {
        self.time(fixed("mask_rows"), || self.inner.mask_rows(logits, masks))
    }

    fn attention(
        &self,
        proj: &B::Tensor,
        w: &AttentionWeights<B::Weight>,
        spec: &AttentionSpec,
        cache: &mut B::Cache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        self.time(fixed("attention"), || {
            self.inner.attention(proj, w, spec, cache, layer, batch)
        })
    }

    fn moe(&self, x: &B::Tensor, w: &MoeWeights<B::Weight>, spec: &MoeSpec) -> B::Tensor {
        self.time(fixed("moe"), || self.inner.moe(x, w, spec))
    }

    // The fused operations go to the inner backend whole (its defaults would
    // split them into the parts above and time those instead).
    fn pre_norm(&self, pre: PreNorm<'_, B::Tensor, B::Weight>) -> B::Tensor {
        self.time(fixed("pre_norm"), || self.inner.pre_norm(pre))
    }

    fn norm_matmul(&self, pre: PreNorm<'_, B::Tensor, B::Weight>, w: &B::Weight) -> B::Tensor {
        let k = self.inner.dims(pre.residual).1;
        self.time(
            |out| format!("norm + matmul {k}->{}", self.inner.dims(out).1),
            || self.inner.norm_matmul(pre, w),
        )
    }

    fn norm_moe(
        &self,
        pre: PreNorm<'_, B::Tensor, B::Weight>,
        w: &MoeWeights<B::Weight>,
        spec: &MoeSpec,
    ) -> B::Tensor {
        self.time(fixed("norm + moe"), || self.inner.norm_moe(pre, w, spec))
    }

    fn gated_delta_net(
        &self,
        proj: &B::Tensor,
        w: &GdnWeights<B::Weight>,
        spec: &GdnSpec,
        cache: &mut B::Cache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        self.time(fixed("gated_delta_net"), || {
            self.inner
                .gated_delta_net(proj, w, spec, cache, layer, batch)
        })
    }
}

/// Qwen3.8-Flash-Next's operations, timed like the shared ones.
impl<B: FlashNextOps> FlashNextOps for Timed<B> {
    fn repeat_streams(&self, x: &B::Tensor, streams: usize) -> B::Tensor {
        self.time(fixed("hyper repeat_streams"), || {
            self.inner.repeat_streams(x, streams)
        })
    }

    fn grouped_rms_norm(
        &self,
        x: &B::Tensor,
        w: &Channels<B::Weight>,
        group: usize,
        eps: f32,
    ) -> B::Tensor {
        self.time(fixed("hyper grouped_rms_norm"), || {
            self.inner.grouped_rms_norm(x, w, group, eps)
        })
    }

    fn hyper_low_rank_act(&self, x: &B::Tensor, streams: usize) -> B::Tensor {
        self.time(fixed("hyper low_rank_act"), || {
            self.inner.hyper_low_rank_act(x, streams)
        })
    }

    fn hyper_mix(&self, normed: &B::Tensor, gate: &B::Tensor, spec: &HyperSpec) -> B::Tensor {
        self.time(fixed("hyper mix"), || {
            self.inner.hyper_mix(normed, gate, spec)
        })
    }

    fn hyper_inject(
        &self,
        x: &mut B::Tensor,
        out: &B::Tensor,
        inject: &B::Tensor,
        spec: &HyperSpec,
    ) {
        self.time(fixed("hyper inject"), || {
            self.inner.hyper_inject(x, out, inject, spec)
        })
    }

    fn hyper_gate_mix(
        &self,
        normed: &B::Tensor,
        down: &B::Weight,
        up: &B::Weight,
        spec: &HyperSpec,
    ) -> B::Tensor {
        self.time(fixed("hyper gate_mix"), || {
            self.inner.hyper_gate_mix(normed, down, up, spec)
        })
    }

    fn hyper_norm(
        &self,
        x: &mut B::Tensor,
        pending: Option<(&B::Tensor, &B::Tensor)>,
        norm: &Channels<B::Weight>,
        inject: Option<&B::Weight>,
        spec: &HyperSpec,
    ) -> (B::Tensor, Option<B::Tensor>) {
        self.time(fixed("hyper norm"), || {
            self.inner.hyper_norm(x, pending, norm, inject, spec)
        })
    }

    fn ple_mix(
        &self,
        streams: &B::Tensor,
        key: &B::Tensor,
        value: &B::Tensor,
        p: &PleParams<B::Weight>,
        spec: &PleSpec,
        state: &mut B::Tensor,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        self.time(fixed("ple_mix"), || {
            self.inner
                .ple_mix(streams, key, value, p, spec, state, batch)
        })
    }

    fn qsa_select(
        &self,
        proj: &B::Tensor,
        norms: &QsaNorms<B::Weight>,
        spec: &QsaSpec,
        keys: &mut IndexerKeys<B::Tensor>,
        block_size: usize,
        batch: &ForwardBatch,
    ) -> TokenSelection {
        self.time(fixed("qsa_select"), || {
            self.inner
                .qsa_select(proj, norms, spec, keys, block_size, batch)
        })
    }

    fn sparse_attention(
        &self,
        proj: &B::Tensor,
        w: &AttentionWeights<B::Weight>,
        spec: &AttentionSpec,
        cache: &mut B::Cache,
        layer: usize,
        batch: &ForwardBatch,
        selection: &TokenSelection,
    ) -> B::Tensor {
        // Within the budget a selection is ordinary attention: say which ran.
        let name = if selection.is_dense() {
            "sparse_attention (dense)"
        } else {
            "sparse_attention"
        };
        self.time(fixed(name), || {
            self.inner
                .sparse_attention(proj, w, spec, cache, layer, batch, selection)
        })
    }

    fn write_rows(&self, t: &mut B::Tensor, data: &[f32]) {
        self.time(fixed("write_rows"), || self.inner.write_rows(t, data))
    }

    fn edit_rows(&self, t: &mut B::Tensor, edit: RowEdit) {
        self.time(fixed("edit_rows"), || self.inner.edit_rows(t, edit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_cpu::CpuBackend;

    #[test]
    fn records_only_while_on_and_forwards_results() {
        let t = Timed::new(CpuBackend::new());
        let w = t
            .upload(&HostTensor::from_f32(vec![3, 2], &[1., 0., 0., 1., 1., 1.]))
            .unwrap();
        let x = t.from_host(1, 2, &[2.0, 5.0]);
        assert_eq!(t.to_host(&t.matmul(&x, &w)), vec![2.0, 5.0, 7.0]);
        assert!(t.breakdown().is_empty());
        t.record(true);
        let y = t.matmul(&x, &w);
        let _ = t.matmul(
            &y,
            &t.upload(&HostTensor::from_f32(vec![1, 3], &[1., 1., 1.]))
                .unwrap(),
        );
        t.record(false);
        let _ = t.matmul(&x, &w);
        let b = t.breakdown();
        assert_eq!(b["matmul 2->3"].calls, 1);
        assert_eq!(b["matmul 3->1"].calls, 1);
        assert_eq!(b.len(), 2);
    }

    /// Flash-Next through the decorator: the same logits as the plain
    /// backend, and its own operations in the breakdown.
    #[test]
    fn flash_next_operations_are_forwarded_and_timed() {
        use kestrel_models::flash_next::FlashNext;
        use kestrel_models::flash_next::runner::FlashNextRunner;

        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/golden/qwen4_exp/model");
        let tokens: Vec<u32> = (0..24).map(|i| i * 13 % 500).collect();
        let plain = {
            let b = CpuBackend::new();
            let model = FlashNext::load(&dir, &b).unwrap();
            let mut runner = FlashNextRunner::new(&b, &model, tokens.len()).unwrap();
            runner.feed_all_logits(&tokens).unwrap()
        };
        let t = Timed::new(CpuBackend::new());
        let model = FlashNext::load(&dir, &t).unwrap();
        let mut runner = FlashNextRunner::new(&t, &model, tokens.len()).unwrap();
        t.record(true);
        let timed = runner.feed_all_logits(&tokens).unwrap();
        t.record(false);
        assert_eq!(timed, plain);
        let b = t.breakdown();
        for op in [
            "hyper repeat_streams",
            "hyper norm",
            "hyper gate_mix",
            "ple_mix",
            "qsa_select",
            // 24 tokens pass the fixture's 16-token budget.
            "sparse_attention",
        ] {
            assert!(b.get(op).is_some_and(|o| o.calls > 0), "{op}: {b:?}");
        }
    }
}

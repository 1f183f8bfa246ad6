//! The host defaults of `FlashNextOps` (what a backend without its own
//! Flash-Next kernels runs, CUDA today) give the CPU backend's logits: a
//! backend that forwards every `Backend` operation to the CPU but keeps the
//! trait's defaults runs the golden fixture. Its sparse attention only takes
//! a selection of every visible position, and says so otherwise.

use std::path::PathBuf;

use kestrel_core::block_attention::HostBlockKeys;
use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, FlashNextOps, ForwardBatch, GdnSpec,
    GdnWeights, HostTensor, MoeSpec, MoeWeights, Result,
};
use kestrel_cpu::{CpuBackend, CpuCache, CpuTensor, CpuWeight};
use kestrel_models::flash_next::FlashNext;
use kestrel_models::flash_next::runner::FlashNextRunner;

/// The CPU backend without its Flash-Next overrides.
struct HostDefaults(CpuBackend);

impl FlashNextOps for HostDefaults {}

impl Backend for HostDefaults {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Cache = CpuCache;
    type BlockKeys = HostBlockKeys;

    fn name(&self) -> String {
        "cpu without Flash-Next overrides".into()
    }

    fn new_block_keys(&self, spec: &AttentionSpec) -> HostBlockKeys {
        self.0.new_block_keys(spec)
    }
    fn block_keys_len(&self, keys: &HostBlockKeys) -> usize {
        self.0.block_keys_len(keys)
    }
    fn append_block_keys(
        &self,
        keys: &mut HostBlockKeys,
        kv: &CpuTensor,
        k_norm: &CpuWeight,
        spec: &AttentionSpec,
        first_position: usize,
    ) {
        self.0
            .append_block_keys(keys, kv, k_norm, spec, first_position)
    }
    fn keep_block_keys(&self, keys: &mut HostBlockKeys, range: std::ops::Range<usize>) {
        self.0.keep_block_keys(keys, range)
    }
    fn block_attention(
        &self,
        qkv: &CpuTensor,
        q_norm: &CpuWeight,
        k_norm: &CpuWeight,
        keys: &mut HostBlockKeys,
        spec: &AttentionSpec,
        first_position: usize,
    ) -> CpuTensor {
        self.0
            .block_attention(qkv, q_norm, k_norm, keys, spec, first_position)
    }
    fn upload(&self, t: &HostTensor) -> Result<CpuWeight> {
        self.0.upload(t)
    }
    fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
        self.0.from_host(rows, cols, data)
    }
    fn to_host(&self, t: &CpuTensor) -> Vec<f32> {
        self.0.to_host(t)
    }
    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        self.0.dims(t)
    }
    fn new_cache(&self, spec: &CacheSpec) -> Result<CpuCache> {
        self.0.new_cache(spec)
    }
    fn zero_state(&self, cache: &mut CpuCache, slot: u32) {
        self.0.zero_state(cache, slot)
    }
    fn copy_state(&self, cache: &mut CpuCache, src: u32, dst: u32) {
        self.0.copy_state(cache, src, dst)
    }
    fn embedding(&self, table: &CpuWeight, ids: &[u32]) -> CpuTensor {
        self.0.embedding(table, ids)
    }
    fn matmul(&self, x: &CpuTensor, w: &CpuWeight) -> CpuTensor {
        self.0.matmul(x, w)
    }
    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32) -> CpuTensor {
        self.0.rms_norm(x, w, eps)
    }
    fn add_rms_norm(&self, r: &mut CpuTensor, x: &CpuTensor, w: &CpuWeight, eps: f32) -> CpuTensor {
        self.0.add_rms_norm(r, x, w, eps)
    }
    fn add_assign(&self, a: &mut CpuTensor, b: &CpuTensor) {
        self.0.add_assign(a, b)
    }
    fn swiglu(&self, gate_up: &CpuTensor) -> CpuTensor {
        self.0.swiglu(gate_up)
    }
    fn gather_rows(&self, x: &CpuTensor, rows: &[usize]) -> CpuTensor {
        self.0.gather_rows(x, rows)
    }
    fn attention(
        &self,
        proj: &CpuTensor,
        w: &AttentionWeights<CpuWeight>,
        spec: &AttentionSpec,
        cache: &mut CpuCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> CpuTensor {
        self.0.attention(proj, w, spec, cache, layer, batch)
    }
    fn moe(&self, x: &CpuTensor, w: &MoeWeights<CpuWeight>, spec: &MoeSpec) -> CpuTensor {
        self.0.moe(x, w, spec)
    }
    fn gated_delta_net(
        &self,
        proj: &CpuTensor,
        w: &GdnWeights<CpuWeight>,
        spec: &GdnSpec,
        cache: &mut CpuCache,
        layer: usize,
        batch: &ForwardBatch,
    ) -> CpuTensor {
        self.0.gated_delta_net(proj, w, spec, cache, layer, batch)
    }
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp/model")
}

fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 512).collect()
}

fn logits<B: FlashNextOps>(b: &B, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let model = FlashNext::load(&model_dir(), b).unwrap();
    let mut runner = FlashNextRunner::new(b, &model, tokens.len()).unwrap();
    runner.feed_all_logits_in_chunks(tokens, chunks).unwrap()
}

#[test]
fn host_defaults_give_the_cpu_logits_within_the_indexer_budget() {
    // 19 positions: the budget's 4 blocks and the tail cover every one.
    let t = tokens(19);
    let cpu = logits(&CpuBackend::new(), &t, &[5, 1, 13]);
    let defaults = logits(&HostDefaults(CpuBackend::new()), &t, &[5, 1, 13]);
    assert!(cpu == defaults, "the defaults differ from the CPU backend");
}

#[test]
#[should_panic(expected = "sparse attention over a partial selection is not implemented")]
fn the_sparse_attention_default_refuses_a_partial_selection() {
    logits(&HostDefaults(CpuBackend::new()), &tokens(21), &[21]);
}

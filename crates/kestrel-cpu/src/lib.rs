//! CPU backend: the f32 numerical reference for every kestrel operation.
//!
//! Weights are widened to f32 on upload and every reduction accumulates in f32,
//! following the order of operations of the Hugging Face transformers modules
//! where it affects rounding. Other backends are tested against this one.

pub mod attention;
pub mod cache;
mod flash_next;
mod forward;
pub mod gdn;
pub mod linear;
pub mod math;
pub mod moe;
pub mod norm;
pub mod rope;
pub mod tensor;

#[cfg(test)]
mod tests;

use kestrel_core::block_attention::HostBlockKeys;
use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, ForwardBatch, GdnSpec, GdnWeights,
    HostTensor, MoeSpec, MoeWeights, Result,
};
use rayon::prelude::*;

pub use cache::CpuCache;
pub use tensor::{CpuTensor, CpuWeight};

/// The CPU backend. Parallel work runs on rayon's global pool.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuBackend {
    /// Cut steps as [`CPU_CUT`] says (see [`CpuBackend::cutting_mixed_steps`]).
    cut_mixed_steps: bool,
}

/// The limits of the short chunks a cutting CPU backend runs first: the
/// CUDA backend's decode-shaped steps (8 sequences, 16 new tokens each).
const CPU_CUT: (usize, usize) = (8, 16);

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend::default()
    }

    /// A CPU backend that cuts mixed steps in two as the CUDA backend does
    /// ([`Backend::step_cut`]). Its rows never depend on the step, so the
    /// outputs are those of one pass; what this exercises is the engine's
    /// side of the cut (the parts' rows, logits and captured states put
    /// back in order), which the GPU cannot run in CI.
    pub fn cutting_mixed_steps() -> Self {
        CpuBackend {
            cut_mixed_steps: true,
        }
    }
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Cache = CpuCache;
    type BlockKeys = HostBlockKeys;

    fn name(&self) -> String {
        format!("cpu ({} threads)", rayon::current_num_threads())
    }

    fn new_block_keys(&self, spec: &AttentionSpec) -> HostBlockKeys {
        HostBlockKeys::new(spec)
    }

    fn block_keys_len(&self, keys: &HostBlockKeys) -> usize {
        keys.len()
    }

    fn append_block_keys(
        &self,
        keys: &mut HostBlockKeys,
        kv: &CpuTensor,
        k_norm: &CpuWeight,
        spec: &AttentionSpec,
        first_position: usize,
    ) {
        keys.append(self, kv, k_norm, spec, first_position)
    }

    fn keep_block_keys(&self, keys: &mut HostBlockKeys, range: std::ops::Range<usize>) {
        keys.keep(range)
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
        keys.attend(self, qkv, q_norm, k_norm, spec, first_position)
    }

    fn upload(&self, t: &HostTensor) -> Result<CpuWeight> {
        CpuWeight::from_host(t)
    }

    fn stack_rows(&self, parts: Vec<CpuWeight>) -> Result<CpuWeight> {
        CpuWeight::stack_rows(parts)
    }

    fn from_host(&self, rows: usize, cols: usize, data: &[f32]) -> CpuTensor {
        CpuTensor::new(rows, cols, data.to_vec())
    }

    fn to_host(&self, t: &CpuTensor) -> Vec<f32> {
        t.data.clone()
    }

    fn dims(&self, t: &CpuTensor) -> (usize, usize) {
        (t.rows, t.cols)
    }

    fn mask_rows(&self, logits: &mut CpuTensor, masks: &[kestrel_core::RowMask<'_>]) {
        kestrel_core::token_mask::mask_rows_host(&mut logits.data, logits.cols, masks)
    }

    fn supports_state_checkpoints(&self) -> bool {
        true
    }

    /// Anywhere: the GDN layer runs the tokens before and after a snapshot
    /// as two runs, each in the form its length picks.
    fn state_snapshot_alignment(&self) -> Option<usize> {
        Some(1)
    }

    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        let (max_seqs, max_new) = CPU_CUT;
        self.cut_mixed_steps
            .then(|| batch.short_prefix_cut(max_seqs, max_new, false))
            .flatten()
    }

    fn new_cache(&self, spec: &CacheSpec) -> Result<CpuCache> {
        CpuCache::new(spec)
    }

    fn zero_state(&self, cache: &mut CpuCache, slot: u32) {
        cache.zero_state(slot);
    }

    fn copy_state(&self, cache: &mut CpuCache, src: u32, dst: u32) {
        cache.copy_state(src, dst);
    }

    fn embedding(&self, table: &CpuWeight, ids: &[u32]) -> CpuTensor {
        assert_eq!(
            table.shape.len(),
            2,
            "embedding table must be 2-D, got {:?}",
            table.shape
        );
        let (vocab, hidden) = (table.shape[0], table.shape[1]);
        let mut data = Vec::with_capacity(ids.len() * hidden);
        for &id in ids {
            let id = id as usize;
            assert!(
                id < vocab,
                "token id {id} out of range (vocabulary {vocab})"
            );
            data.extend_from_slice(&table.data[id * hidden..(id + 1) * hidden]);
        }
        CpuTensor::new(ids.len(), hidden, data)
    }

    fn matmul(&self, x: &CpuTensor, w: &CpuWeight) -> CpuTensor {
        let n = w.dim0();
        assert!(
            w.shape.len() == 2 && w.shape[1] == x.cols,
            "matmul: weight {:?} does not take inputs of width {}",
            w.shape,
            x.cols
        );
        let mut out = vec![0.0f32; x.rows * n];
        linear::linear(&x.data, x.rows, x.cols, &w.data, n, &mut out, true);
        CpuTensor::new(x.rows, n, out)
    }

    fn rms_norm(&self, x: &CpuTensor, w: &CpuWeight, eps: f32) -> CpuTensor {
        CpuTensor::new(
            x.rows,
            x.cols,
            norm::rms_norm(&x.data, x.cols, &w.data, eps),
        )
    }

    fn add_rms_norm(
        &self,
        residual: &mut CpuTensor,
        x: &CpuTensor,
        w: &CpuWeight,
        eps: f32,
    ) -> CpuTensor {
        assert_eq!(
            (residual.rows, residual.cols),
            (x.rows, x.cols),
            "add_rms_norm: shapes differ"
        );
        let out = norm::add_rms_norm(&mut residual.data, &x.data, x.cols, &w.data, eps);
        CpuTensor::new(x.rows, x.cols, out)
    }

    fn add_assign(&self, a: &mut CpuTensor, b: &CpuTensor) {
        assert_eq!(
            (a.rows, a.cols),
            (b.rows, b.cols),
            "add_assign: shapes differ"
        );
        a.data
            .par_iter_mut()
            .zip(&b.data)
            .with_min_len(4096)
            .for_each(|(x, y)| *x += y);
    }

    fn swiglu(&self, gate_up: &CpuTensor) -> CpuTensor {
        CpuTensor::new(
            gate_up.rows,
            gate_up.cols / 2,
            norm::swiglu(&gate_up.data, gate_up.cols),
        )
    }

    fn gather_rows(&self, x: &CpuTensor, rows: &[usize]) -> CpuTensor {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            assert!(
                r < x.rows,
                "gather_rows: row {r} out of range ({} rows)",
                x.rows
            );
            data.extend_from_slice(x.row(r));
        }
        CpuTensor::new(rows.len(), x.cols, data)
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
        attend(proj, w, spec, cache, layer, batch, None)
    }

    fn moe(&self, x: &CpuTensor, w: &MoeWeights<CpuWeight>, spec: &MoeSpec) -> CpuTensor {
        CpuTensor::new(x.rows, x.cols, moe::moe(&x.data, x.cols, w, spec))
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
        let slots = cache.spec.num_state_slots;
        let n_layers = cache.gdn.len();
        let state = cache
            .gdn
            .get_mut(layer)
            .unwrap_or_else(|| panic!("GDN layer {layer} out of range ({n_layers} in the cache)"));
        let out = gdn::gated_delta_net(&proj.data, proj.cols, w, spec, state, slots, batch);
        CpuTensor::new(proj.rows, spec.value_width(), out)
    }
}

/// Attention of `layer` over its paged cache: every cached position, or per
/// token only the `selected` ones (Flash-Next's sparse attention).
fn attend(
    proj: &CpuTensor,
    w: &AttentionWeights<CpuWeight>,
    spec: &AttentionSpec,
    cache: &mut CpuCache,
    layer: usize,
    batch: &ForwardBatch,
    selected: Option<&[Vec<u32>]>,
) -> CpuTensor {
    let pages = attention::PageLayout {
        num_blocks: cache.spec.num_blocks,
        block_size: cache.spec.block_size,
        num_kv_heads: cache.spec.num_kv_heads,
        head_dim: cache.spec.head_dim,
    };
    let n_layers = cache.kv.len();
    let pool = cache.kv.get_mut(layer).unwrap_or_else(|| {
        panic!("attention layer {layer} out of range ({n_layers} in the cache)")
    });
    let out = attention::attention(
        &proj.data,
        proj.cols,
        &w.q_norm.data,
        &w.k_norm.data,
        spec,
        pool,
        &pages,
        batch,
        selected,
    );
    CpuTensor::new(proj.rows, spec.q_width(), out)
}

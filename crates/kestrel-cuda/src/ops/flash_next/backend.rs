//! `FlashNextOps` for the CUDA backend: every operation on the device.

use kestrel_core::flash_next::{
    Channels, FlashNextOps, HyperSpec, IndexerKeys, PleParams, PleSpec, QsaNorms, QsaSpec, RowEdit,
    TokenSelection, composed_hyper_gate_mix, composed_hyper_norm,
};
use kestrel_core::{AttentionSpec, AttentionWeights, Backend, ForwardBatch};

use crate::tensor::Format;
use crate::{CudaBackend, CudaCache, CudaTensor, CudaWeight};

impl FlashNextOps for CudaBackend {
    fn repeat_streams(&self, x: &CudaTensor, streams: usize) -> CudaTensor {
        super::repeat_streams(&self.cx(), x, streams)
    }

    fn grouped_rms_norm(
        &self,
        x: &CudaTensor,
        w: &Channels<CudaWeight>,
        group: usize,
        eps: f32,
    ) -> CudaTensor {
        super::grouped_rms_norm(&self.cx(), x, w, group, eps)
    }

    fn hyper_low_rank_act(&self, x: &CudaTensor, streams: usize) -> CudaTensor {
        super::hyper::scaled_silu(&self.cx(), x, streams as f32)
    }

    fn hyper_mix(&self, normed: &CudaTensor, gate: &CudaTensor, spec: &HyperSpec) -> CudaTensor {
        super::hyper::mix(&self.cx(), normed, gate, spec)
    }

    fn hyper_inject(
        &self,
        x: &mut CudaTensor,
        out: &CudaTensor,
        inject: &CudaTensor,
        spec: &HyperSpec,
    ) {
        super::hyper::inject(&self.cx(), x, out, inject, spec)
    }

    /// With the plan's hyper-connection fusion, two kernels for a
    /// decode-shaped step with 16-bit gate weights; the products and the two
    /// small kernels otherwise.
    fn hyper_gate_mix(
        &self,
        normed: &CudaTensor,
        down: &CudaWeight,
        up: &CudaWeight,
        spec: &HyperSpec,
    ) -> CudaTensor {
        let cx = self.cx();
        let s = &cx.gpu.stream;
        if self.plan.hyper_fusion && sixteen_bit(down) && down.format() == up.format() {
            let (down_m, up_m) = (down.matrix("gate down", s), up.matrix("gate up", s));
            if let Some(mixed) =
                super::hyper::gate_mix_decode(&cx, normed, (down_m, down.dim0()), up_m, spec)
            {
                return mixed;
            }
        }
        composed_hyper_gate_mix(self, normed, down, up, spec)
    }

    /// With the plan's hyper-connection fusion, one kernel when the inject
    /// projection is 16-bit (as Flash-Next stores it, FP8 checkpoints
    /// included); the three operations otherwise.
    fn hyper_norm(
        &self,
        x: &mut CudaTensor,
        pending: Option<(&CudaTensor, &CudaTensor)>,
        norm: &Channels<CudaWeight>,
        inject: Option<&CudaWeight>,
        spec: &HyperSpec,
    ) -> (CudaTensor, Option<CudaTensor>) {
        if self.plan.hyper_fusion && inject.is_none_or(sixteen_bit) {
            let cx = self.cx();
            let m = inject.map(|w| w.matrix("hyper-connection inject", &cx.gpu.stream));
            return super::hyper::hyper_norm(&cx, x, pending, norm, m, spec);
        }
        composed_hyper_norm(self, x, pending, norm, inject, spec)
    }

    fn ple_mix(
        &self,
        streams: &CudaTensor,
        key: &CudaTensor,
        value: &CudaTensor,
        p: &PleParams<CudaWeight>,
        spec: &PleSpec,
        state: &mut CudaTensor,
        batch: &ForwardBatch,
    ) -> CudaTensor {
        super::ple_mix(&self.cx(), streams, key, value, p, spec, state, batch)
    }

    fn qsa_select(
        &self,
        proj: &CudaTensor,
        norms: &QsaNorms<CudaWeight>,
        spec: &QsaSpec,
        keys: &mut IndexerKeys<CudaTensor>,
        block_size: usize,
        batch: &ForwardBatch,
    ) -> TokenSelection {
        super::qsa::select(&self.cx(), proj, norms, spec, keys, block_size, batch)
    }

    /// A selection of every visible position is ordinary causal attention
    /// (contexts within the indexer's budget): the paged kernels, prefill
    /// ones included. Otherwise each row reads its own selected slots.
    fn sparse_attention(
        &self,
        proj: &CudaTensor,
        w: &AttentionWeights<CudaWeight>,
        spec: &AttentionSpec,
        cache: &mut CudaCache,
        layer: usize,
        batch: &ForwardBatch,
        selection: &TokenSelection,
    ) -> CudaTensor {
        if selection.is_dense() {
            return self.attention(proj, w, spec, cache, layer, batch);
        }
        super::qsa::sparse_attention(&self.cx(), proj, w, spec, cache, layer, batch, selection)
    }

    fn write_rows(&self, t: &mut CudaTensor, data: &[f32]) {
        super::pools::write_rows(&self.cx(), t, data)
    }

    fn edit_rows(&self, t: &mut CudaTensor, edit: RowEdit) {
        super::pools::edit_rows(&self.cx(), t, edit)
    }
}

/// A bf16 or f16 matrix: what the fused hyper-connection kernels read.
fn sixteen_bit(w: &CudaWeight) -> bool {
    matches!(w.format(), Some(Format::Bf16 | Format::F16))
}

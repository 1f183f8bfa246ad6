//! The Flash-Next operations on the CPU: the host reference functions of
//! `kestrel_core::flash_next::host` run on the tensors' own data, and sparse
//! attention is the paged attention restricted to the selected positions.

use kestrel_core::flash_next::{
    Channels, FlashNextOps, HyperSpec, IndexerKeys, PleParams, PleSpec, QsaNorms, QsaSpec, RowEdit,
    TokenSelection, host,
};
use kestrel_core::{AttentionSpec, AttentionWeights, ForwardBatch};

use crate::{CpuBackend, CpuCache, CpuTensor, CpuWeight};

impl FlashNextOps for CpuBackend {
    fn repeat_streams(&self, x: &CpuTensor, streams: usize) -> CpuTensor {
        let out = host::repeat_streams(&x.data, x.cols, streams);
        CpuTensor::new(x.rows, x.cols * streams, out)
    }

    fn grouped_rms_norm(
        &self,
        x: &CpuTensor,
        w: &Channels<CpuWeight>,
        group: usize,
        eps: f32,
    ) -> CpuTensor {
        let out = host::grouped_rms_norm(&x.data, x.cols, &w.host, group, eps);
        CpuTensor::new(x.rows, x.cols, out)
    }

    fn hyper_low_rank_act(&self, x: &CpuTensor, streams: usize) -> CpuTensor {
        CpuTensor::new(x.rows, x.cols, host::scaled_silu(&x.data, streams as f32))
    }

    fn hyper_mix(&self, normed: &CpuTensor, gate: &CpuTensor, spec: &HyperSpec) -> CpuTensor {
        let out = host::hyper_mix(&normed.data, &gate.data, spec);
        CpuTensor::new(normed.rows, spec.hidden, out)
    }

    fn hyper_inject(
        &self,
        x: &mut CpuTensor,
        out: &CpuTensor,
        inject: &CpuTensor,
        spec: &HyperSpec,
    ) {
        host::hyper_inject(&mut x.data, &out.data, &inject.data, spec);
    }

    fn ple_mix(
        &self,
        streams: &CpuTensor,
        key: &CpuTensor,
        value: &CpuTensor,
        p: &PleParams<CpuWeight>,
        spec: &PleSpec,
        state: &mut CpuTensor,
        batch: &ForwardBatch,
    ) -> CpuTensor {
        let out = host::ple_mix(
            &streams.data,
            &key.data,
            &value.data,
            &p.host(),
            spec,
            &mut state.data,
            batch,
        );
        CpuTensor::new(streams.rows, spec.hyper.width(), out)
    }

    fn qsa_select(
        &self,
        proj: &CpuTensor,
        norms: &QsaNorms<CpuWeight>,
        spec: &QsaSpec,
        keys: &mut IndexerKeys<CpuTensor>,
        block_size: usize,
        batch: &ForwardBatch,
    ) -> TokenSelection {
        // The host function works on the vectors, moved out and back.
        let mut host_keys = IndexerKeys {
            raw: std::mem::take(&mut keys.raw.data),
            pooled: std::mem::take(&mut keys.pooled.data),
        };
        let sel = host::qsa_select(
            &proj.data,
            &norms.host(),
            spec,
            &mut host_keys,
            block_size,
            batch,
        );
        keys.raw.data = host_keys.raw;
        keys.pooled.data = host_keys.pooled;
        sel
    }

    fn edit_rows(&self, t: &mut CpuTensor, edit: RowEdit) {
        host::edit_rows(&mut t.data, t.cols, edit);
    }

    fn sparse_attention(
        &self,
        proj: &CpuTensor,
        w: &AttentionWeights<CpuWeight>,
        spec: &AttentionSpec,
        cache: &mut CpuCache,
        layer: usize,
        batch: &ForwardBatch,
        selection: &TokenSelection,
    ) -> CpuTensor {
        assert_eq!(selection.tokens.len(), proj.rows, "one selection per token");
        crate::attend(
            proj,
            w,
            spec,
            cache,
            layer,
            batch,
            Some(&selection.positions()),
        )
    }
}

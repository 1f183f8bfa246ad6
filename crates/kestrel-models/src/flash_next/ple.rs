//! The PLE layer: the hashed n-gram embedding of each token, projected to a
//! value and one key per stream; each stream gates the value by how its
//! normalised state agrees with its key, and a dilated depthwise causal conv
//! adds local context. The result is added to every stream.

use anyhow::Result;
use kestrel_core::ForwardBatch;
use kestrel_core::flash_next::{Channels, FlashNextOps, HyperSpec, PleParams, PleSpec};

use super::hyper::norm_channels;
use super::ngram::{NgramHasher, NgramTable};
use crate::loader::Loader;

pub struct Ple<B: FlashNextOps> {
    pub hasher: NgramHasher,
    table: NgramTable,
    key_proj: B::Weight,
    value_proj: B::Weight,
    params: PleParams<B::Weight>,
    pub spec: PleSpec,
    /// This module's conv-state pool in the cache.
    pub state_index: usize,
}

impl<B: FlashNextOps> Ple<B> {
    /// `p` is the module prefix, e.g. `model.language_model.layers.0.ple.`.
    pub fn load(
        l: &Loader<B>,
        p: &str,
        hasher: NgramHasher,
        table: NgramTable,
        hyper: HyperSpec,
        conv: (usize, usize),
        state_index: usize,
    ) -> Result<Self> {
        let (w, e) = (hyper.width(), embed_width(&hasher, &table));
        let (kernel, dilation) = conv;
        let taps = l.host_f32(&format!("{p}conv1d.weight"), &[w, 1, kernel])?;
        Ok(Ple {
            key_proj: l.weight(&format!("{p}key_proj.weight"), &[w, e])?,
            value_proj: l.weight(&format!("{p}value_proj.weight"), &[hyper.hidden, e])?,
            params: PleParams {
                norm_key: norm_channels(l, &format!("{p}norm_key.weight"), w)?,
                norm_query: norm_channels(l, &format!("{p}norm_query.weight"), w)?,
                norm_conv: norm_channels(l, &format!("{p}norm_conv.weight"), w)?,
                conv: Channels::new(l.backend, taps)?,
            },
            spec: PleSpec {
                hyper,
                conv_kernel: kernel,
                conv_dilation: dilation,
            },
            hasher,
            table,
            state_index,
        })
    }

    /// The n-gram embeddings (`[T, heads * table dim]`, row-major) of the
    /// new tokens whose n-gram histories are `history`, gathered from the
    /// table on the host.
    pub fn embeddings(&self, history: &[u32]) -> Result<Vec<f32>> {
        self.table.gather(&self.hasher.rows_of(history))
    }

    /// `x += ple(x)` for the new tokens whose embeddings are `emb`.
    pub fn forward(
        &self,
        b: &B,
        x: &mut B::Tensor,
        emb: &B::Tensor,
        state: &mut B::Tensor,
        batch: &ForwardBatch,
    ) {
        let key = b.matmul(emb, &self.key_proj);
        let value = b.matmul(emb, &self.value_proj);
        let out = b.ple_mix(x, &key, &value, &self.params, &self.spec, state, batch);
        b.add_assign(x, &out);
    }
}

/// The embedding width: heads times the table's row width.
fn embed_width(hasher: &NgramHasher, table: &NgramTable) -> usize {
    hasher.heads() * table.dim
}

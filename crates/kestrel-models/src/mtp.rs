//! The multi-token-prediction head of Qwen3.5/3.6 (`mtp.*` weights), run as
//! vLLM's `Qwen3_5MultiTokenPredictor` runs it.
//!
//! For the token at position t, the head combines the target model's output
//! hidden state at t (after the target's final norm: that is what vLLM's
//! model forward returns and hands to the proposer) with the embedding of the
//! token at t+1, and predicts the token at t+2:
//! `x = fc([norm_e(embed(tok[t+1])) ; norm_h(h[t])])`, one full-attention
//! decoder layer with its own MoE and its own KV cache (at position t), then
//! `mtp.norm` and the shared lm_head. Deeper drafts feed the head's own
//! normalised output back in as `h`.

use anyhow::Result;
use kestrel_core::{Backend, CacheSpec, ForwardBatch, HostTensor};

use crate::config::{LayerKind, ModelConfig};
use crate::decoder::{Decoder, DecoderLayer};
use crate::loader::Loader;

pub struct MtpHead<B: Backend> {
    norm_embedding: B::Weight,
    norm_hidden: B::Weight,
    /// `mtp.fc.weight` `[H, 2H]` split by input half: embedding, hidden.
    fc_embedding: B::Weight,
    fc_hidden: B::Weight,
    layer: DecoderLayer<B>,
    norm: B::Weight,
    eps: f32,
}

impl<B: Backend> MtpHead<B> {
    pub fn load(l: &Loader<B>, cfg: &ModelConfig) -> Result<Self> {
        let h = cfg.hidden_size;
        let half = |right: bool| {
            let part = if right {
                "mtp.fc.weight#hidden"
            } else {
                "mtp.fc.weight#embedding"
            };
            l.materialize(part, &[h, h], || {
                let (left_half, right_half) =
                    split_columns(&l.tensor("mtp.fc.weight", &[h, 2 * h])?.into_dense(), h);
                Ok(if right { right_half } else { left_half })
            })
        };
        Ok(MtpHead {
            norm_embedding: l.norm("mtp.pre_fc_norm_embedding.weight", h)?,
            norm_hidden: l.norm("mtp.pre_fc_norm_hidden.weight", h)?,
            fc_embedding: half(false)?,
            fc_hidden: half(true)?,
            layer: DecoderLayer::load(
                l,
                "mtp.layers.0.",
                cfg,
                LayerKind::FullAttention,
                cfg.moe.is_some(),
                0,
            )?,
            norm: l.norm("mtp.norm.weight", h)?,
            eps: cfg.rms_norm_eps,
        })
    }

    /// The head's own cache: one attention layer, no recurrent state.
    pub fn cache_spec(target: &Decoder<B>, num_blocks: usize, block_size: usize) -> CacheSpec {
        CacheSpec {
            attn_layers: 1,
            gdn_layers: 0,
            num_state_slots: 0,
            gdn: None,
            ..target.cache_spec(num_blocks, block_size, 0)
        }
    }

    /// `hidden`: the target's normalised output rows (or the head's own
    /// output for deeper drafts); `next_ids`: the token following each row.
    /// Returns the head's normalised output, ready for the lm_head.
    pub fn forward(
        &self,
        b: &B,
        target: &Decoder<B>,
        hidden: &B::Tensor,
        next_ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
    ) -> B::Tensor {
        let e = b.embedding(&target.embed, next_ids);
        let e = b.rms_norm(&e, &self.norm_embedding, self.eps);
        let hn = b.rms_norm(hidden, &self.norm_hidden, self.eps);
        let mut residual = b.matmul(&e, &self.fc_embedding);
        b.add_assign(&mut residual, &b.matmul(&hn, &self.fc_hidden));
        let out = self
            .layer
            .forward(b, &mut residual, None, self.eps, cache, batch);
        b.add_rms_norm(&mut residual, &out, &self.norm, self.eps)
    }
}

/// Split `[rows, 2n]` into its left and right `[rows, n]` halves.
fn split_columns(t: &HostTensor, n: usize) -> (HostTensor<'static>, HostTensor<'static>) {
    let rows = t.shape[0];
    let es = t.dtype.size();
    let mut left = Vec::with_capacity(rows * n * es);
    let mut right = Vec::with_capacity(rows * n * es);
    for r in 0..rows {
        let row = &t.data[r * 2 * n * es..(r + 1) * 2 * n * es];
        left.extend_from_slice(&row[..n * es]);
        right.extend_from_slice(&row[n * es..]);
    }
    let make = |data: Vec<u8>| HostTensor {
        dtype: t.dtype,
        shape: vec![rows, n],
        data: std::borrow::Cow::Owned(data),
    };
    (make(left), make(right))
}

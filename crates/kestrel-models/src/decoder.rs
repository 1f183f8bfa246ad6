//! The decoder stack shared by every Qwen3 architecture: embedding, layers of
//! (norm, mixer, norm, feed-forward) with residuals, final norm, lm_head.
//! Architectures differ only in which mixer and feed-forward each layer has
//! and in checkpoint layouts, which the blocks' loaders absorb.

use anyhow::Result;
use std::hash::{Hash, Hasher};

use kestrel_core::{Backend, CacheSpec, ForwardBatch, PreNorm, StepKey};

use crate::blocks::{
    Attention, FeedForward, GatedDeltaNet, attention::attention_spec, gdn::gdn_spec,
};
use crate::config::{LayerKind, ModelConfig};
use crate::loader::Loader;

/// Largest number of decoding sequences whose steps are keyed for replay.
pub const MAX_REPLAYED_BATCH: usize = 8;
/// Most new tokens per sequence in a keyed step: a decode step has one, a
/// speculative verify step one per draft plus one.
pub const MAX_REPLAYED_TOKENS: usize = 16;

/// The new tokens of each sequence when `batch` is decode-shaped: up to
/// [`MAX_REPLAYED_BATCH`] sequences, each bringing the same number of new
/// tokens, 1 to [`MAX_REPLAYED_TOKENS`], none of them prompt tokens. Only
/// such steps are keyed for replay: prefill chunks vary too much in shape
/// for recordings to pay off, and a prompt's last token may take other
/// kernels than a decode row (`SeqChunk::prompt`).
pub(crate) fn decode_shaped(batch: &ForwardBatch) -> Option<usize> {
    let tokens = batch.seqs.first()?.num_tokens;
    let fits = batch.seqs.len() <= MAX_REPLAYED_BATCH
        && (1..=MAX_REPLAYED_TOKENS).contains(&tokens)
        && batch
            .seqs
            .iter()
            .all(|s| s.num_tokens == tokens && !s.prompt);
    fits.then_some(tokens)
}

/// The replay key of a decode-shaped step of model `owner` (its address):
/// the number of sequences, their new tokens and state checkpoints, and
/// what else changes the recorded work (`extra`: which rows get logits).
pub(crate) fn step_key(owner: usize, batch: &ForwardBatch, extra: impl Hash) -> StepKey {
    let checkpoints: Vec<usize> = batch
        .seqs
        .iter()
        .map(|s| s.state_checkpoints.len())
        .collect();
    let mut h = std::hash::DefaultHasher::new();
    (owner, batch.seqs.len(), batch.num_tokens(), checkpoints).hash(&mut h);
    extra.hash(&mut h);
    StepKey(h.finish())
}

/// The residual stream and the last layer's output, not yet added.
pub(crate) type Unadded<T> = (T, Option<T>);

pub enum Mixer<B: Backend> {
    Attention(Attention<B>),
    GatedDeltaNet(GatedDeltaNet<B>),
}

pub struct DecoderLayer<B: Backend> {
    pub input_norm: B::Weight,
    pub mixer: Mixer<B>,
    pub post_norm: B::Weight,
    pub ffn: FeedForward<B>,
}

impl<B: Backend> DecoderLayer<B> {
    /// `p` is the layer prefix, e.g. `model.layers.7.`; `cache_layer` is this
    /// layer's index among the cache layers of its kind.
    pub fn load(
        l: &Loader<B>,
        p: &str,
        cfg: &ModelConfig,
        kind: LayerKind,
        sparse: bool,
        cache_layer: usize,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let mixer = match kind {
            LayerKind::FullAttention => Mixer::Attention(Attention::load(
                l,
                &format!("{p}self_attn."),
                cfg,
                cache_layer,
            )?),
            LayerKind::LinearAttention => Mixer::GatedDeltaNet(GatedDeltaNet::load(
                l,
                &format!("{p}linear_attn."),
                cfg,
                cache_layer,
            )?),
        };
        let ffn = match (&cfg.moe, sparse) {
            (Some(moe), true) => FeedForward::load_moe(l, &format!("{p}mlp."), h, moe)?,
            _ => FeedForward::load_dense(
                l,
                &format!("{p}mlp."),
                h,
                cfg.dense_intermediate.unwrap_or_default(),
            )?,
        };
        Ok(DecoderLayer {
            input_norm: l.norm(&format!("{p}input_layernorm.weight"), h)?,
            mixer,
            post_norm: l.norm(&format!("{p}post_attention_layernorm.weight"), h)?,
            ffn,
        })
    }

    /// One layer on the residual stream: `residual += delta` (the previous
    /// layer's output; `None` for the first layer), then the layer. Returns
    /// the feed-forward output (not yet added to `residual`). Each norm is
    /// handed to the block's first operation, which may fuse it.
    pub fn forward(
        &self,
        b: &B,
        residual: &mut B::Tensor,
        delta: Option<&B::Tensor>,
        eps: f32,
        cache: &mut B::Cache,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let x = PreNorm {
            residual: &mut *residual,
            delta,
            weight: &self.input_norm,
            eps,
        };
        let mixed = match &self.mixer {
            Mixer::Attention(a) => a.forward(b, x, cache, batch),
            Mixer::GatedDeltaNet(g) => g.forward(b, x, cache, batch),
        };
        let x = PreNorm {
            residual,
            delta: Some(&mixed),
            weight: &self.post_norm,
            eps,
        };
        self.ffn.forward(b, x)
    }
}

pub struct Decoder<B: Backend> {
    pub config: ModelConfig,
    pub embed: B::Weight,
    pub layers: Vec<DecoderLayer<B>>,
    pub final_norm: B::Weight,
    /// `None` when the lm_head is tied to the embedding.
    lm_head: Option<B::Weight>,
}

impl<B: Backend> Decoder<B> {
    pub fn load(l: &Loader<B>, cfg: &ModelConfig) -> Result<Self> {
        let p = &cfg.weight_prefix;
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        // Each layer's index among the cache layers of its kind.
        let (mut attn_idx, mut gdn_idx) = (0, 0);
        let cache_layers: Vec<usize> = cfg
            .layer_kinds
            .iter()
            .map(|kind| {
                let counter = match kind {
                    LayerKind::FullAttention => &mut attn_idx,
                    LayerKind::LinearAttention => &mut gdn_idx,
                };
                *counter += 1;
                *counter - 1
            })
            .collect();
        let load_layer = |i: usize| {
            let lp = format!("{p}layers.{i}.");
            let kind = cfg.layer_kinds[i];
            DecoderLayer::load(l, &lp, cfg, kind, cfg.sparse_layers[i], cache_layers[i])
        };
        let (layers, ends) = l.join(
            || l.each(cfg.layer_kinds.len(), load_layer),
            || -> Result<_> {
                let embed_name = format!("{p}embed_tokens.weight");
                let embed = l.weight(&embed_name, &[v, h])?;
                let tied = cfg.tie_word_embeddings && !l.has("lm_head.weight");
                let lm_head = l.lm_head(&embed_name, tied, &[v, h])?;
                let final_norm = l.norm(&format!("{p}norm.weight"), h)?;
                Ok((embed, lm_head, final_norm))
            },
        );
        let (layers, (embed, lm_head, final_norm)) = (layers?, ends?);
        Ok(Decoder {
            config: cfg.clone(),
            embed,
            layers,
            final_norm,
            lm_head,
        })
    }

    pub fn lm_head(&self) -> &B::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// The caches this model needs for `num_blocks` KV pages and `num_slots`
    /// recurrent-state slots.
    pub fn cache_spec(&self, num_blocks: usize, block_size: usize, num_slots: usize) -> CacheSpec {
        cache_spec(&self.config, num_blocks, block_size, num_slots)
    }

    /// Runs the new tokens of `batch` through every layer and returns the
    /// hidden states before the final norm (what the MTP head consumes).
    pub fn forward(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
    ) -> B::Tensor {
        b.run_step(ids, batch, cache, None, &mut |cache| {
            self.forward_layers(b, ids, batch, cache)
        })
    }

    /// One step that ends in logits of the given `rows`. Decode and verify
    /// steps (up to [`MAX_REPLAYED_BATCH`] sequences, each with the same
    /// number of new tokens, at most [`MAX_REPLAYED_TOKENS`]) are keyed so
    /// that a backend can record them once and replay them.
    pub fn step_logits(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
        rows: &[usize],
    ) -> B::Tensor {
        let key = self.decode_key(batch, rows);
        b.run_step(ids, batch, cache, key, &mut |cache| {
            let (residual, out) = self.forward_layers_unadded(b, ids, batch, cache);
            self.logits_of_sum(b, residual, out, rows)
        })
    }

    /// [`Self::step_logits`] (the same logits, bit for bit) that also
    /// returns the hidden states of every row before the final norm, for a
    /// drafter that reads them (the MTP head). Not keyed for replay: the
    /// recording of a step returns one tensor.
    pub fn step_logits_and_hidden(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
        rows: &[usize],
    ) -> (B::Tensor, B::Tensor) {
        let mut hidden = None;
        let logits = b.run_step(ids, batch, cache, None, &mut |cache| {
            let (residual, out) = self.forward_layers_unadded(b, ids, batch, cache);
            let all: Vec<usize> = (0..b.dims(&residual).0).collect();
            let mut sum = b.gather_rows(&residual, &all);
            if let Some(out) = &out {
                b.add_assign(&mut sum, out);
            }
            hidden = Some(sum);
            self.logits_of_sum(b, residual, out, rows)
        });
        (logits, hidden.expect("an unkeyed step runs its closure"))
    }

    /// The replay key of a decode or verify step ([`decode_shaped`]) whose
    /// every row gets logits: this model and the step's shape ([`step_key`]).
    fn decode_key(&self, batch: &ForwardBatch, rows: &[usize]) -> Option<StepKey> {
        decode_shaped(batch)?;
        // Logits of a subset of the rows (a prefill chunk's last) gather
        // them by an uploaded index list, which a recording cannot replay.
        if !rows.iter().copied().eq(0..batch.num_tokens()) {
            return None;
        }
        Some(step_key(self as *const Self as usize, batch, rows))
    }

    fn forward_layers(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
    ) -> B::Tensor {
        let (mut residual, out) = self.forward_layers_unadded(b, ids, batch, cache);
        if let Some(out) = out {
            b.add_assign(&mut residual, &out);
        }
        residual
    }

    /// The layers' residual stream and the last layer's output, not yet
    /// added (the hidden states are their sum).
    fn forward_layers_unadded(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
    ) -> (B::Tensor, Option<B::Tensor>) {
        self.forward_layers_tapped(b, ids, batch, cache, &[]).0
    }

    /// [`Self::forward_layers_unadded`], also returning the hidden states
    /// after each layer of `taps` (in that order): extra copies, the
    /// stream itself untouched, so outputs do not change.
    pub(crate) fn forward_layers_tapped(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut B::Cache,
        taps: &[usize],
    ) -> (Unadded<B::Tensor>, Vec<B::Tensor>) {
        let eps = self.config.rms_norm_eps;
        let mut residual = b.embedding(&self.embed, ids);
        let mut out: Option<B::Tensor> = None;
        let mut tapped: Vec<Option<B::Tensor>> = taps.iter().map(|_| None).collect();
        for (i, layer) in self.layers.iter().enumerate() {
            let o = layer.forward(b, &mut residual, out.as_ref(), eps, cache, batch);
            for (slot, _) in tapped.iter_mut().zip(taps).filter(|(_, t)| **t == i) {
                let all: Vec<usize> = (0..b.dims(&residual).0).collect();
                let mut sum = b.gather_rows(&residual, &all);
                b.add_assign(&mut sum, &o);
                *slot = Some(sum);
            }
            out = Some(o);
        }
        let tapped = tapped
            .into_iter()
            .map(|t| t.expect("every tapped layer exists (checked by the drafter's loader)"))
            .collect();
        ((residual, out), tapped)
    }

    /// Logits of the selected rows of `hidden` (pre-final-norm states).
    pub fn logits(&self, b: &B, hidden: &B::Tensor, rows: &[usize]) -> B::Tensor {
        let x = b.gather_rows(hidden, rows);
        let x = b.rms_norm(&x, &self.final_norm, self.config.rms_norm_eps);
        b.matmul(&x, self.lm_head())
    }

    /// [`Self::logits`] of the hidden states `residual + out`, with the sum
    /// and the final norm inside the lm_head's product (`norm_matmul`: on
    /// CUDA one kernel at decode sizes, in place of an add, a norm and the
    /// product). Rows are gathered first where they are not all of them.
    pub(crate) fn logits_of_sum(
        &self,
        b: &B,
        residual: B::Tensor,
        out: Option<B::Tensor>,
        rows: &[usize],
    ) -> B::Tensor {
        let all = rows.iter().copied().eq(0..b.dims(&residual).0);
        let (mut residual, out) = if all {
            (residual, out)
        } else {
            let gathered = out.map(|o| b.gather_rows(&o, rows));
            (b.gather_rows(&residual, rows), gathered)
        };
        b.norm_matmul(
            PreNorm {
                residual: &mut residual,
                delta: out.as_ref(),
                weight: &self.final_norm,
                eps: self.config.rms_norm_eps,
            },
            self.lm_head(),
        )
    }
}

/// The backend caches (KV pages of the attention layers, recurrent-state
/// slots of the Gated DeltaNet layers) of a model of `cfg`, for
/// `num_blocks` pages and `num_slots` slots; Flash-Next's layers keep the
/// same ones.
pub fn cache_spec(
    cfg: &ModelConfig,
    num_blocks: usize,
    block_size: usize,
    num_slots: usize,
) -> CacheSpec {
    let attn = attention_spec(cfg);
    CacheSpec {
        attn_layers: cfg.num_attention_layers(),
        num_blocks,
        block_size,
        num_kv_heads: attn.num_kv_heads,
        head_dim: attn.head_dim,
        gdn_layers: cfg.num_linear_layers(),
        num_state_slots: num_slots,
        gdn: gdn_spec(cfg),
    }
}

#[cfg(test)]
mod tests {
    use kestrel_core::SeqChunk;
    use kestrel_cpu::CpuBackend;

    use super::*;
    use crate::Model;

    fn batch(tokens: &[usize]) -> ForwardBatch {
        ForwardBatch {
            seqs: tokens
                .iter()
                .enumerate()
                .map(|(i, &n)| SeqChunk {
                    prompt: false,
                    num_tokens: n,
                    cached_len: 3,
                    block_table: vec![i as u32],
                    state_slot: i as u32,
                    state_checkpoints: Vec::new(),
                    state_snapshot: None,
                })
                .collect(),
        }
    }

    #[test]
    fn decode_and_verify_steps_of_up_to_eight_equal_sequences_are_keyed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/golden/qwen3/model");
        let model = Model::load(&dir, &CpuBackend::new()).unwrap();
        let d = &model.decoder;
        let key = |tokens: &[usize], rows: &[usize]| d.decode_key(&batch(tokens), rows);
        for n in 1..=MAX_REPLAYED_BATCH {
            let rows: Vec<usize> = (0..n).collect();
            assert!(key(&vec![1; n], &rows).is_some(), "{n} sequences");
        }
        assert!(key(&[1; MAX_REPLAYED_BATCH + 1], &[0]).is_none());
        assert!(
            key(&[1, 2], &[0, 2]).is_none(),
            "sequences with different numbers of tokens"
        );
        assert!(key(&[], &[]).is_none());
        // Verify steps: every sequence with the same k + 1 tokens.
        assert!(key(&[4, 4], &[0, 1, 2, 3, 4, 5, 6, 7]).is_some());
        let all = |n: usize| (0..n).collect::<Vec<_>>();
        assert!(key(&[MAX_REPLAYED_TOKENS], &all(MAX_REPLAYED_TOKENS)).is_some());
        assert!(
            key(&[MAX_REPLAYED_TOKENS + 1], &all(MAX_REPLAYED_TOKENS + 1)).is_none(),
            "a prefill chunk"
        );
        assert!(
            key(&[4], &[3]).is_none(),
            "logits of some rows only: their gather uploads an index list"
        );
        assert_ne!(key(&[2, 2], &all(4)), key(&[1, 1], &[0, 1]));
        let mut with_checkpoints = batch(&[2, 2]);
        for s in &mut with_checkpoints.seqs {
            s.state_checkpoints = vec![7];
        }
        assert_ne!(
            d.decode_key(&with_checkpoints, &all(4)),
            key(&[2, 2], &all(4)),
            "checkpoint writes change the work"
        );
        // Different batch sizes or logit rows must not share a recording.
        assert_ne!(key(&[1], &[0]), key(&[1, 1], &[0, 1]));
        assert!(key(&[1, 1], &[1]).is_none());
        assert_eq!(key(&[1, 1], &[0, 1]), key(&[1, 1], &[0, 1]));
    }
}

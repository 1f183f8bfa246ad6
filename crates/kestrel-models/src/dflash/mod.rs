//! The DFlash block drafter (z-lab checkpoints): one non-causal pass of a
//! few Qwen3 layers proposes a whole block of drafts.
//!
//! Why it is shaped this way: the drafter has no embedding, no lm_head and
//! no causal self-history of its own. What it knows about the sequence is
//! the *context*: the target's hidden states after the layers
//! `target_layer_ids`, concatenated, projected by `fc` and normed by
//! `hidden_norm`, then turned by every layer's own k/v projections (k_norm,
//! RoPE at the token's position) into keys and values. Those are computed
//! once per accepted token and kept ([`DraftContext`]), so a draft pass
//! only runs the block: `[anchor, mask x (B-1)]` at positions
//! `start .. start+B-1`, embedded with the target's table, whose queries
//! see every context key and every block key (no mask), then the drafter's
//! `norm` and the target's lm_head on the B-1 mask rows.
//!
//! The block's own keys and values are used for that pass only; the next
//! pass starts from the context again (the reference crops its draft cache
//! back to the context after every pass).

pub mod config;
mod context;

use std::path::Path;

use anyhow::{Context, Result};
use kestrel_core::{AttentionSpec, Backend, HostTensor, PreNorm, RopeSpec};

pub use config::DflashConfig;
pub use context::DraftContext;

use crate::blocks::FeedForward;
use crate::decoder::Decoder;
use crate::draft_head::DraftHead;
use crate::loader::Loader;
use crate::weights::WeightFiles;

struct DraftLayer<B: Backend> {
    input_norm: B::Weight,
    /// `q_proj`, `k_proj` and `v_proj` stacked: `[Hq*D + 2 * Hkv * D, H]`,
    /// what a block pass projects.
    qkv_proj: B::Weight,
    /// `k_proj` and `v_proj` stacked: `[2 * Hkv * D, H]`, what the context
    /// projects (it needs no queries).
    kv_proj: B::Weight,
    o_proj: B::Weight,
    q_norm: B::Weight,
    k_norm: B::Weight,
    post_norm: B::Weight,
    mlp: FeedForward<B>,
}

impl<B: Backend> DraftLayer<B> {
    fn load(l: &Loader<B>, p: &str, cfg: &DflashConfig, spec: &AttentionSpec) -> Result<Self> {
        let h = cfg.layers.hidden_size;
        let (qw, kvw, d) = (spec.q_width(), spec.kv_width(), spec.head_dim);
        let a = format!("{p}self_attn.");
        Ok(DraftLayer {
            input_norm: l.norm(&format!("{p}input_layernorm.weight"), h)?,
            qkv_proj: l.fused(&[
                (&format!("{a}q_proj.weight"), &[qw, h]),
                (&format!("{a}k_proj.weight"), &[kvw, h]),
                (&format!("{a}v_proj.weight"), &[kvw, h]),
            ])?,
            kv_proj: l.fused(&[
                (&format!("{a}k_proj.weight"), &[kvw, h]),
                (&format!("{a}v_proj.weight"), &[kvw, h]),
            ])?,
            o_proj: l.weight(&format!("{a}o_proj.weight"), &[h, qw])?,
            q_norm: l.norm(&format!("{a}q_norm.weight"), d)?,
            k_norm: l.norm(&format!("{a}k_norm.weight"), d)?,
            post_norm: l.norm(&format!("{p}post_attention_layernorm.weight"), h)?,
            mlp: FeedForward::load_dense(
                l,
                &format!("{p}mlp."),
                h,
                cfg.layers
                    .dense_intermediate
                    .context("missing intermediate_size")?,
            )?,
        })
    }
}

pub struct DflashDrafter<B: Backend> {
    pub config: DflashConfig,
    spec: AttentionSpec,
    /// `fc.weight` `[H, taps * H]` split by input block: `fc[j]` `[H, H]`
    /// reads tap j, so the concatenated feature is never formed.
    fc: Vec<B::Weight>,
    hidden_norm: B::Weight,
    layers: Vec<DraftLayer<B>>,
    norm: B::Weight,
}

impl<B: Backend> DflashDrafter<B> {
    /// Loads a drafter folder (`config.json` with `dflash_config`, and
    /// safetensors) for `target`, whose embedding and lm_head it uses.
    pub fn load(dir: &Path, backend: &B, target: &Decoder<B>) -> Result<Self> {
        let build = || -> Result<Self> {
            let config = DflashConfig::from_file(&dir.join("config.json"))?;
            config.check_target(&target.config)?;
            let files = WeightFiles::open(dir)?;
            // Qwen3 norms: plain weights.
            let l = Loader::from_files(&files, backend, false);
            Self::build(&l, config)
        };
        build().with_context(|| format!("cannot load the DFlash drafter from {}", dir.display()))
    }

    /// A drafter of `config` (a drafter `config.json`, or its folder) with
    /// random weights, for timing at real shapes without a checkpoint.
    pub fn dummy(config: &Path, backend: &B, target: &Decoder<B>, seed: u64) -> Result<Self> {
        let path = crate::config::config_file(config);
        let build = || -> Result<Self> {
            let config = DflashConfig::from_file(&path)?;
            config.check_target(&target.config)?;
            let dummy = crate::loader::DummyWeights {
                seed,
                absent: Default::default(),
            };
            Self::build(&Loader::dummy(dummy, backend, false), config)
        };
        build().with_context(|| {
            format!(
                "cannot build a dummy DFlash drafter from {}",
                path.display()
            )
        })
    }

    fn build(l: &Loader<B>, config: DflashConfig) -> Result<Self> {
        let c = &config.layers;
        let h = c.hidden_size;
        let spec = AttentionSpec {
            num_q_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rope: RopeSpec {
                theta: c.rope_theta,
                rotary_dim: c.rotary_dim,
            },
            norm_eps: c.rms_norm_eps,
            output_gate: false,
            scale: (c.head_dim as f32).powf(-0.5),
        };
        let layers = (0..c.num_layers)
            .map(|i| DraftLayer::load(l, &format!("layers.{i}."), &config, &spec))
            .collect::<Result<Vec<_>>>()?;
        let taps = config.target_layer_ids.len();
        let fc = (0..taps)
            .map(|j| {
                l.materialize(&format!("fc.weight#tap{j}"), &[h, h], || {
                    let full = l.tensor("fc.weight", &[h, taps * h])?.into_dense();
                    Ok(column_block(&full, j * h, h))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(DflashDrafter {
            fc,
            hidden_norm: l.norm("hidden_norm.weight", h)?,
            norm: l.norm("norm.weight", h)?,
            layers,
            spec,
            config,
        })
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Appends to every layer's context keys and values (`keys`, one store
    /// per drafter layer) those of `taps` (per target layer of
    /// `target_layer_ids`, `[n, H]`: the target's hidden states of n
    /// consecutive tokens from `first_position` on).
    pub fn append_context(
        &self,
        b: &B,
        keys: &mut [B::BlockKeys],
        taps: &[B::Tensor],
        first_position: usize,
    ) {
        let n = taps.first().map_or(0, |t| b.dims(t).0);
        self.append_contexts(b, &mut [keys], taps, &[first_position], &[n]);
    }

    /// [`DflashDrafter::append_context`] of several sequences in one call:
    /// `taps` hold their rows one sequence after another (`counts[s]` rows
    /// of sequence `s`, whose stores are `keys[s]`, from
    /// `first_positions[s]` on). The products run once over every row, and
    /// each layer's rows go to all the sequences' stores in one backend call.
    pub fn append_contexts(
        &self,
        b: &B,
        keys: &mut [&mut [B::BlockKeys]],
        taps: &[B::Tensor],
        first_positions: &[usize],
        counts: &[usize],
    ) {
        assert_eq!(
            taps.len(),
            self.fc.len(),
            "one hidden state per target layer tapped"
        );
        assert!(
            keys.iter().all(|k| k.len() == self.layers.len()),
            "one store per drafter layer"
        );
        let eps = self.config.layers.rms_norm_eps;
        let mut projected = b.matmul(&taps[0], &self.fc[0]);
        for (tap, fc) in taps.iter().zip(&self.fc).skip(1) {
            b.add_assign(&mut projected, &b.matmul(tap, fc));
        }
        let x = b.rms_norm(&projected, &self.hidden_norm, eps);
        for (i, layer) in self.layers.iter().enumerate() {
            let kv = b.matmul(&x, &layer.kv_proj);
            let mut stores: Vec<&mut B::BlockKeys> = keys.iter_mut().map(|k| &mut k[i]).collect();
            b.append_block_keys_batch(
                &mut stores,
                &kv,
                &layer.k_norm,
                &self.spec,
                first_positions,
                counts,
            );
        }
    }

    /// Empty context stores, one per drafter layer.
    pub fn new_context_keys(&self, b: &B) -> Vec<B::BlockKeys> {
        self.layers
            .iter()
            .map(|_| b.new_block_keys(&self.spec))
            .collect()
    }

    /// The drafter's normalised output for the block `[anchor, mask x
    /// (block - 1)]` placed right after `context` (`[block, H]`; row 0 is
    /// the anchor's, rows 1.. predict the drafts).
    pub fn block_hidden(
        &self,
        b: &B,
        target: &Decoder<B>,
        context: &mut DraftContext<B>,
        anchor: u32,
        block: usize,
    ) -> B::Tensor {
        self.blocks_hidden(b, target, &mut [(context, anchor)], block)
    }

    /// [`DflashDrafter::block_hidden`] of several sequences in one pass:
    /// their blocks are consecutive row groups of every product (the
    /// weights are read once for all of them), and only the attention runs
    /// per sequence, over its own context. `[seqs * block, H]`.
    pub fn blocks_hidden(
        &self,
        b: &B,
        target: &Decoder<B>,
        seqs: &mut [(&mut DraftContext<B>, u32)],
        block: usize,
    ) -> B::Tensor {
        let eps = self.config.layers.rms_norm_eps;
        let block = block.max(1);
        let mut ids = Vec::with_capacity(seqs.len() * block);
        for (_, anchor) in seqs.iter() {
            ids.push(*anchor);
            ids.extend(std::iter::repeat_n(self.config.mask_token_id, block - 1));
        }
        let mut residual = b.embedding(&target.embed, &ids);
        let mut out: Option<B::Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let x = b.pre_norm(PreNorm {
                residual: &mut residual,
                delta: out.as_ref(),
                weight: &layer.input_norm,
                eps,
            });
            let qkv = b.matmul(&x, &layer.qkv_proj);
            let first_positions: Vec<usize> = seqs.iter().map(|(c, _)| c.end()).collect();
            let mut keys: Vec<&mut B::BlockKeys> =
                seqs.iter_mut().map(|(c, _)| c.layer_mut(i)).collect();
            let attn = b.block_attention_batch(
                &qkv,
                &layer.q_norm,
                &layer.k_norm,
                &mut keys,
                &self.spec,
                &first_positions,
                block,
            );
            let mixed = b.matmul(&attn, &layer.o_proj);
            out = Some(layer.mlp.forward(
                b,
                PreNorm {
                    residual: &mut residual,
                    delta: Some(&mixed),
                    weight: &layer.post_norm,
                    eps,
                },
            ));
        }
        match out {
            Some(o) => b.add_rms_norm(&mut residual, &o, &self.norm, eps),
            None => b.rms_norm(&residual, &self.norm, eps),
        }
    }

    /// Draft logits of a block (`[block - 1, vocab]`, the target's lm_head
    /// on the mask rows).
    pub fn block_logits(
        &self,
        b: &B,
        target: &Decoder<B>,
        context: &mut DraftContext<B>,
        anchor: u32,
        block: usize,
    ) -> B::Tensor {
        let hidden = self.block_hidden(b, target, context, anchor, block);
        let rows: Vec<usize> = (1..block).collect();
        b.matmul(&b.gather_rows(&hidden, &rows), target.lm_head())
    }

    /// Greedy drafts of several sequences' blocks in one pass
    /// ([`DflashDrafter::blocks_hidden`]): `block - 1` ids that `head`
    /// scores (the whole lm_head or a reduced draft vocabulary's rows) each,
    /// none for a sequence whose context is empty.
    pub fn drafts_batch(
        &self,
        b: &B,
        target: &Decoder<B>,
        seqs: &mut [(&mut DraftContext<B>, u32)],
        block: usize,
        head: &DraftHead<B>,
    ) -> Vec<Vec<u32>> {
        let mut drafts = vec![Vec::new(); seqs.len()];
        if block < 2 {
            return drafts;
        }
        let (ready, mut with_context): (Vec<usize>, Vec<_>) = seqs
            .iter_mut()
            .enumerate()
            .filter(|(_, (c, _))| !c.is_empty())
            .map(|(i, (c, a))| (i, (&mut **c, *a)))
            .unzip();
        if with_context.is_empty() {
            return drafts;
        }
        let hidden = self.blocks_hidden(b, target, &mut with_context, block);
        let rows: Vec<usize> = (0..ready.len())
            .flat_map(|s| s * block + 1..(s + 1) * block)
            .collect();
        let ids = head.argmax(b, target, &b.gather_rows(&hidden, &rows));
        for (chunk, &i) in ids.chunks(block - 1).zip(&ready) {
            drafts[i] = chunk.to_vec();
        }
        drafts
    }

    /// Greedy drafts of a block (`block - 1` ids that `head` scores).
    pub fn drafts(
        &self,
        b: &B,
        target: &Decoder<B>,
        context: &mut DraftContext<B>,
        anchor: u32,
        block: usize,
        head: &DraftHead<B>,
    ) -> Vec<u32> {
        self.drafts_batch(b, target, &mut [(context, anchor)], block, head)
            .pop()
            .unwrap_or_default()
    }
}

/// Columns `start .. start + width` of a `[rows, cols]` tensor.
fn column_block(t: &HostTensor, start: usize, width: usize) -> HostTensor<'static> {
    let (rows, cols) = (t.shape[0], t.shape[1]);
    let es = t.dtype.size();
    let mut data = Vec::with_capacity(rows * width * es);
    for r in 0..rows {
        data.extend_from_slice(&t.data[(r * cols + start) * es..(r * cols + start + width) * es]);
    }
    HostTensor {
        dtype: t.dtype,
        shape: vec![rows, width],
        data: std::borrow::Cow::Owned(data),
    }
}

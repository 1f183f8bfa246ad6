//! Qwen3.8-Flash-Next (`model_type` `qwen4_exp`), the text model, on any
//! backend with [`FlashNextOps`].
//!
//! It keeps Qwen3.5's Gated DeltaNet (with a sigmoid output gate), gated
//! attention and MoE blocks, but replaces the residual with four-stream
//! hyper-connections, restricts attention to blocks chosen by a learned
//! indexer (QSA), and adds hashed n-gram embeddings (PLE) on some layers.
//! These do not fit the shared [`crate::Decoder`], so the model has its own
//! layer stack here; see `docs/flash-next.md`. The engine drives it through
//! [`crate::Target`]. Not yet covered: the MTP head and checkpoints stored in
//! FP8 (FP8 at load time is).

pub mod cache;
pub mod config;
pub mod dummy;
mod hyper;
mod layer;
pub mod ngram;
mod ple;
pub mod runner;

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use kestrel_core::flash_next::{FlashNextOps, HyperSpec};
use kestrel_core::{ForwardBatch, StateSnapshot, StepKey};

pub use cache::FlashNextCache;
pub use config::FlashNextConfig;
use hyper::HyperConnection;
use layer::FlashNextLayer;
use ngram::{NgramHasher, NgramTable, context_after, token_history};
use ple::Ple;

use crate::config::LayerKind;
use crate::decoder::{decode_shaped, step_key};
use crate::loader::Loader;
use crate::pipeline::{self, LoadMode, LoadPlan};
use crate::weights::WeightFiles;
use crate::{Quantization, WeightForm, fp8};

pub struct FlashNext<B: FlashNextOps> {
    pub config: FlashNextConfig,
    embed: B::Weight,
    layers: Vec<FlashNextLayer<B>>,
    /// Averages the streams into the hidden state the lm_head reads (no
    /// final norm follows).
    mixer: HyperConnection<B>,
    lm_head: Option<B::Weight>,
    hyper: HyperSpec,
}

impl<B: FlashNextOps> FlashNext<B> {
    /// Loads `config.json` and the safetensors of a model folder. The n-gram
    /// tables stay in the memory-mapped files.
    pub fn load(dir: &Path, backend: &B) -> Result<Self> {
        Self::load_as(dir, backend, Quantization::AsStored)
    }

    /// [`Self::load`] in the form `form` says: the weights as stored, or
    /// quantised to block-FP8 while loading (`--quantization fp8`: the
    /// linear projections and experts [`fp8::quantizable`] names, as for the
    /// other architectures; the hyper-connection, router, GDN gate and n-gram
    /// weights stay as stored), and optionally the lm_head quantised too
    /// (`--lm-head-dtype fp8`). Checkpoints stored in FP8 are refused: which
    /// of Flash-Next's own tensors they quantise is not known.
    pub fn load_as(dir: &Path, backend: &B, form: impl Into<WeightForm>) -> Result<Self> {
        let form = form.into();
        let config_path = dir.join("config.json");
        let config = FlashNextConfig::from_file(&config_path)?;
        if fp8::QuantConfig::from_file(&config_path)?.is_some() {
            bail!("quantised qwen4_exp checkpoints are not supported yet");
        }
        let files = Arc::new(WeightFiles::open(dir)?);
        let plan = LoadPlan {
            zero_centred_norms: true,
            mode: LoadMode::Upload,
            form,
        };
        let shared = Arc::clone(&files);
        pipeline::load(&files, backend, plan, move |l| {
            Self::build(l, config, shared)
        })
        .map(|(model, _)| model)
        .with_context(|| format!("cannot load model from {}", dir.display()))
    }

    /// The model of a `config.json` (a file, or a folder holding one) with
    /// random weights of the real shapes drawn from `seed`, in the form
    /// `form` says ([`Self::load_as`]), its n-gram tables sparse files in
    /// `table_dir` (default [`dummy::default_dir`]): benchmarks of the
    /// full-size model without its files.
    pub fn load_dummy_as(
        config: &Path,
        backend: &B,
        seed: u64,
        table_dir: Option<&Path>,
        form: impl Into<WeightForm>,
    ) -> Result<Self> {
        let form = form.into();
        let path = crate::config::config_file(config);
        let config = FlashNextConfig::from_file(&path)?;
        let table_dir = table_dir.map_or_else(|| dummy::default_dir(&config), Path::to_path_buf);
        let tables = Arc::new(dummy::sparse_tables(&config, &table_dir)?);
        let mut absent = std::collections::HashSet::new();
        if config.base.tie_word_embeddings {
            absent.insert("lm_head.weight".to_string());
        }
        let weights = crate::loader::DummyWeights { seed, absent };
        let loader = Loader::dummy(weights, backend, true).with_quantization(form);
        Self::build(&loader, config, tables)
            .with_context(|| format!("cannot build a dummy model from {}", path.display()))
    }

    fn build(l: &Loader<B>, config: FlashNextConfig, files: Arc<WeightFiles>) -> Result<Self> {
        let cfg = &config.base;
        let p = &cfg.weight_prefix;
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let hyper = HyperSpec {
            streams: config.hc_count,
            hidden: h,
            eps: cfg.rms_norm_eps,
        };
        let (mut attn_idx, mut gdn_idx) = (0, 0);
        let mut layers = Vec::with_capacity(cfg.num_layers);
        for (i, &kind) in cfg.layer_kinds.iter().enumerate() {
            let counter = match kind {
                LayerKind::FullAttention => &mut attn_idx,
                LayerKind::LinearAttention => &mut gdn_idx,
            };
            let cache_layer = *counter;
            *counter += 1;
            let lp = format!("{p}layers.{i}.");
            let ple = match &config.ple {
                Some(pc) => match pc.layers.iter().position(|&l| l == i) {
                    Some(index) => {
                        let hasher = NgramHasher::new(pc, v, index);
                        let table = NgramTable::open(
                            Arc::clone(&files),
                            &format!("{lp}ple.ple_embedding.ngram_embedding."),
                            hasher.rows as usize,
                            pc.head_dim(),
                            pc.split_parts,
                        )?;
                        let conv = (pc.conv_kernel, pc.ngram_size);
                        Some(Ple::load(
                            l,
                            &format!("{lp}ple."),
                            hasher,
                            table,
                            hyper,
                            conv,
                            index,
                        )?)
                    }
                    None => None,
                },
                None => None,
            };
            layers.push(
                FlashNextLayer::load(l, &lp, &config, kind, cache_layer, hyper, ple)
                    .with_context(|| format!("layer {i}"))?,
            );
        }
        let embed_name = format!("{p}embed_tokens.weight");
        let tied = cfg.tie_word_embeddings && !l.has("lm_head.weight");
        let lm_head = l.lm_head(&embed_name, tied, &[v, h])?;
        Ok(FlashNext {
            embed: l.weight(&embed_name, &[v, h])?,
            layers,
            mixer: HyperConnection::load(
                l,
                &format!("{p}hyper_connection_mixer."),
                hyper,
                config.hc_lowrank,
                false,
            )?,
            lm_head,
            hyper,
            config,
        })
    }

    pub fn lm_head(&self) -> &B::Weight {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Caches for `num_blocks` pages of `block_size` positions and `slots`
    /// sequence-state slots.
    pub fn new_cache(
        &self,
        b: &B,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> Result<FlashNextCache<B>> {
        let cfg = &self.config.base;
        let base = b.new_cache(&crate::decoder::cache_spec(
            cfg, num_blocks, block_size, slots,
        ))?;
        let ple = &self.config.ple;
        let ple_modules = ple.as_ref().map_or(0, |p| p.layers.len());
        let state_rows = self
            .layers
            .iter()
            .find_map(|l| l.ple.as_ref().map(|p| p.spec.state_len()))
            .unwrap_or(0);
        FlashNextCache::new(
            b,
            base,
            (
                cfg.num_attention_layers(),
                self.config.qsa.head_dim,
                self.config.qsa.compress_ratio,
            ),
            (ple_modules, state_rows, self.hyper.width()),
            ple.as_ref().map_or(0, |p| p.ngram_size - 1),
            ple.as_ref().map_or(0, |p| p.eos_token_id),
            num_blocks,
            block_size,
            slots,
        )
    }

    /// Runs the new tokens of `batch` and returns their hidden states
    /// `[T, hidden]` (the streams averaged by the final mixer).
    pub fn forward(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
    ) -> Result<B::Tensor> {
        self.step(b, ids, batch, cache, None)
    }

    /// Logits of `rows` of the step's new tokens: [`Self::logits`] of
    /// [`Self::forward`]'s states, computed inside the step (so that a
    /// decode step's lm_head takes the decode products too).
    pub fn step_logits(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
        rows: &[usize],
    ) -> Result<B::Tensor> {
        self.step(b, ids, batch, cache, Some(rows))
    }

    /// One forward step as one `Backend::run_step` (a device stages the
    /// step's layout once for every layer and picks its decode kernels for
    /// decode-shaped steps): the hidden states of every new token, or the
    /// logits of `rows`.
    fn step(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
        rows: Option<&[usize]>,
    ) -> Result<B::Tensor> {
        if ids.len() != batch.num_tokens() {
            bail!(
                "{} ids for a batch of {} tokens",
                ids.len(),
                batch.num_tokens()
            );
        }
        // The n-gram histories are the same for every PLE module. The
        // context is per-sequence state like the GDN state: checkpoints and
        // snapshots get it too.
        let mut history = Vec::new();
        if let Some(pc) = &self.config.ple {
            let mut start = 0;
            for s in &batch.seqs {
                let seq = &ids[start..start + s.num_tokens];
                let before = cache.ngram_context[s.state_slot as usize].clone();
                for (i, &dst) in s.state_checkpoints.iter().enumerate() {
                    cache.ngram_context[dst as usize] = context_after(&before, &seq[..i + 1]);
                }
                if let Some(StateSnapshot {
                    after,
                    slot: Some(dst),
                }) = s.state_snapshot
                {
                    cache.ngram_context[dst as usize] = context_after(&before, &seq[..after]);
                }
                let ctx = &mut cache.ngram_context[s.state_slot as usize];
                history.extend(token_history(ctx, seq, pc.ngram_size, pc.eos_token_id));
                start += s.num_tokens;
            }
        }
        let key = self.decode_key(batch, rows);
        let mut embeddings: Vec<Vec<f32>> = vec![Vec::new(); cache.ple_conv.len()];
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some(ple) = &layer.ple {
                embeddings[ple.state_index] = ple
                    .embeddings(&history)
                    .with_context(|| format!("layer {i}: n-gram embeddings"))?;
            }
        }
        cache.stage_ple(b, embeddings, ids.len(), key.is_some());
        let (base, mut pools) = cache.split();
        Ok(b.run_step(ids, batch, base, key, &mut |base| {
            let mut x = b.repeat_streams(&b.embedding(&self.embed, ids), self.hyper.streams);
            let mut pending = None;
            for layer in &self.layers {
                layer.forward(b, &mut x, &mut pending, base, &mut pools, batch);
            }
            let hidden = self.mixer.mix(b, &mut x, pending).0;
            match rows {
                Some(rows) => self.logits(b, &hidden, rows),
                None => hidden,
            }
        }))
    }

    /// The key under which the backend may record a step (see
    /// `Backend::run_step`): decode-shaped steps (`crate::decoder::decode_shaped`)
    /// with logits of every row or none, and only while no new token has
    /// more complete indexer blocks than the budget keeps: past it the
    /// tokens' block scores come back to the host to be ranked, which a
    /// recording cannot do.
    fn decode_key(&self, batch: &ForwardBatch, rows: Option<&[usize]>) -> Option<StepKey> {
        decode_shaped(batch)?;
        let qsa = &self.config.qsa;
        let top = qsa.budget / qsa.compress_ratio;
        let scores = batch
            .seqs
            .iter()
            .any(|s| s.total_len() / qsa.compress_ratio > top);
        let some_rows = rows.is_some_and(|r| !r.iter().copied().eq(0..batch.num_tokens()));
        if scores || some_rows {
            return None;
        }
        Some(step_key(
            self as *const Self as usize,
            batch,
            rows.is_some(),
        ))
    }

    /// Logits of the selected rows of `hidden`.
    pub fn logits(&self, b: &B, hidden: &B::Tensor, rows: &[usize]) -> B::Tensor {
        b.matmul(&b.gather_rows(hidden, rows), self.lm_head())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::SeqChunk;
    use kestrel_cpu::CpuBackend;

    /// Steps of `seqs` sequences at these cached lengths, `tokens` new each.
    fn step(cached: &[usize], tokens: usize) -> ForwardBatch {
        ForwardBatch {
            seqs: cached
                .iter()
                .enumerate()
                .map(|(i, &c)| SeqChunk::new(tokens, c, vec![0; 8], i as u32))
                .collect(),
        }
    }

    #[test]
    fn decode_steps_are_keyed_only_within_the_indexer_budget() {
        let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../testdata/golden/qwen4_exp/model");
        let model = FlashNext::load(&dir, &CpuBackend::new()).unwrap();
        let qsa = &model.config.qsa;
        // The last position whose complete blocks the budget still keeps.
        let last = (qsa.budget / qsa.compress_ratio + 1) * qsa.compress_ratio - 1;
        let all = [0, 1];
        let key = |b: &ForwardBatch, rows: Option<&[usize]>| model.decode_key(b, rows);

        let within = step(&[last - 1, 3], 1);
        assert!(key(&within, None).is_some());
        assert!(key(&within, Some(&all)).is_some());
        assert_ne!(key(&within, None), key(&within, Some(&all)));
        // The same shape at other positions replays the same recording.
        assert_eq!(key(&within, None), key(&step(&[2, 5], 1), None));
        // Verify steps of 4 tokens per sequence have a key of their own.
        let verify = step(&[2, 5], 4);
        assert!(key(&verify, None).is_some());
        assert_ne!(key(&verify, None), key(&within, None));

        // A token past the budget scores blocks on the host.
        assert!(key(&step(&[last, 3], 1), None).is_none());
        // Logits of some rows, uneven chunks and prompt chunks are not keyed.
        assert!(key(&within, Some(&[1])).is_none());
        let mut uneven = step(&[2, 5], 1);
        uneven.seqs[1].num_tokens = 2;
        assert!(key(&uneven, None).is_none());
        let mut prompt = step(&[0, 5], 1);
        prompt.seqs[0].prompt = true;
        assert!(key(&prompt, None).is_none());
    }
}

//! What the serving engine runs: a model on the shared [`Decoder`] (with
//! its MTP head), or Qwen3.8-Flash-Next with its own layer stack, behind one
//! set of step methods; and the caches each needs.
//!
//! Flash-Next's operations need [`FlashNextOps`], which the engine does not
//! ask of its backend, so it comes type-erased ([`FlashNextStep`]): built
//! where the backend is known, driven where only [`Backend`] is.

use std::path::Path;

use anyhow::Result;
use kestrel_core::{Backend, FlashNextOps, ForwardBatch};

use crate::decoder::cache_spec;
use crate::flash_next::{FlashNext, FlashNextCache};
use crate::{Arch, Model, ModelConfig, WeightForm};

/// The model the engine drives (one per engine, so the variants' sizes do
/// not matter).
#[allow(clippy::large_enum_variant)]
pub enum Target<B: Backend> {
    Decoder(Model<B>),
    FlashNext(Box<dyn FlashNextStep<B>>),
}

/// One Flash-Next forward and its logits, for any backend with the
/// operations (see [`FlashNext`]).
pub trait FlashNextStep<B: Backend>: Send {
    fn config(&self) -> &ModelConfig;
    fn new_cache(
        &self,
        b: &B,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> Result<FlashNextCache<B>>;
    fn forward(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
    ) -> Result<B::Tensor>;
    fn step_logits(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
        rows: &[usize],
    ) -> Result<B::Tensor>;
    fn logits(&self, b: &B, hidden: &B::Tensor, rows: &[usize]) -> B::Tensor;
}

impl<B: FlashNextOps> FlashNextStep<B> for FlashNext<B>
where
    FlashNext<B>: Send,
{
    fn config(&self) -> &ModelConfig {
        &self.config.base
    }
    fn new_cache(
        &self,
        b: &B,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> Result<FlashNextCache<B>> {
        FlashNext::new_cache(self, b, num_blocks, block_size, slots)
    }
    fn forward(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
    ) -> Result<B::Tensor> {
        FlashNext::forward(self, b, ids, batch, cache)
    }
    fn step_logits(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut FlashNextCache<B>,
        rows: &[usize],
    ) -> Result<B::Tensor> {
        FlashNext::step_logits(self, b, ids, batch, cache, rows)
    }
    fn logits(&self, b: &B, hidden: &B::Tensor, rows: &[usize]) -> B::Tensor {
        FlashNext::logits(self, b, hidden, rows)
    }
}

impl<B: Backend> From<Model<B>> for Target<B> {
    fn from(model: Model<B>) -> Self {
        Target::Decoder(model)
    }
}

impl<B: FlashNextOps> From<FlashNext<B>> for Target<B>
where
    FlashNext<B>: Send + 'static,
{
    fn from(model: FlashNext<B>) -> Self {
        Target::FlashNext(Box::new(model))
    }
}

impl<B: FlashNextOps> Target<B>
where
    FlashNext<B>: Send + 'static,
{
    /// Loads a model folder of any supported architecture, in the form
    /// `form` says ([`Model::load_as`], [`FlashNext::load_as`]).
    pub fn load_as(dir: &Path, backend: &B, form: impl Into<WeightForm>) -> Result<Self> {
        let form = form.into();
        if !is_flash_next(&dir.join("config.json"))? {
            return Ok(Model::load_as(dir, backend, form)?.0.into());
        }
        Ok(FlashNext::load_as(dir, backend, form)?.into())
    }

    /// [`Model::load_dummy_as`]; for Flash-Next [`FlashNext::load_dummy_as`],
    /// its n-gram tables sparse files under the temporary folder
    /// ([`crate::flash_next::dummy`]).
    pub fn load_dummy_as(
        config: &Path,
        backend: &B,
        seed: u64,
        form: impl Into<WeightForm>,
    ) -> Result<Self> {
        let path = crate::config::config_file(config);
        if !is_flash_next(&path)? {
            return Ok(Model::load_dummy_as(config, backend, seed, form)?.into());
        }
        Ok(FlashNext::load_dummy_as(&path, backend, seed, None, form)?.into())
    }
}

/// Whether a `config.json` is a `qwen4_exp` model.
fn is_flash_next(config: &Path) -> Result<bool> {
    Ok(ModelConfig::from_file(config)?.arch == Arch::Qwen4Exp)
}

impl<B: Backend> Target<B> {
    pub fn config(&self) -> &ModelConfig {
        match self {
            Target::Decoder(m) => m.config(),
            Target::FlashNext(m) => m.config(),
        }
    }

    /// The model on the shared decoder: what the MTP and DFlash drafters
    /// read. `None` for Flash-Next.
    pub fn decoder_model(&self) -> Option<&Model<B>> {
        match self {
            Target::Decoder(m) => Some(m),
            Target::FlashNext(_) => None,
        }
    }

    /// The backend caches for `num_blocks` pages and `slots` state slots
    /// (Flash-Next's own per-position and per-slot state excluded).
    pub fn cache_spec(
        &self,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> kestrel_core::CacheSpec {
        cache_spec(self.config(), num_blocks, block_size, slots)
    }

    pub fn new_cache(
        &self,
        b: &B,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> Result<TargetCache<B>> {
        Ok(match self {
            Target::Decoder(_) => {
                TargetCache::Decoder(b.new_cache(&self.cache_spec(num_blocks, block_size, slots))?)
            }
            Target::FlashNext(m) => {
                TargetCache::FlashNext(m.new_cache(b, num_blocks, block_size, slots)?)
            }
        })
    }

    /// The hidden states of every new token of `batch`: what [`Self::logits`]
    /// reads (the decoder's before its final norm, Flash-Next's after the
    /// stream mixer).
    pub fn forward(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut TargetCache<B>,
    ) -> Result<B::Tensor> {
        match (self, cache) {
            (Target::Decoder(m), TargetCache::Decoder(c)) => {
                Ok(m.decoder.forward(b, ids, batch, c))
            }
            (Target::FlashNext(m), TargetCache::FlashNext(c)) => m.forward(b, ids, batch, c),
            _ => anyhow::bail!("a model was handed another model's cache"),
        }
    }

    /// Logits of `rows` of the step (the same bits as [`Self::logits`] of
    /// [`Self::forward`]'s states); the decoder's steps may be replayed.
    pub fn step_logits(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut TargetCache<B>,
        rows: &[usize],
    ) -> Result<B::Tensor> {
        match (self, cache) {
            (Target::Decoder(m), TargetCache::Decoder(c)) => {
                Ok(m.decoder.step_logits(b, ids, batch, c, rows))
            }
            (Target::FlashNext(m), TargetCache::FlashNext(c)) => {
                m.step_logits(b, ids, batch, c, rows)
            }
            _ => anyhow::bail!("a model was handed another model's cache"),
        }
    }

    /// [`Self::step_logits`] and every row's hidden state.
    pub fn step_logits_and_hidden(
        &self,
        b: &B,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut TargetCache<B>,
        rows: &[usize],
    ) -> Result<(B::Tensor, B::Tensor)> {
        match (self, cache) {
            (Target::Decoder(m), TargetCache::Decoder(c)) => {
                Ok(m.decoder.step_logits_and_hidden(b, ids, batch, c, rows))
            }
            (t, c) => {
                let hidden = t.forward(b, ids, batch, c)?;
                Ok((t.logits(b, &hidden, rows), hidden))
            }
        }
    }

    /// Logits of the selected rows of hidden states from [`Self::forward`].
    pub fn logits(&self, b: &B, hidden: &B::Tensor, rows: &[usize]) -> B::Tensor {
        match self {
            Target::Decoder(m) => m.decoder.logits(b, hidden, rows),
            Target::FlashNext(m) => m.logits(b, hidden, rows),
        }
    }
}

/// The caches of a [`Target`].
pub enum TargetCache<B: Backend> {
    Decoder(B::Cache),
    FlashNext(FlashNextCache<B>),
}

impl<B: Backend> TargetCache<B> {
    /// The backend's KV pages and state slots.
    pub fn base_mut(&mut self) -> &mut B::Cache {
        match self {
            TargetCache::Decoder(c) => c,
            TargetCache::FlashNext(c) => &mut c.base,
        }
    }

    /// A sequence starts over in `slot`: all of its per-slot state.
    pub fn zero_state(&mut self, b: &B, slot: u32) {
        match self {
            TargetCache::Decoder(c) => b.zero_state(c, slot),
            TargetCache::FlashNext(c) => c.zero_state(b, slot),
        }
    }

    /// Copies all per-slot state of `src` into `dst` (snapshots, rollback).
    pub fn copy_state(&mut self, b: &B, src: u32, dst: u32) {
        match self {
            TargetCache::Decoder(c) => b.copy_state(c, src, dst),
            TargetCache::FlashNext(c) => c.copy_state(b, src, dst),
        }
    }
}

//! One sequence through Flash-Next with its own cache, as
//! [`crate::runner::SequenceRunner`] does for the shared decoder: what the
//! golden tests need.

use anyhow::{Result, bail};
use kestrel_core::{FlashNextOps, ForwardBatch, SeqChunk};

use super::{FlashNext, FlashNextCache};

pub struct FlashNextRunner<'a, B: FlashNextOps> {
    backend: &'a B,
    model: &'a FlashNext<B>,
    cache: FlashNextCache<B>,
    block_size: usize,
    /// Pages in a scrambled order, so that paging bugs show in one sequence.
    block_table: Vec<u32>,
    len: usize,
    max_len: usize,
}

impl<'a, B: FlashNextOps> FlashNextRunner<'a, B> {
    pub fn new(backend: &'a B, model: &'a FlashNext<B>, max_len: usize) -> Result<Self> {
        let block_size = 16;
        let num_blocks = max_len.div_ceil(block_size).max(1);
        let mut cache = model.new_cache(backend, num_blocks, block_size, 1)?;
        cache.zero_state(backend, 0);
        let stride = (0..)
            .map(|k| 7 + 2 * k)
            .find(|s| gcd(*s, num_blocks) == 1)
            .unwrap_or(1);
        let block_table = (0..num_blocks)
            .map(|i| ((i * stride) % num_blocks) as u32)
            .collect();
        Ok(FlashNextRunner {
            backend,
            model,
            cache,
            block_size,
            block_table,
            len: 0,
            max_len,
        })
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<B::Tensor> {
        if tokens.is_empty() {
            bail!("nothing to feed");
        }
        if self.len + tokens.len() > self.max_len {
            bail!(
                "sequence of {} tokens exceeds this runner's capacity of {}",
                self.len + tokens.len(),
                self.max_len
            );
        }
        let vocab = self.model.config.base.vocab_size;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        let pages = (self.len + tokens.len()).div_ceil(self.block_size);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk::new(
                tokens.len(),
                self.len,
                self.block_table[..pages].to_vec(),
                0,
            )],
        };
        let hidden = self
            .model
            .forward(self.backend, tokens, &batch, &mut self.cache)?;
        self.len += tokens.len();
        Ok(hidden)
    }

    /// Appends `tokens` and returns the logits of every one (`[n, vocab]` flat).
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.feed(tokens)?;
        let rows: Vec<usize> = (0..tokens.len()).collect();
        Ok(self
            .backend
            .to_host(&self.model.logits(self.backend, &hidden, &rows)))
    }

    /// [`Self::feed_all_logits`] of `tokens` fed in steps of the sizes
    /// `chunks` gives, cycled until every token is in.
    pub fn feed_all_logits_in_chunks(
        &mut self,
        tokens: &[u32],
        chunks: &[usize],
    ) -> Result<Vec<f32>> {
        if chunks.is_empty() || chunks.contains(&0) {
            bail!("chunk sizes must be at least 1: {chunks:?}");
        }
        let (mut out, mut start) = (Vec::with_capacity(tokens.len()), 0);
        for &c in chunks.iter().cycle() {
            if start == tokens.len() {
                break;
            }
            let end = (start + c).min(tokens.len());
            out.extend(self.feed_all_logits(&tokens[start..end])?);
            start = end;
        }
        Ok(out)
    }

    /// Appends `tokens` and returns the logits of the last one.
    pub fn feed_last_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.feed(tokens)?;
        let last = [tokens.len() - 1];
        Ok(self
            .backend
            .to_host(&self.model.logits(self.backend, &hidden, &last)))
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

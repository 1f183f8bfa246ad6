//! One sequence through a model, with its own cache: what `kestrel generate`,
//! the golden tests and the perplexity command need. The serving engine
//! batches many sequences over shared pages instead.

use anyhow::{Result, bail};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};

use crate::Model;

pub struct SequenceRunner<'a, B: Backend> {
    backend: &'a B,
    model: &'a Model<B>,
    cache: B::Cache,
    mtp_cache: Option<B::Cache>,
    block_size: usize,
    /// Pages are handed out in a scrambled order so that paging bugs show up
    /// even in single-sequence runs.
    block_table: Vec<u32>,
    len: usize,
    max_len: usize,
}

impl<'a, B: Backend> SequenceRunner<'a, B> {
    pub fn new(backend: &'a B, model: &'a Model<B>, max_len: usize) -> Result<Self> {
        let block_size = 16;
        let num_blocks = max_len.div_ceil(block_size).max(1);
        let spec = model.decoder.cache_spec(num_blocks, block_size, 1);
        let mut cache = backend.new_cache(&spec)?;
        backend.zero_state(&mut cache, 0);
        let mtp_cache = match &model.mtp {
            Some(_) => Some(backend.new_cache(&crate::MtpHead::cache_spec(
                &model.decoder,
                num_blocks,
                block_size,
            ))?),
            None => None,
        };
        // A fixed odd stride visits every page once in a non-identity order.
        let stride = (0..)
            .map(|k| 7 + 2 * k)
            .find(|s| gcd(*s, num_blocks) == 1)
            .unwrap_or(1);
        let block_table = (0..num_blocks)
            .map(|i| ((i * stride) % num_blocks) as u32)
            .collect();
        Ok(SequenceRunner {
            backend,
            model,
            cache,
            mtp_cache,
            block_size,
            block_table,
            len: 0,
            max_len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn batch(&self, n: usize) -> ForwardBatch {
        let pages = (self.len + n).div_ceil(self.block_size);
        ForwardBatch {
            seqs: vec![SeqChunk {
                prompt: false,
                num_tokens: n,
                cached_len: self.len,
                block_table: self.block_table[..pages].to_vec(),
                state_slot: 0,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            }],
        }
    }

    fn check_feed(&self, tokens: &[u32]) -> Result<()> {
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
        let vocab = self.model.config().vocab_size;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        Ok(())
    }

    /// Appends `tokens` and returns the pre-final-norm hidden state of each.
    pub fn feed(&mut self, tokens: &[u32]) -> Result<B::Tensor> {
        self.check_feed(tokens)?;
        let batch = self.batch(tokens.len());
        let hidden = self
            .model
            .decoder
            .forward(self.backend, tokens, &batch, &mut self.cache);
        self.len += tokens.len();
        Ok(hidden)
    }

    /// Appends `tokens` and returns the hidden states after each layer of
    /// `taps` (one `[n, hidden]` per tap) and the logits of the last token:
    /// what a DFlash drafter reads from its target.
    pub fn feed_tapped(
        &mut self,
        tokens: &[u32],
        taps: &[usize],
    ) -> Result<(Vec<B::Tensor>, Vec<f32>)> {
        self.check_feed(tokens)?;
        if let Some(bad) = taps.iter().find(|&&t| t >= self.model.config().num_layers) {
            bail!(
                "layer {bad} cannot be tapped: the model has {} layers",
                self.model.config().num_layers
            );
        }
        let batch = self.batch(tokens.len());
        let step = self.model.decoder.step_with_taps(
            self.backend,
            tokens,
            &batch,
            &mut self.cache,
            &[tokens.len() - 1],
            taps,
        );
        self.len += tokens.len();
        let logits = step.logits.expect("a row was asked for");
        Ok((step.taps, self.backend.to_host(&logits)))
    }

    /// Appends `tokens` and returns the logits of the last one. One-token
    /// feeds are decode steps, which a backend may record and replay.
    pub fn feed_last_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_feed(tokens)?;
        let batch = self.batch(tokens.len());
        let logits = self.model.decoder.step_logits(
            self.backend,
            tokens,
            &batch,
            &mut self.cache,
            &[tokens.len() - 1],
        );
        self.len += tokens.len();
        Ok(self.backend.to_host(&logits))
    }

    /// Appends `tokens` and returns the logits of every one (`[n, vocab]` flat).
    pub fn feed_all_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let hidden = self.feed(tokens)?;
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let logits = self.model.decoder.logits(self.backend, &hidden, &rows);
        Ok(self.backend.to_host(&logits))
    }

    /// Teacher-forced MTP logits: row t predicts token t+2 of `tokens` from
    /// the target's state at t and token t+1. Feeds the whole sequence (the
    /// runner must be fresh). Returns `[n-1, vocab]` flat.
    pub fn mtp_logits(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self.teacher_forced(tokens)?.1 {
            Some(logits) => Ok(logits),
            None => bail!("this model has no MTP head"),
        }
    }

    /// Feeds a fresh runner the whole of `tokens` and returns the logits of
    /// every position (`[n, vocab]`) and, for models with an MTP head, the
    /// head's logits for slots 0..n-1 (`[n-1, vocab]`, row t predicting
    /// token t+2).
    pub fn teacher_forced(&mut self, tokens: &[u32]) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
        if !self.is_empty() || tokens.len() < 2 {
            bail!("teacher forcing needs a fresh runner and at least two tokens");
        }
        let hidden = self.feed(tokens)?;
        let b = self.backend;
        let decoder = &self.model.decoder;
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let lm = b.to_host(&decoder.logits(b, &hidden, &rows));
        let Some(mtp) = &self.model.mtp else {
            return Ok((lm, None));
        };
        let n = tokens.len() - 1;
        let h = b.gather_rows(&hidden, &rows[..n]);
        let h = b.rms_norm(&h, &decoder.final_norm, self.model.config().rms_norm_eps);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                prompt: false,
                num_tokens: n,
                cached_len: 0,
                block_table: self.block_table[..n.div_ceil(self.block_size)].to_vec(),
                state_slot: 0,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            }],
        };
        let cache = self
            .mtp_cache
            .as_mut()
            .expect("MTP cache exists with the head");
        let out = mtp.forward(b, decoder, &h, &tokens[1..], &batch, cache);
        Ok((lm, Some(b.to_host(&b.matmul(&out, decoder.lm_head())))))
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 { a } else { gcd(b, a % b) }
}

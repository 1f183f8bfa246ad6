//! Drafting with the model's own multi-token-prediction head (Qwen3.5/3.6,
//! Qwen3-Next), chained as vLLM's `qwen3_next_mtp` chains it.
//!
//! After every step the head catches up on the positions the target just
//! committed: row `t` pairs the target's hidden state at `t` (after its final
//! norm) with the token at `t + 1` and writes the head's own KV at `t` (its
//! attention layer has a cache of its own, paged with the sequence's block
//! table). The last such row of a decoding sequence predicts the token
//! after its newest one: the first draft. Deeper drafts feed the head's
//! normalised output back in with the previous draft, one position further
//! each; those positions are rewritten by the next catch-up. Drafts are the
//! head's greedy choices, so they have no distribution (a Dirac q).
//!
//! A prefix-cache hit skips the target's rows, so the head's KV there is the
//! one written by the sequence that computed the cached pages: the same
//! except at a page's last position, whose next token may differ. Drafts
//! only ever cost speed, never output.
//!
//! With a reduced draft vocabulary the drafts are chosen among its ids only,
//! scoring only their rows of the lm_head (`DraftHead`); the catch-up and
//! the chained steps are the same.

use std::collections::HashMap;

use anyhow::{Context, Result};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_models::{DraftHead, Model, MtpHead};

use super::DraftVocab;
use crate::sequence::SeqId;

/// One sequence's rows in a step, as the drafter needs them.
pub(crate) struct CommittedRows<'a> {
    pub id: SeqId,
    /// Row of the step's hidden states holding position `start`.
    pub first_row: usize,
    /// Positions `start..committed` were committed in this step.
    pub start: usize,
    pub committed: usize,
    /// The sequence's tokens (prompt + generated, the newest uncomputed).
    pub tokens: &'a [u32],
    pub block_table: &'a [u32],
    /// Whether the sequence decodes next (its newest token follows `committed`).
    pub decodes_next: bool,
    /// The most drafts its next step takes ([`super::DraftLength::limit`]).
    pub draft_limit: usize,
}

pub(crate) struct MtpDrafter<B: Backend> {
    cache: B::Cache,
    block_size: usize,
    depth: usize,
    /// The step's row budget, which bounds the chains ([`super::DraftRows`]).
    rows: Option<usize>,
    /// The lm_head rows drafts are chosen among.
    draft_head: DraftHead<B>,
    drafts: HashMap<SeqId, Vec<u32>>,
}

impl<B: Backend> MtpDrafter<B> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: &B,
        model: &Model<B>,
        num_blocks: usize,
        block_size: usize,
        depth: usize,
        rows: Option<usize>,
        vocab: usize,
        draft_vocab: Option<&DraftVocab>,
    ) -> Result<Self> {
        if model.mtp.is_none() {
            anyhow::bail!("--speculative mtp needs a model with an MTP head (mtp.* weights)");
        }
        let draft_head = match draft_vocab {
            None => DraftHead::full(vocab),
            Some(v) => DraftHead::reduced(backend, &model.decoder, v.ids())
                .context("cannot build the reduced draft head")?,
        };
        let spec = MtpHead::cache_spec(&model.decoder, num_blocks, block_size);
        Ok(Self {
            cache: backend
                .new_cache(&spec)
                .context("cannot allocate the MTP head's cache")?,
            block_size,
            depth,
            rows,
            draft_head,
            drafts: HashMap::new(),
        })
    }

    /// The drafts made for `id` after the last step.
    pub fn drafts(&self, id: SeqId) -> &[u32] {
        self.drafts.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Catch up on every sequence's committed rows of the step whose hidden
    /// states are `hidden`, then chain drafts for those that decode next.
    pub fn after_step(
        &mut self,
        b: &B,
        model: &Model<B>,
        hidden: &B::Tensor,
        seqs: &[CommittedRows<'_>],
    ) -> Result<()> {
        self.drafts.clear();
        let head = model.mtp.as_ref().context("the MTP head vanished")?;
        let decoder = &model.decoder;
        let bs = self.block_size;
        let mut rows = Vec::new();
        let mut next_ids = Vec::new();
        let mut batch = ForwardBatch::default();
        let mut last_rows = Vec::new();
        let mut drafting = Vec::new();
        for s in seqs.iter().filter(|s| s.committed > s.start) {
            let n = s.committed - s.start;
            rows.extend(s.first_row..s.first_row + n);
            next_ids.extend_from_slice(&s.tokens[s.start + 1..=s.committed]);
            batch.seqs.push(SeqChunk::new(
                n,
                s.start,
                s.block_table[..s.committed.div_ceil(bs)].to_vec(),
                0,
            ));
            if s.decodes_next {
                last_rows.push(rows.len() - 1);
                drafting.push(s);
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        let eps = model.config().rms_norm_eps;
        let h = b.rms_norm(&b.gather_rows(hidden, &rows), &decoder.final_norm, eps);
        let out = head.forward(b, decoder, &h, &next_ids, &batch, &mut self.cache);
        if drafting.is_empty() {
            return Ok(());
        }
        // How deep each chain may go: no deeper than the step's row budget
        // lets the next step verify (the first draft comes with the catch-up
        // anyway), and draft `d` (1-based) of a sequence is computed at
        // position `committed + d - 2`, which its pages must hold.
        let depth = super::drafts_per_sequence(self.rows, drafting.len(), self.depth).max(1);
        let reach: Vec<usize> = drafting
            .iter()
            .map(|s| {
                let capacity = s.block_table.len() * bs;
                depth
                    .min(s.draft_limit)
                    .min((capacity + 1).saturating_sub(s.committed))
            })
            .collect();
        let mut state = b.gather_rows(&out, &last_rows);
        let mut chains: Vec<Vec<u32>> = self
            .draft_head
            .argmax(b, decoder, &state)
            .into_iter()
            .map(|t| vec![t])
            .collect();
        // `live`: the chains still growing, in `drafting` order; `state`
        // holds their rows. Reaches only end chains, so `live` only shrinks.
        let mut live: Vec<usize> = (0..drafting.len()).collect();
        for depth in 1..depth {
            let keep: Vec<usize> = (0..live.len())
                .filter(|&j| reach[live[j]] > depth)
                .collect();
            if keep.is_empty() {
                break;
            }
            if keep.len() < live.len() {
                state = b.gather_rows(&state, &keep);
                live = keep.iter().map(|&j| live[j]).collect();
            }
            let mut batch = ForwardBatch::default();
            for &i in &live {
                let s = drafting[i];
                let pos = s.committed + depth - 1;
                batch.seqs.push(SeqChunk::new(
                    1,
                    pos,
                    s.block_table[..(pos + 1).div_ceil(bs)].to_vec(),
                    0,
                ));
            }
            let ids: Vec<u32> = live
                .iter()
                .map(|&i| *chains[i].last().expect("a first draft"))
                .collect();
            state = head.forward(b, decoder, &state, &ids, &batch, &mut self.cache);
            for (&i, token) in live.iter().zip(self.draft_head.argmax(b, decoder, &state)) {
                chains[i].push(token);
            }
        }
        for (s, chain) in drafting.iter().zip(chains) {
            self.drafts.insert(s.id, chain);
        }
        Ok(())
    }
}

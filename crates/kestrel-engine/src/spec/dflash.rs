//! Drafting with a DFlash block drafter: one non-causal pass proposes up
//! to `block - 1` tokens (see `kestrel_models::dflash`).
//!
//! After every step each sequence's drafter context catches up on the
//! positions the target just committed: their hidden states at the
//! drafter's `target_layer_ids`, recorded by the step itself, become
//! context keys and values (kept per sequence, limited to the draft
//! window). A sequence that decodes next is then drafted from its newest
//! token, the anchor, at the position right after its context.
//!
//! The context follows the sequence's committed positions: where a step
//! starts before the context's end (a preempted sequence recomputing), the
//! context is cut back there; where it starts after it (a prefix-cache hit
//! whose rows the target did not compute), the context starts afresh at
//! that position, without the skipped tokens. Drafts are greedy (a Dirac
//! q), so the core's verification keeps output identical whatever they
//! are; a thin context only costs acceptance. Contexts of sequences that
//! leave the running set are dropped.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use kestrel_core::Backend;
use kestrel_models::{DflashDrafter, DraftContext, DraftHead, Model};

use super::DraftVocab;
use super::mtp::CommittedRows;
use crate::sequence::SeqId;

/// Tokens of context a sequence's drafter keeps by default (SGLang's
/// `--speculative-dflash-draft-window-size` default).
pub const DEFAULT_DRAFT_WINDOW: usize = 8192;

/// Settings of DFlash drafting.
#[derive(Clone, Debug)]
pub struct DflashOptions {
    /// The drafter's folder (z-lab form: `config.json` with `dflash_config`
    /// and safetensors).
    pub draft_model: PathBuf,
    /// Most context tokens a sequence's drafter keeps.
    pub window: usize,
    /// Draft only these ids, scoring only their rows of the lm_head (the
    /// larger half of a pass's bytes on Qwen3.6); `None`: every id.
    pub draft_vocab: Option<Arc<DraftVocab>>,
}

impl DflashOptions {
    pub fn new(draft_model: impl Into<PathBuf>) -> Self {
        DflashOptions {
            draft_model: draft_model.into(),
            window: DEFAULT_DRAFT_WINDOW,
            draft_vocab: None,
        }
    }
}

pub(crate) struct DflashProposer<B: Backend> {
    drafter: DflashDrafter<B>,
    window: usize,
    /// Most tokens per drafted block: the anchor and the drafts.
    block: usize,
    /// The step's row budget (`DraftRows`): a pass drafts only what the
    /// next step can verify, and none when it verifies none.
    rows: Option<usize>,
    /// The lm_head rows drafts are chosen among.
    head: DraftHead<B>,
    contexts: HashMap<SeqId, DraftContext<B>>,
    drafts: HashMap<SeqId, Vec<u32>>,
}

impl<B: Backend> DflashProposer<B> {
    pub fn new(
        backend: &B,
        model: &Model<B>,
        options: &DflashOptions,
        max_drafts: usize,
        rows: Option<usize>,
        vocab: usize,
    ) -> Result<Self> {
        let drafter = DflashDrafter::load(&options.draft_model, backend, &model.decoder)?;
        if options.window == 0 {
            anyhow::bail!("the DFlash draft window must hold at least one token");
        }
        let head = match &options.draft_vocab {
            None => DraftHead::full(vocab),
            Some(v) => DraftHead::reduced(backend, &model.decoder, v.ids())
                .context("cannot build the reduced draft head")?,
        };
        Ok(Self {
            drafter,
            window: options.window,
            block: max_drafts + 1,
            rows,
            head,
            contexts: HashMap::new(),
            drafts: HashMap::new(),
        })
    }

    /// The target layers whose hidden states each step must record.
    pub fn taps(&self) -> &[usize] {
        &self.drafter.config.target_layer_ids
    }

    /// The drafts made for `id` after the last step.
    pub fn drafts(&self, id: SeqId) -> &[u32] {
        self.drafts.get(&id).map_or(&[], Vec::as_slice)
    }

    /// Drops the contexts of sequences for which `running` says no.
    pub fn retain(&mut self, running: impl Fn(SeqId) -> bool) {
        self.contexts.retain(|id, _| running(*id));
    }

    /// Catch every sequence's context up on its committed rows of the step
    /// whose tapped hidden states are `taps` (one `[step tokens, H]` per
    /// target layer), then draft for those that decode next.
    pub fn after_step(
        &mut self,
        b: &B,
        model: &Model<B>,
        taps: &[B::Tensor],
        seqs: &[CommittedRows<'_>],
    ) -> Result<()> {
        self.drafts.clear();
        let window = self.window;
        let mut drafting = Vec::new();
        // The longest run a drafting sequence will take: one block serves
        // them all, so it is as long as the longest.
        let mut longest = 0;
        // Every sequence's committed rows go into its context in one append:
        // the drafter's products run once over all of them.
        let mut appending: Vec<(SeqId, DraftContext<B>)> = Vec::new();
        let (mut rows, mut counts) = (Vec::new(), Vec::new());
        for s in seqs {
            let mut ctx = self
                .contexts
                .remove(&s.id)
                .unwrap_or_else(|| DraftContext::starting_at(s.start, window));
            if ctx.end() > s.start {
                ctx.truncate(b, s.start);
            }
            if ctx.end() < s.start {
                ctx = DraftContext::starting_at(s.start, window);
            }
            let n = s.committed.saturating_sub(s.start);
            rows.extend(s.first_row..s.first_row + n);
            counts.push(n);
            appending.push((s.id, ctx));
        }
        if !rows.is_empty() {
            let own: Vec<B::Tensor> = taps.iter().map(|t| b.gather_rows(t, &rows)).collect();
            let mut contexts: Vec<&mut DraftContext<B>> =
                appending.iter_mut().map(|(_, c)| c).collect();
            DraftContext::append_all(b, &self.drafter, &mut contexts, &own, &counts);
        }
        self.contexts.extend(appending);
        for s in seqs {
            let ctx = &self.contexts[&s.id];
            if s.decodes_next && ctx.end() == s.committed {
                let anchor = *s
                    .tokens
                    .get(s.committed)
                    .context("a decoding sequence has its newest token")?;
                drafting.push((s.id, anchor));
                longest = longest.max(s.draft_limit);
            }
        }
        // The next step verifies at most this many drafts a sequence: a
        // longer block would be drafted for nothing.
        let decoding = seqs.iter().filter(|s| s.decodes_next).count();
        let verifiable =
            super::drafts_per_sequence(self.rows, decoding, self.block - 1).min(longest);
        if verifiable == 0 {
            return Ok(());
        }
        // One pass for every sequence that drafts: the drafter's weights
        // and the lm_head are read once per step, not once per sequence.
        let mut taken: Vec<(SeqId, DraftContext<B>, u32)> = drafting
            .iter()
            .filter_map(|&(id, anchor)| self.contexts.remove(&id).map(|c| (id, c, anchor)))
            .collect();
        let mut seqs: Vec<(&mut DraftContext<B>, u32)> =
            taken.iter_mut().map(|(_, c, a)| (c, *a)).collect();
        let drafts =
            self.drafter
                .drafts_batch(b, &model.decoder, &mut seqs, verifiable + 1, &self.head);
        for ((id, ctx, _), drafts) in taken.into_iter().zip(drafts) {
            self.contexts.insert(id, ctx);
            self.drafts.insert(id, drafts);
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "dflash_tests.rs"]
mod tests;

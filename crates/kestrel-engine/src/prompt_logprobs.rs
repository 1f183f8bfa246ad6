//! Prompt logprobs (vLLM's `prompt_logprobs`): for every prompt token after
//! the first, its log-probability given the tokens before it, its rank and
//! the row's most likely ids. Row `r` of a prefill chunk predicts prompt
//! token `r + 1`, so a chunk over positions `start..end` gives the entries of
//! tokens `start + 1..=end` (the prompt's last row predicts the first
//! generated token and is sampled as usual).
//!
//! Only a sequence that asks for them costs anything: a step that carries
//! such a chunk keeps the hidden states of every row (see
//! [`crate::spec::capture`]), and the lm_head runs over that chunk's rows
//! [`ROWS_PER_PASS`] at a time; each group's logits come to the host, are
//! reduced to the entries and dropped, so no more than that many rows of
//! vocabulary-sized logits exist at once. Values follow the `logprobs`
//! convention ([`crate::logprobs`]): the log-softmax of the raw row, padded
//! ids at `-inf`.
//!
//! A prefix-cache hit would skip the positions it covers, so a sequence
//! whose prompt logprobs are not all sent yet is admitted without one
//! (`Scheduler::admit_next`); what it computes still goes into the cache.
//! After a preemption the recomputed positions whose entries were already
//! sent are not sent again ([`Sequence::prompt_logprobs_sent`]).

use std::ops::Range;

use anyhow::{Context, Result};
use kestrel_core::Backend;
use kestrel_models::Target;
use kestrel_sampling::RowLogprobs;

use crate::handle::EngineEvent;
use crate::scheduler::{Scheduler, StepPlan};
use crate::sequence::Sequence;

/// Rows whose logits exist at once while prompt logprobs are computed.
pub const ROWS_PER_PASS: usize = 32;

/// One prompt token's entry.
#[derive(Clone, Debug, PartialEq)]
pub struct PromptTokenLogprobs {
    /// The prompt token.
    pub token: u32,
    pub logprob: f32,
    /// 1 + the number of ids more likely than `token`.
    pub rank: usize,
    /// The row's most likely ids, best first (ties: lower id first), as
    /// many as asked for.
    pub top: Vec<(u32, f32)>,
}

/// The chunk rows (relative to the chunk's first position `start`, which
/// ends at `end`) whose entries `seq` still has to send.
pub(crate) fn pending_rows(seq: &Sequence, start: usize, end: usize) -> Range<usize> {
    if seq.sampler.params().prompt_logprobs.is_none() {
        return 0..0;
    }
    // Row `r` predicts token `r + 1`; the prompt's last row is not an entry.
    let first = start.max(seq.prompt_logprobs_sent.saturating_sub(1));
    let last = end.min(seq.prompt_len.saturating_sub(1));
    if first >= last {
        return 0..0;
    }
    first - start..last - start
}

/// Whether any chunk of `plan` brings prompt-logprob rows (the step must
/// then keep its hidden states).
pub(crate) fn step_needs_hidden(sched: &Scheduler, plan: &StepPlan) -> bool {
    plan.chunks.iter().any(|c| {
        sched
            .running_seq(c.id)
            .is_some_and(|seq| !pending_rows(seq, c.start, c.end - c.drafts).is_empty())
    })
}

/// Compute and send the prompt logprobs of every chunk of `plan` that has
/// some, from `hidden` (every row of the step, pre-final-norm).
pub(crate) fn send_step<B: Backend>(
    backend: &B,
    model: &Target<B>,
    hidden: &B::Tensor,
    sched: &mut Scheduler,
    plan: &StepPlan,
) -> Result<()> {
    let sampled_vocab = sched.config().sampled_vocab;
    let mut first_row = 0;
    for chunk in &plan.chunks {
        let chunk_first = first_row;
        first_row += chunk.end - chunk.start;
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        let rows = pending_rows(seq, chunk.start, chunk.end - chunk.drafts);
        if rows.is_empty() {
            continue;
        }
        let top = seq.sampler.params().prompt_logprobs.unwrap_or(0);
        let mut entries = Vec::with_capacity(rows.len());
        let step_rows: Vec<usize> = rows.clone().map(|r| chunk_first + r).collect();
        for group in step_rows.chunks(ROWS_PER_PASS) {
            let logits = model.logits(backend, hidden, group);
            let vocab = backend.dims(&logits).1;
            let keep = sampled_vocab.map_or(vocab, |v| v.min(vocab));
            let values = backend.to_host(&logits);
            drop(logits);
            for (row, &step_row) in values.chunks_exact(vocab).zip(group) {
                let position = chunk.start + (step_row - chunk_first);
                let token = seq.tokens[position + 1];
                let mut row = row.to_vec();
                row[keep..].fill(f32::NEG_INFINITY);
                let lp = RowLogprobs::new(&row);
                let t = lp.token(token, top);
                entries.push(PromptTokenLogprobs {
                    token,
                    logprob: t.logprob,
                    rank: lp.rank(token),
                    top: t.top,
                });
            }
        }
        seq.prompt_logprobs_sent = chunk.start + rows.end + 1;
        seq.emit(EngineEvent::PromptLogprobs(entries));
    }
    Ok(())
}

//! The target step a drafter reads from: plain (no drafter, or one that
//! needs nothing of the target), with the last hidden states (MTP), or with
//! the hidden states after chosen layers (DFlash). Logits are the same
//! bits in every form; only what is copied out besides them differs.

use anyhow::Result;
use kestrel_core::{Backend, ForwardBatch};
use kestrel_models::Model;

use super::dflash::DflashProposer;
use super::mtp::{CommittedRows, MtpDrafter};

/// A drafter that reads the target's states after each step.
pub(crate) enum StepReader<'a, B: Backend> {
    Mtp(&'a mut MtpDrafter<B>),
    Dflash(&'a mut DflashProposer<B>),
}

/// What the step recorded for the reader.
pub(crate) enum Captured<T> {
    /// Hidden states of every row before the final norm.
    Hidden(T),
    /// Per tapped layer, the hidden states of every row after it.
    Taps(Vec<T>),
}

impl<B: Backend> StepReader<'_, B> {
    /// Hand the reader what the step recorded, with the committed rows of
    /// each sequence still running.
    pub fn after_step(
        self,
        b: &B,
        model: &Model<B>,
        captured: &Captured<B::Tensor>,
        rows: &[CommittedRows<'_>],
    ) -> Result<()> {
        match (self, captured) {
            (StepReader::Mtp(m), Captured::Hidden(h)) => m.after_step(b, model, h, rows),
            (StepReader::Dflash(d), Captured::Taps(t)) => d.after_step(b, model, t, rows),
            _ => anyhow::bail!("a drafter was handed the wrong capture of the step"),
        }
    }
}

/// One forward over `batch`: logits of `logit_rows` (none when empty) and
/// what `reader` reads.
pub(crate) fn forward<B: Backend>(
    b: &B,
    model: &Model<B>,
    ids: &[u32],
    batch: &ForwardBatch,
    cache: &mut B::Cache,
    logit_rows: &[usize],
    reader: Option<&StepReader<'_, B>>,
) -> (Option<B::Tensor>, Option<Captured<B::Tensor>>) {
    let d = &model.decoder;
    match (reader, logit_rows.is_empty()) {
        (None, true) => {
            d.forward(b, ids, batch, cache);
            (None, None)
        }
        (None, false) => (Some(d.step_logits(b, ids, batch, cache, logit_rows)), None),
        (Some(StepReader::Mtp(_)), true) => (
            None,
            Some(Captured::Hidden(d.forward(b, ids, batch, cache))),
        ),
        (Some(StepReader::Mtp(_)), false) => {
            let (logits, hidden) = d.step_logits_and_hidden(b, ids, batch, cache, logit_rows);
            (Some(logits), Some(Captured::Hidden(hidden)))
        }
        (Some(StepReader::Dflash(p)), _) => {
            let step = d.step_with_taps(b, ids, batch, cache, logit_rows, p.taps());
            (step.logits, Some(Captured::Taps(step.taps)))
        }
    }
}

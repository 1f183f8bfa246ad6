//! The target step a drafter reads from: plain (no drafter, or one that
//! needs nothing of the target), with the last hidden states (MTP), or with
//! the hidden states after chosen layers (DFlash). Logits are the same
//! bits in every form; only what is copied out besides them differs.
//!
//! A step the backend cuts in two ([`Backend::step_cut`]) runs as two such
//! forwards, whose logits and captured states are joined in row order.

use anyhow::Result;
use kestrel_core::{Backend, ForwardBatch};
use kestrel_models::{Model, Target, TargetCache};

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

/// What [`forward_step`] returns.
pub(crate) struct StepOutput<T> {
    pub logits: Option<T>,
    pub captured: Option<Captured<T>>,
    /// Hidden states of every row before the final norm, when asked for
    /// (prompt logprobs, see [`crate::prompt_logprobs`]).
    pub hidden: Option<T>,
    /// Whether the step ran as two passes.
    pub split: bool,
}

/// [`forward`] over `batch`, as one pass or, where the backend cuts the step,
/// as two over its first `cut` sequences and the rest: the same logits rows
/// and captured rows, in the same order.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_step<B: Backend>(
    b: &B,
    model: &Target<B>,
    ids: &[u32],
    batch: &ForwardBatch,
    cache: &mut TargetCache<B>,
    logit_rows: &[usize],
    reader: Option<&StepReader<'_, B>>,
    keep_hidden: bool,
) -> Result<StepOutput<B::Tensor>> {
    let Some(cut) = b.step_cut(batch) else {
        let (logits, captured, hidden) =
            forward(b, model, ids, batch, cache, logit_rows, reader, keep_hidden)?;
        return Ok(StepOutput {
            logits,
            captured,
            hidden,
            split: false,
        });
    };
    let first = batch.part(0..cut);
    let second = batch.part(cut..batch.seqs.len());
    let split = first.num_tokens();
    // `logit_rows` ascend: the first part's rows, then the second's.
    let (rows_a, rows_b): (Vec<usize>, Vec<usize>) = logit_rows.iter().partition(|&&r| r < split);
    let rows_b: Vec<usize> = rows_b.iter().map(|r| r - split).collect();
    let (logits_a, captured_a, hidden_a) = forward(
        b,
        model,
        &ids[..split],
        &first,
        cache,
        &rows_a,
        reader,
        keep_hidden,
    )?;
    let (logits_b, captured_b, hidden_b) = forward(
        b,
        model,
        &ids[split..],
        &second,
        cache,
        &rows_b,
        reader,
        keep_hidden,
    )?;
    let logits = join(b, logits_a, logits_b);
    let captured = match (captured_a, captured_b) {
        (None, None) => None,
        (Some(Captured::Hidden(a)), Some(Captured::Hidden(c))) => {
            Some(Captured::Hidden(b.concat_rows(&a, &c)))
        }
        (Some(Captured::Taps(a)), Some(Captured::Taps(c))) => Some(Captured::Taps(
            a.iter().zip(&c).map(|(x, y)| b.concat_rows(x, y)).collect(),
        )),
        _ => unreachable!("both parts of a step are read by the same reader"),
    };
    Ok(StepOutput {
        logits,
        captured,
        hidden: join(b, hidden_a, hidden_b),
        split: true,
    })
}

/// The rows of `a`, then those of `c`, either of which may be absent.
fn join<B: Backend>(b: &B, a: Option<B::Tensor>, c: Option<B::Tensor>) -> Option<B::Tensor> {
    match (a, c) {
        (Some(a), Some(c)) => Some(b.concat_rows(&a, &c)),
        (a, c) => a.or(c),
    }
}

/// What one [`forward`] returns: logits, capture, hidden states.
type Forward<T> = (Option<T>, Option<Captured<T>>, Option<T>);

/// One forward over `batch`: logits of `logit_rows` (none when empty), what
/// `reader` reads and, with `keep_hidden`, the hidden states of every row.
#[allow(clippy::too_many_arguments)]
fn forward<B: Backend>(
    b: &B,
    target: &Target<B>,
    ids: &[u32],
    batch: &ForwardBatch,
    cache: &mut TargetCache<B>,
    logit_rows: &[usize],
    reader: Option<&StepReader<'_, B>>,
    keep_hidden: bool,
) -> Result<Forward<B::Tensor>> {
    let (Target::Decoder(model), TargetCache::Decoder(cache)) = (target, &mut *cache) else {
        // No drafter reads another stack's states (refused at start-up).
        anyhow::ensure!(
            reader.is_none(),
            "a drafter was handed a model it cannot read"
        );
        return Ok(match (logit_rows.is_empty(), keep_hidden) {
            (true, false) => {
                target.forward(b, ids, batch, cache)?;
                (None, None, None)
            }
            (true, true) => (None, None, Some(target.forward(b, ids, batch, cache)?)),
            (false, false) => (
                Some(target.step_logits(b, ids, batch, cache, logit_rows)?),
                None,
                None,
            ),
            (false, true) => {
                let (logits, hidden) =
                    target.step_logits_and_hidden(b, ids, batch, cache, logit_rows)?;
                (Some(logits), None, Some(hidden))
            }
        });
    };
    Ok(decoder_forward(
        b,
        model,
        ids,
        batch,
        cache,
        logit_rows,
        reader,
        keep_hidden,
    ))
}

/// [`forward`] of a model on the shared decoder, which drafters may read.
#[allow(clippy::too_many_arguments)]
fn decoder_forward<B: Backend>(
    b: &B,
    model: &Model<B>,
    ids: &[u32],
    batch: &ForwardBatch,
    cache: &mut B::Cache,
    logit_rows: &[usize],
    reader: Option<&StepReader<'_, B>>,
    keep_hidden: bool,
) -> Forward<B::Tensor> {
    let d = &model.decoder;
    match (reader, logit_rows.is_empty()) {
        (None, true) if keep_hidden => (None, None, Some(d.forward(b, ids, batch, cache))),
        (None, false) if keep_hidden => {
            let (logits, hidden) = d.step_logits_and_hidden(b, ids, batch, cache, logit_rows);
            (Some(logits), None, Some(hidden))
        }
        (None, true) => {
            d.forward(b, ids, batch, cache);
            (None, None, None)
        }
        (None, false) => (
            Some(d.step_logits(b, ids, batch, cache, logit_rows)),
            None,
            None,
        ),
        (Some(StepReader::Mtp(_)), true) => {
            let hidden = d.forward(b, ids, batch, cache);
            let kept = keep_hidden.then(|| copy_rows(b, &hidden));
            (None, Some(Captured::Hidden(hidden)), kept)
        }
        (Some(StepReader::Mtp(_)), false) => {
            let (logits, hidden) = d.step_logits_and_hidden(b, ids, batch, cache, logit_rows);
            let kept = keep_hidden.then(|| copy_rows(b, &hidden));
            (Some(logits), Some(Captured::Hidden(hidden)), kept)
        }
        (Some(StepReader::Dflash(p)), _) => {
            // The last layer's tap is the hidden state itself.
            let mut taps = p.taps().to_vec();
            if keep_hidden {
                taps.push(model.config().num_layers - 1);
            }
            let mut step = d.step_with_taps(b, ids, batch, cache, logit_rows, &taps);
            let hidden = if keep_hidden { step.taps.pop() } else { None };
            (step.logits, Some(Captured::Taps(step.taps)), hidden)
        }
    }
}

/// A copy of every row of `x`.
fn copy_rows<B: Backend>(b: &B, x: &B::Tensor) -> B::Tensor {
    let all: Vec<usize> = (0..b.dims(x).0).collect();
    b.gather_rows(x, &all)
}

//! Running one planned step: restore states, one forward pass over every
//! scheduled chunk, sample where a chunk reaches the end of its sequence,
//! snapshot and cache what was computed, finish what stopped.

use anyhow::{Context, Result};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_models::Model;
use kestrel_sampling::Finish;

use crate::client::SeqId;
use crate::engine::LogitsObserver;
use crate::handle::EngineEvent;
use crate::scheduler::{Scheduler, StateOp, StepPlan};

/// What happened to a sequence in this step, applied after all sampling.
enum Outcome {
    Finished(SeqId, Finish),
    Failed(SeqId, String),
}

pub(crate) fn execute<B: Backend>(
    backend: &B,
    model: &Model<B>,
    cache: &mut B::Cache,
    sched: &mut Scheduler,
    plan: StepPlan,
    mut observer: Option<&mut LogitsObserver>,
) -> Result<()> {
    if plan.chunks.is_empty() {
        return Ok(());
    }
    for op in &plan.state_ops {
        match *op {
            StateOp::Zero(slot) => backend.zero_state(cache, slot),
            StateOp::Copy { src, dst } => backend.copy_state(cache, src, dst),
        }
    }

    let block_size = sched.config.block_size;
    let mut ids = Vec::with_capacity(plan.chunks.iter().map(|c| c.end - c.start).sum());
    let mut batch = ForwardBatch::default();
    for chunk in &plan.chunks {
        let seq = sched
            .running_seq(chunk.id)
            .context("a scheduled sequence is not running")?;
        ids.extend_from_slice(&seq.tokens[chunk.start..chunk.end]);
        batch.seqs.push(SeqChunk {
            num_tokens: chunk.end - chunk.start,
            cached_len: chunk.start,
            block_table: seq.cache.block_table()[..chunk.end.div_ceil(block_size)].to_vec(),
            state_slot: seq.cache.state_slot().unwrap_or(0),
        });
    }
    // Logits only for chunks that end at their sequence's last known token.
    let last_rows = batch.last_token_rows();
    let mut sampled_rows = Vec::new();
    let mut sampling = Vec::with_capacity(plan.chunks.len());
    // Rows whose token is the raw argmax can be picked on the device, which
    // saves copying a vocabulary-sized row per sequence to the host.
    let mut all_plain_argmax = observer.is_none();
    for (chunk, &row) in plan.chunks.iter().zip(&last_rows) {
        let seq = sched.running_seq(chunk.id).context("sequence vanished")?;
        let samples = chunk.end == seq.tokens.len();
        if samples {
            sampled_rows.push(row);
            all_plain_argmax &= seq.sampler.is_plain_argmax(&seq.tokens);
        }
        sampling.push(samples);
    }
    // One step either way; ending in logits lets decode steps be replayed.
    let mut device_argmax = Vec::new().into_iter();
    let mut logits = Vec::new();
    if sampled_rows.is_empty() {
        model.decoder.forward(backend, &ids, &batch, cache);
    } else {
        let out = model
            .decoder
            .step_logits(backend, &ids, &batch, cache, &sampled_rows);
        let vocab = backend.dims(&out).1;
        let sampled_vocab = sched.config.sampled_vocab.map_or(vocab, |v| v.min(vocab));
        if all_plain_argmax {
            device_argmax = backend.argmax_rows(&out, sampled_vocab).into_iter();
        } else {
            logits = backend.to_host(&out);
            if sampled_vocab < vocab {
                // Padded ids (no token behind them) can never be sampled.
                for row in logits.chunks_exact_mut(vocab) {
                    row[sampled_vocab..].fill(f32::NEG_INFINITY);
                }
            }
        }
    }
    let vocab = if sampled_rows.is_empty() || all_plain_argmax {
        0
    } else {
        logits.len() / sampled_rows.len()
    };

    let mut outcomes = Vec::new();
    let mut logits_rows = logits.chunks_exact_mut(vocab.max(1));
    for (chunk, samples) in plan.chunks.iter().zip(sampling) {
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        seq.cache.set_num_tokens(chunk.end, block_size)?;
        if samples {
            let sampled = if all_plain_argmax {
                device_argmax.next().context("missing argmax row").map(Ok)?
            } else {
                let row = logits_rows.next().context("missing logits row")?;
                if let Some(observe) = observer.as_mut() {
                    observe(&seq.request_id, row);
                }
                seq.sampler.sample(row, &seq.tokens)
            };
            match sampled {
                Ok(token) => {
                    seq.tokens.push(token);
                    seq.emit(EngineEvent::Tokens(vec![token]));
                    if let Some(finish) =
                        seq.stop.check(token, seq.num_generated(), seq.tokens.len())
                    {
                        outcomes.push(Outcome::Finished(chunk.id, finish));
                    }
                    sched.counters.generation_tokens += 1;
                }
                Err(e) => outcomes.push(Outcome::Failed(chunk.id, format!("sampling failed: {e}"))),
            }
        }
        cache_progress(backend, cache, sched, chunk.id, chunk.start, chunk.end)?;
    }

    for outcome in outcomes {
        match outcome {
            Outcome::Finished(id, finish) => sched.finish(id, finish)?,
            Outcome::Failed(id, message) => sched.fail(id, &message),
        }
    }
    Ok(())
}

/// Offer what a prefill chunk computed to the prefix cache: on hybrid models
/// a state snapshot at each resume point, on attention-only models the full
/// prompt blocks (decoded blocks are offered when the sequence ends).
fn cache_progress<B: Backend>(
    backend: &B,
    cache: &mut B::Cache,
    sched: &mut Scheduler,
    id: SeqId,
    start: usize,
    end: usize,
) -> Result<()> {
    if !sched.radix.is_enabled() {
        return Ok(());
    }
    let (prompt_len, slot) = {
        let seq = sched.running_seq(id).context("sequence vanished")?;
        (seq.prompt_len, seq.cache.state_slot())
    };
    let snapshot = if sched.hybrid {
        if !sched.policy.is_snapshot_point(end, prompt_len) {
            return Ok(());
        }
        let Some(own) = slot else { return Ok(()) };
        let Some(snap) = sched.snapshot_slot()? else {
            return Ok(()); // every slot busy: resumable later from a shallower point
        };
        backend.copy_state(cache, own, snap);
        Some((end / sched.config.block_size - 1, snap))
    } else if start < prompt_len {
        None
    } else {
        return Ok(());
    };
    let seq = sched
        .running
        .iter()
        .find(|s| s.id == id)
        .context("sequence vanished")?;
    let snapshots: Vec<(usize, u32)> = snapshot.into_iter().collect();
    sched.radix.insert(
        &seq.tokens[..end],
        &seq.salt,
        seq.cache.block_table(),
        &snapshots,
        &mut sched.blocks,
        &mut sched.slots,
    )?;
    Ok(())
}

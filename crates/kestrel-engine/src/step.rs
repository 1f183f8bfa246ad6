//! Running one planned step: restore states, one forward pass over every
//! scheduled chunk, sample where a chunk reaches the end of its sequence,
//! snapshot and cache what was computed, finish what stopped.

use anyhow::{Context, Result};
use kestrel_core::{Backend, CandidateRequest, ForwardBatch, RowCandidates, SeqChunk};
use kestrel_models::Model;
use kestrel_sampling::{DEFAULT_MAX_CANDIDATES, Finish};

use crate::client::SeqId;
use crate::engine::LogitsObserver;
use crate::handle::EngineEvent;
use crate::scheduler::{Scheduler, StateOp, StepPlan};

/// What happened to a sequence in this step, applied after all sampling.
enum Outcome {
    Finished(SeqId, Finish),
    Failed(SeqId, String),
}

/// Where a sampled row's token comes from.
enum RowSource {
    /// Picked on the device (plain greedy).
    Argmax(u32),
    /// The device's best candidates, or its draw over a row no filter cuts
    /// (row `row` of the logits); the whole row is fetched only if they
    /// cannot decide.
    Candidates {
        row: usize,
        request: CandidateRequest,
        found: RowCandidates,
    },
    /// The whole row, copied to the host.
    Logits(Vec<f32>),
}

pub(crate) fn execute<B: Backend>(
    backend: &B,
    model: &Model<B>,
    cache: &mut B::Cache,
    sched: &mut Scheduler,
    plan: StepPlan,
    mut observer: Option<&mut LogitsObserver>,
    use_candidates: bool,
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
    let mut logits = None;
    let mut sources = Vec::new().into_iter();
    if sampled_rows.is_empty() {
        model.decoder.forward(backend, &ids, &batch, cache);
    } else {
        let out = model
            .decoder
            .step_logits(backend, &ids, &batch, cache, &sampled_rows);
        let candidates = use_candidates && observer.is_none();
        sources =
            row_sources(backend, &out, sched, &plan, all_plain_argmax, candidates)?.into_iter();
        logits = Some((sampled_vocab(backend, &out, sched), out));
    }

    let mut outcomes = Vec::new();
    for (chunk, samples) in plan.chunks.iter().zip(sampling) {
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        seq.cache.set_num_tokens(chunk.end, block_size)?;
        if samples {
            let sampled = match sources.next().context("missing sampled row")? {
                RowSource::Argmax(token) => Ok(token),
                RowSource::Logits(mut row) => {
                    if let Some(observe) = observer.as_mut() {
                        observe(&seq.request_id, &row);
                    }
                    seq.sampler.sample(&mut row, &seq.tokens)
                }
                RowSource::Candidates {
                    row,
                    request,
                    found,
                } => match seq.sampler.sample_candidates(&request, &found) {
                    Some(sampled) => sampled,
                    None => {
                        let (vocab, out) = logits.as_ref().context("logits vanished")?;
                        let mut row = host_rows(backend, out, &[row], *vocab).remove(0);
                        seq.sampler.sample(&mut row, &seq.tokens)
                    }
                },
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

/// Ids that may be sampled: the tokenizer's vocabulary within the logits' width.
fn sampled_vocab<B: Backend>(backend: &B, out: &B::Tensor, sched: &Scheduler) -> usize {
    let vocab = backend.dims(out).1;
    sched.config.sampled_vocab.map_or(vocab, |v| v.min(vocab))
}

/// Decide, for every sampled row in order, where its token comes from, and
/// do the device work and copies that needs: the device argmax when every row
/// is plain greedy; else, with `candidates`, the device's best candidates (or
/// draw) for the rows a sampler can finish on them, and one copy of the
/// other rows.
fn row_sources<B: Backend>(
    backend: &B,
    out: &B::Tensor,
    sched: &mut Scheduler,
    plan: &StepPlan,
    all_plain_argmax: bool,
    candidates: bool,
) -> Result<Vec<RowSource>> {
    let sampled_vocab = sampled_vocab(backend, out, sched);
    if all_plain_argmax {
        let ids = backend.argmax_rows(out, sampled_vocab);
        return Ok(ids.into_iter().map(RowSource::Argmax).collect());
    }
    // Per sampled row: its candidate request, or None for a full-row copy.
    let mut requests = Vec::new();
    for chunk in &plan.chunks {
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        if chunk.end != seq.tokens.len() {
            continue;
        }
        let row = requests.len();
        requests.push(if candidates {
            seq.sampler
                .candidate_request(&seq.tokens, row, sampled_vocab, DEFAULT_MAX_CANDIDATES)
        } else {
            None
        });
    }
    let asked: Vec<CandidateRequest> = requests.iter().flatten().cloned().collect();
    let mut found = backend.top_candidates(out, &asked).into_iter();
    let full: Vec<usize> = (0..requests.len())
        .filter(|&r| requests[r].is_none())
        .collect();
    let mut copied = host_rows(backend, out, &full, sampled_vocab).into_iter();
    requests
        .into_iter()
        .enumerate()
        .map(|(row, request)| {
            Ok(match request {
                Some(request) => RowSource::Candidates {
                    row,
                    request,
                    found: found.next().context("missing candidates")?,
                },
                None => RowSource::Logits(copied.next().context("missing logits row")?),
            })
        })
        .collect()
}

/// Rows `rows` of the logits, copied to the host in one transfer, with the
/// padded ids (no token behind them) at `-inf` so they are never sampled.
fn host_rows<B: Backend>(
    backend: &B,
    out: &B::Tensor,
    rows: &[usize],
    sampled_vocab: usize,
) -> Vec<Vec<f32>> {
    if rows.is_empty() {
        return Vec::new();
    }
    let (num_rows, vocab) = backend.dims(out);
    let values = if rows.len() == num_rows {
        backend.to_host(out)
    } else {
        backend.to_host(&backend.gather_rows(out, rows))
    };
    values
        .chunks_exact(vocab)
        .map(|row| {
            let mut row = row.to_vec();
            row[sampled_vocab..].fill(f32::NEG_INFINITY);
            row
        })
        .collect()
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

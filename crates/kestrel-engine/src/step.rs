//! Running one planned step: restore states, one forward pass over every
//! scheduled chunk, sample where a chunk reaches the end of its sequence
//! (verifying its drafts on a speculative step, see [`crate::spec`]),
//! commit the state, snapshot and cache what was computed, finish what
//! stopped.

use std::time::Instant;

use anyhow::{Context, Result};
use kestrel_core::{Backend, CandidateRequest, ForwardBatch, RowMask, SeqChunk, StateSnapshot};
use kestrel_models::{Target, TargetCache};
use kestrel_sampling::{DEFAULT_MAX_CANDIDATES, Finish, FinishReason};

use crate::choose::{RowSource, StepLogits};
use crate::handle::EngineEvent;
use crate::logprobs::RowRecorder;
use crate::prompt_logprobs;
use crate::scheduler::{Scheduler, StateOp, StepPlan};
use crate::sequence::SeqId;
use crate::sequence::Sequence;
use crate::spec::capture::{self, StepReader};
use crate::spec::mtp::CommittedRows;
use crate::timing;

/// Instrumentation: called with a request's `request_id` and each raw logits
/// row the engine samples that request's next token from (before penalties).
/// The tests use it to check that outputs are bitwise independent of
/// batching, preemption and the prefix cache.
pub type LogitsObserver = Box<dyn FnMut(&str, &[f32]) + Send>;

/// What happened to a sequence in this step, applied after all sampling.
enum Outcome {
    Finished(SeqId, Finish),
    Failed(SeqId, String),
}

/// The logits rows of one chunk (`first..first + count` of the step's
/// logits): the last `1 + drafts` of its rows when it reaches the end of its
/// sequence's known tokens (a verify chunk has one per draft plus the bonus
/// row), none otherwise.
struct ChunkRows {
    first: usize,
    count: usize,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn execute<B: Backend>(
    backend: &B,
    model: &Target<B>,
    cache: &mut TargetCache<B>,
    sched: &mut Scheduler,
    plan: StepPlan,
    mut observer: Option<&mut LogitsObserver>,
    use_candidates: bool,
    drafter: Option<StepReader<'_, B>>,
) -> Result<()> {
    if plan.chunks.is_empty() {
        return Ok(());
    }
    for op in &plan.state_ops {
        match *op {
            StateOp::Zero(slot) => cache.zero_state(backend, slot),
            StateOp::Copy { src, dst } => cache.copy_state(backend, src, dst),
        }
    }

    let block_size = sched.config().block_size;
    let mut ids = Vec::with_capacity(plan.chunks.iter().map(|c| c.end - c.start).sum());
    let mut batch = ForwardBatch::default();
    let mut chunk_rows = Vec::with_capacity(plan.chunks.len());
    let mut logit_rows = Vec::new();
    // Rows whose token is the raw argmax can be picked on the device, which
    // saves copying a vocabulary-sized row per sequence to the host.
    let mut all_plain_argmax = observer.is_none();
    for chunk in &plan.chunks {
        let seq = sched
            .running_seq(chunk.id)
            .context("a scheduled sequence is not running")?;
        let known_end = chunk.end - chunk.drafts;
        ids.extend_from_slice(&seq.tokens[chunk.start..known_end]);
        ids.extend_from_slice(&seq.drafts[..chunk.drafts]);
        batch.seqs.push(SeqChunk {
            num_tokens: chunk.end - chunk.start,
            cached_len: chunk.start,
            block_table: seq.cache.block_table()[..chunk.end.div_ceil(block_size)].to_vec(),
            state_slot: seq.cache.state_slot().unwrap_or(0),
            state_checkpoints: seq.cache.checkpoint_slots().to_vec(),
            state_snapshot: chunk.snapshot.map(|(at, slot)| StateSnapshot {
                after: at - chunk.start,
                slot,
            }),
            prompt: chunk.drafts == 0 && chunk.end <= seq.prompt_len,
        });
        // Logits only for chunks that end at their sequence's last known token.
        let rows = (known_end == seq.tokens.len()).then(|| {
            let first_id = ids.len() - 1 - chunk.drafts;
            let rows = ChunkRows {
                first: logit_rows.len(),
                count: 1 + chunk.drafts,
            };
            logit_rows.extend(first_id..ids.len());
            all_plain_argmax &= seq.sampler.is_plain_argmax(&seq.tokens) && !needs_host_row(seq);
            rows
        });
        chunk_rows.push(rows);
    }

    let forward_start = Instant::now();
    // One step either way (which the backend may run as two passes, its
    // decode and verify rows apart from prefill chunks); ending in logits
    // lets decode steps be replayed. A drafter that reads the target's
    // states gets them too.
    let keep_hidden = prompt_logprobs::step_needs_hidden(sched, &plan);
    let capture::StepOutput {
        logits: mut out,
        captured,
        hidden,
        split,
    } = capture::forward_step(
        backend,
        model,
        &ids,
        &batch,
        cache,
        &logit_rows,
        drafter.as_ref(),
        keep_hidden,
    )?;
    if let Some(hidden) = hidden {
        prompt_logprobs::send_step(backend, model, &hidden, sched, &plan)?;
    }
    if split {
        sched.record_split_step();
    }
    // The forward is queued: the grammars compute their masks meanwhile.
    let masking = match out.as_mut() {
        Some(out) => mask_on_backend(backend, out, sched, &plan, &chunk_rows, observer.is_none())?,
        None => vec![Masking::None; plan.chunks.len()],
    };
    let step_logits = out
        .as_ref()
        .map(|out| StepLogits::new(backend, out, sched.config().sampled_vocab));
    let mut sources: Vec<Option<RowSource>> = match &step_logits {
        None => Vec::new(),
        Some(logits) => {
            let requests = if all_plain_argmax {
                Vec::new()
            } else {
                // An observer sees whole rows, so it turns candidates off.
                let candidates = use_candidates && observer.is_none();
                candidate_requests(sched, &plan, &chunk_rows, logits, candidates)?
            };
            logits
                .sources(requests, all_plain_argmax)?
                .into_iter()
                .map(Some)
                .collect()
        }
    };

    // The logits are on the host (or their candidates chosen): the pass is over.
    let forward = forward_start.elapsed();
    timing::report_step(plan.chunks.len(), ids.len(), forward);

    let mut outcomes = Vec::new();
    let mut committed_ends = Vec::with_capacity(plan.chunks.len());
    for ((chunk, rows), masking) in plan.chunks.iter().zip(&chunk_rows).zip(masking) {
        if let Some((at, Some(slot))) = chunk.snapshot {
            sched.cache_snapshot(chunk.id, at, slot)?;
        }
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        seq.timing.add_pass(forward);
        let known_end = chunk.end - chunk.drafts;
        let Some(rows) = rows else {
            seq.cache.set_num_tokens(chunk.end, block_size)?;
            committed_ends.push(chunk.end);
            sched.cache_progress(chunk.id, chunk.start, chunk.end, |own, snap| {
                cache.copy_state(backend, own, snap)
            })?;
            continue;
        };
        let logits = step_logits.as_ref().context("logits vanished")?;
        if seq.tokens_left() == 0 {
            // `max_tokens: 0`: the prompt is computed, nothing is generated.
            outcomes.push(Outcome::Finished(
                chunk.id,
                Finish {
                    reason: FinishReason::Length,
                    stop_token: None,
                },
            ));
            seq.cache.set_num_tokens(known_end, block_size)?;
            committed_ends.push(known_end);
            sched.cache_progress(chunk.id, chunk.start, known_end, |own, snap| {
                cache.copy_state(backend, own, snap)
            })?;
            continue;
        }
        // Sample row by row; a draft is kept while the token sampled for
        // its position equals it.
        let mut emitted = Vec::with_capacity(rows.count);
        let mut emitted_logprobs = Vec::new();
        let mut accepted = 0;
        for i in 0..rows.count {
            let source = sources[rows.first + i]
                .take()
                .context("missing sampled row")?;
            let mut row_logprobs = RowRecorder::new(seq.sampler.params().logprobs);
            let mut observe = |row: &[f32]| {
                if let Some(observe) = observer.as_mut() {
                    observe(&seq.request_id, row);
                }
                row_logprobs.observe(row);
            };
            let chosen = match (&masking, seq.constraint.as_deref_mut()) {
                (Masking::Failed(message), _) => Err(message.clone()),
                (Masking::Backend, _) | (_, None) => logits
                    .choose(source, &mut seq.sampler, &seq.tokens, &mut observe)?
                    .map_err(|e| format!("sampling failed: {e}")),
                (Masking::None, Some(constraint)) => logits.choose_constrained(
                    source,
                    &mut seq.sampler,
                    &seq.tokens,
                    &mut observe,
                    constraint,
                )?,
            };
            match chosen {
                Ok(token) => {
                    emitted_logprobs.extend(row_logprobs.token(token)?);
                    seq.tokens.push(token);
                    emitted.push(token);
                    let matched = i < chunk.drafts && seq.drafts[i] == token;
                    accepted += usize::from(matched);
                    if let Some(finish) =
                        seq.stop.check(token, seq.num_generated(), seq.tokens.len())
                    {
                        outcomes.push(Outcome::Finished(chunk.id, finish));
                        break;
                    }
                    if let Some(ended) = advance_constraint(seq, chunk.id, token) {
                        outcomes.push(ended);
                        break;
                    }
                    if !matched {
                        break;
                    }
                }
                Err(message) => {
                    outcomes.push(Outcome::Failed(chunk.id, message));
                    break;
                }
            }
        }
        // Computed and valid: the known tokens and the accepted drafts.
        let committed = known_end + emitted.len().saturating_sub(1);
        seq.cache.set_num_tokens(committed, block_size)?;
        if chunk.drafts > 0 {
            // The live state went through every draft; the last accepted
            // token's checkpoint is the state to keep, and its slot becomes
            // the live one (no copy on the path between two steps).
            // (There are `drafts` checkpoints: none when every draft was kept.)
            seq.cache.keep_checkpoint(committed - chunk.start - 1);
        }
        if !emitted.is_empty() {
            let cached = seq.cached_tokens.unwrap_or(0);
            seq.timing
                .first_token(&seq.request_id, seq.prompt_len, cached);
        }
        seq.drafts.clear();
        if chunk.drafts > 0 {
            seq.draft_length.record(chunk.drafts, accepted);
            sched.end_speculation(chunk.id, chunk.drafts, accepted)?;
        }
        if !emitted.is_empty() {
            sched.record_generated(emitted.len());
            let seq = sched.running_seq(chunk.id).context("sequence vanished")?;
            if !emitted_logprobs.is_empty() {
                seq.emit(EngineEvent::Logprobs(emitted_logprobs));
            }
            seq.emit(EngineEvent::Tokens(emitted));
        }
        committed_ends.push(committed);
        sched.cache_progress(chunk.id, chunk.start, committed, |own, snap| {
            cache.copy_state(backend, own, snap)
        })?;
    }

    if let (Some(drafter), Some(captured)) = (drafter, captured.as_ref()) {
        let ended: Vec<SeqId> = outcomes
            .iter()
            .map(|o| match o {
                Outcome::Finished(id, _) | Outcome::Failed(id, _) => *id,
            })
            .collect();
        let mut first_row = 0;
        let mut rows = Vec::with_capacity(plan.chunks.len());
        for (chunk, &committed) in plan.chunks.iter().zip(&committed_ends) {
            let row = first_row;
            first_row += chunk.end - chunk.start;
            if ended.contains(&chunk.id) {
                continue;
            }
            let seq = sched.running_seq(chunk.id).context("sequence vanished")?;
            rows.push(CommittedRows {
                id: chunk.id,
                first_row: row,
                start: chunk.start,
                committed,
                tokens: &seq.tokens,
                block_table: seq.cache.block_table(),
                decodes_next: committed + 1 == seq.tokens.len(),
                draft_limit: seq.draft_length.limit(),
            });
        }
        let model = model
            .decoder_model()
            .context("a drafter reads a model on the shared decoder")?;
        drafter.after_step(backend, model, captured, &rows)?;
    }

    for outcome in outcomes {
        match outcome {
            Outcome::Finished(id, finish) => sched.finish(id, finish)?,
            Outcome::Failed(id, message) => sched.fail(id, &message),
        }
    }
    Ok(())
}

/// Feed an emitted token to the sequence's constraint: the sequence fails
/// when the constraint errs, and finishes (a stop) when the grammar is
/// complete.
fn advance_constraint(seq: &mut Sequence, id: SeqId, token: u32) -> Option<Outcome> {
    let constraint = seq.constraint.as_mut()?;
    if let Err(e) = constraint.accept(token) {
        return Some(Outcome::Failed(
            id,
            format!("the output constraint failed: {e}"),
        ));
    }
    constraint.is_complete().then_some(Outcome::Finished(
        id,
        Finish {
            reason: FinishReason::Stop,
            stop_token: None,
        },
    ))
}

/// Whether a sequence's rows must come to the host whole: logprobs are
/// computed from them there (and its constraint then masks them there too).
fn needs_host_row(seq: &Sequence) -> bool {
    seq.sampler.params().logprobs.is_some()
}

/// How a chunk's rows were masked by its sequence's constraint.
#[derive(Clone)]
enum Masking {
    /// Not by the backend: no constraint, or one the host applies to the
    /// whole rows (see [`crate::constraint`]).
    None,
    /// By the backend, before any row was read.
    Backend,
    /// The constraint could not say what may come next.
    Failed(String),
}

/// Compute the masks of every constrained row whose sequence does not need
/// its rows on the host (`rows_stay` is false when an observer takes every
/// row whole) and apply them to `logits` on the backend, in one call.
fn mask_on_backend<B: Backend>(
    backend: &B,
    logits: &mut B::Tensor,
    sched: &mut Scheduler,
    plan: &StepPlan,
    chunk_rows: &[Option<ChunkRows>],
    rows_stay: bool,
) -> Result<Vec<Masking>> {
    let row_len = backend.dims(logits).1;
    let mut masking = Vec::with_capacity(plan.chunks.len());
    let mut masks: Vec<(usize, Vec<u32>)> = Vec::new();
    for (chunk, rows) in plan.chunks.iter().zip(chunk_rows) {
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        let on_backend = rows_stay && !needs_host_row(seq);
        let (Some(rows), Some(constraint), true) =
            (rows, seq.constraint.as_deref_mut(), on_backend)
        else {
            masking.push(Masking::None);
            continue;
        };
        match constraint.allowed_along(&seq.drafts[..chunk.drafts], row_len) {
            Ok(found) => {
                masks.extend(
                    found
                        .into_iter()
                        .enumerate()
                        .map(|(i, m)| (rows.first + i, m)),
                );
                masking.push(Masking::Backend);
            }
            Err(e) => masking.push(Masking::Failed(format!(
                "the output constraint failed: {e}"
            ))),
        }
    }
    let masks: Vec<RowMask<'_>> = masks
        .iter()
        .map(|(row, allowed)| RowMask { row: *row, allowed })
        .collect();
    backend.mask_rows(logits, &masks);
    Ok(masking)
}

/// The device-candidate request of every logits row, in order: one for the
/// single row of a plain step whose sampler can finish on candidates, none
/// for a sequence that [`needs_host_row`], none for a speculative
/// step's rows (each is sampled only if the rows before it
/// matched their drafts, so none may draw from the RNG ahead of time).
fn candidate_requests<B: Backend>(
    sched: &mut Scheduler,
    plan: &StepPlan,
    chunk_rows: &[Option<ChunkRows>],
    logits: &StepLogits<'_, B>,
    use_candidates: bool,
) -> Result<Vec<Option<CandidateRequest>>> {
    let mut requests = Vec::new();
    for (chunk, rows) in plan.chunks.iter().zip(chunk_rows) {
        let Some(rows) = rows else { continue };
        let whole_row = sched.running_seq(chunk.id).is_some_and(needs_host_row);
        if rows.count > 1 || !use_candidates || whole_row {
            requests.extend((0..rows.count).map(|_| None));
            continue;
        }
        let seq = sched
            .running_seq_mut(chunk.id)
            .context("sequence vanished")?;
        requests.push(seq.sampler.candidate_request(
            &seq.tokens,
            rows.first,
            logits.sampled_vocab,
            DEFAULT_MAX_CANDIDATES,
        ));
    }
    Ok(requests)
}

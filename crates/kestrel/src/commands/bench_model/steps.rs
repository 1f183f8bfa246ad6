//! Timed forward steps over a batch of prefilled sequences, driven directly
//! through `Decoder::step_logits` with hand-built `ForwardBatch`es (no
//! scheduler): decode steps (one new token per sequence) and speculative
//! verify steps (k + 1 new tokens per sequence, with k state checkpoints
//! each on hybrid models, as the engine lays them out). Tokens are chosen by
//! the engine's chooser.

use std::time::Instant;

use anyhow::{Result, bail};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_engine::{RowSource, StepLogits};
use kestrel_models::Model;

use super::Args;
use super::report::{Breakdown, DecodeResult, Stats};
use super::sampling::TokenChooser;
use super::timing::Timed;
use super::traffic::{self, Storage};

pub const BLOCK_SIZE: usize = 16;

/// Prompt token ids: a fixed pseudo-random sequence inside the vocabulary.
pub fn prompt_ids(len: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i.wrapping_add(salt * 7919)).wrapping_mul(2_654_435_761) % vocab) as u32)
        .collect()
}

/// The greedy token of every row, picked by the engine's chooser.
fn greedy<B: Backend>(b: &B, logits: &B::Tensor) -> Result<Vec<u32>> {
    StepLogits::new(b, logits, None)
        .sources(Vec::new(), true)?
        .into_iter()
        .map(|source| match source {
            RowSource::Argmax(token) => Ok(token),
            _ => bail!("a greedy row was not picked on the device"),
        })
        .collect()
}

/// Feeds `ids` to one sequence from position `start`, in chunks of at most
/// `budget` tokens, and returns the greedy next token.
pub fn prefill_sequence<B: Backend>(
    b: &B,
    model: &Model<B>,
    cache: &mut B::Cache,
    ids: &[u32],
    pages: &[u32],
    slot: u32,
    budget: usize,
) -> Result<u32> {
    let mut done = 0;
    let mut next = 0;
    while done < ids.len() {
        let n = budget.min(ids.len() - done);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                prompt: true,
                num_tokens: n,
                cached_len: done,
                block_table: pages[..(done + n).div_ceil(BLOCK_SIZE)].to_vec(),
                state_slot: slot,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            }],
        };
        let chunk = &ids[done..done + n];
        done += n;
        if done == ids.len() {
            let logits = model.decoder.step_logits(b, chunk, &batch, cache, &[n - 1]);
            next = greedy(b, &logits)?[0];
        } else {
            model.decoder.forward(b, chunk, &batch, cache);
        }
    }
    Ok(next)
}

/// `batch` sequences, each holding `context` tokens of its own prompt, in a
/// cache with room for `positions` positions per sequence and `checkpoints`
/// state-checkpoint slots per sequence (after the `batch` live slots).
struct Prefilled<C> {
    cache: C,
    tables: Vec<Vec<u32>>,
    /// Each sequence's next token.
    tokens: Vec<u32>,
    /// Each sequence's prompt and next token.
    histories: Vec<Vec<u32>>,
    checkpoints: usize,
}

impl<C> Prefilled<C> {
    fn new<B: Backend<Cache = C>>(
        b: &B,
        model: &Model<B>,
        batch: usize,
        positions: usize,
        checkpoints: usize,
        args: &Args,
    ) -> Result<Self> {
        let vocab = model.config().vocab_size;
        let per_seq = positions.div_ceil(BLOCK_SIZE);
        let spec = model
            .decoder
            .cache_spec(per_seq * batch, BLOCK_SIZE, batch * (1 + checkpoints));
        let mut cache = b.new_cache(&spec)?;
        let tables: Vec<Vec<u32>> = (0..batch)
            .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
            .collect();
        let mut tokens = Vec::with_capacity(batch);
        let mut histories = Vec::with_capacity(batch);
        for (s, table) in tables.iter().enumerate() {
            b.zero_state(&mut cache, s as u32);
            let mut ids = prompt_ids(args.context, vocab, s + 1);
            let first = prefill_sequence(
                b,
                model,
                &mut cache,
                &ids,
                table,
                s as u32,
                args.max_batched_tokens,
            )?;
            tokens.push(first);
            ids.push(first);
            histories.push(ids);
        }
        Ok(Self {
            cache,
            tables,
            tokens,
            histories,
            checkpoints,
        })
    }

    /// Every sequence bringing `new` tokens on top of `cached` ones.
    fn batch(&self, cached: usize, new: usize) -> ForwardBatch {
        let n = self.tables.len();
        ForwardBatch {
            seqs: self
                .tables
                .iter()
                .enumerate()
                .map(|(s, t)| SeqChunk {
                    prompt: false,
                    num_tokens: new,
                    cached_len: cached,
                    block_table: t[..(cached + new).div_ceil(BLOCK_SIZE)].to_vec(),
                    state_slot: s as u32,
                    state_checkpoints: (0..self.checkpoints)
                        .map(|i| (n + s * self.checkpoints + i) as u32)
                        .collect(),
                    state_snapshot: None,
                })
                .collect(),
        }
    }
}

/// Untimed warm-up steps, the timed ones, and instrumented ones for the
/// breakdown; `step` returns one step's wall time.
pub fn time_steps<B: Backend>(
    b: &Timed<B>,
    args: &Args,
    mut step: impl FnMut() -> Result<f64>,
) -> Result<(Vec<f64>, Option<Breakdown>)> {
    for _ in 0..args.warmup {
        step()?;
    }
    let times = (0..args.steps)
        .map(|_| step())
        .collect::<Result<Vec<f64>>>()?;
    let breakdown = if args.breakdown_steps > 0 {
        b.record(true);
        let mut wall = 0.0;
        for _ in 0..args.breakdown_steps {
            wall += step()?;
        }
        b.record(false);
        Some(Breakdown::new(&b.breakdown(), args.breakdown_steps, wall))
    } else {
        None
    };
    Ok((times, breakdown))
}

pub fn decode<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    batch: usize,
    storage: Storage,
    bandwidth_gbs: f64,
    sampled_vocab: Option<usize>,
    args: &Args,
) -> Result<(DecodeResult, Option<Breakdown>)> {
    let cfg = model.config();
    let vocab = cfg.vocab_size;
    let total = args.context + args.warmup + args.steps + args.breakdown_steps;
    let mut seqs = Prefilled::new(b, model, batch, total, 0, args)?;
    let mut chooser = TokenChooser::new(args.sampling, seqs.histories.clone(), sampled_vocab)?;
    let mut len = args.context;
    let (times, breakdown) = time_steps(b, args, || {
        let fb = seqs.batch(len, 1);
        b.synchronize()?;
        let start = Instant::now();
        let rows: Vec<usize> = (0..batch).collect();
        let logits = model
            .decoder
            .step_logits(b, &seqs.tokens, &fb, &mut seqs.cache, &rows);
        seqs.tokens = chooser.choose(b, &logits)?;
        let secs = start.elapsed().as_secs_f64();
        len += 1;
        if seqs.tokens.iter().any(|&t| t as usize >= vocab) {
            bail!("a token outside the vocabulary");
        }
        Ok(secs)
    })?;
    if chooser.sampled > 0 {
        eprintln!(
            "decode batch {batch}, sampling {:?}: {} of {} sampled tokens needed their whole row",
            args.sampling, chooser.full_rows, chooser.sampled
        );
    }
    let first_timed_context = args.context + args.warmup;
    // The mean cached length over the timed steps.
    let context = first_timed_context as f64 + (args.steps as f64 - 1.0) / 2.0;
    let result = DecodeResult {
        batch,
        context: first_timed_context,
        stats: Stats::of(&times),
        bytes: traffic::step_bytes(cfg, storage, batch, context, 1),
        bandwidth_gbs,
    };
    Ok((result, breakdown))
}

/// Verify steps of `k` drafts: every sequence brings its next token and `k`
/// drafts at the decode context (`--context` cached tokens, the same
/// positions every step, as if each step's drafts were all rejected), and
/// every row's greedy token is picked on the device, as the engine does for
/// greedy requests.
pub fn verify<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    batch: usize,
    k: usize,
    args: &Args,
) -> Result<(Stats, Option<Breakdown>)> {
    let hybrid = model.config().arch.is_hybrid();
    let checkpoints = if hybrid { k } else { 0 };
    let mut seqs = Prefilled::new(b, model, batch, args.context + k + 1, checkpoints, args)?;
    // The next token, then k drafts (the greedy tokens of the rows before).
    let mut ids: Vec<u32> = seqs
        .tokens
        .iter()
        .flat_map(|&t| std::iter::repeat_n(t, k + 1))
        .collect();
    let rows: Vec<usize> = (0..batch * (k + 1)).collect();
    let fb = seqs.batch(args.context, k + 1);
    let (times, breakdown) = time_steps(b, args, || {
        b.synchronize()?;
        let start = Instant::now();
        let logits = model
            .decoder
            .step_logits(b, &ids, &fb, &mut seqs.cache, &rows);
        ids = greedy(b, &logits)?;
        Ok(start.elapsed().as_secs_f64())
    })?;
    Ok((Stats::of(&times), breakdown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ids_stay_in_the_vocabulary_and_differ_per_sequence() {
        let a = prompt_ids(1000, 37, 0);
        assert!(a.iter().all(|&t| t < 37));
        assert_ne!(a, prompt_ids(1000, 37, 1));
    }
}

//! Whole-step throughput of speculative decoding at a known acceptance:
//! the real engine (scheduler, verification, state commit) on the same
//! backend and model, with the replay proposer as its draft source.
//!
//! One engine serves every round, so that its recorded steps (CUDA graphs)
//! carry over from warm-up to timed rounds. Per batch size: a plain round
//! (drafting off) records each request's continuation and warms up, a
//! second plain round is timed, then a warm-up and a timed round with the
//! replay drafts on. A round's rate counts the tokens that arrive after
//! every request has its first one (the prefill's), over the time from then
//! to the last: decode throughput, prefill excluded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};
use kestrel_core::Backend;
use kestrel_engine::spec::{DraftRows, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{
    Engine, EngineConfig, EngineEvent, EngineHandle, EngineOptions, EngineStats, GenerateRequest,
};
use kestrel_models::Model;
use serde_json::{Value, json};

use super::replay::{Profile, ReplaySource};
use super::sampling::SamplingMode;
use super::steps::{BLOCK_SIZE, prompt_ids};

/// What the replay runs are asked to do.
pub struct ReplaySettings {
    pub profile: Profile,
    pub batches: Vec<usize>,
    pub context: usize,
    /// Tokens each request generates.
    pub max_tokens: usize,
    pub max_batched_tokens: usize,
    pub sampling: SamplingMode,
    /// Ids the requests may produce (`EngineConfig::sampled_vocab`).
    pub sampled_vocab: Option<usize>,
    pub seed: u64,
    /// The decode and verify rows a step may bring.
    pub draft_rows: DraftRows,
    /// Adapt each request's draft length to its acceptance.
    pub adaptive_drafts: bool,
}

/// One round's requests: their tokens and the decode rate.
pub struct Round {
    pub outputs: Vec<Vec<u32>>,
    pub tokens_per_s: f64,
}

/// Counter differences over the timed speculative round.
#[derive(Debug)]
pub struct Acceptance {
    pub drafts: u64,
    pub draft_tokens: u64,
    pub accepted: u64,
    pub per_position: Vec<f64>,
}

impl Acceptance {
    /// vLLM's mean acceptance length: tokens a speculative step emits.
    pub fn length(&self) -> f64 {
        1.0 + self.accepted as f64 / self.drafts.max(1) as f64
    }
}

pub struct ReplayResult {
    pub batch: usize,
    pub plain: Round,
    pub speculative: Round,
    pub acceptance: Acceptance,
    /// Requests whose speculative output equals their plain output.
    pub same_outputs: usize,
}

/// Runs every batch size of `settings` on one engine (which takes the
/// backend and the model).
pub fn run<B: Backend>(
    backend: B,
    model: Model<B>,
    settings: &ReplaySettings,
) -> Result<Vec<ReplayResult>> {
    let vocab = model.config().vocab_size;
    let k = settings.profile.len();
    let most = settings.batches.iter().copied().max().unwrap_or(1);
    let max_len = settings.context + settings.max_tokens + k + 1;
    let source = Arc::new(ReplaySource::new(settings.profile.clone(), settings.seed));
    let config = EngineConfig {
        max_num_seqs: most,
        max_queued_requests: most,
        max_num_batched_tokens: settings.max_batched_tokens.max(most * (k + 1)),
        block_size: BLOCK_SIZE,
        num_blocks: most * (max_len.div_ceil(BLOCK_SIZE) + 1),
        num_state_slots: most * (1 + k),
        enable_prefix_cache: false,
        max_model_len: max_len,
        force_preempt_at: None,
        sampled_vocab: settings.sampled_vocab,
    };
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method: SpeculativeMethod::External(source.clone()),
            num_speculative_tokens: k,
        }),
        draft_rows: settings.draft_rows,
        adaptive_drafts: settings.adaptive_drafts,
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(backend, model, config, options)?;
    let mut results = Vec::new();
    for &batch in &settings.batches {
        let requests = requests(settings, batch, vocab);
        source.set_on(false);
        let recorded = round(&engine, &requests)?;
        for (r, out) in requests.iter().zip(&recorded.outputs) {
            source.record(&r.request_id, out.clone());
        }
        let plain = round(&engine, &requests)?;
        source.set_on(true);
        round(&engine, &requests)?;
        let before = idle_stats(&engine)?;
        let speculative = round(&engine, &requests)?;
        let after = idle_stats(&engine)?;
        let same_outputs = recorded
            .outputs
            .iter()
            .zip(&speculative.outputs)
            .filter(|(a, b)| a == b)
            .count();
        results.push(ReplayResult {
            batch,
            plain,
            speculative,
            acceptance: acceptance(&before, &after),
            same_outputs,
        });
    }
    engine.shutdown();
    Ok(results)
}

fn requests(settings: &ReplaySettings, batch: usize, vocab: usize) -> Vec<GenerateRequest> {
    (0..batch)
        .map(|s| {
            let mut params = settings.sampling.params(s as u64 + 1);
            params.max_tokens = Some(settings.max_tokens);
            params.ignore_eos = true;
            GenerateRequest {
                request_id: format!("batch{batch}-{s}"),
                prompt_ids: prompt_ids(settings.context, vocab, s + 1),
                params,
                cache_salt: Vec::new(),
                constraint: None,
            }
        })
        .collect()
}

/// Submits every request at once and collects their events.
fn round(engine: &EngineHandle, requests: &[GenerateRequest]) -> Result<Round> {
    let start = Instant::now();
    let streams = requests
        .iter()
        .map(|r| engine.submit(r.clone()).map_err(|e| anyhow!("submit: {e}")))
        .collect::<Result<Vec<_>>>()?;
    // One thread per stream: each event is timed when it arrives.
    let handles: Vec<_> = streams
        .into_iter()
        .map(|mut stream| {
            std::thread::spawn(move || -> Result<Vec<(Duration, Vec<u32>)>> {
                let mut events = Vec::new();
                loop {
                    match stream.blocking_recv() {
                        Some(EngineEvent::Tokens(t)) => events.push((start.elapsed(), t)),
                        Some(EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_)) => {}
                        Some(EngineEvent::Finished { .. }) => return Ok(events),
                        Some(EngineEvent::Error(e)) => bail!("a request failed: {e}"),
                        None => bail!("the engine stopped"),
                    }
                }
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.push(
            h.join()
                .map_err(|_| anyhow!("a stream reader panicked"))??,
        );
    }
    let first = all
        .iter()
        .map(|e| e.first().map_or(Duration::ZERO, |f| f.0))
        .max()
        .unwrap_or_default();
    let last = all
        .iter()
        .filter_map(|e| e.last().map(|l| l.0))
        .max()
        .unwrap_or_default();
    let after: usize = all
        .iter()
        .flatten()
        .filter(|(t, _)| *t > first)
        .map(|(_, tokens)| tokens.len())
        .sum();
    let window = (last - first).as_secs_f64();
    let outputs = all
        .into_iter()
        .map(|events| events.into_iter().flat_map(|(_, t)| t).collect())
        .collect();
    Ok(Round {
        outputs,
        tokens_per_s: if window > 0.0 {
            after as f64 / window
        } else {
            0.0
        },
    })
}

/// The engine's counters once it has retired every request (it publishes
/// them after the step that finished the last one).
fn idle_stats(engine: &EngineHandle) -> Result<EngineStats> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = engine.stats();
        if stats.num_running == 0 && stats.num_waiting == 0 {
            return Ok(stats);
        }
        if Instant::now() > deadline {
            bail!("the engine did not become idle");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn acceptance(before: &EngineStats, after: &EngineStats) -> Acceptance {
    let drafts = after.spec_decode_num_drafts_total - before.spec_decode_num_drafts_total;
    let per_pos = |s: &EngineStats, i: usize| {
        s.spec_decode_num_accepted_tokens_per_pos_total
            .get(i)
            .copied()
            .unwrap_or(0)
    };
    let positions = after.spec_decode_num_accepted_tokens_per_pos_total.len();
    Acceptance {
        drafts,
        draft_tokens: after.spec_decode_num_draft_tokens_total
            - before.spec_decode_num_draft_tokens_total,
        accepted: after.spec_decode_num_accepted_tokens_total
            - before.spec_decode_num_accepted_tokens_total,
        per_position: (0..positions)
            .map(|i| (per_pos(after, i) - per_pos(before, i)) as f64 / drafts.max(1) as f64)
            .collect(),
    }
}

impl ReplayResult {
    pub fn to_json(&self, profile: &Profile) -> Value {
        json!({
            "proposer": profile.label(),
            "profile": profile.rates(),
            "batch": self.batch,
            "plain_tokens_per_s": self.plain.tokens_per_s,
            "speculative_tokens_per_s": self.speculative.tokens_per_s,
            "speedup": self.speculative.tokens_per_s / self.plain.tokens_per_s.max(1e-12),
            "acceptance_length": self.acceptance.length(),
            "expected_acceptance_length": profile.expected_acceptance_length(),
            "per_position_acceptance": self.acceptance.per_position,
            "drafts": self.acceptance.drafts,
            "draft_tokens": self.acceptance.draft_tokens,
            "accepted_tokens": self.acceptance.accepted,
            "requests": self.plain.outputs.len(),
            "outputs_same_as_plain": self.same_outputs,
        })
    }
}

/// The replay table, every line naming the proposer and its profile.
pub fn print(results: &[ReplayResult], profile: &Profile, settings: &ReplaySettings) {
    if results.is_empty() {
        return;
    }
    println!(
        "\nspeculative decoding through the engine, {} (expected acceptance length {:.2}); \
         context {}, {} tokens a request",
        profile.label(),
        profile.expected_acceptance_length(),
        settings.context,
        settings.max_tokens
    );
    println!(
        "  {:>5} {:>11} {:>11} {:>8} {:>9}  {:<24} {:>9}",
        "batch", "plain tok/s", "spec tok/s", "speedup", "acc. len", "per position", "same out"
    );
    for r in results {
        let per_pos: Vec<String> = r
            .acceptance
            .per_position
            .iter()
            .map(|a| format!("{a:.2}"))
            .collect();
        println!(
            "  {:>5} {:>11.1} {:>11.1} {:>7.2}x {:>9.2}  {:<24} {:>4}/{:<4}",
            r.batch,
            r.plain.tokens_per_s,
            r.speculative.tokens_per_s,
            r.speculative.tokens_per_s / r.plain.tokens_per_s.max(1e-12),
            r.acceptance.length(),
            per_pos.join("/"),
            r.same_outputs,
            r.plain.outputs.len()
        );
    }
}

/// Why the replay runs cannot run here, if they cannot.
pub fn unsupported<B: Backend>(backend: &B, model: &Model<B>) -> Option<String> {
    (model.config().arch.is_hybrid() && !backend.supports_state_checkpoints()).then(|| {
        format!(
            "speculative replay: a hybrid model needs state checkpoints, which the {} backend \
             does not support yet",
            backend.name()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_cpu::CpuBackend;

    /// The bundled model (a hybrid MoE) at batch 2, 25 tokens a request: with
    /// every draft right, six steps of 3 drafts + 1, all at full length.
    fn replay(rates: &[f64]) -> ReplayResult {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models/kestrel-tiny-qwen35");
        let b = CpuBackend::new();
        let model = Model::load(&dir, &b).unwrap();
        let settings = ReplaySettings {
            profile: Profile::new(rates.to_vec()).unwrap(),
            batches: vec![2],
            context: 20,
            max_tokens: 25,
            max_batched_tokens: 256,
            sampling: SamplingMode::Greedy,
            sampled_vocab: None,
            seed: 3,
            draft_rows: DraftRows::default(),
            adaptive_drafts: false,
        };
        let mut results = run(b, model, &settings).unwrap();
        assert_eq!(results.len(), 1);
        results.pop().unwrap()
    }

    #[test]
    fn replayed_drafts_at_profile_one_are_all_accepted_and_change_nothing() {
        let r = replay(&[1.0, 1.0, 1.0]);
        assert_eq!(r.acceptance.drafts, 2 * 6, "{:?}", r.acceptance);
        assert_eq!(r.acceptance.per_position, [1.0, 1.0, 1.0]);
        assert_eq!(r.acceptance.length(), 4.0);
        assert_eq!(r.same_outputs, 2);
        assert!(r.plain.outputs.iter().all(|o| o.len() == 25));
        assert!(r.plain.tokens_per_s > 0.0 && r.speculative.tokens_per_s > 0.0);
    }

    #[test]
    fn replayed_drafts_at_profile_zero_are_all_rejected_and_change_nothing() {
        let r = replay(&[0.0, 0.0, 0.0]);
        // One token a step after the prefill's: 24 steps, of which the last
        // has no room for a draft.
        assert_eq!(r.acceptance.drafts, 2 * 23, "{:?}", r.acceptance);
        assert_eq!(r.acceptance.accepted, 0);
        assert_eq!(r.acceptance.per_position, [0.0, 0.0, 0.0]);
        assert_eq!(r.same_outputs, 2);
        assert_eq!(r.plain.outputs, r.speculative.outputs);
        assert!(r.plain.outputs.iter().all(|o| o.len() == 25));
    }
}

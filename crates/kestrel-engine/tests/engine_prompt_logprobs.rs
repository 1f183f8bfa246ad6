//! Prompt logprobs: every prompt token after the first gets the
//! log-softmax of the raw logits of the position before it, its rank and
//! the row's best alternatives, computed here from a `SequenceRunner` fed
//! the prompt on the CPU backend; over several prefill chunks, beside
//! requests that ask for none, and whole when the prompt is already in the
//! prefix cache; `max_tokens: 0` computes the prompt alone.

mod common;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::prefill::ChunkPolicy;
use kestrel_engine::{EngineEvent, PromptTokenLogprobs, RequestStream};
use kestrel_models::runner::SequenceRunner;
use kestrel_sampling::{FinishReason, SamplingParams};

/// What a request with prompt logprobs sent.
struct Received {
    prompt_logprobs: Vec<PromptTokenLogprobs>,
    tokens: Vec<u32>,
    reason: FinishReason,
    cached_tokens: usize,
}

/// Reads a stream to its end: every `PromptLogprobs` comes before any token.
fn receive(stream: &mut RequestStream) -> Received {
    let mut prompt_logprobs = Vec::new();
    let mut tokens: Vec<u32> = Vec::new();
    loop {
        match stream.blocking_recv() {
            Some(EngineEvent::PromptLogprobs(l)) => {
                assert!(tokens.is_empty(), "prompt logprobs after a token");
                prompt_logprobs.extend(l);
            }
            Some(EngineEvent::Tokens(t)) => tokens.extend(t),
            Some(EngineEvent::Logprobs(_)) => {}
            Some(EngineEvent::Finished { reason, usage, .. }) => {
                assert_eq!(usage.completion_tokens, tokens.len());
                return Received {
                    prompt_logprobs,
                    tokens,
                    reason,
                    cached_tokens: usage.cached_tokens,
                };
            }
            Some(EngineEvent::Error(e)) => panic!("request failed: {e}"),
            None => panic!("stream closed without a terminal event"),
        }
    }
}

fn asking(top: usize, max_tokens: usize) -> SamplingParams {
    SamplingParams {
        prompt_logprobs: Some(top),
        ..greedy(max_tokens)
    }
}

/// The raw logits of every prompt position, from a runner fed the prompt
/// in the engine's chunks (a hybrid model's rounding follows the split).
fn reference_rows(model: TestModel, prompt: &[u32]) -> Vec<Vec<f32>> {
    let backend = CpuBackend::new();
    let m = model.load();
    let policy = ChunkPolicy::new(&config(), model.is_hybrid()).unwrap();
    let mut runner = SequenceRunner::new(&backend, &m, prompt.len()).unwrap();
    let mut rows = Vec::new();
    let mut start = 0;
    for end in policy.prompt_chunk_ends(prompt.len()) {
        let flat = runner.feed_all_logits(&prompt[start..end]).unwrap();
        let width = flat.len() / (end - start);
        rows.extend(flat.chunks_exact(width).map(<[f32]>::to_vec));
        start = end;
    }
    rows
}

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Checks one entry per prompt token after the first against the reference.
fn check(model: TestModel, prompt: &[u32], got: &[PromptTokenLogprobs], top: usize) {
    assert_eq!(
        got.len(),
        prompt.len() - 1,
        "one entry per prompt token but the first"
    );
    let rows = reference_rows(model, prompt);
    for (i, (entry, row)) in got.iter().zip(&rows).enumerate() {
        let token = prompt[i + 1];
        let want = log_softmax(row);
        assert_eq!(entry.token, token, "position {}", i + 1);
        let v = want[token as usize];
        assert!(
            (entry.logprob as f64 - v).abs() < 1e-5,
            "position {}: {} vs {v}",
            i + 1,
            entry.logprob
        );
        // Rank: 1 + ids clearly more likely; ids within rounding may go
        // either way.
        let above = want.iter().filter(|&&x| x > v + 1e-5).count();
        let near = want.iter().filter(|&&x| x > v - 1e-5).count();
        assert!(
            (above + 1..=near).contains(&entry.rank),
            "position {}: rank {} not in {}..={near}",
            i + 1,
            entry.rank,
            above + 1
        );
        let mut order: Vec<usize> = (0..want.len()).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        assert_eq!(entry.top.len(), top);
        for (r, &(id, lp)) in entry.top.iter().enumerate() {
            assert!((lp as f64 - want[id as usize]).abs() < 1e-5);
            assert!((lp as f64 - want[order[r]]).abs() < 1e-5, "rank {r}");
        }
    }
}

#[test]
fn prompt_logprobs_over_several_chunks_match_a_forward_over_the_prompt() {
    for model in [TestModel::Moe, TestModel::HybridGolden] {
        let engine = spawn(model, config());
        // 300 tokens: chunks end at 144, 288 and 300 (grid 144).
        let p = prompt(21, 300, model.vocab());
        let policy = ChunkPolicy::new(&config(), model.is_hybrid()).unwrap();
        assert!(policy.prompt_chunk_ends(p.len()).len() >= 3);
        let mut with = engine.submit(named("pl", &p, asking(5, 4))).unwrap();
        let mut plain = engine
            .submit(named("plain", &prompt(22, 40, model.vocab()), greedy(6)))
            .unwrap();
        let got = receive(&mut with);
        let neighbour = collect(&mut plain);
        assert_eq!(neighbour.tokens.len(), 6);
        check(model, &p, &got.prompt_logprobs, 5);

        // Asking for prompt logprobs changes no generated token.
        let alone = run_one(&engine, named("again", &p, greedy(4)));
        assert_eq!(alone.tokens, got.tokens, "{model:?}");
        wait_idle(&engine);
    }
}

#[test]
fn a_prompt_in_the_prefix_cache_still_gets_every_entry() {
    for model in [TestModel::Moe, TestModel::HybridGolden] {
        let engine = spawn(model, config());
        let p = prompt(31, 200, model.vocab());
        let first = run_one(&engine, named("warm", &p, greedy(2)));
        let hit = run_one(&engine, named("hit", &p, greedy(2)));
        assert!(
            hit.usage.cached_tokens > 0,
            "{model:?}: the prompt is cached"
        );

        let mut stream = engine.submit(named("pl", &p, asking(3, 2))).unwrap();
        let got = receive(&mut stream);
        assert_eq!(got.cached_tokens, 0, "the hit is bypassed");
        check(model, &p, &got.prompt_logprobs, 3);
        assert_eq!(got.tokens, first.tokens);

        // What it computed went into the cache as a miss's would.
        let after = run_one(&engine, named("after", &p, greedy(2)));
        assert!(after.usage.cached_tokens > 0);
        assert_eq!(after.tokens, first.tokens);
        wait_idle(&engine);
    }
}

#[test]
fn max_tokens_zero_computes_the_prompt_and_generates_nothing() {
    let model = TestModel::Moe;
    let engine = spawn(model, config());
    let p = prompt(41, 30, model.vocab());
    let mut stream = engine.submit(request(&p, asking(0, 0))).unwrap();
    let got = receive(&mut stream);
    assert!(got.tokens.is_empty());
    assert_eq!(got.reason, FinishReason::Length);
    check(model, &p, &got.prompt_logprobs, 0);

    let without = run_one(&engine, request(&p, greedy(0)));
    assert!(without.tokens.is_empty());
    assert_eq!(without.reason, FinishReason::Length);
    let s = wait_idle(&engine);
    assert_eq!(s.num_running, 0);
}

#[test]
fn a_one_token_prompt_has_no_entries_and_more_than_twenty_are_refused() {
    let model = TestModel::Moe;
    let engine = spawn(model, config());
    let got = receive(&mut engine.submit(request(&[7], asking(20, 2))).unwrap());
    assert!(got.prompt_logprobs.is_empty());
    assert_eq!(got.tokens.len(), 2);
    assert!(engine.submit(request(&[7, 8], asking(21, 2))).is_err());
}

#[test]
fn a_preempted_request_sends_each_entry_once() {
    let model = TestModel::HybridGolden;
    let engine = spawn(
        model,
        kestrel_engine::EngineConfig {
            force_preempt_at: Some(2),
            ..config()
        },
    );
    let p = prompt(51, 180, model.vocab());
    let mut a = engine.submit(named("a", &p, asking(2, 8))).unwrap();
    let mut b = engine
        .submit(named("b", &prompt(52, 170, model.vocab()), asking(2, 8)))
        .unwrap();
    let got_a = receive(&mut a);
    let got_b = receive(&mut b);
    check(model, &p, &got_a.prompt_logprobs, 2);
    assert_eq!(got_b.prompt_logprobs.len(), 169);
    assert!(wait_idle(&engine).num_preemptions_total > 0);
}

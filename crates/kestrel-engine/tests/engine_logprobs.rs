//! Logprobs: every generated token's log-probability and its row's best
//! alternatives are the log-softmax of the model's raw logits at that
//! position (before penalties, temperature and filters), computed here
//! from `SequenceRunner` on the CPU backend; identical with speculative
//! decoding on and off; never naming a padded id.

mod common;

use std::sync::Arc;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::prefill::ChunkPolicy;
use kestrel_engine::spec::{DraftSource, NgramConfig, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineConfig, EngineEvent, EngineOptions, RequestStream};
use kestrel_models::runner::SequenceRunner;
use kestrel_sampling::{SamplingParams, TokenLogprobs};

/// A request's tokens and the logprobs the engine sent for them.
fn collect_logprobs(stream: &mut RequestStream) -> (Vec<u32>, Vec<TokenLogprobs>) {
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    loop {
        match stream.blocking_recv() {
            Some(EngineEvent::Logprobs(l)) => {
                logprobs.extend(l);
                // Each `Logprobs` event precedes the tokens it describes.
                match stream.blocking_recv() {
                    Some(EngineEvent::Tokens(t)) => tokens.extend(t),
                    other => panic!("expected the tokens of the logprobs, got {other:?}"),
                }
                assert_eq!(tokens.len(), logprobs.len());
            }
            Some(EngineEvent::Tokens(t)) => panic!("tokens {t:?} came without logprobs"),
            Some(EngineEvent::PromptLogprobs(p)) => {
                panic!("prompt logprobs {p:?} were not asked for")
            }
            Some(EngineEvent::Finished { .. }) => return (tokens, logprobs),
            Some(EngineEvent::Error(e)) => panic!("request failed: {e}"),
            None => panic!("stream closed without a terminal event"),
        }
    }
}

/// Seeded sampling with every filter and penalty on: the logprobs must
/// still be those of the raw logits.
fn filtered(n: usize, top: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.7,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.02,
        repetition_penalty: 1.3,
        presence_penalty: 0.5,
        frequency_penalty: 0.4,
        seed: Some(11),
        ignore_eos: true,
        max_tokens: Some(n),
        logprobs: Some(top),
        ..SamplingParams::default()
    }
}

/// The raw logits row of every generated position, from a runner fed the
/// prompt in the engine's chunks and then each generated token.
fn reference_rows(model: TestModel, prompt: &[u32], generated: &[u32]) -> Vec<Vec<f32>> {
    let backend = CpuBackend::new();
    let m = model.load();
    let policy = ChunkPolicy::new(&config(), model.is_hybrid()).unwrap();
    let mut runner = SequenceRunner::new(&backend, &m, prompt.len() + generated.len()).unwrap();
    let mut start = 0;
    let mut row = Vec::new();
    for end in policy.prompt_chunk_ends(prompt.len()) {
        row = runner.feed_last_logits(&prompt[start..end]).unwrap();
        start = end;
    }
    let mut rows = Vec::new();
    for &token in generated {
        rows.push(std::mem::take(&mut row));
        row = runner.feed_last_logits(&[token]).unwrap();
    }
    rows
}

/// The log-softmax of `row[..vocab]` in f64.
fn log_softmax(row: &[f32], vocab: usize) -> Vec<f64> {
    let row = &row[..vocab];
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

/// Checks `got` against the log-softmax of the reference rows over the
/// first `vocab` ids.
fn check_against_reference(
    model: TestModel,
    prompt: &[u32],
    tokens: &[u32],
    got: &[TokenLogprobs],
    top: usize,
    vocab: usize,
) {
    let rows = reference_rows(model, prompt, tokens);
    for (i, ((row, &token), lp)) in rows.iter().zip(tokens).zip(got).enumerate() {
        let want = log_softmax(row, vocab);
        assert_eq!(lp.token, token, "token {i}");
        assert!(
            (lp.logprob as f64 - want[token as usize]).abs() < 1e-5,
            "token {i}: logprob {} vs {}",
            lp.logprob,
            want[token as usize]
        );
        let mut order: Vec<usize> = (0..vocab).collect();
        order.sort_by(|&a, &b| want[b].total_cmp(&want[a]).then(a.cmp(&b)));
        assert_eq!(lp.top.len(), top, "token {i}: alternatives");
        for (rank, &(id, v)) in lp.top.iter().enumerate() {
            assert!(
                (v as f64 - want[id as usize]).abs() < 1e-5,
                "token {i}: alternative {rank}"
            );
            // The ids are the best ones (ties within rounding may swap).
            let best = want[order[rank]];
            assert!((v as f64 - best).abs() < 1e-5, "token {i}: rank {rank}");
            assert!((id as usize) < vocab, "token {i}: id {id} is padding");
        }
    }
}

#[test]
fn logprobs_are_the_log_softmax_of_the_raw_logits_beside_other_requests() {
    for model in [TestModel::Moe, TestModel::HybridGolden] {
        let engine = spawn(model, config());
        let p = prompt(3, 37, model.vocab());
        let mut with = engine.submit(named("lp", &p, filtered(12, 5))).unwrap();
        // A greedy neighbour without logprobs, in the same steps.
        let mut plain = engine
            .submit(named("plain", &prompt(4, 20, model.vocab()), greedy(12)))
            .unwrap();
        let (tokens, logprobs) = collect_logprobs(&mut with);
        let neighbour = collect(&mut plain);
        assert_eq!(tokens.len(), 12);
        assert_eq!(neighbour.tokens.len(), 12);
        check_against_reference(model, &p, &tokens, &logprobs, 5, model.vocab() as usize);

        // The same seed without logprobs samples the same tokens: asking for
        // them changes nothing else.
        let params = SamplingParams {
            logprobs: None,
            ..filtered(12, 5)
        };
        let alone = run_one(&engine, named("again", &p, params));
        assert_eq!(alone.tokens, tokens, "{model:?}");
        wait_idle(&engine);
    }
}

#[test]
fn no_alternatives_and_the_most_alternatives() {
    let model = TestModel::Moe;
    let engine = spawn(model, config());
    let p = prompt(8, 21, model.vocab());
    for top in [0, kestrel_sampling::MAX_TOP_LOGPROBS] {
        let mut stream = engine.submit(request(&p, filtered(4, top))).unwrap();
        let (tokens, logprobs) = collect_logprobs(&mut stream);
        check_against_reference(model, &p, &tokens, &logprobs, top, model.vocab() as usize);
    }
    let mut too_many = filtered(4, kestrel_sampling::MAX_TOP_LOGPROBS + 1);
    too_many.seed = None;
    assert!(engine.submit(request(&p, too_many)).is_err());
}

#[test]
fn padded_ids_never_appear_and_do_not_count() {
    let model = TestModel::Moe;
    let sampled = model.vocab() as usize - 200;
    let engine = spawn(
        model,
        EngineConfig {
            sampled_vocab: Some(sampled),
            ..config()
        },
    );
    let p = prompt(5, 30, model.vocab());
    let mut stream = engine.submit(request(&p, filtered(8, 20))).unwrap();
    let (tokens, logprobs) = collect_logprobs(&mut stream);
    assert!(tokens.iter().all(|&t| (t as usize) < sampled));
    check_against_reference(model, &p, &tokens, &logprobs, 20, sampled);
}

/// Drafts the continuation of a reference run: every draft is accepted.
struct Oracle(Vec<u32>);

impl DraftSource for Oracle {
    fn drafts(&self, _: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let done = tokens.len() - prompt_len;
        self.0.iter().skip(done).take(max).copied().collect()
    }
}

fn run_speculative(
    model: TestModel,
    method: Option<SpeculativeMethod>,
    prompt: &[u32],
    params: &SamplingParams,
) -> (Vec<u32>, Vec<TokenLogprobs>, u64) {
    let options = EngineOptions {
        speculative: method.map(|method| SpeculativeConfig {
            method,
            num_speculative_tokens: 3,
        }),
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(CpuBackend::new(), model.load(), config(), options)
        .expect("engine starts");
    let mut stream = engine.submit(request(prompt, params.clone())).unwrap();
    let (tokens, logprobs) = collect_logprobs(&mut stream);
    let stats = wait_idle(&engine);
    (
        tokens,
        logprobs,
        stats.spec_decode_num_accepted_tokens_total,
    )
}

#[test]
fn logprobs_are_the_same_with_speculation_on_and_off() {
    for model in [TestModel::Moe, TestModel::HybridGolden] {
        // A repeating prompt gives prompt lookup something to find.
        let base = prompt(6, 12, model.vocab());
        let p: Vec<u32> = base.iter().cycle().take(48).copied().collect();
        for params in [
            SamplingParams {
                logprobs: Some(4),
                ..greedy(16)
            },
            filtered(16, 4),
        ] {
            let (tokens, off, _) = run_speculative(model, None, &p, &params);
            let mut methods = vec![
                (
                    "oracle",
                    SpeculativeMethod::External(Arc::new(Oracle(tokens.clone()))),
                ),
                (
                    "ngram",
                    SpeculativeMethod::Ngram(NgramConfig::new(1, 4, 3).unwrap()),
                ),
            ];
            if model.has_mtp_head() {
                methods.push(("mtp", SpeculativeMethod::mtp()));
            }
            for (name, method) in methods {
                let (on_tokens, on, accepted) = run_speculative(model, Some(method), &p, &params);
                let what = format!("{model:?} / {name} / temperature {}", params.temperature);
                assert_eq!(on_tokens, tokens, "{what}");
                assert_eq!(on, off, "{what}: logprobs");
                if name == "oracle" {
                    assert!(accepted > 0, "{what}: no draft was accepted");
                }
            }
            check_against_reference(model, &p, &tokens, &off, 4, model.vocab() as usize);
        }
    }
}

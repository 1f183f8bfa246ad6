//! The engine against the single-sequence runner, and its request contract:
//! validation, queue bound, seeded sampling, identical concurrent requests,
//! shutdown.

mod common;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::prefill::ChunkPolicy;
use kestrel_engine::{EngineEvent, SubmitError};
use kestrel_models::runner::SequenceRunner;
use kestrel_sampling::{FinishReason, Sampler, SamplingParams};

/// Greedy tokens from `SequenceRunner`, prefilling in the chunks the engine uses.
fn runner_greedy(model: TestModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let backend = CpuBackend::new();
    let m = model.load();
    let policy = ChunkPolicy::new(&config(), model.is_hybrid()).unwrap();
    let mut runner = SequenceRunner::new(&backend, &m, prompt.len() + n).unwrap();
    let mut sampler = Sampler::new(&greedy(n), prompt.len(), &[]).unwrap();
    let mut history = prompt.to_vec();
    let mut start = 0;
    let mut logits = Vec::new();
    for end in policy.prompt_chunk_ends(prompt.len()) {
        logits = runner.feed_last_logits(&prompt[start..end]).unwrap();
        start = end;
    }
    for _ in 0..n {
        let token = sampler.sample(&mut logits, &history).unwrap();
        history.push(token);
        logits = runner.feed_last_logits(&[token]).unwrap();
    }
    history.split_off(prompt.len())
}

#[test]
fn greedy_matches_the_sequence_runner() {
    for model in [TestModel::Moe, TestModel::HybridGolden, TestModel::Bundled] {
        let engine = spawn(model, config());
        for (seed, len) in [(1, 5), (2, 150), (3, 300)] {
            let p = prompt(seed, len, model.vocab());
            let out = run_one(&engine, request(&p, greedy(24)));
            assert_eq!(out.reason, FinishReason::Length);
            assert_eq!(out.usage.prompt_tokens, len);
            assert_eq!(
                out.tokens,
                runner_greedy(model, &p, 24),
                "{model:?}, prompt of {len}"
            );
        }
        let s = wait_idle(&engine);
        assert_eq!(s.requests_finished_length, 3);
        assert_eq!(s.prompt_tokens_total, 455);
        assert_eq!(s.generation_tokens_total, 72);
    }
}

#[test]
fn identical_concurrent_requests_give_identical_outputs() {
    let engine = spawn(TestModel::Bundled, config());
    let p = prompt(7, 90, 4096);
    let reqs = vec![request(&p, greedy(32)); 4];
    let outs = run_together(&engine, &reqs);
    for out in &outs {
        assert_eq!(out.tokens, outs[0].tokens);
    }
    let alone = run_one(&engine, request(&p, greedy(32)));
    assert_eq!(alone.tokens, outs[0].tokens);
    assert!(alone.usage.cached_tokens > 0, "the repeat hits the cache");
    wait_idle(&engine);
}

#[test]
fn seeded_sampling_is_reproducible() {
    let engine = spawn(TestModel::Bundled, config());
    let params = |seed| SamplingParams {
        temperature: 0.9,
        top_p: 0.95,
        top_k: 50,
        seed: Some(seed),
        max_tokens: Some(40),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let p = prompt(11, 60, 4096);
    let first = run_one(&engine, request(&p, params(42)));
    // Again, batched with other requests this time.
    let others = [
        request(&prompt(12, 30, 4096), params(1)),
        request(&p, params(42)),
    ];
    let batched = run_together(&engine, &others);
    assert_eq!(batched[1].tokens, first.tokens);
    let other_seed = run_one(&engine, request(&p, params(43)));
    assert_ne!(other_seed.tokens, first.tokens, "the seed drives the draws");
    wait_idle(&engine);
}

#[test]
fn stops_on_eos_and_stop_tokens() {
    let engine = spawn(TestModel::Moe, config());
    let p = prompt(5, 40, 512);
    let free = run_one(&engine, request(&p, greedy(20))).tokens;
    // Make the 5th generated token a stop token: generation ends there.
    let stop = free[4];
    let first_at = free.iter().position(|&t| t == stop).unwrap();
    let params = SamplingParams {
        stop_token_ids: vec![stop],
        ..greedy(20)
    };
    let mut stream = engine.submit(request(&p, params)).unwrap();
    let mut tokens = Vec::new();
    loop {
        match stream.blocking_recv().unwrap() {
            EngineEvent::Tokens(t) => tokens.extend(t),
            EngineEvent::Finished {
                reason, stop_token, ..
            } => {
                assert_eq!(reason, FinishReason::Stop);
                assert_eq!(stop_token, Some(stop));
                break;
            }
            EngineEvent::Error(e) => panic!("{e}"),
            EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_) => {
                panic!("logprobs nobody asked for")
            }
        }
    }
    assert_eq!(tokens, free[..=first_at]);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_stop, 1);
}

#[test]
fn invalid_requests_are_refused() {
    let engine = spawn(TestModel::Moe, config());
    let invalid = |req| matches!(engine.submit(req), Err(SubmitError::Invalid(_)));
    assert!(invalid(request(&[], greedy(4))), "empty prompt");
    assert!(
        invalid(request(&[1, 2, 512], greedy(4))),
        "id outside the vocabulary"
    );
    let hot = SamplingParams {
        temperature: 3.0,
        ..greedy(4)
    };
    assert!(invalid(request(&[1, 2], hot)), "temperature out of range");
    let long = prompt(1, 600, 512);
    assert!(
        invalid(request(&long, greedy(41))),
        "prompt + max_tokens over max_model_len"
    );
    assert!(invalid(request(
        &prompt(1, 640, 512),
        SamplingParams::greedy()
    )));
    let bad_stop = SamplingParams {
        stop_token_ids: vec![9999],
        ..greedy(4)
    };
    assert!(invalid(request(&[1, 2], bad_stop)));
    // A valid request still runs afterwards.
    let out = run_one(&engine, request(&long, greedy(40)));
    assert_eq!(out.tokens.len(), 40);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_failed, 0);
}

#[test]
fn full_queue_is_refused_then_recovers() {
    let engine = spawn(
        TestModel::Moe,
        kestrel_engine::EngineConfig {
            max_num_seqs: 1,
            max_queued_requests: 2,
            ..config()
        },
    );
    let p = prompt(3, 20, 512);
    let endless = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut running = engine.submit(request(&p, endless)).unwrap();
    take_tokens(&mut running, 1); // admitted: no longer queued
    let queued: Vec<_> = (0..2)
        .map(|_| engine.submit(request(&p, greedy(4))).unwrap())
        .collect();
    assert_eq!(
        engine.submit(request(&p, greedy(4))).err(),
        Some(SubmitError::QueueFull(2))
    );
    drop(running);
    for mut q in queued {
        assert_eq!(collect(&mut q).tokens.len(), 4);
    }
    // Read it to the end: a stream dropped early would count as an abort.
    let mut after = engine.submit(request(&p, greedy(4))).unwrap();
    assert_eq!(collect(&mut after).tokens.len(), 4);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_abort, 1);
}

#[test]
fn shutdown_aborts_everything_and_stops() {
    let engine = spawn(TestModel::Moe, config());
    let p = prompt(4, 30, 512);
    let endless = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let mut running = engine.submit(request(&p, endless.clone())).unwrap();
    let first = take_tokens(&mut running, 2);
    engine.shutdown();
    let out = collect_from(&mut running, first);
    assert_eq!(out.reason, FinishReason::Abort);
    assert!(out.tokens.len() >= 2);
    wait_for(&engine, "the engine to stop", |_| !engine.is_alive());
    assert_eq!(
        engine.submit(request(&p, endless)).err(),
        Some(SubmitError::Stopped)
    );
    let s = engine.stats();
    assert_eq!(s.requests_finished_abort, 1);
    assert_eq!(s.num_free_blocks + s.num_cached_blocks, s.num_total_blocks);
}

#[test]
fn handles_and_streams_cross_threads() {
    fn send_sync<T: Send + Sync + Clone>() {}
    fn send<T: Send>() {}
    send_sync::<kestrel_engine::EngineHandle>();
    send::<kestrel_engine::RequestStream>();
}

#[test]
fn accessors_describe_the_model() {
    let engine = spawn(TestModel::Bundled, config());
    assert_eq!(engine.vocab_size(), 4096);
    assert!(engine.eos_token_ids().contains(&4063));
    assert_eq!(engine.config().block_size, 16);
    assert!(engine.is_alive());
}

#[test]
fn a_panic_in_a_step_fails_requests_and_marks_the_engine_dead() {
    // The observer runs inside the step, so a panic there takes the same
    // path as a panic in a kernel or in the scheduler.
    let observer: kestrel_engine::LogitsObserver = Box::new(|id, _| {
        if id == "boom" {
            panic!("injected failure");
        }
    });
    let engine = kestrel_engine::Engine::spawn_with_logits_observer(
        CpuBackend::new(),
        TestModel::Moe.load(),
        config(),
        observer,
    )
    .unwrap();
    let endless = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy()
    };
    let p = prompt(9, 20, 512);
    let mut bystander = engine.submit(named("ok", &p, endless.clone())).unwrap();
    take_tokens(&mut bystander, 2);
    let mut boom = engine.submit(named("boom", &p, endless.clone())).unwrap();
    for stream in [&mut boom, &mut bystander] {
        let last = std::iter::from_fn(|| stream.blocking_recv()).last();
        match last {
            Some(EngineEvent::Error(message)) => assert!(message.contains("injected failure")),
            other => panic!("expected an error, got {other:?}"),
        }
    }
    wait_for(&engine, "the engine to stop", |_| !engine.is_alive());
    assert_eq!(
        engine.submit(request(&p, endless)).err(),
        Some(SubmitError::Stopped)
    );
    assert_eq!(engine.stats().requests_failed, 2);
}

/// With `sampled_vocab`, ids at or above the limit (a padded embedding's rows
/// without a token) are never produced: neither by greedy requests, whose
/// argmax the backend takes over the allowed columns, nor by sampled ones,
/// whose rows are masked on the host.
#[test]
fn sampled_vocab_keeps_padded_ids_out() {
    let model = TestModel::HybridGolden;
    let p = prompt(7, 40, model.vocab());
    let free = run_one(&spawn(model, config()), request(&p, greedy(16))).tokens;
    // A limit at the largest free-running id removes at least that token.
    let limit = *free.iter().max().unwrap() as usize;
    let engine = spawn(
        model,
        kestrel_engine::EngineConfig {
            sampled_vocab: Some(limit),
            ..config()
        },
    );
    let restricted = run_one(&engine, request(&p, greedy(16))).tokens;
    assert!(
        restricted.iter().all(|&t| (t as usize) < limit),
        "{restricted:?}"
    );
    assert_ne!(restricted, free);
    // Until the first removed token the two runs agree.
    let first_cut = free.iter().position(|&t| t as usize >= limit).unwrap();
    assert_eq!(restricted[..first_cut], free[..first_cut]);
    let sampled = SamplingParams {
        temperature: 1.5,
        seed: Some(3),
        ..greedy(64)
    };
    let out = run_one(&engine, request(&p, sampled)).tokens;
    assert_eq!(out.len(), 64);
    assert!(out.iter().all(|&t| (t as usize) < limit), "{out:?}");
}

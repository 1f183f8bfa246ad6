//! Dropping a stream aborts its request wherever it is (waiting, prefilling,
//! decoding): its pages and slot come back, the abort is counted once, and
//! other requests are unaffected.

mod common;

use common::*;
use kestrel_engine::EngineConfig;
use kestrel_sampling::SamplingParams;

fn endless() -> SamplingParams {
    SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

/// Long prompts, small steps: prefill takes many steps.
fn slow_prefill(enable_cache: bool) -> EngineConfig {
    EngineConfig {
        max_num_batched_tokens: 19, // grid of 16: one page per prefill step
        max_model_len: 2048,
        num_blocks: 160,
        enable_prefix_cache: enable_cache,
        ..config()
    }
}

fn check_cancellation(model: TestModel, enable_cache: bool) {
    let engine = spawn(model, slow_prefill(enable_cache));
    let v = model.vocab();
    let bystander_prompt = prompt(40, 50, v);
    let reference = run_one(&engine, request(&bystander_prompt, greedy(60)));
    let idle = wait_idle(&engine);

    // A bystander decodes throughout.
    let mut bystander = engine
        .submit(request(&bystander_prompt, greedy(60)))
        .unwrap();
    let first = take_tokens(&mut bystander, 1);

    // Mid-prefill: a 2000-token prompt needs 125 steps of prefill.
    let generated_before = engine.stats().generation_tokens_total;
    let long = engine
        .submit(request(&prompt(41, 2000, v), endless()))
        .unwrap();
    wait_for(&engine, "the long prompt to run", |s| s.num_running == 2);
    drop(long);

    // Mid-decode.
    let mut decoding = engine
        .submit(request(&prompt(42, 30, v), endless()))
        .unwrap();
    take_tokens(&mut decoding, 3);
    drop(decoding);

    let out = collect_from(&mut bystander, first);
    assert_eq!(
        out.tokens, reference.tokens,
        "{model:?}: bystander unaffected"
    );
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_abort, idle.requests_finished_abort + 2);
    // The long request never produced a token: it was dropped while prefilling.
    let decoded = s.generation_tokens_total - generated_before;
    assert!(decoded < 60 + 3 + 40, "{model:?}: {decoded} tokens");
    if !enable_cache {
        assert_eq!(s.num_free_blocks, s.num_total_blocks);
        assert_eq!(s.num_free_state_slots, s.num_total_state_slots);
    }
}

#[test]
fn cancel_mid_prefill_and_mid_decode_moe() {
    check_cancellation(TestModel::Moe, true);
    check_cancellation(TestModel::Moe, false);
}

#[test]
fn cancel_mid_prefill_and_mid_decode_hybrid() {
    check_cancellation(TestModel::HybridGolden, true);
    check_cancellation(TestModel::HybridGolden, false);
}

#[test]
fn cancel_while_waiting() {
    let engine = spawn(
        TestModel::Moe,
        EngineConfig {
            max_num_seqs: 1,
            ..config()
        },
    );
    let p = prompt(43, 20, 512);
    let mut running = engine.submit(request(&p, endless())).unwrap();
    take_tokens(&mut running, 1);
    let waiting = engine.submit(request(&p, greedy(5))).unwrap();
    wait_for(&engine, "the second request to queue", |s| {
        s.num_waiting == 1
    });
    drop(waiting);
    wait_for(&engine, "the queue to empty", |s| s.num_waiting == 0);
    assert_eq!(engine.stats().requests_finished_abort, 1);
    assert_eq!(engine.stats().num_running, 1);
    drop(running);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_abort, 2);
    // The queue bound counts the aborted request as gone.
    let again = run_one(&engine, request(&p, greedy(5)));
    assert_eq!(again.tokens.len(), 5);
}

#[test]
fn streams_dropped_after_finishing_do_not_count_as_aborts() {
    let engine = spawn(TestModel::Moe, config());
    let p = prompt(44, 20, 512);
    for _ in 0..3 {
        let mut stream = engine.submit(request(&p, greedy(4))).unwrap();
        collect(&mut stream);
        drop(stream);
    }
    // A stream dropped with its terminal event unread: the request finished
    // on its own, so it is not an abort either.
    let stream = engine.submit(request(&p, greedy(2))).unwrap();
    wait_for(&engine, "the request to finish", |s| {
        s.requests_finished_length == 4
    });
    drop(stream);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_abort, 0);
    assert_eq!(s.requests_finished_length, 4);
}

#[test]
fn many_cancelled_requests_leave_nothing_behind() {
    // vLLM's cancellation test in miniature: many requests, all dropped
    // after a moment; then a fresh request runs and the pools are idle.
    let engine = spawn(
        TestModel::HybridGolden,
        EngineConfig {
            max_queued_requests: 256,
            ..config()
        },
    );
    let streams: Vec<_> = (0..40)
        .map(|i| {
            let p = prompt(100 + i, 20 + 7 * i as usize, 512);
            engine.submit(request(&p, endless())).unwrap()
        })
        .collect();
    wait_for(&engine, "some progress", |s| s.generation_tokens_total >= 8);
    drop(streams);
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_abort, 40);
    let out = run_one(&engine, request(&prompt(1, 30, 512), greedy(10)));
    assert_eq!(out.tokens.len(), 10);
    wait_idle(&engine);
}

#[test]
fn a_stop_string_finish_is_counted_as_stop() {
    let engine = spawn(TestModel::Moe, config());
    let mut stream = engine
        .submit(request(&prompt(45, 30, 512), endless()))
        .unwrap();
    take_tokens(&mut stream, 3);
    stream.finish_on_stop_string();
    let s = wait_idle(&engine);
    assert_eq!(s.requests_finished_stop, 1);
    assert_eq!(s.requests_finished_abort, 0);
}

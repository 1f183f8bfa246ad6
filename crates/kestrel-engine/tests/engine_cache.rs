//! The prefix cache is lossless: every logits row a request samples from is
//! bitwise identical (so greedy tokens are too) with the cache on or off,
//! alone or batched with requests arriving at different steps, with or
//! without preemption, on the attention-only and the hybrid models.
//!
//! Bitwise, because on the hybrid models a different prefill split changes
//! the logits by about 1e-5, which rarely flips a greedy token.

mod common;

use common::*;
use kestrel_engine::{EngineConfig, EngineHandle, GenerateRequest};

/// Independent requests of different lengths; the third shares a 150-token
/// prefix with the first.
fn requests(model: TestModel) -> Vec<GenerateRequest> {
    let v = model.vocab();
    let a = prompt(21, 200, v);
    let mut c = a[..150].to_vec();
    c.extend(prompt(23, 60, v));
    vec![
        named("a", &a, greedy(30)),
        named("b", &prompt(22, 70, v), greedy(25)),
        named("c", &c, greedy(20)),
        named("d", &prompt(24, 17, v), greedy(28)),
    ]
}

/// A three-turn conversation: each prompt is the previous prompt, its
/// answer and a new message. Returns the outputs of the three turns.
///
/// On hybrid models a later turn resumes from a grid point of the prefill
/// (144 tokens here), so the first prompt is longer than that.
fn multi_turn(engine: &EngineHandle, model: TestModel) -> Vec<Output> {
    let v = model.vocab();
    let mut context = prompt(25, 150, v);
    let mut outs = Vec::new();
    for (turn, (seed, extra)) in [(26, 40), (27, 50), (28, 0)].into_iter().enumerate() {
        let id = format!("turn{turn}");
        let out = run_one(engine, named(&id, &context, greedy(20)));
        context.extend(&out.tokens);
        context.extend(prompt(seed, extra, v));
        outs.push(out);
    }
    outs
}

fn tokens(outs: &[Output]) -> Vec<Vec<u32>> {
    outs.iter().map(|o| o.tokens.clone()).collect()
}

fn with_cache(enable: bool) -> EngineConfig {
    EngineConfig {
        enable_prefix_cache: enable,
        ..config()
    }
}

fn check_model(model: TestModel) {
    let reqs = requests(model);

    // Reference: every request alone, no prefix cache.
    let (off, rec) = spawn_recorded(model, with_cache(false));
    let reference: Vec<Output> = reqs.iter().map(|r| run_one(&off, r.clone())).collect();
    let reference_turns = multi_turn(&off, model);
    assert!(reference.iter().all(|o| o.usage.cached_tokens == 0));
    let s = wait_idle(&off);
    assert_eq!(s.prefix_cache_hits_total, 0);
    assert_eq!(s.num_cached_blocks, 0);
    let want = rec.take();
    let want_requests = only(&want, |id| !id.starts_with("turn"));

    // Cache on, alone: the third request and later turns hit.
    let (on, rec) = spawn_recorded(model, with_cache(true));
    let alone: Vec<Output> = reqs.iter().map(|r| run_one(&on, r.clone())).collect();
    assert_eq!(
        tokens(&alone),
        tokens(&reference),
        "{model:?}: cache on, alone"
    );
    assert!(
        alone[2].usage.cached_tokens >= 144,
        "{model:?}: shared prefix hit"
    );
    let turns = multi_turn(&on, model);
    assert_eq!(
        tokens(&turns),
        tokens(&reference_turns),
        "{model:?}: multi-turn"
    );
    for t in &turns[1..] {
        assert!(t.usage.cached_tokens > 0, "{model:?}: later turns hit");
    }
    wait_idle(&on);
    assert_same_logits(&rec.take(), &want, &format!("{model:?} cache on, alone"));
    // The identical request again resumes from its last full block.
    let again = run_one(&on, reqs[0].clone());
    assert_eq!(again.tokens, reference[0].tokens);
    assert_eq!(
        again.usage.cached_tokens, 192,
        "{model:?}: 200-token prompt"
    );
    let what = format!("{model:?}: full prompt hit");
    assert_same_logits(&rec.take(), &only(&want, |id| id == "a"), &what);
    let s = wait_idle(&on);
    assert!(s.prefix_cache_hits_total > 0);
    assert!(s.num_cached_blocks > 0);
    if model.is_hybrid() {
        assert!(s.num_cached_state_slots > 0, "snapshots are kept");
    }

    // Batched, arriving at different steps, cache on and off.
    for enable in [true, false] {
        let (engine, rec) = spawn_recorded(model, with_cache(enable));
        let outs = run_staggered(&engine, &reqs);
        assert_eq!(
            tokens(&outs),
            tokens(&reference),
            "{model:?}: staggered, cache {enable}"
        );
        wait_idle(&engine);
        let what = format!("{model:?} staggered, cache {enable}");
        assert_same_logits(&rec.take(), &want_requests, &what);
        let outs = run_together(&engine, &reqs);
        assert_eq!(
            tokens(&outs),
            tokens(&reference),
            "{model:?}: together, cache {enable}"
        );
        wait_idle(&engine);
        let what = format!("{model:?} together, cache {enable}");
        assert_same_logits(&rec.take(), &want_requests, &what);
    }
}

#[test]
fn lossless_on_attention_only_moe() {
    check_model(TestModel::Moe);
}

#[test]
fn lossless_on_hybrid_golden() {
    check_model(TestModel::HybridGolden);
}

#[test]
fn lossless_on_bundled_hybrid() {
    check_model(TestModel::Bundled);
}

/// Prefix-cache snapshots of Flash-Next carry its PLE conv state and n-gram
/// context; shared pages carry the indexer's keys.
#[test]
fn lossless_on_flash_next() {
    check_model(TestModel::FlashNext);
}

/// Outputs are unchanged by preemption (forced, or from running out of pages),
/// with the cache on and off.
fn check_preemption(model: TestModel) {
    let reqs = requests(model);
    let (off, rec) = spawn_recorded(model, with_cache(false));
    let reference: Vec<Output> = reqs.iter().map(|r| run_one(&off, r.clone())).collect();
    let reference_turns = multi_turn(&off, model);
    wait_idle(&off);
    let want = rec.take();
    drop(off);

    for enable in [true, false] {
        let forced = EngineConfig {
            force_preempt_at: Some(2),
            ..with_cache(enable)
        };
        // Small pool: 20 pages hold one 320-token request; four overflow it.
        let small = EngineConfig {
            num_blocks: 20,
            max_model_len: 320,
            ..with_cache(enable)
        };
        for (name, cfg) in [("forced", forced), ("small pool", small)] {
            let what = format!("{model:?} {name}, cache {enable}");
            let (engine, rec) = spawn_recorded(model, cfg);
            let outs = run_staggered(&engine, &reqs);
            assert_eq!(tokens(&outs), tokens(&reference), "{what}");
            let turns = multi_turn(&engine, model);
            assert_eq!(tokens(&turns), tokens(&reference_turns), "{what}");
            wait_idle(&engine);
            assert_same_logits(&rec.take(), &want, &what);
            let outs = run_together(&engine, &reqs);
            assert_eq!(tokens(&outs), tokens(&reference), "{what}");
            let s = wait_idle(&engine);
            let want_requests = only(&want, |id| !id.starts_with("turn"));
            assert_same_logits(&rec.take(), &want_requests, &format!("{what}, together"));
            assert!(s.num_preemptions_total > 0, "{what}: {s:?}");
            assert_eq!(s.requests_finished_length, 11);
        }
    }
}

#[test]
fn preemption_keeps_outputs_on_attention_only_moe() {
    check_preemption(TestModel::Moe);
}

#[test]
fn preemption_keeps_outputs_on_hybrid_golden() {
    check_preemption(TestModel::HybridGolden);
}

#[test]
fn preemption_keeps_outputs_on_bundled_hybrid() {
    check_preemption(TestModel::Bundled);
}

#[test]
fn preemption_keeps_outputs_on_flash_next() {
    check_preemption(TestModel::FlashNext);
}

#[test]
fn salts_separate_cache_entries() {
    let engine = spawn(TestModel::Moe, with_cache(true));
    let p = prompt(31, 100, 512);
    let salted = |salt: &[u8]| GenerateRequest {
        cache_salt: salt.to_vec(),
        ..request(&p, greedy(5))
    };
    assert_eq!(run_one(&engine, salted(b"a")).usage.cached_tokens, 0);
    assert_eq!(run_one(&engine, salted(b"b")).usage.cached_tokens, 0);
    assert_eq!(run_one(&engine, salted(b"a")).usage.cached_tokens, 96);
    wait_idle(&engine);
}

//! The replay proposer through the HTTP API: a greedy prompt the server has
//! answered before gets its recorded answer as drafts, corrupted at the
//! profile. The text never changes; every draft is accepted at profile 1,
//! none at profile 0, and over many steps the achieved per-position
//! acceptance is the profile's.

mod common;

use std::sync::Arc;

use common::*;
use kestrel_engine::spec::prompt_replay::PromptReplay;
use kestrel_engine::spec::replay::Profile;
use kestrel_engine::spec::{SpeculativeConfig, SpeculativeMethod};
use serde_json::json;

const PROMPT: &str = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n";

fn replay_server(rates: &[f64]) -> String {
    let profile = Profile::new(rates.to_vec()).unwrap();
    spawn_server(|c| {
        c.speculative = Some(SpeculativeConfig {
            num_speculative_tokens: profile.len(),
            method: SpeculativeMethod::External(Arc::new(PromptReplay::new(profile, 0))),
        })
    })
}

async fn text(base: &str, max_tokens: u32, temperature: f64) -> String {
    let body = json!({
        "model": MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": 11,
        "ignore_eos": true,
    });
    let (status, v) = post(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{v}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// Speculative steps, draft tokens, accepted tokens, and accepted tokens
/// per draft position, from `/metrics`.
struct Counters {
    drafts: f64,
    draft_tokens: f64,
    accepted: f64,
    per_position: Vec<f64>,
}

/// The counters once the engine is idle: a response can arrive before the
/// engine publishes the statistics of the step that produced its last
/// tokens (they are published after every step).
async fn counters(base: &str) -> Counters {
    wait_idle(base, std::time::Duration::from_secs(10)).await;
    let page = get(base, "/metrics").await.1;
    let per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total{";
    Counters {
        drafts: metric_in(&page, "vllm:spec_decode_num_drafts_total").unwrap(),
        draft_tokens: metric_in(&page, "vllm:spec_decode_num_draft_tokens_total").unwrap(),
        accepted: metric_in(&page, "vllm:spec_decode_num_accepted_tokens_total").unwrap(),
        per_position: page
            .lines()
            .filter(|l| l.starts_with(per_pos))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_drafts_are_all_accepted_at_profile_one_and_change_nothing() {
    let plain = spawn_server(|_| {});
    let want = text(&plain, 40, 0.0).await;
    let spec = replay_server(&[1.0, 1.0, 1.0]);
    assert_eq!(text(&spec, 40, 0.0).await, want, "the recording run");
    assert_eq!(
        counters(&spec).await.drafts,
        0.0,
        "a new prompt has no drafts"
    );
    assert_eq!(text(&spec, 40, 0.0).await, want, "the replayed run");
    let c = counters(&spec).await;
    // 39 tokens after the prefill's, 4 a step: 9 full steps and 3 tokens.
    assert_eq!((c.drafts, c.draft_tokens), (10.0, 29.0));
    assert_eq!(c.accepted, c.draft_tokens);
    assert_eq!(c.per_position, [10.0, 10.0, 9.0]);
    // Sampled requests get no drafts, even for a recorded prompt.
    text(&spec, 40, 0.7).await;
    assert_eq!(counters(&spec).await.drafts, 10.0);
    let page = get(&spec, "/metrics").await.1;
    let info = page
        .lines()
        .find(|l| l.starts_with("kestrel:speculative_method_info{"))
        .expect("the method is named");
    assert!(
        info.contains("replay proposer, profile 1/1/1")
            && info.contains("benchmark proposer for dummy weights"),
        "{info}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_drafts_are_all_rejected_at_profile_zero_and_change_nothing() {
    let plain = spawn_server(|_| {});
    let want = text(&plain, 40, 0.0).await;
    let spec = replay_server(&[0.0, 0.0, 0.0]);
    for _ in 0..2 {
        assert_eq!(text(&spec, 40, 0.0).await, want);
    }
    let c = counters(&spec).await;
    // One token a step; the last step has no room for a draft.
    assert_eq!(c.drafts, 38.0);
    assert_eq!(c.accepted, 0.0);
    assert_eq!(c.per_position, [0.0, 0.0, 0.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_achieved_acceptance_is_the_profiles() {
    let rates = [0.87, 0.74, 0.61];
    let spec = replay_server(&rates);
    let want = text(&spec, 128, 0.0).await;
    // Four requests at a time, each replaying the same recording (with the
    // same draws: the steps of every request accept alike).
    for _ in 0..3 {
        let texts = futures_util::future::join_all((0..4).map(|_| text(&spec, 128, 0.0))).await;
        assert!(texts.iter().all(|t| *t == want));
    }
    let c = counters(&spec).await;
    assert!(c.drafts > 300.0, "{} speculative steps", c.drafts);
    for (i, (&accepted, rate)) in c.per_position.iter().zip(rates).enumerate() {
        // The draws of a request's ~40 steps spread evenly over [0, 1)
        // (spec::replay), so this is close; the steps near max_tokens carry
        // fewer drafts. A profile that is ignored misses by more.
        let achieved = accepted / c.drafts;
        assert!(
            (achieved - rate).abs() < 0.06,
            "position {}: achieved {achieved:.3}, profile {rate}",
            i + 1
        );
    }
}

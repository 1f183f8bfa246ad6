//! A scripted OpenAI-compatible SSE server with known timings, and tests that
//! the harness measures exactly what was scripted.
//!
//! Script (per model id): TTFT = TTFT_MS x (uncached share of the prompt);
//! chunks then arrive at fixed absolute deadlines TOKEN_MS apart, so timer
//! lateness does not accumulate. Prompt tokens = chars / 4; cached tokens =
//! the longest prefix shared with an earlier prompt in whole 64-char blocks, / 4.
//! Models: `scripted` (one token per chunk), `spec` (three tokens per chunk,
//! with speculative counters on /metrics, per position too, and the method
//! named), `empty` (no tokens at all),
//! `divergent` (different text on a cache hit).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream;
use serde_json::{Value, json};
use tokio::time::Instant;

use kestrel_bench::outcome::{Outcome, classify};
use kestrel_bench::runner::{BenchResult, RunConfig, run_workload};
use kestrel_bench::workload::Workload;

pub const TTFT_MS: u64 = 200;
pub const TOKEN_MS: u64 = 25;

#[derive(Default)]
struct Shared {
    seen: Mutex<Vec<String>>,
    /// (drafts, accepted) speculative counters.
    spec: Mutex<(u64, u64)>,
}

fn common_prefix_chars(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

fn sse(v: Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn chat(State(st): State<Arc<Shared>>, Json(body): Json<Value>) -> Response {
    let start = Instant::now();
    let model = body["model"].as_str().unwrap_or("").to_string();
    let prompt = body["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let max_tokens = body["max_tokens"].as_u64().unwrap_or(16);
    let prompt_chars = prompt.chars().count();
    let cached_chars = {
        let mut seen = st.seen.lock().unwrap();
        // Whole 64-character blocks only, like a paged prefix cache.
        let best = seen
            .iter()
            .map(|s| common_prefix_chars(s, &prompt) / 64 * 64)
            .max()
            .unwrap_or(0);
        seen.push(prompt.clone());
        best
    };
    let prompt_tokens = (prompt_chars / 4).max(1) as u64;
    let cached_tokens = (cached_chars / 4) as u64;
    let uncached_share =
        (prompt_tokens - cached_tokens.min(prompt_tokens)) as f64 / prompt_tokens as f64;
    let ttft = Duration::from_secs_f64(TTFT_MS as f64 / 1000.0 * uncached_share.max(0.05));
    let per_chunk: u64 = if model == "spec" { 3 } else { 1 };
    let chunks = if model == "empty" {
        0
    } else {
        max_tokens.div_ceil(per_chunk)
    };
    if model == "spec" {
        let mut c = st.spec.lock().unwrap();
        c.0 += chunks;
        c.1 += chunks * (per_chunk - 1);
    }
    let word = if model == "divergent" && cached_tokens > 0 {
        "hit "
    } else {
        "tok "
    };

    let mut events: Vec<(Instant, Bytes)> = vec![(
        start,
        sse(json!({"choices": [{"delta": {"role": "assistant"}}]})),
    )];
    for k in 0..chunks {
        let at = start + ttft + Duration::from_millis(TOKEN_MS * k);
        let field = if k == 0 {
            "reasoning_content"
        } else {
            "content"
        };
        let finish = if k + 1 == chunks {
            json!("length")
        } else {
            Value::Null
        };
        events.push((at, sse(json!({"choices": [{"delta": {field: word.repeat(per_chunk as usize)}, "finish_reason": finish}]}))));
    }
    let last = events.last().map(|e| e.0).unwrap_or(start);
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": chunks * per_chunk,
        "prompt_tokens_details": {"cached_tokens": cached_tokens}});
    events.push((last, sse(json!({"choices": [], "usage": usage}))));
    events.push((last, Bytes::from_static(b"data: [DONE]\n\n")));

    let body = Body::from_stream(stream::unfold(events.into_iter(), |mut it| async move {
        let (at, bytes) = it.next()?;
        tokio::time::sleep_until(at).await;
        Some((Ok::<_, Infallible>(bytes), it))
    }));
    ([("content-type", "text/event-stream")], body).into_response()
}

async fn metrics(State(st): State<Arc<Shared>>) -> String {
    let (d, a) = *st.spec.lock().unwrap();
    // Every draft step accepts two drafts: positions 0 and 1.
    format!(
        "# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{{engine=\"0\"}} {d}\nvllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {a}\n\
         vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"0\"}} {d}\n\
         vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine=\"0\",position=\"1\"}} {d}\n\
         kestrel:speculative_method_info{{engine=\"0\",method=\"scripted drafts\"}} 1\n"
    )
}

pub async fn start_server() -> SocketAddr {
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route(
            "/v1/models",
            get(|| async { Json(json!({"data": [{"id": "scripted"}]})) }),
        )
        .route("/health", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .with_state(Arc::new(Shared::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

pub fn write_workload(dir: &Path, extra: &str) -> (Workload, std::path::PathBuf) {
    std::fs::create_dir_all(dir.join("corpus")).unwrap();
    let text: String = (0..200)
        .map(|i| format!("def function_{i}(x):\n    return x * {i}\n"))
        .collect();
    std::fs::write(dir.join("corpus/code.txt"), text).unwrap();
    let mut table: toml::Table = toml::from_str(
        r#"schema_version = 1
name = "scripted"
target_prompt_tokens = 500
instruction = "Read the code."
question = "Question: what does it do?"
max_tokens = 9
rounds = 2
warmup_requests = 1
[corpus]
dir = "corpus"
files = ["code.txt"]
"#,
    )
    .unwrap();
    let overrides: toml::Table = toml::from_str(extra).unwrap();
    table.extend(overrides);
    let path = dir.join("w.toml");
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    Workload::load(&path).unwrap()
}

pub async fn run(addr: SocketAddr, dir: &Path, model: &str, extra: &str) -> BenchResult {
    let (workload, workload_base) = write_workload(dir, extra);
    let cfg = RunConfig {
        base_url: format!("http://{addr}"),
        model: Some(model.into()),
        api_key: None,
        workload,
        workload_base,
        rounds: None,
    };
    run_workload(&cfg).await.unwrap()
}

fn near(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= want.abs() * rel
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_and_primed_figures_match_the_script() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        addr,
        dir.path(),
        "scripted",
        r#"modes = ["cold", "primed"]"#,
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.rounds.len(), 2);
    let cold = &r.modes["cold"];
    let ttft = cold.ttft_s.median.unwrap();
    assert!(
        ttft >= TTFT_MS as f64 / 1000.0 && near(ttft, TTFT_MS as f64 / 1000.0, 0.15),
        "cold TTFT {ttft}"
    );
    // Prompt tokens come from usage: the server counts chars / 4 of the full prompt.
    let rec = &r.rounds[0].modes[0].record;
    assert_eq!(
        cold.prompt_tokens.median.unwrap() as usize,
        rec.prompt_chars / 4
    );
    let m = r.rounds[0].modes[0].metrics.as_ref().unwrap();
    assert!(near(
        m.prefill_tps,
        m.prompt_tokens as f64 / m.ttft_s,
        1e-12
    ));
    // 9 tokens, 8 intervals of TOKEN_MS: 1000 / 25 = 40 tok/s.
    let decode = cold.decode_tps.median.unwrap();
    assert!(
        near(decode, 1000.0 / TOKEN_MS as f64, 0.12),
        "decode {decode}"
    );
    assert_eq!(cold.completion_tokens.median, Some(9.0));
    assert_eq!(
        cold.cached_tokens.median,
        Some(0.0),
        "cold runs must not share a prefix"
    );

    // Primed: most of the prompt is cached, TTFT shrinks, the uncached rate is reported.
    let primed = &r.modes["primed"];
    let cached = primed.cached_tokens.median.unwrap();
    let prompt = primed.prompt_tokens.median.unwrap();
    assert!(cached > 0.9 * prompt, "cached {cached} of {prompt}");
    let pt = primed.ttft_s.median.unwrap();
    assert!(pt < ttft / 2.0, "primed TTFT {pt} vs cold {ttft}");
    let uncached = primed.uncached_prefill_tps.median.unwrap();
    assert!(uncached < primed.prefill_tps.median.unwrap());
    // Reasoning and content chunks both count as tokens.
    assert!(rec.reasoning_chars > 0 && rec.content_chars > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_curve_aggregates_the_joint_decode_window() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        addr,
        dir.path(),
        "scripted",
        "modes = []\nstream_curve = [1, 2, 4]\nrounds = 1",
    )
    .await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    for s in &r.stream_curve {
        let agg = s.aggregate_tps.median.unwrap();
        // Each stream decodes at 40 tok/s for the whole window.
        let want = s.concurrency as f64 * 1000.0 / TOKEN_MS as f64;
        assert!(
            near(agg, want, 0.2),
            "c={} aggregate {agg}, want {want}",
            s.concurrency
        );
    }
    let step = &r.rounds[0].stream_curve[2];
    assert_eq!(step.records.len(), 4);
    let w = step.window.as_ref().unwrap();
    assert!(w.end_s > w.start_s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_chunks_count_usage_tokens_and_tokens_per_step() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let r = run(addr, dir.path(), "spec", "max_tokens = 12\nrounds = 1").await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    let cold = &r.modes["cold"];
    // 4 chunks of 3 tokens over 3 intervals: (12 - 1) / 0.075 s.
    let decode = cold.decode_tps.median.unwrap();
    let want = 11.0 / (3.0 * TOKEN_MS as f64 / 1000.0);
    assert!(near(decode, want, 0.12), "decode {decode}, want {want}");
    assert_eq!(cold.tokens_per_step.median, Some(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_prompts_are_sent_in_warm_up_rounds_and_acceptance_is_per_position() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = "modes = []\nstream_curve = [1, 2]\nrounds = 2\nmax_tokens = 12\n\
                 repeat_prompts = true\nwarmup_rounds = 1";
    let r = run(addr, dir.path(), "spec", extra).await;
    assert!(r.failures.is_empty(), "{:?}", r.failures);
    assert_eq!(r.rounds.len(), 2, "warm-up rounds are not results");
    for step in r.rounds.iter().flat_map(|r| &r.stream_curve) {
        for rec in &step.records {
            // The same bytes went out in the warm-up round: all but the
            // last partial block of the prompt is a prefix-cache hit.
            let usage = rec.usage.unwrap();
            let cached = usage.cached_tokens.unwrap();
            assert!(
                cached + 16 >= usage.prompt_tokens,
                "{}: {cached} of {} cached",
                rec.label,
                usage.prompt_tokens
            );
        }
        assert_eq!(step.per_position_acceptance, Some(vec![1.0, 1.0]));
    }
    for s in &r.stream_curve {
        let medians: Vec<Option<f64>> =
            s.per_position_acceptance.iter().map(|p| p.median).collect();
        assert_eq!(medians, [Some(1.0), Some(1.0)], "c={}", s.concurrency);
    }
    assert_eq!(r.speculative_method.as_deref(), Some("scripted drafts"));

    // Without repeat_prompts every stream has a fresh nonce: no hits.
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        addr,
        dir.path(),
        "spec",
        "modes = []\nstream_curve = [2]\nrounds = 1",
    )
    .await;
    let rec = &r.rounds[0].stream_curve[0].records[1];
    assert!(rec.usage.unwrap().cached_tokens.unwrap() < 16, "{rec:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_output_fails_the_run() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let (workload, workload_base) = write_workload(dir.path(), "rounds = 1\nwarmup_requests = 0");
    let cfg = RunConfig {
        base_url: format!("http://{addr}"),
        model: Some("empty".into()),
        api_key: None,
        workload,
        workload_base,
        rounds: None,
    };
    let r = run_workload(&cfg).await.unwrap();
    assert!(
        r.failures.iter().any(|f| f.contains("empty output")),
        "{:?}",
        r.failures
    );
    let input = kestrel_bench::outcome::ClassifyInput {
        failures: r.failures.clone(),
        ..Default::default()
    };
    assert_eq!(classify(&input).outcome, Outcome::NotReproduced);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_hit_divergence_is_detected() {
    let addr = start_server().await;
    let dir = tempfile::tempdir().unwrap();
    let r = run(
        addr,
        dir.path(),
        "divergent",
        "modes = [\"cold\", \"primed\"]\nrounds = 1",
    )
    .await;
    assert!(
        r.failures
            .iter()
            .any(|f| f.contains("cache-hit output differs")),
        "{:?}",
        r.failures
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (workload, workload_base) = write_workload(dir.path(), "");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let cfg = RunConfig {
        base_url: format!("http://127.0.0.1:{port}"),
        model: Some("scripted".into()),
        api_key: None,
        workload,
        workload_base,
        rounds: None,
    };
    let err = run_workload(&cfg).await.unwrap_err().to_string();
    assert!(err.contains("warmup request failed"), "{err}");
}

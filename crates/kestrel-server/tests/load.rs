//! Bounded load test: 32 concurrent clients mixing chat and completions,
//! streaming and not, with random disconnects during prefill and decode.
//! Passes when no response is a 5xx, every stream read to the end is well
//! formed, and afterwards no KV page is held.
//!
//! Duration: `KESTREL_LOAD_TEST_SECS`, else 60 s under CI (`CI` set), else 15 s.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

const CLIENTS: usize = 32;

fn duration() -> Duration {
    let secs = std::env::var("KESTREL_LOAD_TEST_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var_os("CI").is_some() {
            60
        } else {
            15
        });
    Duration::from_secs(secs)
}

#[derive(Default)]
struct Tally {
    completed: AtomicUsize,
    streams_checked: AtomicUsize,
    disconnects: AtomicUsize,
    rate_limited: AtomicUsize,
}

enum Hangup {
    Never,
    /// Drop the request this long after sending it (during prefill for long prompts).
    After(Duration),
    /// Streaming only: drop after this many body chunks (during decode).
    AfterChunks(usize),
}

fn request_body(rng: &mut StdRng, stream: bool, long_prompt: bool) -> (&'static str, Value) {
    let max_tokens = rng.random_range(1..120);
    let chat = rng.random_bool(0.5);
    let prompt = if long_prompt {
        "value = compute(value)\n".repeat(rng.random_range(100..300))
    } else {
        [
            "def main():\n",
            "import sys\n",
            "class Node:\n",
            "for i in range(",
        ][rng.random_range(0..4)]
        .to_string()
    };
    let mut body = if chat {
        json!({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens})
    } else {
        json!({"prompt": prompt, "max_tokens": max_tokens})
    };
    if rng.random_bool(0.5) {
        body["temperature"] = json!(0);
    } else {
        body["seed"] = json!(rng.random::<u32>());
    }
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    (
        if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        },
        body,
    )
}

/// Checks a complete stream: data events, one finish chunk, a usage chunk,
/// then `[DONE]` last.
fn check_stream(text: &str) {
    let events = sse_data(text);
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "stream not terminated: {text}"
    );
    let mut finishes = 0;
    let mut usage = 0;
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap_or_else(|_| panic!("bad event {e}"));
        assert!(v.get("error").is_none(), "error event: {e}");
        let choices = v["choices"].as_array().unwrap();
        if choices.is_empty() {
            usage += 1;
        } else if choices[0]["finish_reason"].is_string() {
            finishes += 1;
        }
    }
    assert_eq!((finishes, usage), (1, 1), "{text}");
}

async fn one_client(base: String, seed: u64, deadline: Instant, tally: Arc<Tally>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let http = client();
    while Instant::now() < deadline {
        let stream = rng.random_bool(0.6);
        let roll: f64 = rng.random();
        let long_prompt = roll < 0.15;
        let hangup = if long_prompt && roll < 0.1 {
            Hangup::After(Duration::from_millis(rng.random_range(5..60)))
        } else if roll < 0.4 {
            if stream {
                Hangup::AfterChunks(rng.random_range(1..6))
            } else {
                Hangup::After(Duration::from_millis(rng.random_range(20..300)))
            }
        } else {
            Hangup::Never
        };
        let (path, body) = request_body(&mut rng, stream, long_prompt);
        let send = http.post(format!("{base}{path}")).json(&body).send();
        let response = match hangup {
            Hangup::After(d) => match tokio::time::timeout(d, send).await {
                Err(_) => {
                    tally.disconnects.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(r) => r,
            },
            _ => send.await,
        };
        let response = response.expect("the server answers");
        let status = response.status().as_u16();
        assert!(status < 500, "{path}: status {status}");
        if status == 429 {
            tally.rate_limited.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(status, 200, "{path} {body}");
        match hangup {
            Hangup::AfterChunks(n) => {
                let mut chunks = response.bytes_stream();
                for _ in 0..n {
                    if chunks.next().await.is_none() {
                        break;
                    }
                }
                tally.disconnects.fetch_add(1, Ordering::Relaxed);
            }
            Hangup::After(_) => {
                // Answered before the hang-up time: read it out.
                let _ = response.bytes().await;
                tally.completed.fetch_add(1, Ordering::Relaxed);
            }
            Hangup::Never => {
                let text = response.text().await.expect("body");
                if stream {
                    check_stream(&text);
                    tally.streams_checked.fetch_add(1, Ordering::Relaxed);
                } else {
                    let v: Value = serde_json::from_str(&text).expect("JSON body");
                    assert!(v["choices"][0]["finish_reason"].is_string(), "{text}");
                }
                tally.completed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_with_random_disconnects() {
    let base = spawn_server(|c| {
        c.max_num_seqs = 32;
        c.kv_cache_tokens = Some(32768);
    });
    wait_idle(&base, Duration::from_secs(5)).await;
    let total_blocks = metric(&base, "kestrel:num_total_blocks").await;
    let deadline = Instant::now() + duration();
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(one_client(
                base.clone(),
                1000 + i as u64,
                deadline,
                tally.clone(),
            ))
        })
        .collect();
    for c in clients {
        c.await.expect("client task");
    }
    let completed = tally.completed.load(Ordering::Relaxed);
    let disconnects = tally.disconnects.load(Ordering::Relaxed);
    eprintln!(
        "load: {completed} completed ({} streams checked), {disconnects} disconnects, {} rate limited",
        tally.streams_checked.load(Ordering::Relaxed),
        tally.rate_limited.load(Ordering::Relaxed)
    );
    assert!(completed >= 8, "too little work done: {completed}");
    assert!(disconnects >= 1);
    wait_idle(&base, Duration::from_secs(10)).await;
    assert_eq!(
        metric(&base, "kestrel:num_total_blocks").await,
        total_blocks
    );
    assert_eq!(metric(&base, "vllm:kv_cache_usage_perc").await, 0.0);
    let (s, _) = get(&base, "/health").await;
    assert_eq!(s, 200);
}

//! Auth, back-pressure (429) and cancellation on disconnect.

mod common;

use std::time::Duration;

use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};

#[tokio::test]
async fn api_key_is_required_except_on_health_and_hello() {
    let base = spawn_server(|c| c.api_keys = vec!["k-one".into(), "k-two".into()]);
    let c = client();
    let r = c.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // Claude Code's reachability probe carries no key.
    let r = c.head(format!("{base}/api/hello")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = c.get(format!("{base}/api/hello")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ok");
    for path in ["/v1/models", "/metrics"] {
        let r = c.get(format!("{base}{path}")).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "authentication_error");
        assert_eq!(v["error"]["code"], 401);
    }
    let r = c
        .post(format!("{base}/tokenize"))
        .json(&json!({"prompt": "a"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("k-on")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let r = c
        .get(format!("{base}/v1/models"))
        .bearer_auth("k-two")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = c
        .get(format!("{base}/v1/models"))
        .header("x-api-key", "k-one")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = c
        .post(format!("{base}/v1/completions"))
        .bearer_auth("k-one")
        .json(&json!({"prompt": "a", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

fn long_stream(max_tokens: u32) -> Value {
    json!({
        "prompt": "class Parser:\n",
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": true,
    })
}

#[tokio::test]
async fn full_queue_gets_429_with_retry_after() {
    let base = spawn_server(|c| {
        c.max_num_seqs = 1;
        c.max_queued_requests = 1;
    });
    let c = client();
    let mut held = Vec::new();
    let mut rejected = 0;
    for _ in 0..6 {
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&long_stream(3000))
            .send()
            .await
            .unwrap();
        match r.status().as_u16() {
            200 => held.push(r),
            429 => {
                assert_eq!(r.headers()["retry-after"], "1");
                let v: Value = r.json().await.unwrap();
                assert_eq!(v["error"]["type"], "rate_limit_error");
                rejected += 1;
            }
            s => panic!("unexpected status {s}"),
        }
    }
    assert!(rejected >= 1, "no 429 with one running and one queued slot");
    // The running request is producing tokens, so the engine has seen both.
    let first = held.remove(0);
    let mut body = first.bytes_stream();
    body.next().await;
    drop(body);
    drop(held);
    wait_idle(&base, Duration::from_secs(10)).await;
    // Every queue slot is free again: as many requests as the queue allows
    // are admitted in turn.
    for i in 0..4 {
        let (s, v) = post(
            &base,
            "/v1/completions",
            &json!({"prompt": "a", "max_tokens": 2}),
        )
        .await;
        assert_eq!(s, 200, "request {i} after the burst: {v}");
    }
}

#[tokio::test]
async fn disconnects_abort_and_free_every_page() {
    let base = spawn_server(|c| c.max_num_seqs = 8);
    wait_idle(&base, Duration::from_secs(5)).await;
    let idle_total = metric(&base, "kestrel:num_total_blocks").await;
    let c = client();
    // Streaming: read a few chunks, then hang up mid-decode.
    for _ in 0..6 {
        let r = c
            .post(format!("{base}/v1/completions"))
            .json(&long_stream(3500))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let mut body = r.bytes_stream();
        for _ in 0..3 {
            body.next().await;
        }
    }
    // Non-streaming: the client gives up after a moment.
    let short = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    for _ in 0..6 {
        let body = json!({"prompt": "def run(self):\n", "max_tokens": 3500, "ignore_eos": true});
        let r = short
            .post(format!("{base}/v1/completions"))
            .json(&body)
            .send()
            .await;
        assert!(r.is_err(), "the request should have timed out");
    }
    // Mid-prefill: a long prompt, dropped at once.
    let long_prompt = "x = 1\n".repeat(600);
    for _ in 0..4 {
        let body = json!({"prompt": long_prompt, "max_tokens": 2000, "stream": true});
        let fut = c.post(format!("{base}/v1/completions")).json(&body).send();
        let _ = tokio::time::timeout(Duration::from_millis(20), fut).await;
    }
    wait_idle(&base, Duration::from_secs(5)).await;
    assert_eq!(metric(&base, "kestrel:num_total_blocks").await, idle_total);
    assert!(metric(&base, "vllm:request_success_total").await >= 0.0);
    let page = get(&base, "/metrics").await.1;
    let aborts = page
        .lines()
        .find(|l| l.contains("finished_reason=\"abort\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap();
    assert!(aborts >= 12.0, "aborts counted: {aborts}");
    let start = std::time::Instant::now();
    let (s, _) = post(
        &base,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 10}),
    )
    .await;
    assert_eq!(s, 200);
    assert!(start.elapsed() < Duration::from_secs(5));
}

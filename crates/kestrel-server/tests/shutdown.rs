//! Shutting down: an open stream is ended cleanly (its abort chunk and
//! `[DONE]` are written and the connection closed, not cut), an idle keep-alive
//! connection does not hold the shutdown up, and nothing is accepted after.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kestrel_server::ServerConfig;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_streams_cleanly_and_stops_accepting() {
    let mut config = ServerConfig::new(model_dir());
    config.addr = "127.0.0.1:0".parse().unwrap();
    config.kv_cache_tokens = Some(16384);
    let server = kestrel_server::start(config, kestrel_cpu::CpuBackend::new())
        .await
        .expect("server starts");
    server
        .wait_ready(Duration::from_secs(120))
        .await
        .expect("model loads");
    let base = format!("http://{}", server.addr());
    // A pooled keep-alive connection, idle during the shutdown.
    let idle = client();
    assert_eq!(
        idle.get(format!("{base}/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to a thousand."}],
        "min_tokens": 2000, "max_tokens": 2000, "stream": true,
    });
    let mut stream = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert!(
        stream.chunk().await.unwrap().is_some(),
        "the stream started"
    );

    let started = Instant::now();
    let stopping = tokio::spawn(server.shutdown());
    let mut rest = Vec::new();
    let read = async {
        while let Some(chunk) = stream
            .chunk()
            .await
            .expect("the stream ends cleanly, not cut")
        {
            rest.extend_from_slice(&chunk);
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .expect("the stream ends within 10 s");
    let rest = String::from_utf8_lossy(&rest);
    let data = sse_data(&rest);
    assert!(
        data.iter()
            .any(|d| d.contains(r#""finish_reason":"abort""#)),
        "the stream did not end with an abort: {rest}"
    );
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{rest}");
    tokio::time::timeout(Duration::from_secs(10), stopping)
        .await
        .expect("shutdown returns")
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(
        client().get(format!("{base}/health")).send().await.is_err(),
        "a new connection was accepted after the shutdown"
    );
}

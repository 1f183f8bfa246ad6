//! Test helpers: a real server with the bundled model on an ephemeral port,
//! running on its own thread and runtime, and raw HTTP helpers.
#![allow(dead_code)]

pub mod bodies;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kestrel_server::ServerConfig;
use serde_json::Value;

pub fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35")
}

pub const MODEL: &str = "kestrel-tiny-qwen35";

/// Starts a server configured by `configure` and returns its base URL. The
/// server lives until the test process exits.
pub fn spawn_server(configure: impl FnOnce(&mut ServerConfig)) -> String {
    let mut config = ServerConfig::new(model_dir());
    config.addr = "127.0.0.1:0".parse().unwrap();
    config.kv_cache_tokens = Some(16384);
    config.max_num_seqs = 16;
    configure(&mut config);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let server = kestrel_server::start(config, kestrel_cpu::CpuBackend::new())
                .await
                .expect("server starts");
            server
                .wait_ready(Duration::from_secs(120))
                .await
                .expect("model loads");
            tx.send(format!("http://{}", server.addr())).unwrap();
            std::future::pending::<()>().await;
        });
    });
    rx.recv_timeout(Duration::from_secs(180))
        .expect("server ready")
}

/// One server shared by the tests of a binary that need no special settings.
pub fn shared_server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| spawn_server(|_| {}))
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// POSTs JSON; returns the status and the parsed body (Null if not JSON).
pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

pub async fn get(base: &str, path: &str) -> (u16, String) {
    let r = client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("request sent");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// The `data:` payloads of an SSE body, in order (`[DONE]` included).
pub fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|event| event.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

/// POSTs a streaming request and returns its data payloads.
pub async fn post_stream(base: &str, path: &str, body: &Value) -> (u16, Vec<String>) {
    let r = client()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .expect("request sent");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, sse_data(&text))
}

/// A metric's value from `/metrics` (first sample with that name).
pub async fn metric(base: &str, name: &str) -> f64 {
    let (_, page) = get(base, "/metrics").await;
    metric_in(&page, name).unwrap_or_else(|| panic!("metric {name} missing"))
}

pub fn metric_in(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Waits until nothing runs or waits and every KV page is free or merely
/// cached, i.e. no request holds memory, on several polls in a row (the
/// engine publishes its stats once per step). Panics after `timeout`.
pub async fn wait_idle(base: &str, timeout: Duration) {
    let start = Instant::now();
    let mut idle_polls = 0;
    loop {
        let (_, page) = get(base, "/metrics").await;
        let m = |n| metric_in(&page, n).unwrap();
        let running = m("vllm:num_requests_running");
        let waiting = m("vllm:num_requests_waiting");
        let free = m("kestrel:num_free_blocks");
        let cached = m("kestrel:num_cached_blocks");
        let total = m("kestrel:num_total_blocks");
        if running == 0.0 && waiting == 0.0 && free + cached == total {
            idle_polls += 1;
            if idle_polls == 4 {
                return;
            }
        } else {
            idle_polls = 0;
        }
        if start.elapsed() > timeout {
            panic!(
                "not idle after {timeout:?}: running {running}, waiting {waiting}, free {free} + cached {cached} != total {total}"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks an error response: the status is 4xx and the body is an OpenAI
/// error object.
pub fn assert_client_error(status: u16, body: &Value, what: &str) {
    assert!(
        (400..500).contains(&status),
        "{what}: status {status}, body {body}"
    );
    let e = &body["error"];
    assert!(
        e["message"].is_string(),
        "{what}: no error.message in {body}"
    );
    assert!(e["type"].is_string(), "{what}: no error.type in {body}");
}

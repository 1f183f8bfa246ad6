//! `--max-model-len`: below the model's context it caps it; above it the
//! server refuses to start unless the long length is allowed explicitly.

mod common;

use common::*;
use kestrel_server::ServerConfig;
use serde_json::Value;

/// The bundled model's `max_position_embeddings`.
const MODEL_CONTEXT: usize = 4096;

fn config(max_model_len: usize, allow_long: bool) -> ServerConfig {
    let mut config = ServerConfig::new(model_dir());
    config.addr = "127.0.0.1:0".parse().unwrap();
    config.max_model_len = Some(max_model_len);
    config.allow_long_max_model_len = allow_long;
    config
}

async fn served_len(base: &str) -> u64 {
    let (status, body) = get(base, "/v1/models").await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"][0]["max_model_len"].as_u64().unwrap()
}

#[tokio::test]
async fn above_the_model_context_is_refused_at_start() {
    let cpu = kestrel_cpu::CpuBackend::new();
    let err = match kestrel_server::start(config(MODEL_CONTEXT + 1, false), cpu).await {
        Ok(_) => panic!("a server started with --max-model-len above the model's context"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("--max-model-len 4097 is above the model's context of 4096 tokens"),
        "{err}"
    );
    assert!(err.contains("--allow-long-max-model-len"), "{err}");
}

#[tokio::test]
async fn the_model_context_itself_is_accepted() {
    let base = spawn_server(|c| *c = config(MODEL_CONTEXT, false));
    assert_eq!(served_len(&base).await, MODEL_CONTEXT as u64);
}

#[tokio::test]
async fn below_the_model_context_caps_it() {
    let base = spawn_server(|c| *c = config(1024, false));
    assert_eq!(served_len(&base).await, 1024);
}

#[tokio::test]
async fn above_the_model_context_is_served_when_allowed() {
    let base = spawn_server(|c| *c = config(2 * MODEL_CONTEXT, true));
    assert_eq!(served_len(&base).await, 2 * MODEL_CONTEXT as u64);
}

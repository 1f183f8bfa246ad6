//! Through the HTTP API, speculative decoding changes neither the text, the
//! logprobs nor the usage, streamed or not, greedy or seeded; the spec_decode counters
//! appear under vLLM's names.

mod common;

use common::*;
use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
use serde_json::{Value, json};

fn body(stream: bool, seed: Option<u64>) -> Value {
    let mut b = json!({
        // Inside the greedy continuation, so it ends a run of accepted drafts.
        "stop": ["self.values = values or {}\n\n    def get(self, key, values"],
        "model": MODEL,
        "prompt": "class Config:\n    def __init__(self, name, values=None):\n        self.name = name\n        self.values = values or {}\n\n    def get(self, key",
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": 2,
        "stream": stream,
    });
    if let Some(seed) = seed {
        b["temperature"] = json!(0.7);
        b["seed"] = json!(seed);
    }
    b
}

/// The text, the logprobs of every token (`token_logprobs` and
/// `top_logprobs`) and, unstreamed, the usage of a completion.
async fn complete(base: &str, stream: bool, seed: Option<u64>) -> (String, Vec<Value>, Value) {
    if stream {
        let (status, events) = post_stream(base, "/v1/completions", &body(true, seed)).await;
        assert_eq!(status, 200);
        let chunks: Vec<Value> = events
            .iter()
            .filter(|e| e.as_str() != "[DONE]")
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .collect();
        let text = chunks
            .iter()
            .filter_map(|v| v["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        let logprobs = chunks
            .iter()
            .flat_map(|v| token_logprobs(&v["choices"][0]["logprobs"]))
            .collect();
        (text, logprobs, Value::Null)
    } else {
        let (status, v) = post(base, "/v1/completions", &body(false, seed)).await;
        assert_eq!(status, 200, "{v}");
        // Prefix-cache hits depend on what each server saw before.
        let mut usage = v["usage"].clone();
        usage["prompt_tokens_details"] = Value::Null;
        let logprobs = token_logprobs(&v["choices"][0]["logprobs"]);
        assert!(!logprobs.is_empty());
        (
            v["choices"][0]["text"].as_str().unwrap().to_string(),
            logprobs,
            usage,
        )
    }
}

/// `[logprob, top_logprobs]` of each token of a `logprobs` object.
fn token_logprobs(lp: &Value) -> Vec<Value> {
    let (Some(values), Some(top)) = (
        lp["token_logprobs"].as_array(),
        lp["top_logprobs"].as_array(),
    ) else {
        return Vec::new();
    };
    values.iter().zip(top).map(|(v, t)| json!([v, t])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_changes_nothing_a_client_sees() {
    let plain = spawn_server(|_| {});
    let methods = [
        SpeculativeMethod::mtp(),
        SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
    ];
    for method in methods {
        let what = format!("{method:?}");
        let spec = spawn_server(|c| {
            c.speculative = Some(SpeculativeConfig {
                method,
                num_speculative_tokens: 3,
            })
        });
        for stream in [false, true] {
            for seed in [None, Some(5)] {
                let want = complete(&plain, stream, seed).await;
                let got = complete(&spec, stream, seed).await;
                assert_eq!(got, want, "{what}, stream {stream}, seed {seed:?}");
            }
        }
        let page = get(&spec, "/metrics").await.1;
        let drafts = metric_in(&page, "vllm:spec_decode_num_draft_tokens_total").unwrap();
        let accepted = metric_in(&page, "vllm:spec_decode_num_accepted_tokens_total").unwrap();
        assert!(
            drafts > 0.0 && accepted > 0.0,
            "{what}: {drafts} drafts, {accepted} accepted"
        );
        assert!(
            page.contains("vllm:spec_decode_num_accepted_tokens_per_pos_total{"),
            "{what}: per-position counter"
        );
        wait_idle(&spec, std::time::Duration::from_secs(20)).await;
    }
}

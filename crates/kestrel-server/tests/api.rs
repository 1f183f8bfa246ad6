//! The routes against a real server with the bundled model.

mod common;

use common::*;
use serde_json::{Value, json};

fn chat_body(stream: bool) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "def parse_args(argv):"}],
        "max_tokens": 24,
        "temperature": 0,
        "seed": 7,
    });
    if stream {
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// Checks the stream's framing and returns (reasoning, content, finish_reason, usage).
fn check_chat_stream(events: &[String]) -> (String, String, String, Value) {
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = chunks[0]["id"].clone();
    let (mut reasoning, mut content, mut finish, mut usage) =
        (String::new(), String::new(), None, None);
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(c["id"], id);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], MODEL);
        let choices = c["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert!(usage.is_none(), "two usage chunks");
            assert_eq!(i, chunks.len() - 1, "usage chunk must be last");
            usage = Some(c["usage"].clone());
            continue;
        }
        assert!(c["usage"].is_null());
        let delta = &choices[0]["delta"];
        assert_eq!(
            delta.get("role").is_some(),
            i == 0,
            "role only in the first chunk"
        );
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert_eq!(delta["reasoning"], delta["reasoning_content"]);
            reasoning.push_str(r);
        }
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            assert!(finish.is_none(), "two finish chunks");
            assert_eq!(delta, &json!({}), "the finish chunk has no content");
            finish = Some(f.to_string());
        }
    }
    (
        reasoning,
        content,
        finish.expect("a finish chunk"),
        usage.expect("a usage chunk"),
    )
}

#[tokio::test]
async fn health_and_models() {
    let base = shared_server();
    let (s, body) = get(base, "/health").await;
    assert_eq!((s, body.as_str()), (200, r#"{"status":"ok"}"#));
    let (s, body) = get(base, "/v1/models").await;
    assert_eq!(s, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["max_model_len"], 4096);
}

#[tokio::test]
async fn chat_stream_matches_non_stream() {
    let base = shared_server();
    let (s, full) = post(base, "/v1/chat/completions", &chat_body(false)).await;
    assert_eq!(s, 200, "{full}");
    assert_eq!(full["object"], "chat.completion");
    let msg = &full["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    assert_eq!(msg["reasoning"], msg["reasoning_content"]);
    let (s, events) = post_stream(base, "/v1/chat/completions", &chat_body(true)).await;
    assert_eq!(s, 200);
    let (reasoning, content, finish, usage) = check_chat_stream(&events);
    assert_eq!(reasoning, msg["reasoning_content"].as_str().unwrap_or(""));
    assert_eq!(content, msg["content"].as_str().unwrap_or(""));
    assert_eq!(
        finish,
        full["choices"][0]["finish_reason"].as_str().unwrap()
    );
    for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
        assert_eq!(usage[k], full["usage"][k], "{k}");
    }
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    assert_eq!(full["usage"]["completion_tokens"], 24);
    assert_eq!(finish, "length");
}

#[tokio::test]
async fn thinking_off_gives_content_only() {
    let base = shared_server();
    let mut body = chat_body(false);
    body["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (s, v) = post(base, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    let msg = &v["choices"][0]["message"];
    assert!(msg.get("reasoning_content").is_none(), "{msg}");
    let content = msg["content"].as_str().unwrap_or("");
    assert!(!content.contains("<think>") && !content.contains("</think>"));
}

#[tokio::test]
async fn completions_stream_and_stop_strings() {
    let base = shared_server();
    let body = json!({"prompt": "import os\n\ndef main(", "max_tokens": 30, "temperature": 0});
    let (s, full) = post(base, "/v1/completions", &body).await;
    assert_eq!(s, 200, "{full}");
    let text = full["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(full["usage"]["completion_tokens"], 30);

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let (_, events) = post_stream(base, "/v1/completions", &sbody).await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut streamed = String::new();
    let mut finishes = 0;
    for e in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(e).unwrap();
        streamed.push_str(c["choices"][0]["text"].as_str().unwrap());
        finishes += c["choices"][0]["finish_reason"].is_string() as usize;
    }
    assert_eq!(streamed, text);
    assert_eq!(finishes, 1);

    // A stop string from the middle of that output, spanning tokens.
    let chars: Vec<char> = text.chars().collect();
    let stop: String = chars[chars.len() / 2..chars.len() / 2 + 4].iter().collect();
    let cut = &text[..text.find(&stop).unwrap()];
    for stream in [false, true] {
        let mut b = body.clone();
        b["stop"] = json!([stop]);
        b["stream"] = json!(stream);
        let (got, finish) = if stream {
            let (_, events) = post_stream(base, "/v1/completions", &b).await;
            let mut t = String::new();
            let mut f = String::new();
            for e in &events[..events.len() - 1] {
                let c: Value = serde_json::from_str(e).unwrap();
                t.push_str(c["choices"][0]["text"].as_str().unwrap());
                if let Some(r) = c["choices"][0]["finish_reason"].as_str() {
                    f = r.into();
                }
            }
            (t, f)
        } else {
            let (_, v) = post(base, "/v1/completions", &b).await;
            let c = &v["choices"][0];
            (
                c["text"].as_str().unwrap().to_string(),
                c["finish_reason"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(got, cut, "stream={stream} stop={stop:?}");
        assert_eq!(finish, "stop");
    }
}

#[tokio::test]
async fn tokenize_detokenize_round_trip() {
    let base = shared_server();
    let text = "def f(x):\n    return x * 2  # héllo ✓\n";
    let (s, v) = post(base, "/tokenize", &json!({"prompt": text})).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["count"].as_u64().unwrap() as usize,
        v["tokens"].as_array().unwrap().len()
    );
    assert_eq!(v["max_model_len"], 4096);
    let (s, d) = post(base, "/detokenize", &json!({"tokens": v["tokens"]})).await;
    assert_eq!(s, 200);
    assert_eq!(d["prompt"], text);
    // Every id below the vocabulary size decodes; the first one above does not.
    let all: Vec<u32> = (0..4096).collect();
    let (s, _) = post(base, "/detokenize", &json!({"tokens": all})).await;
    assert_eq!(s, 200);
    let (s, e) = post(base, "/detokenize", &json!({"tokens": [1, 4096]})).await;
    assert_client_error(s, &e, "out of vocab");
    assert_eq!(e["error"]["param"], "tokens[1]");
    // Chat messages go through the template.
    let (s, v) = post(
        base,
        "/tokenize",
        &json!({"messages": [{"role": "user", "content": "hi"}], "return_token_strs": true}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["token_strs"][0], "<|im_start|>");
}

#[tokio::test]
async fn request_errors() {
    let base = shared_server();
    let (s, v) = post(
        base,
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], "model_not_found");

    let long = "x = 1\n".repeat(3000);
    let (s, v) = post(
        base,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 5}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length"),
        "{v}"
    );
    let (s, v) = post(base, "/v1/completions", &json!({"prompt": [5, 4096]})).await;
    assert_client_error(s, &v, "prompt token out of vocab");
    let (s, v) = post(
        base,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "temperature": 3}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("temperature"))
    );
    let (s, _) = get(base, "/v1/nothing").await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn request_id_is_echoed() {
    let base = shared_server();
    let r = client()
        .post(format!("{base}/v1/completions"))
        .header("x-request-id", "my-req-42")
        .json(&json!({"prompt": "a", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "my-req-42");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["id"], "cmpl-my-req-42");
}

#[tokio::test]
async fn metrics_page_has_vllm_names() {
    let base = shared_server();
    post(
        base,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2}),
    )
    .await;
    let (s, page) = get(base, "/metrics").await;
    assert_eq!(s, 200);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:num_preemptions_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "kestrel:num_free_blocks",
        "kestrel:num_cached_blocks",
    ] {
        assert!(metric_in(&page, name).is_some(), "{name} missing");
    }
    assert!(page.contains(
        "vllm:request_success_total{model_name=\"kestrel-tiny-qwen35\",finished_reason=\"length\"}"
    ));
    assert!(page.contains(
        "vllm:time_to_first_token_seconds_bucket{model_name=\"kestrel-tiny-qwen35\",le=\"0.001\"}"
    ));
    assert!(page.contains(
        "vllm:e2e_request_latency_seconds_bucket{model_name=\"kestrel-tiny-qwen35\",le=\"7680.0\"}"
    ));
    assert!(metric_in(&page, "vllm:generation_tokens_total").unwrap() >= 2.0);
}

/// `tool_choice` naming a function constrains the reply to a call of that
/// function (see tests/structured.rs for the arguments), streamed or not.
#[tokio::test]
async fn named_tool_choice_starts_the_call() {
    let base = shared_server();
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": false},
    }}]);
    let mut body = chat_body(false);
    body["max_tokens"] = json!(100);
    body["tools"] = tools;
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let (s, v) = post(base, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200, "{v}");
    let choice = &v["choices"][0];
    let msg = &choice["message"];
    let calls = msg["tool_calls"].as_array().expect("a tool call");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(
        msg.get("reasoning_content").is_none(),
        "thinking is off for a forced call"
    );

    // Streamed, the same call arrives.
    body["stream"] = json!(true);
    let (s, events) = post_stream(base, "/v1/chat/completions", &body).await;
    assert_eq!(s, 200);
    let arguments: String = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .flat_map(|c| {
            // A delta may carry several entries of one call (its name, then
            // a piece of its arguments).
            let calls = c["choices"][0]["delta"]["tool_calls"].as_array().cloned();
            calls
                .unwrap_or_default()
                .into_iter()
                .filter_map(|t| t["function"]["arguments"].as_str().map(String::from))
        })
        .collect();
    assert_eq!(
        arguments,
        calls[0]["function"]["arguments"].as_str().unwrap()
    );
}

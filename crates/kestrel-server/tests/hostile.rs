//! Malformed and hostile requests: each gets a 4xx with an OpenAI error
//! body, never a 5xx or a dropped connection, and the server keeps serving.

mod common;

use std::sync::OnceLock;

use common::*;
use serde_json::{Value, json};

const BODY_LIMIT: usize = 256 * 1024;

fn server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| spawn_server(|c| c.max_body_bytes = BODY_LIMIT))
}

fn msgs() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

/// Chat bodies that must be refused.
fn bad_chat_bodies() -> Vec<Value> {
    let mut v = vec![
        json!({}),
        json!({"messages": null}),
        json!({"messages": "hello"}),
        json!({"messages": [123]}),
        json!({"messages": [{}]}),
        json!({"messages": []}),
        json!({"messages": [{"role": 5, "content": "x"}]}),
        json!({"messages": [{"role": "user", "content": 5}]}),
        json!({"messages": [{"role": "user", "content": [1, 2]}]}),
        json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
        json!({"messages": [{"role": "wizard", "content": "x"}]}),
        json!({"messages": [{"role": "user"}], "model": 7}),
        json!({"messages": msgs(), "model": "other-model"}),
        json!({"messages": msgs(), "stream": "yes"}),
        json!({"messages": msgs(), "stream": false, "stream_options": {"include_usage": true}}),
        json!({"messages": msgs(), "stream": true, "stream_options": "x"}),
        json!({"messages": msgs(), "n": 17}),
        json!({"messages": msgs(), "n": 0}),
        json!({"messages": msgs(), "best_of": 2}),
        json!({"messages": msgs(), "logit_bias": {"1": 5}}),
        json!({"messages": msgs(), "logprobs": true, "top_logprobs": 21}),
        json!({"messages": msgs(), "top_logprobs": 5}),
        json!({"messages": msgs(), "tool_choice": "required", "tools": []}),
        json!({"messages": msgs(), "tools": "x"}),
        json!({"messages": msgs(), "tools": [{"type": "function"}]}),
        json!({"messages": msgs(), "tools": [{"type": "function", "function": {"name": 5}}]}),
        json!({"messages": msgs(), "response_format": {"type": "json_schema"}}),
        json!({"messages": msgs(), "response_format": "json"}),
        json!({"messages": msgs(), "chat_template_kwargs": "x"}),
        json!({"messages": msgs(), "chat_template_kwargs": {"enable_thinking": "yes"}}),
        json!({"messages": msgs(), "stop": 5}),
        json!({"messages": msgs(), "stop": [1, 2]}),
        json!({"messages": msgs(), "stop": ["a","b","c","d","e","f","g","h","i"]}),
        json!({"messages": msgs(), "seed": -1}),
        json!({"messages": msgs(), "seed": 1.5}),
        json!({"messages": msgs(), "seed": "1"}),
        json!({"messages": msgs(), "seed": 18446744073709551616.0}),
        json!({"messages": msgs(), "max_tokens": 0}),
        json!({"messages": msgs(), "max_tokens": -5}),
        json!({"messages": msgs(), "max_tokens": 1e30}),
        json!({"messages": msgs(), "max_tokens": "10"}),
        json!({"messages": msgs(), "max_tokens": 100000}),
        json!({"messages": msgs(), "max_completion_tokens": -1}),
        json!({"messages": msgs(), "min_tokens": -1}),
        json!({"messages": msgs(), "stop_token_ids": [-1]}),
        json!({"messages": msgs(), "stop_token_ids": [99999999999u64]}),
        json!({"messages": msgs(), "echo": true}),
        json!({"messages": msgs(), "functions": []}),
        json!({"messages": msgs(), "continue_final_message": true, "add_generation_prompt": false}),
    ];
    for (param, values) in [
        (
            "temperature",
            vec![json!(-0.1), json!(2.5), json!("hot"), json!(1e300)],
        ),
        ("top_p", vec![json!(0), json!(1.5), json!(-1), json!([])]),
        ("top_k", vec![json!(-2), json!(1.5), json!("5")]),
        ("min_p", vec![json!(-0.1), json!(1.1), json!({})]),
        ("presence_penalty", vec![json!(-3), json!(2.5), json!(true)]),
        ("frequency_penalty", vec![json!(-2.1), json!(9)]),
        ("repetition_penalty", vec![json!(0), json!(-1), json!("x")]),
    ] {
        for value in values {
            let mut b = json!({"messages": msgs()});
            b[param] = value;
            v.push(b);
        }
    }
    v
}

/// Raw bodies that are not valid JSON objects, or numbers JSON cannot hold.
fn bad_raw_bodies() -> Vec<Vec<u8>> {
    let mut v: Vec<Vec<u8>> = [
        "",
        " ",
        "{",
        "}",
        "[]",
        "null",
        "true",
        "42",
        "\"str\"",
        "{\"messages\":",
        "{\"messages\": [}",
        "{'messages': []}",
        "{\"temperature\": NaN, \"messages\": []}",
        "{\"temperature\": Infinity}",
        "{\"temperature\": -Infinity}",
        "{\"max_tokens\": 1e999}",
        "{\"a\":1,}",
        "\u{feff}{}",
        "{\"messages\":[{\"role\":\"user\",\"content\":\"\\ud800\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": nan}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    v.push(vec![0xff, 0xfe, 0x00]);
    v.push(b"{\"messages\": \"\xc3\x28\"}".to_vec());
    // Nesting deeper than the parser's limit.
    v.push(format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes());
    v.push(
        format!(
            "{{\"messages\": {}{}}}",
            "{\"a\":".repeat(5000),
            "1}".repeat(5000)
        )
        .into_bytes(),
    );
    v
}

fn bad_completion_bodies() -> Vec<Value> {
    vec![
        json!({}),
        json!({"prompt": null}),
        json!({"prompt": 5}),
        json!({"prompt": []}),
        json!({"prompt": [-1]}),
        json!({"prompt": [4096]}),
        json!({"prompt": [1, 2, 4294967296u64]}),
        json!({"prompt": [1.5]}),
        json!({"prompt": ["a", "b"]}),
        json!({"prompt": [[1], [2]]}),
        json!({"prompt": "x", "suffix": "y"}),
        json!({"prompt": "x", "echo": "yes"}),
        json!({"prompt": "x", "logprobs": 21}),
        json!({"prompt": "x", "prompt_logprobs": 21}),
        json!({"prompt": "x", "max_tokens": -1}),
        json!({"prompt": "x", "n": 17}),
        json!({"prompt": "x", "max_tokens": 5000}),
        json!({"prompt": "x", "temperature": -1}),
        json!({"prompt": "x", "model": "gpt-4"}),
        json!({"prompt": "x", "truncate_prompt_tokens": 0}),
        json!({"prompt": "x", "stream": 1}),
    ]
}

fn bad_tokenize_bodies() -> Vec<(&'static str, Value)> {
    vec![
        ("/tokenize", json!({})),
        ("/tokenize", json!({"prompt": 5})),
        ("/tokenize", json!({"prompt": "a", "messages": msgs()})),
        ("/tokenize", json!({"messages": "x"})),
        (
            "/tokenize",
            json!({"prompt": "a", "add_special_tokens": "yes"}),
        ),
        ("/tokenize", json!({"prompt": "a", "model": "nope"})),
        ("/detokenize", json!({})),
        ("/detokenize", json!({"tokens": "abc"})),
        ("/detokenize", json!({"tokens": [4096]})),
        ("/detokenize", json!({"tokens": [100000000]})),
        ("/detokenize", json!({"tokens": [-1]})),
        ("/detokenize", json!({"tokens": [1.5]})),
        ("/detokenize", json!({"tokens": [null]})),
        ("/detokenize", json!({"tokens": [1], "model": 3})),
    ]
}

async fn send_raw(
    base: &str,
    path: &str,
    body: Vec<u8>,
    content_type: Option<&str>,
) -> (u16, Value) {
    let mut r = client().post(format!("{base}{path}")).body(body);
    if let Some(ct) = content_type {
        r = r.header("content-type", ct);
    }
    let r = r
        .send()
        .await
        .unwrap_or_else(|e| panic!("{path}: connection failed: {e}"));
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn good_request_works(base: &str) {
    let (s, v) = post(
        base,
        "/v1/chat/completions",
        &json!({"messages": msgs(), "max_tokens": 3}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
}

#[tokio::test]
async fn malformed_requests_get_4xx_json() {
    let base = server();
    let mut count = 0;
    for body in bad_chat_bodies() {
        let (s, v) = send_raw(
            base,
            "/v1/chat/completions",
            body.to_string().into_bytes(),
            Some("application/json"),
        )
        .await;
        assert_client_error(s, &v, &format!("chat {body}"));
        count += 1;
    }
    for body in bad_raw_bodies() {
        for path in ["/v1/chat/completions", "/v1/completions", "/tokenize"] {
            let (s, v) = send_raw(base, path, body.clone(), Some("application/json")).await;
            assert_client_error(
                s,
                &v,
                &format!(
                    "{path} raw {:?}",
                    String::from_utf8_lossy(&body[..body.len().min(60)])
                ),
            );
            count += 1;
        }
    }
    for body in bad_completion_bodies() {
        let (s, v) = send_raw(
            base,
            "/v1/completions",
            body.to_string().into_bytes(),
            Some("application/json"),
        )
        .await;
        assert_client_error(s, &v, &format!("completion {body}"));
        count += 1;
    }
    for (path, body) in bad_tokenize_bodies() {
        let (s, v) = send_raw(
            base,
            path,
            body.to_string().into_bytes(),
            Some("application/json"),
        )
        .await;
        assert_client_error(s, &v, &format!("{path} {body}"));
        count += 1;
    }
    // Wrong media types.
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        let body = json!({"messages": msgs()}).to_string().into_bytes();
        let (s, v) = send_raw(base, "/v1/chat/completions", body, Some(ct)).await;
        assert_eq!(s, 415, "{ct}");
        assert_client_error(s, &v, ct);
        count += 1;
    }
    // Wrong methods and routes.
    let r = client()
        .get(format!("{base}/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 405);
    let r = client()
        .post(format!("{base}/v1/unknown"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    let v: Value = r.json().await.unwrap();
    assert_client_error(404, &v, "unknown route");
    count += 2;
    assert!(count >= 100, "only {count} hostile requests");
    good_request_works(base).await;
}

#[tokio::test]
async fn oversized_bodies_get_413() {
    let base = server();
    // Exactly the limit parses (and fails as JSON); one byte more is 413.
    let at_limit = vec![b' '; BODY_LIMIT];
    let (s, v) = send_raw(base, "/v1/completions", at_limit, Some("application/json")).await;
    assert_eq!(s, 400, "{v}");
    let mut big = format!("{{\"prompt\": \"{}", "a".repeat(BODY_LIMIT)).into_bytes();
    big.extend_from_slice(b"\"}");
    let (s, v) = send_raw(base, "/v1/completions", big, Some("application/json")).await;
    assert_eq!(s, 413, "{v}");
    assert_client_error(s, &v, "413");
    good_request_works(base).await;
}

/// Heads over the server's limits (64 KiB of headers, 100 header lines) get
/// a 431 with the route's error body, OpenAI's or, on `/v1/messages`,
/// Anthropic's, before authentication runs. hyper's own limits sit far
/// above (1 MiB, 1000 lines): past those it answers a bare 431 itself.
#[tokio::test]
async fn oversized_headers_get_431_with_an_error_body() {
    let base = server();
    for path in ["/v1/models", "/v1/messages", "/nowhere"] {
        let big = client()
            .get(format!("{base}{path}"))
            .header("x-big", "a".repeat(200 * 1024));
        let mut many = client().get(format!("{base}{path}"));
        for i in 0..300 {
            many = many.header(format!("x-h{i}"), "v");
        }
        for (what, req) in [("one 200 KiB header", big), ("300 headers", many)] {
            let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(r.status().as_u16(), 431, "{path} {what}");
            let v: Value = r.json().await.expect("a JSON body");
            if path == "/v1/messages" {
                assert_eq!(v["type"], "error", "{v}");
            }
            assert!(
                v["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("limit")),
                "{v}"
            );
        }
    }
    // Just under the limits is served.
    let mut near = client().get(format!("{base}/v1/models"));
    for i in 0..90 {
        near = near.header(format!("x-h{i}"), "v".repeat(600));
    }
    assert_eq!(near.send().await.unwrap().status().as_u16(), 200);
    // Past hyper's buffer: still a 431 (with hyper's empty body).
    let r = client()
        .get(format!("{base}/v1/models"))
        .header("x-big", "a".repeat(2 * 1024 * 1024))
        .send()
        .await
        .expect("answered, not dropped");
    assert_eq!(r.status().as_u16(), 431);
    good_request_works(base).await;
}

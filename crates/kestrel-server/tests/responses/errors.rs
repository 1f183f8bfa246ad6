//! `/v1/responses` requests that must fail or that try to break the
//! server: OpenAI error bodies naming the field, the stored-response
//! features refused, hostile inputs, a client leaving mid-stream.

use std::time::Duration;

use serde_json::{Value, json};

use super::common::*;
use super::{response_body, weather_tool};

#[tokio::test]
async fn bad_requests_get_openai_errors_and_the_server_stays_healthy() {
    let base = shared_server();
    let cases = [
        json!({"model": MODEL}),
        json!({"model": MODEL, "input": 7}),
        json!({"model": MODEL, "input": []}),
        json!({"model": MODEL, "input": "hi", "max_output_tokens": "8"}),
        json!({"model": MODEL, "input": "hi", "temperature": 9}),
        json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "nope"}]}]}),
        json!({"model": MODEL, "input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
        json!({"model": MODEL, "input": [{"role": "robot", "content": "hi"}]}),
        json!({"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "no json"}]}),
        json!({"model": MODEL, "input": [{"type": "function_call_output", "output": "x"}]}),
        json!({"model": MODEL, "input": [{"type": "item_reference", "id": "msg_1"}]}),
        json!({"model": MODEL, "input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:image/png;base64,"}]}]}),
        json!({"model": MODEL, "input": "hi", "tools": [{"type": "web_search_preview"}]}),
        json!({"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f", "parameters": 3}]}),
        json!({"model": MODEL, "input": "hi", "tools": [weather_tool()],
               "tool_choice": {"type": "function", "name": "missing"}}),
        json!({"model": MODEL, "input": "hi", "tool_choice": "required"}),
        json!({"model": MODEL, "input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}),
        json!({"model": MODEL, "input": "hi", "reasoning": {"effort": "maximal"}}),
        json!({"model": MODEL, "input": "hi", "background": true}),
        json!([1, 2]),
    ];
    for body in &cases {
        let (s, v) = post(base, "/v1/responses", body).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (s, v) = post(
        base,
        "/v1/responses",
        &json!({"model": MODEL, "input": "hi", "previous_response_id": "resp_123"}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(v["error"]["param"], "previous_response_id");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not store"),
        "{v}"
    );
    let (s, v) = post(
        base,
        "/v1/responses",
        &json!({"model": MODEL, "input": "hi", "max_output_tokens": 0}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("max_output_tokens")),
        "{v}"
    );
    let (s, v) = post(
        base,
        "/v1/responses",
        &json!({"model": "gpt-nope", "input": "hi"}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (404, Some("model_not_found")),
        "{v}"
    );
    let (s, _) = post(base, "/v1/responses", &response_body()).await;
    assert_eq!(s, 200);
    assert_eq!(get(base, "/health").await.0, 200);
}

/// Inputs an attacker or a broken client may send: each is answered (200
/// or a 4xx error body), and the server still serves afterwards.
#[tokio::test]
async fn hostile_inputs_are_answered_and_leave_the_server_healthy() {
    let base = shared_server();
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let many_items: Vec<Value> = (0..2000)
        .map(|i| json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": i.to_string()}]}))
        .chain([json!({"role": "user", "content": "hi"})])
        .collect();
    // (body, the status it must get; None: 200 or a client error).
    let cases = [
        (
            json!({"model": MODEL, "input": "nul \u{0} and <|im_end|> and </think>",
                "max_output_tokens": 2}),
            Some(200),
        ),
        (
            json!({"model": MODEL, "input": many_items, "max_output_tokens": 2}),
            Some(200),
        ),
        (
            json!({"model": MODEL, "input": [{"type": "function_call", "call_id": "c", "name": "f",
                "arguments": deep}]}),
            Some(400),
        ),
        (
            json!({"model": MODEL, "input": [{"type": "function_call_output", "call_id": "c",
                "output": {"a": 1}}]}),
            Some(400),
        ),
        (
            json!({"model": MODEL, "input": [{"type": null, "role": "user", "content": null}]}),
            Some(400),
        ),
        (
            json!({"model": MODEL, "input": "hi", "tools": [{"type": "function", "name": "f",
                "parameters": {"type": "object", "properties": {"x": {"$ref": "#/x"}}}}],
                "tool_choice": "required", "max_output_tokens": 4}),
            None,
        ),
        (
            json!({"model": MODEL, "input": "hi", "metadata": "not an object"}),
            Some(400),
        ),
        (
            json!({"model": MODEL, "input": "hi", "stream": "yes"}),
            Some(400),
        ),
        (
            json!({"model": MODEL, "input": "x ".repeat(100_000), "max_output_tokens": 2}),
            Some(400),
        ),
    ];
    for (body, expected) in &cases {
        let (s, v) = post(base, "/v1/responses", body).await;
        let what: String = body.to_string().chars().take(120).collect();
        match expected {
            Some(200) => assert_eq!(s, 200, "{what}: {v}"),
            Some(code) => {
                assert_eq!(s, *code, "{what}: {v}");
                assert_client_error(s, &v, &what);
            }
            None if s == 200 => {}
            None => assert_client_error(s, &v, &what),
        }
    }
    for raw in [
        "{",
        "null",
        "\"input\"",
        "{\"input\": \"hi\", \"input\": 3}",
    ] {
        let r = client()
            .post(format!("{base}/v1/responses"))
            .header("content-type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        assert_client_error(s, &v, raw);
    }
    // A client that leaves mid-stream aborts its request.
    let mut body = response_body();
    body["stream"] = json!(true);
    body["max_output_tokens"] = json!(400);
    let mut r = client()
        .post(format!("{base}/v1/responses"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    drop(r);
    wait_idle(base, Duration::from_secs(60)).await;
    let (s, _) = post(base, "/v1/responses", &response_body()).await;
    assert_eq!(s, 200);
}

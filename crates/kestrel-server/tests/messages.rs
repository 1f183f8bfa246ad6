//! `/v1/messages` and `/v1/messages/count_tokens` against a real server with
//! the bundled model: the answer's shape, the stream's event order, tool
//! use, Anthropic error bodies, and the prefix cache across Claude Code's
//! per-request billing line.

mod common;

use common::*;
use serde_json::{Value, json};

fn message_body() -> Value {
    json!({
        "model": MODEL,
        "max_tokens": 12,
        "temperature": 0,
        "system": "You write Python.",
        "thinking": {"type": "disabled"},
        "messages": [{"role": "user", "content": "def parse_args(argv):"}],
    })
}

/// The (event name, data) pairs of an Anthropic SSE body; every event's name
/// must equal its data's `type`.
fn anthropic_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty() && !e.starts_with(':'))
        .map(|e| {
            let (name, data) = e.split_once('\n').expect("event and data lines");
            let name = name
                .strip_prefix("event: ")
                .expect("event line")
                .to_string();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name.as_str(), "{e}");
            (name, data)
        })
        .collect()
}

async fn post_raw(base: &str, path: &str, body: &Value) -> (u16, String) {
    let r = client()
        .post(format!("{base}{path}"))
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test]
async fn a_message_has_anthropic_shape_and_usage() {
    let base = shared_server();
    let (s, v) = post(base, "/v1/messages", &message_body()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("msg_"));
    let output_tokens = v["usage"]["output_tokens"].as_u64().unwrap();
    let expected = if output_tokens == 12 {
        "max_tokens"
    } else {
        "end_turn"
    };
    assert_eq!(v["stop_reason"], expected, "{v}");
    assert!(v["stop_sequence"].is_null());
    let blocks = v["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 1, "thinking is off: {v}");
    assert_eq!(blocks[0]["type"], "text", "{v}");
    let (_, count) = post(base, "/v1/messages/count_tokens", &message_body()).await;
    let usage = &v["usage"];
    assert_eq!(
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_read_input_tokens"].as_u64().unwrap(),
        count["input_tokens"].as_u64().unwrap(),
        "{usage} vs {count}"
    );
}

#[tokio::test]
async fn the_stream_follows_anthropic_event_order_and_matches_the_message() {
    let base = shared_server();
    let (_, whole) = post(base, "/v1/messages", &message_body()).await;
    let mut body = message_body();
    body["stream"] = json!(true);
    let (s, text) = post_raw(base, "/v1/messages", &body).await;
    assert_eq!(s, 200, "{text}");
    let events = anthropic_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"]);
    assert_eq!(events[0].1["message"]["content"], json!([]));
    // Blocks open and close in turn, with deltas only inside an open block.
    let mut open: Option<u64> = None;
    let mut next = 0;
    let mut streamed = String::new();
    for (name, data) in &events[2..events.len() - 2] {
        match name.as_str() {
            "content_block_start" => {
                assert!(open.is_none(), "{names:?}");
                assert_eq!(data["index"], next);
                open = Some(next);
                next += 1;
            }
            "content_block_delta" => {
                assert_eq!(data["index"].as_u64(), open);
                if let Some(t) = data["delta"]["text"].as_str() {
                    streamed.push_str(t);
                }
            }
            "content_block_stop" => assert_eq!(data["index"].as_u64(), open.take()),
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(open.is_none());
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(
        delta["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    assert_eq!(
        streamed,
        whole["content"][0]["text"].as_str().unwrap(),
        "{whole}"
    );
}

#[tokio::test]
async fn a_stop_sequence_is_reported() {
    let base = shared_server();
    let (_, first) = post(base, "/v1/messages", &message_body()).await;
    let text = first["content"][0]["text"].as_str().unwrap().to_string();
    // A piece of the greedy answer, as a stop sequence, ends it there.
    let stop: String = text.trim().chars().skip(2).take(3).collect();
    let mut body = message_body();
    body["stop_sequences"] = json!([stop]);
    let (s, v) = post(base, "/v1/messages", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["stop_reason"], "stop_sequence", "{v} (stop {stop:?})");
    assert_eq!(v["stop_sequence"], stop.as_str());
}

fn weather_tools() -> Value {
    json!([{"name": "get_weather", "description": "Weather for a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}])
}

/// A history with a `tool_use` and its `tool_result` renders as the chat
/// template's tool call and tool response (the same prompt as the OpenAI
/// form through `/tokenize`), and a forced tool, whose call a grammar
/// constrains, answers with a `tool_use` block of that tool, or stops at
/// `max_tokens` inside the call.
#[tokio::test]
async fn a_tool_use_round_trip() {
    let base = shared_server();
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me check."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "20 C, sunny"},
            {"type": "text", "text": "And in Rome?"}]},
    ]);
    let mut body = json!({"model": MODEL, "max_tokens": 24, "temperature": 0,
        "tools": weather_tools(), "messages": history,
        "tool_choice": {"type": "tool", "name": "get_weather"}});
    let (_, count) = post(base, "/v1/messages/count_tokens", &body).await;
    let openai = json!({"model": MODEL, "chat_template_kwargs": {"enable_thinking": false},
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "Weather for a city", "parameters": weather_tools()[0]["input_schema"]}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [{"id": "toolu_1",
                "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "20 C, sunny"},
            {"role": "user", "content": [{"type": "text", "text": "And in Rome?"}]}]});
    let (s, tok) = post(base, "/tokenize", &openai).await;
    assert_eq!(s, 200, "{tok}");
    // The forced call turns thinking off; the prompt is the OpenAI form's.
    assert_eq!(
        count["input_tokens"].as_u64().unwrap(),
        tok["count"].as_u64().unwrap(),
        "{count} vs {tok}"
    );

    let (s, v) = post(base, "/v1/messages", &body).await;
    assert_eq!(s, 200, "{v}");
    let blocks = v["content"].as_array().unwrap();
    match blocks.iter().find(|b| b["type"] == "tool_use") {
        Some(call) => {
            assert_eq!(call["name"], "get_weather");
            assert!(call["input"].is_object());
            assert_eq!(v["stop_reason"], "tool_use");
        }
        None => assert_eq!(v["stop_reason"], "max_tokens", "{v}"),
    }
    body["stream"] = json!(true);
    let (s, text) = post_raw(base, "/v1/messages", &body).await;
    assert_eq!(s, 200);
    let events = anthropic_events(&text);
    assert_eq!(events.last().unwrap().0, "message_stop");
}

#[tokio::test]
async fn bad_requests_get_anthropic_errors_and_the_server_stays_healthy() {
    let base = shared_server();
    let user = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        json!({"model": MODEL, "messages": user}),
        json!({"model": MODEL, "max_tokens": "8", "messages": user}),
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "nope"}]}]}),
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]}),
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]}),
        json!({"model": MODEL, "max_tokens": 8, "messages": "hi"}),
        json!({"model": MODEL, "max_tokens": 8, "messages": user, "temperature": 9}),
        json!({"model": MODEL, "max_tokens": 8, "messages": user, "tools": [{"name": "f", "input_schema": 3}]}),
        json!({"model": MODEL, "max_tokens": 8, "messages": user, "system": [{"type": "tool_use", "id": "a", "name": "b"}]}),
        json!({"model": MODEL, "max_tokens": 8, "messages": user, "tools": weather_tools(),
            "tool_choice": {"type": "tool", "name": "missing"}}),
        json!({"model": MODEL, "max_tokens": 8, "messages": user, "tool_choice": {"type": "any"}}),
        json!([1, 2]),
    ];
    for body in &cases {
        let (s, v) = post(base, "/v1/messages", body).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert_eq!(v["type"], "error", "{v}");
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty())
        );
    }
    let (s, v) = post(
        base,
        "/v1/messages",
        &json!({"model": "claude-nope", "max_tokens": 8, "messages": user}),
    )
    .await;
    assert_eq!(
        (s, v["error"]["type"].as_str()),
        (404, Some("not_found_error")),
        "{v}"
    );
    let (s, v) = post(base, "/v1/messages/count_tokens", &json!({"model": MODEL})).await;
    assert_eq!((s, v["type"].as_str()), (400, Some("error")), "{v}");
    let (s, _) = post(base, "/v1/messages", &message_body()).await;
    assert_eq!(s, 200);
    assert_eq!(get(base, "/health").await.0, 200);
}

#[tokio::test]
async fn x_api_key_and_bearer_both_authenticate() {
    let base = spawn_server(|c| c.api_keys = vec!["sekret".into()]);
    let send = |h: Option<(&'static str, &'static str)>| {
        let mut r = client()
            .post(format!("{base}/v1/messages"))
            .json(&message_body());
        if let Some((k, v)) = h {
            r = r.header(k, v);
        }
        r.send()
    };
    let r = send(None).await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    assert_eq!(
        send(Some(("x-api-key", "wrong")))
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(
        send(Some(("x-api-key", "sekret")))
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let bearer = send(Some(("authorization", "Bearer sekret")))
        .await
        .unwrap();
    assert_eq!(bearer.status().as_u16(), 200);
}

/// Claude Code's system prompt starts with a billing line whose `cch` hash
/// changes every request. Dropped (the default), two requests that differ
/// only there share the cached prompt; kept, they share almost nothing.
#[tokio::test]
async fn the_billing_line_does_not_break_the_prefix_cache() {
    let instructions = "You are an agent that edits code. ".repeat(20);
    let body = |cch: &str| {
        json!({"model": MODEL, "max_tokens": 1, "temperature": 0,
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch={cch};")},
                {"type": "text", "text": instructions}],
            "messages": [{"role": "user", "content": "hello"}]})
    };
    let cached = |v: &Value| v["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    for strip in [true, false] {
        let base = spawn_server(|c| c.strip_billing_header = strip);
        let (s, first) = post(&base, "/v1/messages", &body("eb6c6")).await;
        assert_eq!(s, 200, "{first}");
        let (_, second) = post(&base, "/v1/messages", &body("71fea")).await;
        let prompt = cached(&second) + second["usage"]["input_tokens"].as_u64().unwrap();
        if strip {
            assert!(cached(&second) + 32 >= prompt, "strip: {second}");
            assert!(cached(&second) > 100, "strip: {second}");
        } else {
            assert!(cached(&second) < 32, "keep: {second}");
        }
    }
}

/// Claude Code's request shape: the beta query, adaptive thinking with a
/// `display`, `context_management`, `output_config`, a deferred tool, and
/// its environment notes as a `system` message after the first user turn.
/// It is answered with a well-formed stream, and the system message is in
/// the prompt where it was sent (the bundled template renders a system
/// turn there): the same prompt as the chat form's through `/tokenize`.
#[tokio::test]
async fn claude_codes_system_message_between_turns_is_rendered_in_place() {
    let base = shared_server();
    let placeholder = json!({"name": "Placeholder", "description": "Never call this.",
        "input_schema": {"type": "object", "properties": {}}, "defer_loading": true});
    let environment = "# Environment\n - Primary working directory: /work\n - Platform: linux";
    let mut body = json!({"model": MODEL, "max_tokens": 8, "stream": true,
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0.abc; cc_entrypoint=sdk-cli;"},
            {"type": "text", "text": "You are an agent.", "cache_control": {"type": "ephemeral"}}],
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "metadata": {"user_id": "{\"device_id\":\"d1\",\"session_id\":\"s1\"}"},
        "tools": [weather_tools()[0].clone(), placeholder],
        "messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
                {"type": "text", "text": "say hi"}]},
            {"role": "system", "content": [
                {"type": "text", "text": environment, "cache_control": {"type": "ephemeral"}}]}]});
    let (s, text) = post_raw(base, "/v1/messages?beta=true", &body).await;
    assert_eq!(s, 200, "{text}");
    let events = anthropic_events(&text);
    assert_eq!(events[0].0, "message_start");
    assert_eq!(events.last().unwrap().0, "message_stop");

    let (s, count) = post(base, "/v1/messages/count_tokens", &body).await;
    assert_eq!(s, 200, "{count}");
    let function = |t: &Value| {
        json!({"type": "function", "function": {"name": t["name"],
        "description": t["description"], "parameters": t["input_schema"]}})
    };
    let tools: Vec<Value> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(function)
        .collect();
    let chat = json!({"model": MODEL, "tools": tools,
        "chat_template_kwargs": {"enable_thinking": true},
        "messages": [
            {"role": "system", "content": "You are an agent."},
            {"role": "user", "content": [
                {"type": "text", "text": "<system-reminder>\nBe brief.\n</system-reminder>"},
                {"type": "text", "text": "say hi"}]},
            {"role": "system", "content": environment}]});
    let (s, tok) = post(base, "/tokenize", &chat).await;
    assert_eq!(s, 200, "{tok}");
    assert_eq!(count["input_tokens"], tok["count"], "{count} vs {tok}");

    body["messages"].as_array_mut().unwrap().pop();
    let (_, without) = post(base, "/v1/messages/count_tokens", &body).await;
    assert!(
        without["input_tokens"].as_u64().unwrap() + 10 < count["input_tokens"].as_u64().unwrap(),
        "{without} vs {count}"
    );
}

/// Past the context, `/v1/messages` words its 400 as Anthropic's API does:
/// Claude Code reads the three numbers of the first message to send the
/// request again with a `max_tokens` that fits (it asks for 32,000 and, at
/// a cut-off answer, 128,000).
#[tokio::test]
async fn context_overflows_are_worded_as_anthropic_words_them() {
    let base = shared_server();
    let (_, models) = get(base, "/v1/models").await;
    let models: Value = serde_json::from_str(&models).unwrap();
    let limit = models["data"][0]["max_model_len"].as_u64().unwrap();
    let mut body = message_body();
    let (_, count) = post(base, "/v1/messages/count_tokens", &body).await;
    let input = count["input_tokens"].as_u64().unwrap();
    body["max_tokens"] = json!(128000);
    let (s, v) = post(base, "/v1/messages", &body).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_eq!(
        v["error"]["message"],
        format!(
            "input length and `max_tokens` exceed context limit: {input} + 128000 > {limit}, \
             decrease input length or `max_tokens` and try again"
        )
    );
    // What just fits is answered (streamed, and left after the headers).
    body["max_tokens"] = json!(limit - input);
    body["stream"] = json!(true);
    let r = client()
        .post(format!("{base}/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    drop(r);
    body["stream"] = json!(false);

    body["max_tokens"] = json!(8);
    body["messages"] = json!([{"role": "user", "content": "word ".repeat(limit as usize + 100)}]);
    let (s, v) = post(base, "/v1/messages", &body).await;
    assert_eq!(s, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap();
    let rest = message.strip_prefix("prompt is too long: ").expect(message);
    let (tokens, max) = rest
        .strip_suffix(" maximum")
        .and_then(|r| r.split_once(" tokens > "))
        .expect(message);
    assert!(tokens.parse::<u64>().unwrap() >= limit, "{message}");
    assert_eq!(max.parse::<u64>().unwrap(), limit - 1, "{message}");
}

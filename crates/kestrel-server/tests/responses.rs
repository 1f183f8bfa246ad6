//! `/v1/responses` against a real server with the bundled model: the
//! response object, the stream's event order and its agreement with the
//! non-streamed response, reasoning items, a function-call round trip and
//! a json_schema text format; failures and hostile inputs in
//! `responses/errors.rs`.

mod common;
#[path = "responses/errors.rs"]
mod errors;

use common::*;
use serde_json::{Value, json};

pub(crate) fn response_body() -> Value {
    json!({
        "model": MODEL,
        "max_output_tokens": 12,
        "temperature": 0,
        "instructions": "You write Python.",
        "reasoning": {"effort": "none"},
        "input": "def parse_args(argv):",
    })
}

/// The (event name, data) pairs of a Responses SSE body; every event's name
/// equals its data's `type`, and sequence numbers count up from 0.
fn response_events(body: &str) -> Vec<(String, Value)> {
    let events: Vec<(String, Value)> = body
        .split("\n\n")
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
        .collect();
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i as u64, "{data}");
    }
    events
}

async fn post_text(base: &str, body: &Value) -> (u16, String) {
    let r = client()
        .post(format!("{base}/v1/responses"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

fn output_types(response: &Value) -> Vec<String> {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap().to_string())
        .collect()
}

/// The text of the response's message items.
fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["type"] == "message")
        .flat_map(|i| i["content"].as_array().unwrap().iter())
        .map(|p| p["text"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_response_has_the_responses_shape_and_usage() {
    let base = shared_server();
    let (s, v) = post(base, "/v1/responses", &response_body()).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"), "{v}");
    assert!(v["created_at"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["instructions"], "You write Python.");
    assert_eq!(v["store"], false, "nothing is stored: {v}");
    assert_eq!(v["max_output_tokens"], 12);
    let usage = &v["usage"];
    let output_tokens = usage["output_tokens"].as_u64().unwrap();
    if output_tokens == 12 {
        assert_eq!(v["status"], "incomplete", "{v}");
        assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    } else {
        assert_eq!(v["status"], "completed", "{v}");
        assert!(v["incomplete_details"].is_null());
    }
    assert_eq!(output_types(&v), ["message"], "thinking is off: {v}");
    let message = &v["output"][0];
    assert_eq!(message["role"], "assistant");
    assert!(message["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(message["content"][0]["type"], "output_text");
    assert!(!output_text(&v).is_empty());
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 0);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + output_tokens
    );
    // The prompt is the chat form's.
    let chat = json!({"model": MODEL, "chat_template_kwargs": {"enable_thinking": false},
        "messages": [{"role": "system", "content": "You write Python."},
                     {"role": "user", "content": "def parse_args(argv):"}]});
    let (_, tok) = post(base, "/tokenize", &chat).await;
    assert_eq!(usage["input_tokens"], tok["count"], "{usage} vs {tok}");
    // So is the text: greedy output through /v1/chat/completions.
    let mut chat = chat;
    chat["max_tokens"] = json!(12);
    chat["temperature"] = json!(0);
    let (_, c) = post(base, "/v1/chat/completions", &chat).await;
    assert_eq!(
        output_text(&v),
        c["choices"][0]["message"]["content"].as_str().unwrap()
    );
}

#[tokio::test]
async fn the_stream_follows_the_event_order_and_matches_the_response() {
    let base = shared_server();
    let (_, whole) = post(base, "/v1/responses", &response_body()).await;
    let mut body = response_body();
    body["stream"] = json!(true);
    let (s, text) = post_text(base, &body).await;
    assert_eq!(s, 200, "{text}");
    let events = response_events(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        &names[..2],
        ["response.created", "response.in_progress"],
        "{names:?}"
    );
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert_eq!(events[0].1["response"]["output"], json!([]));
    let (last, done) = events.last().unwrap();
    assert_eq!(
        *last,
        format!("response.{}", whole["status"].as_str().unwrap())
    );
    let done = &done["response"];
    // Items open and close in turn; text deltas only inside an open part.
    let mut open: Option<u64> = None;
    let mut part_open = false;
    let mut streamed = String::new();
    for (name, data) in &events[2..events.len() - 1] {
        match name.as_str() {
            "response.output_item.added" => {
                assert!(open.is_none(), "{names:?}");
                open = data["output_index"].as_u64();
            }
            "response.content_part.added" => part_open = true,
            "response.output_text.delta" => {
                assert!(part_open);
                assert_eq!(data["output_index"].as_u64(), open);
                streamed.push_str(data["delta"].as_str().unwrap());
            }
            "response.output_text.done" => assert_eq!(data["text"], streamed.as_str()),
            "response.content_part.done" => part_open = false,
            "response.output_item.done" => {
                assert_eq!(data["output_index"].as_u64(), open.take());
                assert_eq!(
                    data["item"],
                    done["output"][data["output_index"].as_u64().unwrap() as usize]
                );
            }
            other => panic!("unexpected event {other}"),
        }
    }
    assert!(open.is_none() && !part_open);
    assert_eq!(streamed, output_text(&whole), "{whole}");
    assert_eq!(done["status"], whole["status"]);
    assert_eq!(
        done["usage"]["output_tokens"],
        whole["usage"]["output_tokens"]
    );
    assert_eq!(output_types(done), output_types(&whole));
}

/// With thinking on the bundled template opens a think block, so the first
/// tokens are reasoning: a `reasoning` item with its text, and counted
/// reasoning tokens.
#[tokio::test]
async fn reasoning_comes_back_as_a_reasoning_item() {
    let base = shared_server();
    let mut body = response_body();
    body["reasoning"] = json!({"effort": "medium", "summary": "auto"});
    let (s, v) = post(base, "/v1/responses", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(output_types(&v)[0], "reasoning", "{v}");
    let item = &v["output"][0];
    assert!(item["id"].as_str().unwrap().starts_with("rs_"));
    assert_eq!(item["content"][0]["type"], "reasoning_text");
    assert!(!item["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(v["reasoning"]["effort"], "medium");
    let usage = &v["usage"];
    let reasoning = usage["output_tokens_details"]["reasoning_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        reasoning > 0 && reasoning <= usage["output_tokens"].as_u64().unwrap(),
        "{usage}"
    );
    body["stream"] = json!(true);
    let (_, text) = post_text(base, &body).await;
    let events = response_events(&text);
    let deltas: String = events
        .iter()
        .filter(|(n, _)| n == "response.reasoning_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, item["content"][0]["text"].as_str().unwrap());
}

/// The city is bounded: forced calls on the bundled model are XML, whose
/// values are raw text, and the tiny model does not end a free text of its
/// own accord.
pub(crate) fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object",
                          "properties": {"city": {"type": "string", "maxLength": 12}},
                          "required": ["city"]}})
}

/// A history with a `function_call` and its `function_call_output` renders
/// as the chat template's tool call and tool response (the same prompt as
/// the chat form through `/tokenize`); a forced function, whose call a
/// grammar constrains, answers with a `function_call` item of that
/// function, and that item can be sent back with its output.
#[tokio::test]
async fn a_function_call_round_trip() {
    let base = shared_server();
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "20 C, sunny"},
        {"role": "user", "content": [{"type": "input_text", "text": "And in Rome?"}]},
    ]);
    let mut body = json!({"model": MODEL, "max_output_tokens": 160, "temperature": 0,
        "tools": [weather_tool()], "input": history,
        "tool_choice": {"type": "function", "name": "get_weather"}});
    let chat = json!({"model": MODEL, "chat_template_kwargs": {"enable_thinking": false},
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "description": "Weather for a city", "parameters": weather_tool()["parameters"]}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "20 C, sunny"},
            {"role": "user", "content": [{"type": "text", "text": "And in Rome?"}]}]});
    let (s, tok) = post(base, "/tokenize", &chat).await;
    assert_eq!(s, 200, "{tok}");

    let (s, v) = post(base, "/v1/responses", &body).await;
    assert_eq!(s, 200, "{v}");
    // The forced call turns thinking off; the prompt is the chat form's.
    assert_eq!(v["usage"]["input_tokens"], tok["count"], "{v} vs {tok}");
    assert_eq!(v["tool_choice"]["name"], "get_weather");
    assert_eq!(v["tools"][0]["name"], "get_weather");
    // Greedy, the grammar-constrained call ends well within the limit.
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(output_types(&v), ["function_call"], "{v}");
    let call = &v["output"][0];
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["status"], "completed");
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{call}");

    body["stream"] = json!(true);
    let (s, text) = post_text(base, &body).await;
    assert_eq!(s, 200);
    let events = response_events(&text);
    let done = &events.last().unwrap().1["response"];
    assert_eq!(output_types(done), output_types(&v));
    let args_done = events
        .iter()
        .find(|(n, _)| n == "response.function_call_arguments.done")
        .expect("arguments done event");
    assert_eq!(args_done.1["arguments"], call["arguments"]);
    assert_eq!(args_done.1["name"], "get_weather");
    // The call goes back with its output: the next turn is accepted.
    let mut input = history.as_array().unwrap().clone();
    input.push(call.clone());
    input.push(
        json!({"type": "function_call_output", "call_id": call["call_id"],
                      "output": [{"type": "input_text", "text": "25 C"}]}),
    );
    let next = json!({"model": MODEL, "max_output_tokens": 4, "tools": [weather_tool()],
                      "input": input, "store": false});
    let (s, next) = post(base, "/v1/responses", &next).await;
    assert_eq!(s, 200, "{next}");
    assert!(
        next["usage"]["input_tokens"].as_u64() > v["usage"]["input_tokens"].as_u64(),
        "{next}"
    );
}

/// `text.format` reuses the structured-output grammars: the text is JSON
/// of the schema, and the format is echoed in the Responses form.
#[tokio::test]
async fn a_json_schema_text_format_constrains_the_text() {
    let base = shared_server();
    let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                        "required": ["answer"], "additionalProperties": false});
    let mut body = response_body();
    body["max_output_tokens"] = json!(64);
    body["text"] = json!({"format": {"type": "json_schema", "name": "verdict", "strict": true,
                                     "schema": schema}});
    let (s, v) = post(base, "/v1/responses", &body).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    let answer: Value = serde_json::from_str(&output_text(&v)).unwrap();
    assert!(
        ["yes", "no"].contains(&answer["answer"].as_str().unwrap()),
        "{v}"
    );
    assert_eq!(answer.as_object().unwrap().len(), 1);
    assert_eq!(v["text"]["format"]["name"], "verdict");
    assert_eq!(v["text"]["format"]["schema"], schema);
}

//! Structured outputs through the HTTP API with the bundled model: JSON
//! schemas, regexes and choices constrain what comes back, forced tool
//! calls name a declared tool with valid arguments, a grammar that does not
//! compile is a 400 that leaves the server healthy, and speculation does
//! not change constrained output.
//!
//! The schemas bound every string, number and array, so that even a model
//! that never closes anything of its own must complete them within
//! `max_tokens`: every output must then parse and validate, with no
//! allowance for a `length` finish.

mod common;
#[path = "structured/schema_check.rs"]
mod schema_check;

use common::*;
use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
use serde_json::{Value, json};

/// The test schemas: nested objects, arrays, enums, required, anyOf.
fn schemas() -> Vec<Value> {
    let name = json!({"type": "string", "maxLength": 12});
    let small = json!({"type": "integer", "minimum": 0, "maximum": 99});
    vec![
        json!({
            "type": "object",
            "properties": {"name": name, "age": small},
            "required": ["name", "age"],
            "additionalProperties": false,
        }),
        json!({
            "type": "object",
            "properties": {
                "user": {
                    "type": "object",
                    "properties": {"id": small, "tags": {
                        "type": "array", "items": name, "minItems": 1, "maxItems": 3,
                    }},
                    "required": ["id", "tags"],
                    "additionalProperties": false,
                },
                "active": {"type": "boolean"},
            },
            "required": ["user", "active"],
            "additionalProperties": false,
        }),
        json!({
            "type": "object",
            "properties": {"color": {"enum": ["red", "green", "blue"]}, "size": {"enum": [1, 2, 3]}},
            "required": ["color", "size"],
            "additionalProperties": false,
        }),
        json!({
            "type": "object",
            "properties": {"value": {"anyOf": [
                {"type": "object", "properties": {"n": small}, "required": ["n"], "additionalProperties": false},
                {"type": "string", "maxLength": 8},
                {"type": "null"},
            ]}},
            "required": ["value"],
            "additionalProperties": false,
        }),
        json!({
            "type": "array",
            "items": {"enum": ["a", "b"]},
            "minItems": 2,
            "maxItems": 4,
        }),
    ]
}

fn chat(content: &str) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 200,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    })
}

/// The sampling settings each case runs with: greedy, and seeded sampling
/// with every filter on (the mask comes before all of them).
fn samplings() -> [Value; 2] {
    [
        json!({"temperature": 0}),
        json!({"temperature": 0.9, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 7}),
    ]
}

fn merge(mut body: Value, extra: &Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn json_schema_output_parses_and_validates() {
    let base = shared_server();
    for schema in schemas() {
        for sampling in samplings() {
            let mut body = merge(chat("Describe a person as JSON."), &sampling);
            body["response_format"] = json!({"type": "json_schema", "json_schema": {
                "name": "answer", "schema": schema, "strict": true,
            }});
            let (status, v) = post(base, "/v1/chat/completions", &body).await;
            assert_eq!(status, 200, "{v}");
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "stop", "{schema}: {v}");
            let content = choice["message"]["content"].as_str().unwrap();
            let parsed: Value = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("{schema}: {content:?} is not JSON: {e}"));
            if let Err(e) = schema_check::check(&parsed, &schema) {
                panic!("{schema}: {content} does not validate: {e}");
            }
        }
    }
}

#[tokio::test]
async fn json_object_and_the_vllm_json_fields_give_json() {
    let base = shared_server();
    let schema = schemas().remove(2);
    let cases = [
        json!({"response_format": {"type": "json_object"}, "max_tokens": 400}),
        json!({"guided_json": schema}),
        json!({"structured_outputs": {"json": schema}}),
        json!({"guided_json": schema.to_string()}),
    ];
    for case in cases {
        let (status, v) = post(
            base,
            "/v1/chat/completions",
            &merge(chat("JSON please"), &case),
        )
        .await;
        assert_eq!(status, 200, "{case}: {v}");
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        if v["choices"][0]["finish_reason"] == "stop" {
            let parsed: Value = serde_json::from_str(content)
                .unwrap_or_else(|e| panic!("{case}: {content:?}: {e}"));
            if case.get("response_format").is_none() {
                schema_check::check(&parsed, &schema).unwrap();
            } else {
                assert!(parsed.is_object(), "{content}");
            }
        } else {
            // json_object has no bounds of its own: a length finish is the
            // model's, but what came is the start of an object.
            assert!(case.get("response_format").is_some(), "{case}: {v}");
            assert!(content.starts_with('{'), "{content}");
        }
    }
}

#[tokio::test]
async fn regex_and_choice_constrain_chat_and_completions() {
    let base = shared_server();
    let re = "[0-9]{3}-[a-z]{2,4}";
    let (s, v) = post(
        base,
        "/v1/completions",
        &json!({
            "model": MODEL, "prompt": "The code is", "max_tokens": 30, "temperature": 0,
            "guided_regex": re,
        }),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(matches_code(text), "{text:?} does not match {re}");

    let choices = ["sunny", "rainy", "cloudy with a chance"];
    for sampling in samplings() {
        let mut body = merge(chat("What is the weather?"), &sampling);
        body["structured_outputs"] = json!({"choice": choices});
        let (s, v) = post(base, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(choices.contains(&content), "{content:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let (s, v) = post(
        base,
        "/v1/completions",
        &json!({
            "model": MODEL, "prompt": "Answer:", "max_tokens": 10, "guided_choice": ["yes", "no"],
        }),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(
        ["yes", "no"].contains(&v["choices"][0]["text"].as_str().unwrap()),
        "{v}"
    );
}

/// Whether `text` matches `[0-9]{3}-[a-z]{2,4}` in full.
fn matches_code(text: &str) -> bool {
    let (digits, letters) = text.split_at(text.len().min(3));
    digits.len() == 3
        && digits.bytes().all(|b| b.is_ascii_digit())
        && letters.strip_prefix('-').is_some_and(|l| {
            (2..=4).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_lowercase())
        })
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": false,
        }}},
        {"type": "function", "function": {"name": "add", "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}, "b": {"type": "integer", "minimum": 0, "maximum": 9}},
            "required": ["a", "b"],
            "additionalProperties": false,
        }}},
    ])
}

/// Every call names a declared tool and its arguments validate against
/// that tool's schema.
fn assert_valid_calls(v: &Value, only: Option<&str>) {
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"]
        .as_array()
        .expect("tool calls");
    assert!(!calls.is_empty());
    let tools = tools();
    for call in calls {
        let name = call["function"]["name"].as_str().unwrap();
        if let Some(only) = only {
            assert_eq!(name, only);
        }
        let tool = tools
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["function"]["name"] == name)
            .unwrap_or_else(|| panic!("{name} is not a declared tool"));
        let args: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        schema_check::check(&args, &tool["function"]["parameters"]).unwrap();
    }
}

#[tokio::test]
async fn forced_tool_calls_name_a_declared_tool_with_valid_arguments() {
    let base = shared_server();
    for sampling in samplings() {
        let mut body = merge(chat("What's the weather in Paris?"), &sampling);
        body["tools"] = tools();
        body["tool_choice"] = json!("required");
        body["parallel_tool_calls"] = json!(false);
        let (s, v) = post(base, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        assert_valid_calls(&v, None);

        body["tool_choice"] = json!({"type": "function", "function": {"name": "add"}});
        let (s, v) = post(base, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{v}");
        assert_valid_calls(&v, Some("add"));
    }
}

#[tokio::test]
async fn a_grammar_that_does_not_compile_is_a_400_and_the_server_stays_healthy() {
    let base = shared_server();
    let bad = [
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}}),
        json!({"guided_regex": "(unclosed"}),
        json!({"guided_grammar": "start: undefined_rule"}),
        json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
        json!({"guided_choice": []}),
        json!({"structured_outputs": {"structural_tag": "x"}}),
    ];
    for case in bad {
        let (s, v) = post(base, "/v1/chat/completions", &merge(chat("hi"), &case)).await;
        assert_client_error(s, &v, &case.to_string());
    }
    let (s, v) = post(base, "/v1/chat/completions", &chat("hi")).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(get(base, "/health").await.0, 200);
    wait_idle(base, std::time::Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculation_does_not_change_constrained_output() {
    let plain = spawn_server(|_| {});
    let spec = spawn_server(|c| {
        c.speculative = Some(SpeculativeConfig {
            method: SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
            num_speculative_tokens: 3,
        })
    });
    let mut cases: Vec<Value> = schemas()
        .into_iter()
        .map(|schema| json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}))
        .collect();
    cases.push(json!({"tools": tools(), "tool_choice": "required"}));
    for case in cases {
        for sampling in samplings() {
            for stream in [false, true] {
                let mut body = merge(merge(chat("Give me data."), &case), &sampling);
                body["stream"] = json!(stream);
                let want = output(&plain, &body).await;
                let got = output(&spec, &body).await;
                assert_eq!(got, want, "{case} {sampling} stream {stream}");
            }
        }
    }
    let drafts = metric(&spec, "vllm:spec_decode_num_draft_tokens_total").await;
    assert!(drafts > 0.0, "no drafts were verified");
}

/// The raw text a chat request produced (the content and the tool calls'
/// arguments, streamed or not).
async fn output(base: &str, body: &Value) -> String {
    if body["stream"] == json!(true) {
        let (s, events) = post_stream(base, "/v1/chat/completions", body).await;
        assert_eq!(s, 200);
        // Speculative steps deliver several tokens a chunk: compare the
        // concatenations, not the chunks.
        let (mut content, mut calls, mut finish) = (String::new(), String::new(), String::new());
        for chunk in events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        {
            let choice = &chunk["choices"][0];
            content.push_str(choice["delta"]["content"].as_str().unwrap_or(""));
            for call in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                calls.push_str(call["function"]["name"].as_str().unwrap_or(""));
                calls.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
            finish.push_str(choice["finish_reason"].as_str().unwrap_or(""));
        }
        format!("{content:?} {calls} {finish}")
    } else {
        let (s, v) = post(base, "/v1/chat/completions", body).await;
        assert_eq!(s, 200, "{v}");
        let m = &v["choices"][0]["message"];
        let calls: Vec<Value> = m["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c["function"].clone())
            .collect();
        format!(
            "{} {:?} {}",
            m["content"], calls, v["choices"][0]["finish_reason"]
        )
    }
}

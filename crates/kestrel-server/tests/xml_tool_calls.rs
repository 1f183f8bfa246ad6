//! Forced tool calls on the bundled model, whose chat template writes calls
//! in the Qwen3.5/3.6 XML format: the model is constrained to that format
//! (the generated tokens spell `<function=...>`), and the call that comes
//! back, streamed or not, names a declared tool with arguments valid
//! against its schema.

mod common;
#[path = "structured/schema_check.rs"]
mod schema_check;

use common::*;
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit"],
            "additionalProperties": false,
        }}},
        {"type": "function", "function": {"name": "record", "parameters": {
            "type": "object",
            "properties": {
                "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 2},
                "note": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]},
            },
            "required": ["ok", "tags", "note"],
            "additionalProperties": false,
        }}},
    ])
}

fn body(choice: Value, sampling: &Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Call a tool."}],
        "max_tokens": 400,
        "chat_template_kwargs": {"enable_thinking": false},
        "tools": tools(),
        "tool_choice": choice,
        "parallel_tool_calls": false,
        "logprobs": true,
    });
    for (k, v) in sampling.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn check_call(name: &str, arguments: &str, only: Option<&str>) {
    if let Some(only) = only {
        assert_eq!(name, only);
    }
    let tools = tools();
    let tool = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not a declared tool"));
    let args: Value = serde_json::from_str(arguments)
        .unwrap_or_else(|e| panic!("{arguments:?} is not JSON: {e}"));
    if let Err(e) = schema_check::check(&args, &tool["function"]["parameters"]) {
        panic!("{name}({arguments}) is not valid: {e}");
    }
}

#[tokio::test]
async fn forced_calls_use_the_xml_format_and_validate() {
    let base = shared_server();
    let samplings = [
        json!({"temperature": 0}),
        json!({"temperature": 1.0, "top_p": 0.95, "seed": 11}),
        json!({"temperature": 1.0, "seed": 12}),
    ];
    let choices = [
        (json!("required"), None),
        (
            json!({"type": "function", "function": {"name": "record"}}),
            Some("record"),
        ),
    ];
    for sampling in &samplings {
        for (choice, only) in &choices {
            let (s, v) = post(
                base,
                "/v1/chat/completions",
                &body(choice.clone(), sampling),
            )
            .await;
            assert_eq!(s, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{v}");
            let raw: String = c["logprobs"]["content"]
                .as_array()
                .expect("logprobs")
                .iter()
                .map(|t| t["token"].as_str().unwrap())
                .collect();
            assert!(raw.contains("<function="), "not the XML format: {raw:?}");
            let calls = c["message"]["tool_calls"].as_array().expect("tool calls");
            assert_eq!(calls.len(), 1, "{v}");
            let f = &calls[0]["function"];
            check_call(
                f["name"].as_str().unwrap(),
                f["arguments"].as_str().unwrap(),
                *only,
            );
        }
    }
}

#[tokio::test]
async fn streamed_forced_calls_validate_and_match_the_whole_response() {
    let base = shared_server();
    for seed in [1, 2, 3] {
        let mut request = body(
            json!("required"),
            &json!({"temperature": 1.0, "seed": seed}),
        );
        request["logprobs"] = json!(false);
        let (s, whole) = post(base, "/v1/chat/completions", &request).await;
        assert_eq!(s, 200, "{whole}");
        request["stream"] = json!(true);
        let (s, events) = post_stream(base, "/v1/chat/completions", &request).await;
        assert_eq!(s, 200);
        let (mut name, mut arguments, mut finish) = (String::new(), String::new(), String::new());
        for chunk in events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        {
            let choice = &chunk["choices"][0];
            for call in choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
            {
                assert_eq!(call["index"], 0);
                name.push_str(call["function"]["name"].as_str().unwrap_or(""));
                arguments.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            }
            finish.push_str(choice["finish_reason"].as_str().unwrap_or(""));
        }
        assert_eq!(finish, "tool_calls");
        check_call(&name, &arguments, None);
        let f = &whole["choices"][0]["message"]["tool_calls"][0]["function"];
        assert_eq!(f["name"], name.as_str());
        assert_eq!(f["arguments"], arguments.as_str());
    }
}

//! The hostile bodies for `/v1/responses`, each with what its error
//! message must say.

use serde_json::{Value, json};

use super::cases::{Case, Expect, nested_arrays, over_context};
use super::common::MODEL;

fn response(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_output_tokens": 8, "input": "hi"});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn with_input(items: Value) -> Value {
    response(json!({ "input": items }))
}

fn function_call() -> Value {
    json!({"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"})
}

pub fn cases() -> Vec<Case> {
    use Expect::Refused;
    let bodies = [
        // Malformed input items.
        (with_input(json!([5])), "input[0]"),
        (with_input(json!(["a string"])), "input[0]"),
        (with_input(json!([null])), "input[0]"),
        (with_input(json!([[]])), "input[0]"),
        (with_input(json!([{"type": "message"}])), "role"),
        (
            with_input(json!([{"type": "message", "role": "user"}])),
            "content",
        ),
        (
            with_input(json!([{"role": "user", "content": 5}])),
            "content",
        ),
        (
            with_input(json!([{"role": "user", "content": [5]}])),
            "content part 0",
        ),
        (
            with_input(json!([{"role": "user", "content": [{"type": "input_text", "text": 5}]}])),
            "content part 0",
        ),
        (
            with_input(json!({"role": "user", "content": "not in a list"})),
            "input",
        ),
        // Unknown item types.
        (
            with_input(json!([{"type": "web_search_call", "id": "ws_1"}])),
            "unknown variant",
        ),
        (
            with_input(json!([{"type": "computer_call_output", "call_id": "c"}])),
            "unknown variant",
        ),
        (with_input(json!([{"type": 5}])), "input[0]"),
        // Function calls and their outputs.
        (
            with_input(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
            "call_id",
        ),
        (
            with_input(json!([{"type": "function_call", "call_id": "c", "arguments": "{}"}])),
            "name",
        ),
        (
            with_input(
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
            ),
            "arguments",
        ),
        (
            with_input(
                json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
            ),
            "arguments",
        ),
        (
            with_input(
                json!([{"type": "function_call_output", "call_id": "call_nope", "output": "20 C"}]),
            ),
            "call_nope",
        ),
        (
            with_input(
                json!([function_call(), {"type": "function_call_output", "call_id": "call_2", "output": "20 C"}]),
            ),
            "call_2",
        ),
        (
            with_input(
                json!([function_call(), {"type": "function_call_output", "call_id": 1, "output": "x"}]),
            ),
            "call_id",
        ),
        (
            with_input(
                json!([function_call(), {"type": "function_call_output", "call_id": "call_1"}]),
            ),
            "output",
        ),
        // Wrong types.
        (
            response(json!({"max_output_tokens": -1})),
            "max_output_tokens",
        ),
        (
            response(json!({"max_output_tokens": 2.5})),
            "max_output_tokens",
        ),
        (
            response(json!({"max_output_tokens": "8"})),
            "max_output_tokens",
        ),
        (response(json!({"temperature": "hot"})), "temperature"),
        (response(json!({"temperature": 3})), "temperature"),
        (response(json!({"top_p": 5})), "top_p"),
        (response(json!({"instructions": 5})), "instructions"),
        (response(json!({"tools": "x"})), "tools"),
        (
            response(json!({"tools": [{"type": "function", "name": 5}]})),
            "name",
        ),
        (response(json!({"tool_choice": 5})), "tool_choice"),
        (
            response(json!({"parallel_tool_calls": "yes"})),
            "parallel_tool_calls",
        ),
        (
            response(json!({"text": {"format": {"type": "bogus"}}})),
            "text.format",
        ),
        (response(json!({"text": "json"})), "text"),
        (response(json!({"reasoning": "high"})), "reasoning"),
        (response(json!({"include": "x"})), "include"),
        (response(json!({"store": "no"})), "store"),
        (response(json!({"stream": 1})), "stream"),
        (response(json!({"input": null})), "input"),
        (response(json!({"input": over_context()})), "context"),
    ];
    let mut cases: Vec<Case> = bodies
        .into_iter()
        .map(|(body, says)| Case::new("/v1/responses", body, Refused(says)))
        .collect();
    let deep = nested_arrays(10_000, "1");
    cases.push(Case {
        path: "/v1/responses",
        body: format!(r#"{{"model":"{MODEL}","input":[{{"role":"user","content":{deep}}}]}}"#),
        expect: Refused("recursion limit"),
    });
    cases
}

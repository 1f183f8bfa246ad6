//! Seeded fuzzing of what requests and model output reach: the tool-call
//! parsers (JSON and XML; streamed in random chunk splits must equal one
//! shot), the reasoning parser, and the request validators of every route
//! (bodies mutated from valid ones). None may panic; a validator's answer
//! is a value or an error, both fine.
//!
//! `KESTREL_FUZZ_ITERS` sets the iterations per target (default 300, for
//! `cargo test`); `KESTREL_FUZZ_SEED` the seed. Runs are deterministic for
//! a seed, so a failure names the iteration that reproduces it.

use kestrel_api::reasoning::ReasoningParser;
use kestrel_api::tools::{ToolCallAccumulator, ToolCallParser, parse_complete};
use kestrel_api::{Tool, ValidationOptions, parse_chat_request, parse_completion_request};
use serde_json::{Value, json};

#[path = "support/fuzz_harness.rs"]
mod fuzz_harness;

use fuzz_harness::{Rng, fuzz};

/// Pieces model output is made of: the tags of both call formats and of
/// reasoning, their fragments, JSON, whitespace and multi-byte text.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n",
    "\n</tool_call>",
    "<function=",
    "<function=f>",
    "<function=get>",
    "</function>",
    "<parameter=",
    "<parameter=a>",
    "<parameter=n>",
    "</parameter>",
    "<think>",
    "</think>",
    "<",
    ">",
    "/",
    "=",
    "\n",
    " ",
    "\t",
    "{",
    "}",
    "[",
    "]",
    "\"",
    ":",
    ",",
    "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"get\"",
    "\"arguments\": \"{\\\"n\\\": 2}\"",
    "null",
    "None",
    "true",
    "1",
    "-2.5e3",
    "abc",
    "é",
    "日本",
    "🦀",
    "\u{0}",
    "\\",
    "<tool_",
    "call>",
    "</tool",
    "<param",
    "eter=",
    "</para",
    "meter>",
];

fn random_output(rng: &mut Rng) -> String {
    (0..rng.below(40))
        .map(|_| *rng.pick(PIECES))
        .collect::<Vec<_>>()
        .concat()
}

/// Splits `text` at random character boundaries.
fn random_chunks(rng: &mut Rng, text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        current.push(c);
        if rng.below(4) == 0 {
            chunks.push(std::mem::take(&mut current));
        }
    }
    chunks.push(current);
    chunks
}

fn tools() -> Vec<Tool> {
    let parameters = json!({"type": "object", "properties": {
        "a": {"type": "integer"}, "n": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    }});
    ["f", "get"]
        .iter()
        .map(|name| Tool {
            name: name.to_string(),
            description: None,
            parameters: parameters.clone(),
            raw: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
        })
        .collect()
}

#[test]
fn tool_call_parsers_stream_as_they_parse_whole() {
    let tools = tools();
    fuzz("tool calls", |rng| {
        let text = random_output(rng);
        let parallel = rng.below(2) == 0;
        let whole = parse_complete(&text, &tools, parallel);
        let mut parser = ToolCallParser::new(&tools, parallel);
        let mut acc = ToolCallAccumulator::default();
        let mut content = String::new();
        for chunk in random_chunks(rng, &text) {
            let step = parser.push(&chunk);
            content.push_str(&step.content);
            step.tool_calls.iter().for_each(|d| acc.push(d));
        }
        let end = parser.finish();
        content.push_str(&end.delta.content);
        end.delta.tool_calls.iter().for_each(|d| acc.push(d));
        let mut calls = acc.into_calls();
        if let Some(i) = end.incomplete_call {
            calls.truncate(i as usize);
        }
        assert_eq!(
            whole.content.clone().unwrap_or_default(),
            content,
            "{text:?}"
        );
        assert_eq!(whole.tool_calls.len(), calls.len(), "{text:?}");
        for (a, b) in whole.tool_calls.iter().zip(&calls) {
            assert_eq!(a.function, b.function, "{text:?}");
            // Completed calls' arguments are JSON objects.
            let args: Value = serde_json::from_str(&a.function.arguments)
                .unwrap_or_else(|e| panic!("{text:?}: arguments {:?}: {e}", a.function.arguments));
            assert!(args.is_object(), "{text:?}");
        }
    });
}

#[test]
fn the_reasoning_parser_streams_as_it_parses_whole() {
    fuzz("reasoning", |rng| {
        let text = random_output(rng);
        let starts_in_reasoning = rng.below(2) == 0;
        let run = |chunks: &[String]| {
            let mut parser = ReasoningParser::new(starts_in_reasoning);
            let (mut reasoning, mut content) = (String::new(), String::new());
            for chunk in chunks {
                let d = parser.push(chunk);
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
            }
            let d = parser.finish();
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            (reasoning, content)
        };
        let whole = run(std::slice::from_ref(&text));
        let streamed = run(&random_chunks(rng, &text));
        assert_eq!(whole, streamed, "{text:?}");
    });
}

/// Valid bodies of each route, the seeds of mutation.
fn seed_bodies() -> Vec<(&'static str, Value)> {
    let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string"}}}}}]);
    vec![
        (
            "chat",
            json!({"model": "m", "messages": [{"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": \"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}],
            "tools": tools, "tool_choice": "auto", "temperature": 0.7, "top_p": 0.9,
            "max_tokens": 16, "stop": ["x"], "stream": true,
            "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x",
                "schema": {"type": "object"}}}, "seed": 3,
            "chat_template_kwargs": {"enable_thinking": false}}),
        ),
        (
            "completion",
            json!({"model": "m", "prompt": "a b", "max_tokens": 4,
            "logprobs": 1, "suffix": null, "guided_regex": "[a-z]+", "n": 1,
            "frequency_penalty": 0.5, "repetition_penalty": 1.1}),
        ),
        (
            "messages",
            json!({"model": "m", "max_tokens": 8, "system": [{"type": "text", "text": "s"}],
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
                {"type": "tool_use", "id": "t", "name": "f", "input": {"a": "x"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                    "content": "ok", "is_error": false}]}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"},
            "stop_sequences": ["z"], "temperature": 1}),
        ),
        (
            "responses",
            json!({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "hi"}]}, {"type": "function_call", "call_id": "c",
            "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c",
            "output": "ok"}], "instructions": "be brief", "max_output_tokens": 9,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "text": {"format": {"type": "json_object"}}, "reasoning": {"effort": "low"},
            "stream": false}),
        ),
    ]
}

/// Replacement values: wrong types, extremes, odd strings, nesting.
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 10 } else { 13 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!(rng.next() as i64),
        3 => json!(*rng.pick(&[0.0, -1.0, 1e308, -1e-308, 2.5, 21.0, 1e19])),
        4 => json!(*rng.pick(&[u64::MAX, 0, 1, 20, 21, 257, 1 << 40])),
        5 => json!(*rng.pick(&[
            "",
            "user",
            "assistant",
            "tool",
            "auto",
            "required",
            "none",
            "json_schema",
            "text",
            "\u{0}",
            "🦀",
            "<think>",
            "function"
        ])),
        6 => json!(*rng.pick(&[-1i64, -2, i64::MIN, 2, 3])),
        7 | 8 => json!(random_output(rng)),
        9 => json!({}),
        10 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "type",
                "role",
                "content",
                "text",
                "name",
                "function",
                "arguments",
                "schema",
                "json_schema",
                "properties",
                "messages",
                "id",
                "input",
                "format",
            ];
            Value::Object(
                (0..rng.below(4))
                    .map(|_| (rng.pick(&keys).to_string(), random_value(rng, depth + 1)))
                    .collect(),
            )
        }
    }
}

/// One mutation somewhere in `v`: replace, delete, insert or duplicate.
fn mutate(rng: &mut Rng, v: &mut Value, depth: usize) {
    let descend = depth < 6 && rng.below(3) != 0;
    match v {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if descend && let Some(child) = map.get_mut(&key) {
                return mutate(rng, child, depth + 1);
            }
            match rng.below(3) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, random_value(rng, depth));
                }
                _ => {
                    let extra = [
                        "max_tokens",
                        "n",
                        "best_of",
                        "logit_bias",
                        "stream",
                        "tools",
                        "tool_choice",
                        "top_k",
                        "min_p",
                        "unknown_key",
                        "structured_outputs",
                    ];
                    map.insert(rng.pick(&extra).to_string(), random_value(rng, depth));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.below(items.len());
            if descend {
                return mutate(rng, &mut items[i], depth + 1);
            }
            match rng.below(3) {
                0 => drop(items.remove(i)),
                1 => items[i] = random_value(rng, depth),
                _ => {
                    let copy = items[i].clone();
                    items.insert(i, copy);
                }
            }
        }
        other => *other = random_value(rng, depth),
    }
}

#[test]
fn validators_answer_mutated_bodies_without_panicking() {
    let seeds = seed_bodies();
    // Everything the server supports on, so mutations reach every check.
    let opts = ValidationOptions {
        max_n: 8,
        logprobs_supported: true,
        structured_outputs_supported: true,
        forced_tool_choice_supported: true,
        ..ValidationOptions::default()
    };
    // The seeds themselves are valid: the mutations start from accepted requests.
    for (route, body) in &seeds {
        let err = match *route {
            "chat" => parse_chat_request(body, &opts).err(),
            "completion" => parse_completion_request(body, &opts).err(),
            "messages" => kestrel_api::anthropic::parse_messages_body(body, true).err(),
            _ => kestrel_api::responses::parse_responses_body(body).err(),
        };
        assert!(err.is_none(), "the {route} seed is not valid: {err:?}");
    }
    let (mut accepted, mut rejected) = (0u64, 0u64);
    fuzz("validators", |rng| {
        let (route, seed) = rng.pick(&seeds);
        let mut body = seed.clone();
        for _ in 0..1 + rng.below(4) {
            mutate(rng, &mut body, 0);
        }
        let ok = match *route {
            "chat" => parse_chat_request(&body, &opts).is_ok(),
            "completion" => parse_completion_request(&body, &opts).is_ok(),
            "messages" => kestrel_api::anthropic::parse_messages_body(&body, true).is_ok(),
            _ => kestrel_api::responses::parse_responses_body(&body).is_ok(),
        };
        if ok {
            accepted += 1
        } else {
            rejected += 1
        }
        // The raw-bytes path too: the body as sent, and cut short.
        let bytes = body.to_string().into_bytes();
        let _ = kestrel_api::parse_json_body(&bytes);
        let _ = kestrel_api::parse_json_body(&bytes[..rng.below(bytes.len() + 1)]);
    });
    eprintln!("validators: {accepted} accepted, {rejected} rejected");
}

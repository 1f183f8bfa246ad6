//! The Responses -> chat translation, checked through the chat validator so
//! a translation the pipeline would refuse fails here, and the builder's
//! event sequence.

use serde_json::{Value, json};

use super::request::parse_responses_body;
use super::{ResponseBuilder, ResponseUsage, in_responses_terms};
use crate::types::sse::DeltaParts;
use crate::types::{FinishReason, FunctionCallDelta, ToolCallDelta, Usage};
use crate::validate::{ValidationOptions, parse_chat_request};

fn chat(body: Value) -> Result<Value, crate::ApiError> {
    parse_responses_body(&body)?.to_chat_body()
}

fn options() -> ValidationOptions {
    ValidationOptions {
        forced_tool_choice_supported: true,
        structured_outputs_supported: true,
        ..Default::default()
    }
}

#[test]
fn a_tool_round_trip_becomes_assistant_tool_calls_and_tool_messages() {
    let body = json!({
        "model": "m",
        "instructions": "Be brief.",
        "max_output_tokens": 16,
        "store": false,
        "reasoning": {"effort": "none"},
        "tools": [{"type": "function", "name": "get_weather", "description": "d", "strict": true,
                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": false,
        "input": [
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "call it"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "20C"},
            {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow?"}]},
        ],
    });
    let c = chat(body).unwrap();
    let m = c["messages"].as_array().unwrap();
    assert_eq!(m.len(), 5, "{m:?}");
    assert_eq!(
        m[0],
        json!({"role": "system", "content": "Be brief.\n\nUse tools."})
    );
    assert_eq!(m[2]["content"], "Checking.");
    assert_eq!(m[2]["reasoning_content"], "call it");
    assert_eq!(m[2]["tool_calls"][0]["id"], "c1");
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "c1", "content": "20C"})
    );
    assert_eq!(m[4]["content"][0]["text"], "And tomorrow?");
    assert_eq!(c["tool_choice"]["function"]["name"], "get_weather");
    assert_eq!(c["tools"][0]["function"]["strict"], true);
    assert_eq!(c["chat_template_kwargs"]["enable_thinking"], false);
    let req = parse_chat_request(&c, &options()).unwrap();
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(req.sampling.max_tokens, Some(16));
    assert!(!req.parallel_tool_calls);
    assert_eq!(req.messages[2].tool_calls[0].name, "get_weather");
}

#[test]
fn a_string_input_reasoning_effort_and_text_format_translate() {
    let c = chat(json!({"input": "hi", "reasoning": {"effort": "high"},
        "text": {"format": {"type": "json_schema", "name": "r", "strict": true,
                            "schema": {"type": "object"}}}}))
    .unwrap();
    assert_eq!(c["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(c["chat_template_kwargs"]["enable_thinking"], true);
    assert_eq!(c["response_format"]["json_schema"]["name"], "r");
    let req = parse_chat_request(&c, &options()).unwrap();
    assert!(req.structured_output.is_some());
    let none = chat(json!({"input": "hi", "reasoning": {"summary": "auto"}})).unwrap();
    assert!(none.get("chat_template_kwargs").is_none(), "{none}");
}

#[test]
fn malformed_bodies_are_refused_naming_the_field() {
    let cases = [
        (json!({}), "input"),
        (json!({"input": 5}), "input"),
        (
            json!({"input": "x", "max_output_tokens": 0}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "max_output_tokens": "9"}),
            "max_output_tokens",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            json!({"input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": [{"role": "tool", "content": "x"}]}),
            "input[0].role",
        ),
        (json!({"input": ["x"]}), "input[0]"),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"type": "web_search_call"}]}),
            "input[0].type",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0]",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "nope"}]}]}),
            "input[0].content",
        ),
        (
            json!({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}),
            "input[0]",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function"}]}),
            "tools[0].name",
        ),
        (
            json!({"input": "x", "tool_choice": {"type": "file_search"}}),
            "tool_choice.type",
        ),
        (
            json!({"input": "x", "reasoning": {"effort": "extreme"}}),
            "reasoning.effort",
        ),
        (
            json!({"input": "x", "text": {"format": {"type": "yaml"}}}),
            "text.format.type",
        ),
        (json!({"input": "x", "truncation": "auto"}), "truncation"),
    ];
    for (body, param) in cases {
        let e = chat(body.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        assert_eq!(e.kind, crate::ErrorKind::InvalidRequest);
        assert!(!e.message.is_empty());
    }
    let e = chat(json!({"input": "x", "previous_response_id": "resp_1"})).unwrap_err();
    assert!(e.message.contains("does not store"), "{e:?}");
}

#[test]
fn chat_validation_errors_name_the_responses_field() {
    let c =
        chat(json!({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]}))
            .unwrap();
    let e = in_responses_terms(parse_chat_request(&c, &options()).unwrap_err());
    assert_eq!(e.param.as_deref(), Some("tools[0].parameters"), "{e:?}");
    let c = chat(json!({"input": []})).unwrap();
    let e = in_responses_terms(parse_chat_request(&c, &options()).unwrap_err());
    assert_eq!(e.param.as_deref(), Some("input"), "{e:?}");
}

fn events(out: &[String]) -> Vec<(String, Value)> {
    out.iter()
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (name.strip_prefix("event: ").unwrap().to_string(), data)
        })
        .collect()
}

fn call(id: Option<&str>, args: &str) -> ToolCallDelta {
    ToolCallDelta {
        index: 0,
        id: id.map(str::to_string),
        kind: None,
        function: FunctionCallDelta {
            name: id.map(|_| "get".to_string()),
            arguments: Some(args.into()),
        },
    }
}

#[test]
fn reasoning_text_and_a_call_stream_as_three_items_in_order() {
    let echo = parse_responses_body(&json!({"input": "x"})).unwrap().echo();
    let mut b = ResponseBuilder::new("r1", "m", 7, echo);
    let mut out = b.start();
    for parts in [
        DeltaParts {
            reasoning: "hmm".into(),
            ..Default::default()
        },
        DeltaParts {
            content: "Hi".into(),
            ..Default::default()
        },
        DeltaParts {
            content: "\n\n".into(),
            ..Default::default()
        },
        DeltaParts {
            tool_calls: vec![call(Some("call_1"), "")],
            ..Default::default()
        },
        DeltaParts {
            tool_calls: vec![call(None, "{\"a\":1}")],
            ..Default::default()
        },
    ] {
        out.extend(b.delta(parts));
    }
    let usage = ResponseUsage::from_chat(&Usage::new(5, 9, Some(2)), 1);
    out.extend(b.finish(FinishReason::ToolCalls, usage));
    let ev = events(&out);
    let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (name, data)) in ev.iter().enumerate() {
        assert_eq!(data["type"], name.as_str());
        assert_eq!(data["sequence_number"], i as u64);
    }
    assert_eq!(ev[12].1["text"], "Hi\n\n");
    assert_eq!(ev[17].1["arguments"], "{\"a\":1}");
    assert_eq!(ev[17].1["output_index"], 2);
    let r = b.response();
    assert_eq!(r, ev.last().unwrap().1["response"]);
    assert_eq!(r["id"], "resp_r1");
    assert_eq!(r["status"], "completed");
    let types: Vec<&str> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["reasoning", "message", "function_call"]);
    assert_eq!(r["output"][0]["content"][0]["text"], "hmm");
    assert_eq!(r["output"][2]["call_id"], "call_1");
    assert_eq!(r["usage"]["total_tokens"], 14);
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 2);
    assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 1);
}

/// A step that ends the open call and goes on with text (a finding of the
/// SSE fuzzer): the call gets its last arguments before the text closes it.
#[test]
fn arguments_that_end_the_open_call_come_before_the_text_after_it() {
    let mut b = ResponseBuilder::new("r3", "m", 7, Default::default());
    b.start();
    b.delta(DeltaParts {
        tool_calls: vec![call(Some("call_1"), "{\"a\":")],
        ..Default::default()
    });
    b.delta(DeltaParts {
        content: "Done.".into(),
        tool_calls: vec![call(None, "1}")],
        ..Default::default()
    });
    b.finish(FinishReason::Stop, ResponseUsage::default());
    let r = b.response();
    assert_eq!(r["output"][0]["arguments"], "{\"a\":1}");
    assert_eq!(r["output"][1]["content"][0]["text"], "Done.");
}

#[test]
fn the_token_limit_makes_the_response_incomplete() {
    let echo = parse_responses_body(&json!({"input": "x"})).unwrap().echo();
    let mut b = ResponseBuilder::new("r2", "m", 7, echo);
    b.start();
    let mut out = b.delta(DeltaParts {
        content: "\n".into(),
        ..Default::default()
    });
    assert!(out.is_empty(), "whitespace alone opens no message");
    out.extend(b.delta(DeltaParts {
        content: "def".into(),
        ..Default::default()
    }));
    out.extend(b.finish(FinishReason::Length, ResponseUsage::default()));
    let ev = events(&out);
    assert_eq!(ev.last().unwrap().0, "response.incomplete");
    let r = b.response();
    assert_eq!(r["status"], "incomplete");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["output"][0]["status"], "incomplete");
    assert_eq!(r["output"][0]["content"][0]["text"], "\ndef");
}

#[test]
fn a_function_call_output_must_answer_an_earlier_call() {
    let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
    let output = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "ok"});
    let body = |input: Value| json!({"input": input});
    assert!(chat(body(json!([call, output("c1")]))).is_ok());
    for input in [json!([output("c1")]), json!([call, output("c2")])] {
        let e = chat(body(input.clone())).unwrap_err();
        assert!(e.message.contains("call_id"), "{input}: {e:?}");
    }
    // A known item type's error names its field.
    let e = chat(body(
        json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {}}]),
    ))
    .unwrap_err();
    assert_eq!(e.param.as_deref(), Some("input[0].arguments"), "{e:?}");
}

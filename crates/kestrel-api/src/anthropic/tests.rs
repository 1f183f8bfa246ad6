//! The Messages -> chat translation, checked through the chat validator so a
//! translation the pipeline would refuse fails here.

use serde_json::{Value, json};

use super::request::{Normalization, parse_messages_body};
use crate::validate::{ValidationOptions, parse_chat_request};

fn chat(body: Value) -> Result<Value, crate::ApiError> {
    parse_messages_body(&body, true)?.to_chat_body(Normalization::default())
}

#[test]
fn a_tool_round_trip_becomes_assistant_tool_calls_and_tool_messages() {
    let body = json!({
        "model": "m",
        "max_tokens": 16,
        "system": [{"type": "text", "text": "Be brief."}],
        "tools": [{"name": "get_weather", "description": "d",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "thinking": {"type": "disabled"},
        "stop_sequences": ["END"],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "call it", "signature": "x"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "20C"}]},
                {"type": "text", "text": "And tomorrow?"}]},
        ],
    });
    let c = chat(body).unwrap();
    let m = c["messages"].as_array().unwrap();
    assert_eq!(m.len(), 5, "{m:?}");
    assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
    assert_eq!(m[2]["reasoning_content"], "call it");
    assert_eq!(
        m[2]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    assert_eq!(
        m[3],
        json!({"role": "tool", "tool_call_id": "t1", "content": "20C"})
    );
    assert_eq!(m[4]["role"], "user");
    assert_eq!(c["tool_choice"], "required");
    assert_eq!(c["parallel_tool_calls"], false);
    assert_eq!(c["chat_template_kwargs"]["enable_thinking"], false);
    assert_eq!(c["stop"], json!(["END"]));
    let opts = ValidationOptions {
        forced_tool_choice_supported: true,
        ..Default::default()
    };
    let req = parse_chat_request(&c, &opts).unwrap();
    assert_eq!(req.tools[0].name, "get_weather");
    assert_eq!(req.sampling.max_tokens, Some(16));
    assert_eq!(req.enable_thinking, Some(false));
}

#[test]
fn malformed_bodies_are_refused_naming_the_field() {
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": msgs}), "max_tokens"),
        (json!({"max_tokens": "5", "messages": msgs}), "max_tokens"),
        (
            json!({"max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]}),
            "messages[1].content",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video"}]}]}),
            "messages[0].content",
        ),
        (
            json!({"max_tokens": 5, "messages": [{"role": "user", "content": 7}]}),
            "messages[0].content",
        ),
        (
            json!({"max_tokens": 5, "messages": msgs, "tool_choice": {"type": "sometimes"}}),
            "tool_choice.type",
        ),
    ];
    for (body, param) in cases {
        let e = chat(body.clone()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        assert_eq!(e.kind, crate::ErrorKind::InvalidRequest);
    }
    let image = json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]});
    let e = chat(image).unwrap_err();
    assert!(e.message.contains("not supported"), "{e:?}");
    let server_tool = json!({"max_tokens": 5, "messages": msgs,
        "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    assert_eq!(
        chat(server_tool).unwrap_err().param.as_deref(),
        Some("tools[0].type")
    );
}

#[test]
fn the_billing_header_line_is_dropped_unless_switched_off() {
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}],
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.100.7b4; cc_entrypoint=cli; cch=eb6c6;"},
            {"type": "text", "text": "You are a coding agent.\nx-anthropic-billing-header: cch=1;\nBe careful."}]});
    let req = parse_messages_body(&body, true).unwrap();
    let on = req.to_chat_body(Normalization::default()).unwrap();
    assert_eq!(
        on["messages"][0]["content"],
        "You are a coding agent.\nBe careful."
    );
    let off = req
        .to_chat_body(Normalization {
            strip_billing_header: false,
            ..Normalization::default()
        })
        .unwrap();
    assert!(
        off["messages"][0]["content"]
            .as_str()
            .unwrap()
            .starts_with("x-anthropic-billing-header: cc_version")
    );
}

#[test]
fn a_tool_result_must_answer_a_tool_use_of_the_previous_message() {
    let call = json!({"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}});
    let result = |id: &str| json!([{"type": "tool_result", "tool_use_id": id, "content": "ok"}]);
    let body = |messages: Value| json!({"max_tokens": 8, "messages": messages});
    let answered = body(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": result("toolu_1")},
    ]));
    assert!(chat(answered).is_ok());
    for messages in [
        json!([{"role": "user", "content": result("toolu_1")}]),
        json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": [call]},
               {"role": "user", "content": result("toolu_2")}]),
        // Only the message right before counts.
        json!([{"role": "user", "content": "go"}, {"role": "assistant", "content": [call]},
               {"role": "user", "content": result("toolu_1")},
               {"role": "assistant", "content": "done"},
               {"role": "user", "content": result("toolu_1")}]),
    ] {
        let e = chat(body(messages.clone())).unwrap_err();
        assert!(e.message.contains("tool_use_id"), "{messages}: {e:?}");
        assert!(
            e.param.as_deref().unwrap().starts_with("messages["),
            "{e:?}"
        );
    }
    let not_an_object = body(json!([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]},
    ]));
    let e = chat(not_an_object).unwrap_err();
    assert!(e.message.contains("input must be an object"), "{e:?}");
}

#[test]
fn system_messages_join_the_system_prompt_or_stay_in_place_or_join_the_user_turn() {
    // Claude Code's shape: its environment notes as a `system` message
    // after the first user turn, and one between a tool call and its result.
    let body = json!({"max_tokens": 8, "system": "You are an agent.",
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}}]},
        {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}, {"type": "text", "text": "cwd: /w"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
        {"role": "system", "content": "New tools."},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]},
        {"role": "system", "content": []},
    ]});
    let req = parse_messages_body(&body, true).unwrap();

    let in_place = req.to_chat_body(Normalization::default()).unwrap();
    assert_eq!(
        in_place["messages"],
        json!([
            {"role": "system", "content": "You are an agent.\n\nRules."},
            {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
            {"role": "system", "content": "# Environment\ncwd: /w"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "system", "content": "New tools."},
            {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        ])
    );

    let folded = req
        .to_chat_body(Normalization {
            late_system_messages: false,
            ..Normalization::default()
        })
        .unwrap();
    assert_eq!(
        folded["messages"],
        json!([
            {"role": "system", "content": "You are an agent.\n\nRules."},
            {"role": "user", "content": [{"type": "text", "text": "say hi"},
                                         {"type": "text", "text": "# Environment\ncwd: /w"}]},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "user", "content": [{"type": "text", "text": "New tools."}]},
            {"role": "tool", "tool_call_id": "t1", "content": "ok"},
        ])
    );
    for chat in [in_place, folded] {
        parse_chat_request(&chat, &ValidationOptions::default()).unwrap();
    }
}

#[test]
fn thinking_is_on_only_when_asked_for() {
    let body = |thinking: Option<Value>| {
        let mut b = json!({"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        if let Some(t) = thinking {
            b["thinking"] = t;
        }
        chat(b).unwrap()["chat_template_kwargs"]["enable_thinking"].clone()
    };
    assert_eq!(body(None), false);
    assert_eq!(body(Some(json!({"type": "disabled"}))), false);
    assert_eq!(
        body(Some(json!({"type": "enabled", "budget_tokens": 1024}))),
        true
    );
    assert_eq!(
        body(Some(json!({"type": "adaptive", "display": "omitted"}))),
        true
    );
}

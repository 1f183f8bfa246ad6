//! The cases' form, and the hostile bodies for `/v1/messages` and
//! `/v1/messages/count_tokens`, each with what its error message must say.

use serde_json::{Value, json};

use super::common::MODEL;

/// What a hostile request must get.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// A 4xx in the route's error shape whose message contains this
    /// (compared without case).
    Refused(&'static str),
    /// A 200, or a 4xx in the route's error shape: legal requests that are
    /// costly to serve (a huge but valid schema).
    ServedOrRefused,
}

pub struct Case {
    pub path: &'static str,
    /// Raw JSON text: some bodies nest deeper than `serde_json` would
    /// build or print.
    pub body: String,
    pub expect: Expect,
}

impl Case {
    pub fn new(path: &'static str, body: Value, expect: Expect) -> Self {
        Case {
            path,
            body: body.to_string(),
            expect,
        }
    }

    /// The path and the start of the body, for failure messages.
    pub fn what(&self) -> String {
        let start: String = self.body.chars().take(160).collect();
        format!("{} {start}", self.path)
    }
}

/// `n` levels of `[` ... `]` around `inner`, as JSON text.
pub fn nested_arrays(n: usize, inner: &str) -> String {
    format!("{}{inner}{}", "[".repeat(n), "]".repeat(n))
}

/// A prompt well over the bundled model's context.
pub fn over_context() -> String {
    "many words ".repeat(20_000)
}

fn user() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

fn message(extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "max_tokens": 8, "messages": user()});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn with_content(blocks: Value) -> Value {
    message(json!({"messages": [{"role": "user", "content": blocks}]}))
}

/// An assistant turn with `blocks`, then a user turn.
fn after_assistant(blocks: Value, reply: Value) -> Value {
    message(json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": reply},
    ]}))
}

fn tool_use() -> Value {
    json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}})
}

pub fn messages() -> Vec<Case> {
    use Expect::Refused;
    let bodies = [
        // Malformed content blocks.
        (
            with_content(json!([{"type": "text", "text": 5}])),
            "content block 0",
        ),
        (with_content(json!([{"text": "no type"}])), "type"),
        (with_content(json!([5])), "content block 0"),
        (with_content(json!(["a string"])), "content block 0"),
        (with_content(json!([null])), "content block 0"),
        (
            with_content(json!({"type": "text", "text": "not in a list"})),
            "content",
        ),
        (with_content(json!(null)), "content"),
        (with_content(json!(42)), "content"),
        (
            with_content(json!([{"type": "text", "text": "a"}, {"type": "text"}])),
            "content block 1",
        ),
        // Unknown block types.
        (
            with_content(json!([{"type": "video", "url": "x"}])),
            "unknown variant",
        ),
        (
            with_content(json!([{"type": "server_tool_use", "id": "s", "name": "web"}])),
            "unknown variant",
        ),
        (with_content(json!([{"type": ""}])), "unknown variant"),
        // tool_use and tool_result out of place or incomplete.
        (
            after_assistant(
                json!([{"type": "tool_use", "name": "get_weather", "input": {}}]),
                json!("ok"),
            ),
            "id",
        ),
        (
            after_assistant(
                json!([{"type": "tool_use", "id": "t", "input": {}}]),
                json!("ok"),
            ),
            "name",
        ),
        (
            after_assistant(
                json!([{"type": "tool_use", "id": 7, "name": "f", "input": {}}]),
                json!("ok"),
            ),
            "id",
        ),
        (
            after_assistant(
                json!([{"type": "tool_use", "id": "t", "name": "f", "input": "x"}]),
                json!("ok"),
            ),
            "input",
        ),
        (with_content(json!([tool_use()])), "tool_use"),
        (
            after_assistant(
                json!([tool_use()]),
                json!([{"type": "tool_result", "content": "20 C"}]),
            ),
            "tool_use_id",
        ),
        (
            after_assistant(
                json!([tool_use()]),
                json!([{"type": "tool_result", "tool_use_id": "toolu_unknown", "content": "20 C"}]),
            ),
            "toolu_unknown",
        ),
        (
            message(
                json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]}]}),
            ),
            "toolu_1",
        ),
        (
            after_assistant(
                json!([tool_use()]),
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "content": 5}]),
            ),
            "content",
        ),
        (
            after_assistant(
                json!([tool_use()]),
                json!([{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": "yes"}]),
            ),
            "content block 0",
        ),
        (
            after_assistant(
                json!([{"type": "tool_result", "tool_use_id": "x"}]),
                json!("ok"),
            ),
            "tool_result",
        ),
        // Wrong types.
        (message(json!({"max_tokens": -1})), "max_tokens"),
        (message(json!({"max_tokens": 1.5})), "max_tokens"),
        (message(json!({"max_tokens": 1e30})), "max_tokens"),
        (message(json!({"max_tokens": [8]})), "max_tokens"),
        (message(json!({"max_tokens": 0})), "max_tokens"),
        (message(json!({"max_tokens": null})), "max_tokens"),
        (message(json!({"temperature": "hot"})), "temperature"),
        (message(json!({"temperature": -1})), "temperature"),
        (message(json!({"temperature": [0.5]})), "temperature"),
        (message(json!({"top_p": "x"})), "top_p"),
        (message(json!({"top_k": 1.5})), "top_k"),
        (message(json!({"stop_sequences": "stop"})), "stop_sequences"),
        (message(json!({"stop_sequences": [1, 2]})), "stop_sequences"),
        (message(json!({"stop_sequences": [null]})), "stop_sequences"),
        (message(json!({"stream": "yes"})), "stream"),
        (message(json!({"system": 5})), "system"),
        (
            message(json!({"system": [{"type": "image", "source": {}}]})),
            "image",
        ),
        (message(json!({"messages": []})), "messages"),
        (message(json!({"messages": null})), "messages"),
        (
            message(json!({"messages": [{"role": "system", "content": "x"}]})),
            "role",
        ),
        (message(json!({"messages": [{"role": "user"}]})), "content"),
        (message(json!({"tools": "x"})), "tools"),
        (message(json!({"tools": [{"name": 5}]})), "name"),
        (
            message(json!({"tools": [{"type": "bash_20250124", "name": "bash"}]})),
            "bash",
        ),
        (message(json!({"tool_choice": "auto"})), "tool_choice"),
        (
            message(json!({"thinking": {"type": "enabled", "budget_tokens": -1}})),
            "thinking",
        ),
        (message(json!({"thinking": "on"})), "thinking"),
        (message(json!({"metadata": "x"})), "metadata"),
        // Too long for the context, in Anthropic's words (clients read them).
        (
            message(json!({"system": over_context()})),
            "prompt is too long",
        ),
        (
            with_content(json!([{"type": "text", "text": over_context()}])),
            "prompt is too long",
        ),
    ];
    let mut cases: Vec<Case> = bodies
        .into_iter()
        .map(|(body, says)| Case::new("/v1/messages", body, Refused(says)))
        .collect();
    // A missing max_tokens is an error on /v1/messages only.
    let mut body = message(json!({}));
    body.as_object_mut().unwrap().remove("max_tokens");
    cases.push(Case::new("/v1/messages", body, Refused("max_tokens")));
    for (body, says) in [
        (with_content(json!([{"type": "nope"}])), "unknown variant"),
        (
            with_content(json!([{"type": "text", "text": 5}])),
            "content block 0",
        ),
        (message(json!({"messages": "hi"})), "messages"),
        (message(json!({"temperature": "hot"})), "temperature"),
        (json!({"model": MODEL}), "messages"),
    ] {
        cases.push(Case::new("/v1/messages/count_tokens", body, Refused(says)));
    }
    // Nesting past the JSON parser's limit, in a block and in a schema.
    let deep = nested_arrays(10_000, "1");
    for path in ["/v1/messages", "/v1/messages/count_tokens"] {
        cases.push(Case {
            path,
            body: format!(
                r#"{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":{deep}}}]}}"#
            ),
            expect: Refused("recursion limit"),
        });
    }
    cases.push(Case {
        path: "/v1/messages",
        body: format!(
            r#"{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}],"tools":[{{"name":"f","input_schema":{{"type":"object","properties":{{"a":{deep}}}}}}}]}}"#
        ),
        expect: Refused("recursion limit"),
    });
    cases
}

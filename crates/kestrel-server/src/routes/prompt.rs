//! Chat messages -> template input -> prompt text and token ids.

use kestrel_api::request::HistoryToolCall;
use kestrel_api::{ApiError, ChatMessage, ErrorKind, Tool};
use kestrel_text::{ChatTemplate, TemplateError};
use serde_json::{Map, Value, json};

use crate::error::{ServerError, ServerResult};
use crate::state::LoadedModel;

/// One message as the chat template sees it. Text parts are joined with
/// "\n" (vLLM's string content format); tool-call arguments are objects.
fn message_value(m: &ChatMessage) -> Value {
    let mut o = Map::new();
    o.insert("role".into(), Value::String(m.role.clone()));
    o.insert(
        "content".into(),
        m.content
            .as_ref()
            .map_or(Value::Null, |c| Value::String(c.joined("\n"))),
    );
    if let Some(name) = &m.name {
        o.insert("name".into(), Value::String(name.clone()));
    }
    if let Some(r) = &m.reasoning_content {
        o.insert("reasoning_content".into(), Value::String(r.clone()));
    }
    if !m.tool_calls.is_empty() {
        let calls = m.tool_calls.iter().map(tool_call_value).collect();
        o.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), Value::String(id.clone()));
    }
    Value::Object(o)
}

fn tool_call_value(c: &HistoryToolCall) -> Value {
    json!({
        "id": c.id,
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    })
}

/// Renders a conversation; template errors caused by the request are 400.
pub fn render_chat(
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
    tools: &[Tool],
    add_generation_prompt: bool,
    kwargs: &Map<String, Value>,
) -> ServerResult<String> {
    let template = template.ok_or_else(|| {
        ApiError::new(
            ErrorKind::InvalidRequest,
            "this model has no chat template; use /v1/completions",
        )
    })?;
    let messages: Vec<Value> = messages.iter().map(message_value).collect();
    let tools: Vec<Value> = tools.iter().map(|t| t.raw.clone()).collect();
    let tools = (!tools.is_empty()).then_some(tools.as_slice());
    template
        .render(&messages, tools, add_generation_prompt, kwargs)
        .map_err(|e| {
            let msg = match e {
                TemplateError::Raised(m) => m,
                other => format!("the chat template failed: {other}"),
            };
            ServerError::from(ApiError::invalid("messages", msg))
        })
}

/// Token ids of a rendered prompt or raw text.
pub fn encode(model: &LoadedModel, text: &str, add_special: bool) -> ServerResult<Vec<u32>> {
    model.tokenizer.encode(text, add_special).map_err(|e| {
        ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e:#}")).into()
    })
}

/// Keeps the last `n` tokens when `truncate_prompt_tokens` is given.
pub fn truncate_left(ids: &mut Vec<u32>, keep: Option<u32>) {
    if let Some(n) = keep {
        let n = n as usize;
        if ids.len() > n {
            ids.drain(..ids.len() - n);
        }
    }
}

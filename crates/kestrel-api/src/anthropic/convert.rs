//! The Messages conversation as chat messages: the system prompt (with the
//! billing-header normalisation), user turns whose `tool_result` blocks
//! become `tool` messages, assistant turns whose `thinking` and `tool_use`
//! blocks become `reasoning_content` and tool calls, and `system` messages
//! between the turns.

use serde_json::{Map, Value, json};

use super::request::{Block, Content, MessagesRequest, Normalization, Role, strip_billing_header};
use crate::error::ApiError;

impl MessagesRequest {
    pub(super) fn chat_messages(&self, norm: Normalization) -> Result<Vec<Value>, ApiError> {
        let mut out = Vec::new();
        // The system prompt: the `system` field, then any `system` messages
        // that come before the first turn.
        let mut system = match &self.system {
            Some(s) => system_text(s, norm).map_err(|e| e.with_param("system"))?,
            None => String::new(),
        };
        let leading = self
            .messages
            .iter()
            .take_while(|m| m.role == Role::System)
            .count();
        for (i, m) in self.messages[..leading].iter().enumerate() {
            let text = system_message_text(&m.content)
                .map_err(|e| e.with_param(format!("messages[{i}].content")))?;
            if !text.is_empty() {
                if !system.is_empty() {
                    system.push_str("\n\n");
                }
                system.push_str(&text);
            }
        }
        if !system.is_empty() {
            out.push(json!({"role": "system", "content": system}));
        }
        // The ids of the previous turn's `tool_use` blocks: the only ones
        // a `tool_result` may answer (as Anthropic's API requires). A
        // `system` message in between does not count as a turn.
        let mut open_calls: Vec<&str> = Vec::new();
        for (i, m) in self.messages.iter().enumerate().skip(leading) {
            let param = format!("messages[{i}].content");
            match m.role {
                Role::User => {
                    user_messages(&m.content, &open_calls, &mut out)
                        .map_err(|e| e.with_param(param))?;
                    open_calls.clear();
                }
                Role::Assistant => {
                    out.push(assistant_message(&m.content).map_err(|e| e.with_param(param))?);
                    open_calls = tool_use_ids(&m.content);
                }
                Role::System => {
                    let text = system_message_text(&m.content).map_err(|e| e.with_param(param))?;
                    if text.is_empty() {
                        continue;
                    }
                    if norm.late_system_messages {
                        out.push(json!({"role": "system", "content": text}));
                    } else {
                        append_user_text(&mut out, text);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The text blocks of a system prompt or a `system` message; any other
/// block is refused.
fn text_blocks<'a>(content: &'a Content, place: &str) -> Result<Vec<&'a str>, ApiError> {
    match content {
        Content::Text(t) => Ok(vec![t.as_str()]),
        Content::Blocks(blocks) => blocks
            .iter()
            .map(|b| match b {
                Block::Text { text } => Ok(text.as_str()),
                other => Err(wrong_block(place, other)),
            })
            .collect(),
    }
}

fn system_text(system: &Content, norm: Normalization) -> Result<String, ApiError> {
    let blocks = text_blocks(system, "system")?.into_iter().map(|t| {
        if norm.strip_billing_header {
            strip_billing_header(t)
        } else {
            t.to_string()
        }
    });
    Ok(blocks
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n"))
}

/// A `system` message's blocks, joined as the system prompt's are.
fn system_message_text(content: &Content) -> Result<String, ApiError> {
    Ok(text_blocks(content, "system messages")?
        .into_iter()
        .filter(|t| !t.is_empty())
        .collect::<Vec<_>>()
        .join("\n"))
}

/// A late `system` message for a template that takes none: a text part of
/// the user turn it follows, or a user turn of its own.
fn append_user_text(out: &mut Vec<Value>, text: String) {
    let part = json!({"type": "text", "text": text});
    if let Some(last) = out.last_mut().filter(|m| m["role"] == "user") {
        match &mut last["content"] {
            Value::Array(parts) => parts.push(part),
            content => {
                let earlier = json!({"type": "text", "text": content.take()});
                *content = json!([earlier, part]);
            }
        }
        return;
    }
    out.push(json!({"role": "user", "content": [part]}));
}

fn wrong_block(place: &str, block: &Block) -> ApiError {
    let kind = match block {
        Block::Text { .. } => "text",
        Block::ToolUse { .. } => "tool_use",
        Block::ToolResult { .. } => "tool_result",
        Block::Thinking { .. } => "thinking",
        Block::RedactedThinking {} => "redacted_thinking",
        Block::Image {} => "image",
        Block::Document {} => "document",
    };
    if matches!(block, Block::Image {} | Block::Document {}) {
        return ApiError::unsupported(format!("{kind} content blocks"));
    }
    ApiError::new(
        crate::ErrorKind::InvalidRequest,
        format!("{kind} blocks are not allowed in {place}"),
    )
}

/// A user turn: its text, with each `tool_result` becoming a `tool` message
/// in place (the chat templates group consecutive tool messages).
fn user_messages(
    content: &Content,
    open_calls: &[&str],
    out: &mut Vec<Value>,
) -> Result<(), ApiError> {
    let blocks = match content {
        Content::Text(t) => {
            out.push(json!({"role": "user", "content": t}));
            return Ok(());
        }
        Content::Blocks(b) => b,
    };
    let mut text: Vec<Value> = Vec::new();
    let flush = |text: &mut Vec<Value>, out: &mut Vec<Value>| {
        if !text.is_empty() {
            out.push(json!({"role": "user", "content": std::mem::take(text)}));
        }
    };
    for b in blocks {
        match b {
            Block::Text { text: t } => text.push(json!({"type": "text", "text": t})),
            Block::ToolResult {
                tool_use_id,
                content,
                is_error,
            } => {
                if !open_calls.contains(&tool_use_id.as_str()) {
                    return Err(ApiError::new(
                        crate::ErrorKind::InvalidRequest,
                        format!(
                            "tool_result for tool_use_id {tool_use_id:?}, which no tool_use \
                             block of the previous (assistant) message has"
                        ),
                    ));
                }
                flush(&mut text, out);
                let mut body = match content {
                    None => String::new(),
                    Some(c) => result_text(c)?,
                };
                if *is_error {
                    body = format!("Error: {body}");
                }
                out.push(json!({"role": "tool", "tool_call_id": tool_use_id, "content": body}));
            }
            other => return Err(wrong_block("user messages", other)),
        }
    }
    flush(&mut text, out);
    Ok(())
}

fn result_text(content: &Content) -> Result<String, ApiError> {
    match content {
        Content::Text(t) => Ok(t.clone()),
        Content::Blocks(blocks) => blocks
            .iter()
            .map(|b| match b {
                Block::Text { text } => Ok(text.as_str()),
                other => Err(wrong_block("tool_result content", other)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|parts| parts.join("\n")),
    }
}

fn tool_use_ids(content: &Content) -> Vec<&str> {
    match content {
        Content::Text(_) => Vec::new(),
        Content::Blocks(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, .. } => Some(id.as_str()),
                _ => None,
            })
            .collect(),
    }
}

/// An assistant turn: text, thinking as `reasoning_content`, `tool_use` as
/// tool calls.
fn assistant_message(content: &Content) -> Result<Value, ApiError> {
    let blocks = match content {
        Content::Text(t) => return Ok(json!({"role": "assistant", "content": t})),
        Content::Blocks(b) => b,
    };
    let (mut text, mut thinking, mut calls) = (Vec::new(), Vec::new(), Vec::new());
    for b in blocks {
        match b {
            Block::Text { text: t } => text.push(t.as_str()),
            Block::Thinking { thinking: t, .. } => thinking.push(t.as_str()),
            Block::RedactedThinking {} => {}
            Block::ToolUse { id, name, input } => {
                let input = match input {
                    Value::Null => json!({}),
                    Value::Object(_) => input.clone(),
                    other => {
                        return Err(ApiError::new(
                            crate::ErrorKind::InvalidRequest,
                            format!(
                                "tool_use {id:?}: input must be an object, got {}",
                                crate::validate::type_name(other)
                            ),
                        ));
                    }
                };
                calls.push(json!({
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            other => return Err(wrong_block("assistant messages", other)),
        }
    }
    let mut m = Map::new();
    m.insert("role".into(), json!("assistant"));
    m.insert("content".into(), json!(text.concat()));
    if !thinking.is_empty() {
        m.insert("reasoning_content".into(), json!(thinking.join("\n")));
    }
    if !calls.is_empty() {
        m.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(Value::Object(m))
}

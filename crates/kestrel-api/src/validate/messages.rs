//! `messages` of a chat request: shape, roles, content and tool-call history.

use serde_json::Value;

use super::fields::{Fields, Result, type_name};
use crate::error::ApiError;
use crate::request::{ChatMessage, HistoryToolCall, MessageContent};

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

pub(crate) fn parse_messages(
    value: Option<&Value>,
    max_messages: usize,
) -> Result<Vec<ChatMessage>> {
    let items = match value {
        None => return Err(ApiError::invalid("messages", "messages is required")),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::invalid(
                "messages",
                format!("messages must be an array, got {}", type_name(other)),
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    if items.len() > max_messages {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "messages may hold at most {max_messages} entries, got {}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(m, &format!("messages[{i}]")))
        .collect()
}

fn parse_message(value: &Value, path: &str) -> Result<ChatMessage> {
    let mut f = Fields::of(value, path)?;
    let role = match f.string("role")? {
        Some(r) if ROLES.contains(&r) => r.to_string(),
        Some(r) => {
            return Err(ApiError::invalid(
                f.param("role"),
                format!("{} must be one of {ROLES:?}, got {r:?}", f.param("role")),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                f.param("role"),
                format!("{} is required", f.param("role")),
            ));
        }
    };
    let content = parse_content(f.get("content"), &f.param("content"))?;
    let tool_calls = match f.get("tool_calls") {
        None => Vec::new(),
        Some(_) if role != "assistant" => {
            return Err(ApiError::invalid(
                f.param("tool_calls"),
                "only assistant messages may carry tool_calls",
            ));
        }
        Some(v) => parse_history_tool_calls(v, &f.param("tool_calls"))?,
    };
    // Assistant turns may be content-less (tool calls only, or prefill).
    if content.is_none() && role != "assistant" {
        return Err(ApiError::invalid(
            f.param("content"),
            format!("{} is required for role {role:?}", f.param("content")),
        ));
    }
    let name = f.string("name")?.map(str::to_string);
    let reasoning = f.string("reasoning")?.map(str::to_string);
    let reasoning_content = f
        .string("reasoning_content")?
        .map(str::to_string)
        .or(reasoning);
    let tool_call_id = f.string("tool_call_id")?.map(str::to_string);
    Ok(ChatMessage {
        role,
        content,
        name,
        reasoning_content,
        tool_calls,
        tool_call_id,
    })
}

/// A string, or an array of `{"type":"text","text":...}` parts.
fn parse_content(value: Option<&Value>, param: &str) -> Result<Option<MessageContent>> {
    match value {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(MessageContent::Text(s.clone()))),
        Some(Value::Array(parts)) => {
            let texts = parts
                .iter()
                .enumerate()
                .map(|(i, p)| text_part(p, &format!("{param}[{i}]")))
                .collect::<Result<Vec<_>>>()?;
            Ok(Some(MessageContent::Parts(texts)))
        }
        Some(other) => Err(ApiError::invalid(
            param,
            format!(
                "{param} must be a string or an array of content parts, got {}",
                type_name(other)
            ),
        )),
    }
}

fn text_part(value: &Value, path: &str) -> Result<String> {
    let mut f = Fields::of(value, path)?;
    match f.string("type")? {
        Some("text") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                f.param("type"),
                format!("content part type {other:?} is not supported"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                f.param("type"),
                format!("{} is required", f.param("type")),
            ));
        }
    }
    match f.string("text")? {
        Some(t) => Ok(t.to_string()),
        None => Err(ApiError::invalid(
            f.param("text"),
            format!("{} is required", f.param("text")),
        )),
    }
}

fn parse_history_tool_calls(value: &Value, param: &str) -> Result<Vec<HistoryToolCall>> {
    let Value::Array(items) = value else {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be an array, got {}", type_name(value)),
        ));
    };
    items
        .iter()
        .enumerate()
        .map(|(i, c)| history_tool_call(c, &format!("{param}[{i}]")))
        .collect()
}

fn history_tool_call(value: &Value, path: &str) -> Result<HistoryToolCall> {
    let mut f = Fields::of(value, path)?;
    let id = f.string("id")?.map(str::to_string);
    if let Some(t) = f.string("type")?
        && t != "function"
    {
        return Err(ApiError::invalid(
            f.param("type"),
            format!("tool call type {t:?} is not supported"),
        ));
    }
    let function = match f.get("function") {
        Some(v) => v,
        None => {
            return Err(ApiError::invalid(
                f.param("function"),
                format!("{} is required", f.param("function")),
            ));
        }
    };
    let mut func = Fields::of(function, &f.param("function"))?;
    let name = match func.string("name")? {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            return Err(ApiError::invalid(
                func.param("name"),
                format!("{} must be a non-empty string", func.param("name")),
            ));
        }
    };
    let args_param = func.param("arguments");
    let arguments = match func.get("arguments") {
        None => Value::Object(Default::default()),
        Some(Value::String(s)) if s.trim().is_empty() => Value::Object(Default::default()),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Err(ApiError::invalid(
                    &args_param,
                    format!("{args_param} must be a JSON object encoded as a string"),
                ));
            }
        },
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(ApiError::invalid(
                &args_param,
                format!("{args_param} must be a string, got {}", type_name(other)),
            ));
        }
    };
    Ok(HistoryToolCall {
        id,
        name,
        arguments,
    })
}

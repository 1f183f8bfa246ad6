//! `/v1/messages` response bodies and the mapping from the chat pipeline's
//! parsed output (reasoning, content, tool calls) to content blocks.

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ErrorKind};
use crate::types::{ChatResponseMessage, FinishReason, ToolCall};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessageResponse {
    pub id: String,
    /// Always `message`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// Always `assistant`.
    pub role: &'static str,
    pub model: String,
    pub content: Vec<Value>,
    pub stop_reason: Option<&'static str>,
    pub stop_sequence: Option<String>,
    pub usage: MessageUsage,
}

/// Anthropic counts cached prompt tokens apart: `input_tokens` is the part
/// that was computed, `cache_read_input_tokens` the part served from the
/// prefix cache; their sum is the prompt (what `count_tokens` returns).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MessageUsage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    pub cache_creation_input_tokens: u32,
    pub cache_read_input_tokens: u32,
}

impl MessageUsage {
    pub fn new(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Self {
        let cached = cached_tokens.min(prompt_tokens);
        MessageUsage {
            input_tokens: prompt_tokens - cached,
            output_tokens,
            cache_creation_input_tokens: 0,
            cache_read_input_tokens: cached,
        }
    }

    pub fn from_chat(usage: &crate::types::Usage) -> Self {
        let cached = usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
        Self::new(usage.prompt_tokens, cached, usage.completion_tokens)
    }
}

/// Anthropic's `stop_reason` for how the chat pipeline ended.
pub fn stop_reason(reason: FinishReason, stop_sequence: Option<&str>) -> &'static str {
    match reason {
        FinishReason::ToolCalls => "tool_use",
        FinishReason::Length => "max_tokens",
        FinishReason::Stop if stop_sequence.is_some() => "stop_sequence",
        FinishReason::Stop | FinishReason::Abort | FinishReason::Error => "end_turn",
    }
}

/// A `tool_use` block's `input`: the call's arguments as an object (`{}`
/// when the model wrote none).
pub fn tool_input(call: &ToolCall) -> Value {
    match serde_json::from_str::<Value>(&call.function.arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The content blocks of a finished answer: thinking, then text (left out
/// when only whitespace, such as the newlines before a tool call), then one
/// `tool_use` per call.
pub fn content_blocks(message: &ChatResponseMessage) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(r) = message.reasoning.as_deref().filter(|r| !r.is_empty()) {
        blocks.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(t) = message.content.as_deref().filter(|t| !t.trim().is_empty()) {
        blocks.push(json!({"type": "text", "text": t}));
    }
    for call in &message.tool_calls {
        blocks.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": tool_input(call),
        }));
    }
    blocks
}

/// The `error.type` Anthropic clients expect for a kind of failure.
pub fn error_type(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::InvalidRequest | ErrorKind::PayloadTooLarge => "invalid_request_error",
        ErrorKind::Authentication => "authentication_error",
        ErrorKind::NotFound => "not_found_error",
        ErrorKind::RateLimit => "rate_limit_error",
        ErrorKind::Unavailable => "overloaded_error",
        ErrorKind::Internal | ErrorKind::NotImplemented => "api_error",
    }
}

/// `{"type":"error","error":{"type":...,"message":...}}`.
pub fn error_body(error: &ApiError) -> Value {
    json!({
        "type": "error",
        "error": {"type": error_type(error.kind), "message": error.message},
    })
}

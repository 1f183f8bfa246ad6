//! Pieces of the response object: usage, the status a finish reason gives,
//! and the SSE framing of events.

use serde::Serialize;
use serde_json::{Value, json};

use crate::types::{FinishReason, Usage};

/// `usage` of a response. `output_tokens_details.reasoning_tokens` counts
/// the reasoning text re-tokenised (the route passes the count in).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct InputTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u32,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

impl ResponseUsage {
    pub fn from_chat(usage: &Usage, reasoning_tokens: u32) -> Self {
        ResponseUsage {
            input_tokens: usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
            },
            output_tokens: usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning_tokens.min(usage.completion_tokens),
            },
            total_tokens: usage.total_tokens,
        }
    }
}

/// `completed`, or `incomplete` when the token limit cut the answer.
pub fn status(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Length => "incomplete",
        _ => "completed",
    }
}

/// `incomplete_details` for a status.
pub fn incomplete_details(reason: FinishReason) -> Value {
    match reason {
        FinishReason::Length => json!({"reason": "max_output_tokens"}),
        _ => Value::Null,
    }
}

/// `event: <type>\ndata: <json>\n\n`, the framing OpenAI uses.
pub fn named_event(data: &Value) -> String {
    let name = data["type"].as_str().unwrap_or("error");
    format!("event: {name}\ndata: {data}\n\n")
}

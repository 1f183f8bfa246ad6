//! Pieces of the response object: the request fields it echoes, usage, the
//! status a finish reason gives, and the SSE framing of events.

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::request::{ReasoningEffort, ResponsesRequest, TextFormat, response_format};
use crate::types::{FinishReason, Usage};

impl ResponsesRequest {
    /// The fields every response object echoes from its request.
    pub fn echo(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("instructions".into(), json!(self.instructions));
        m.insert("max_output_tokens".into(), json!(self.max_output_tokens));
        m.insert(
            "parallel_tool_calls".into(),
            json!(self.parallel_tool_calls.unwrap_or(true)),
        );
        m.insert("previous_response_id".into(), Value::Null);
        let reasoning = self.reasoning.as_ref();
        m.insert(
            "reasoning".into(),
            json!({
                "effort": reasoning.and_then(|r| r.effort).map(ReasoningEffort::as_str),
                "summary": reasoning.and_then(|r| r.summary.clone()),
            }),
        );
        // Nothing is kept, whatever the request asked for.
        m.insert("store".into(), json!(false));
        m.insert("temperature".into(), json!(self.temperature));
        m.insert("top_p".into(), json!(self.top_p));
        let format = self
            .text
            .as_ref()
            .and_then(|t| t.format.as_ref())
            .map_or_else(|| json!({"type": "text"}), echo_format);
        m.insert("text".into(), json!({"format": format}));
        let default_choice = if self.tools().is_empty() {
            "none"
        } else {
            "auto"
        };
        m.insert(
            "tool_choice".into(),
            self.tool_choice.clone().unwrap_or(json!(default_choice)),
        );
        let tools: Vec<Value> = self
            .tools()
            .iter()
            .map(|t| {
                json!({
                    "type": t.kind,
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                    "strict": t.strict,
                })
            })
            .collect();
        m.insert("tools".into(), Value::Array(tools));
        m.insert("truncation".into(), json!("disabled"));
        m.insert("user".into(), json!(self.user));
        m.insert(
            "metadata".into(),
            Value::Object(self.metadata.clone().unwrap_or_default()),
        );
        m
    }
}

fn echo_format(format: &TextFormat) -> Value {
    match format {
        TextFormat::JsonSchema {
            name,
            schema,
            description,
            strict,
        } => json!({
            "type": "json_schema",
            "name": name,
            "schema": schema,
            "description": description,
            "strict": strict,
        }),
        other => response_format(other),
    }
}

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

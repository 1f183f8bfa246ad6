//! Server-sent-event framing and a builder that keeps a chat stream's
//! invariants: constant `id`/`model`/`created`, `role` only in the first
//! chunk, a final chunk with `finish_reason` and no content, one usage chunk
//! with empty `choices`, then `[DONE]`.

use serde::Serialize;

use super::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, CompletionChoice, CompletionChunk,
    FinishReason, Role, ToolCallDelta, Usage,
};
use crate::error::ApiError;

/// The terminating event.
pub const SSE_DONE: &str = "data: [DONE]\n\n";
/// A keep-alive comment for long queues or prefills.
pub const SSE_PING: &str = ": ping\n\n";

/// `data: <json>\n\n`.
pub fn sse_event<T: Serialize>(value: &T) -> String {
    match serde_json::to_string(value) {
        Ok(json) => format!("data: {json}\n\n"),
        Err(e) => sse_error(&ApiError::new(crate::ErrorKind::Internal, e.to_string())),
    }
}

/// A mid-stream error event; send [`SSE_DONE`] after it.
pub fn sse_error(error: &ApiError) -> String {
    format!("data: {}\n\n", error.to_json())
}

/// Builds the chunks of one streamed chat completion.
#[derive(Debug, Clone)]
pub struct ChatStream {
    id: String,
    model: String,
    created: u64,
    role_sent: bool,
}

/// What one step of the parsers produced for the client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeltaParts {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl ChatStream {
    pub fn new(id: impl Into<String>, model: impl Into<String>, created: u64) -> Self {
        ChatStream {
            id: id.into(),
            model: model.into(),
            created,
            role_sent: false,
        }
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    fn choice(
        &mut self,
        mut delta: ChatDelta,
        finish_reason: Option<FinishReason>,
    ) -> ChatCompletionChunk {
        if !self.role_sent {
            delta.role = Some(Role::Assistant);
            self.role_sent = true;
        }
        self.chunk(
            vec![ChatChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason,
            }],
            None,
        )
    }

    /// The opening chunk: `role` and empty content.
    pub fn start(&mut self) -> ChatCompletionChunk {
        self.choice(
            ChatDelta {
                content: Some(String::new()),
                ..Default::default()
            },
            None,
        )
    }

    /// A chunk for the parsers' output, or `None` when there is nothing to send.
    pub fn delta(&mut self, parts: DeltaParts) -> Option<ChatCompletionChunk> {
        if parts.reasoning.is_empty() && parts.content.is_empty() && parts.tool_calls.is_empty() {
            return None;
        }
        let reasoning = (!parts.reasoning.is_empty()).then_some(parts.reasoning);
        let delta = ChatDelta {
            role: None,
            content: (!parts.content.is_empty()).then_some(parts.content),
            reasoning_content: reasoning.clone(),
            reasoning,
            tool_calls: parts.tool_calls,
        };
        Some(self.choice(delta, None))
    }

    /// The last choice chunk: `finish_reason`, empty delta.
    pub fn finish(&mut self, reason: FinishReason) -> ChatCompletionChunk {
        self.choice(ChatDelta::default(), Some(reason))
    }

    /// The usage chunk (`choices: []`), sent only with `include_usage`.
    pub fn usage(&self, usage: Usage) -> ChatCompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

/// Builds the chunks of one streamed text completion.
#[derive(Debug, Clone)]
pub struct CompletionStream {
    id: String,
    model: String,
    created: u64,
}

impl CompletionStream {
    pub fn new(id: impl Into<String>, model: impl Into<String>, created: u64) -> Self {
        CompletionStream {
            id: id.into(),
            model: model.into(),
            created,
        }
    }

    fn chunk(&self, choices: Vec<CompletionChoice>, usage: Option<Usage>) -> CompletionChunk {
        CompletionChunk {
            id: self.id.clone(),
            object: "text_completion".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
        }
    }

    /// A text delta, or `None` when it is empty.
    pub fn delta(&self, text: String) -> Option<CompletionChunk> {
        (!text.is_empty()).then(|| {
            self.chunk(
                vec![CompletionChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )
        })
    }

    pub fn finish(&self, reason: FinishReason) -> CompletionChunk {
        let choice = CompletionChoice {
            index: 0,
            text: String::new(),
            logprobs: None,
            finish_reason: Some(reason),
        };
        self.chunk(vec![choice], None)
    }

    pub fn usage(&self, usage: Usage) -> CompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

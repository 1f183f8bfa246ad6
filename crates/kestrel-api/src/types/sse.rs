//! Server-sent-event framing and a builder that keeps a chat stream's
//! invariants: constant `id`/`model`/`created`, `role` only in the first
//! chunk, a final chunk with `finish_reason` and no content, one usage chunk
//! with empty `choices`, then `[DONE]`. With `n > 1` each choice has its
//! own builder (its `index`); logprobs ride on the next chunk of their choice.

use serde::Serialize;

use super::{
    ChatChunkChoice, ChatCompletionChunk, ChatDelta, ChatLogprobs, CompletionChoice,
    CompletionChunk, CompletionLogprobs, FinishReason, GeneratedLogprob, PromptLogprobs, Role,
    ToolCallDelta, Usage,
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
    index: u32,
    role_sent: bool,
    /// Logprobs of generated tokens not sent yet.
    logprobs: Vec<GeneratedLogprob>,
    /// Sent on the first chunk.
    prompt_logprobs: Option<PromptLogprobs>,
}

/// What one step of the parsers produced for the client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeltaParts {
    pub reasoning: String,
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

impl DeltaParts {
    /// Takes out the call deltas, from the first, that continue the call of
    /// index `open` (arguments, no new call's start). The parts keep content
    /// and calls apart, not their order; these came before any content of
    /// the step, since the call was open then, so a stream that gives each
    /// call its own block sends them before content closes the block.
    pub fn take_continuing_arguments(&mut self, open: Option<u32>) -> Vec<ToolCallDelta> {
        let n = self
            .tool_calls
            .iter()
            .take_while(|c| Some(c.index) == open && c.id.is_none() && c.function.name.is_none())
            .count();
        self.tool_calls.drain(..n).collect()
    }
}

impl ChatStream {
    pub fn new(id: impl Into<String>, model: impl Into<String>, created: u64) -> Self {
        ChatStream {
            id: id.into(),
            model: model.into(),
            created,
            index: 0,
            role_sent: false,
            logprobs: Vec::new(),
            prompt_logprobs: None,
        }
    }

    /// The stream of choice `index` (`n > 1`).
    pub fn with_index(mut self, index: u32) -> Self {
        self.index = index;
        self
    }

    /// Logprobs of generated tokens, sent with the choice's next chunk.
    pub fn push_logprobs(&mut self, tokens: &[GeneratedLogprob]) {
        self.logprobs.extend_from_slice(tokens);
    }

    /// The prompt's logprobs, sent on the first chunk.
    pub fn with_prompt_logprobs(mut self, prompt_logprobs: Option<PromptLogprobs>) -> Self {
        self.prompt_logprobs = prompt_logprobs;
        self
    }

    /// Whether logprobs wait to be sent.
    pub fn has_logprobs(&self) -> bool {
        !self.logprobs.is_empty()
    }

    fn chunk(&self, choices: Vec<ChatChunkChoice>, usage: Option<Usage>) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk".into(),
            created: self.created,
            model: self.model.clone(),
            choices,
            usage,
            prompt_logprobs: None,
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
        let logprobs = (!self.logprobs.is_empty())
            .then(|| ChatLogprobs::from_tokens(&std::mem::take(&mut self.logprobs)));
        let mut chunk = self.chunk(
            vec![ChatChunkChoice {
                index: self.index,
                delta,
                logprobs,
                finish_reason,
            }],
            None,
        );
        chunk.prompt_logprobs = self.prompt_logprobs.take();
        chunk
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

    /// A chunk for the parsers' output, or `None` when there is nothing to
    /// send (no text and no logprobs waiting).
    pub fn delta(&mut self, parts: DeltaParts) -> Option<ChatCompletionChunk> {
        if parts.reasoning.is_empty()
            && parts.content.is_empty()
            && parts.tool_calls.is_empty()
            && self.logprobs.is_empty()
        {
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
    index: u32,
    /// Logprobs of generated tokens not sent yet.
    logprobs: Vec<GeneratedLogprob>,
    /// Sent on the choice's first chunk.
    prompt_logprobs: Option<PromptLogprobs>,
    /// `echo`: the prompt's text and its logprobs, the first chunk's.
    echo: Option<(String, Option<CompletionLogprobs>)>,
    /// Characters before the generated text (the echoed prompt's): added
    /// to the generated tokens' `text_offset`.
    offset: u32,
}

impl CompletionStream {
    pub fn new(id: impl Into<String>, model: impl Into<String>, created: u64) -> Self {
        CompletionStream {
            id: id.into(),
            model: model.into(),
            created,
            index: 0,
            logprobs: Vec::new(),
            prompt_logprobs: None,
            echo: None,
            offset: 0,
        }
    }

    /// The stream of choice `index` (`n > 1`).
    pub fn with_index(mut self, index: u32) -> Self {
        self.index = index;
        self
    }

    /// The prompt's logprobs, sent on the choice's first chunk.
    pub fn with_prompt_logprobs(mut self, prompt_logprobs: Option<PromptLogprobs>) -> Self {
        self.prompt_logprobs = prompt_logprobs;
        self
    }

    /// `echo`: the first chunk carries the prompt's text (and its
    /// logprobs); the generated tokens' offsets count from its end.
    pub fn with_echo(mut self, text: String, logprobs: Option<CompletionLogprobs>) -> Self {
        self.offset = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
        self.echo = Some((text, logprobs));
        self
    }

    /// Logprobs of generated tokens, sent with the choice's next chunk.
    pub fn push_logprobs(&mut self, tokens: &[GeneratedLogprob]) {
        self.logprobs.extend_from_slice(tokens);
    }

    /// The opening chunk when there is an echo or prompt logprobs to send.
    pub fn start(&mut self) -> Option<CompletionChunk> {
        if self.echo.is_none() && self.prompt_logprobs.is_none() {
            return None;
        }
        let (text, logprobs) = self.echo.take().unwrap_or_default();
        let mut choice = self.choice(text, None);
        choice.logprobs = logprobs;
        Some(self.chunk(vec![choice], None))
    }

    fn choice(&mut self, text: String, finish_reason: Option<FinishReason>) -> CompletionChoice {
        let logprobs = (!self.logprobs.is_empty()).then(|| {
            CompletionLogprobs::from_tokens(&std::mem::take(&mut self.logprobs))
                .shifted(self.offset)
        });
        CompletionChoice {
            index: self.index,
            text,
            logprobs,
            finish_reason,
            prompt_logprobs: self.prompt_logprobs.take(),
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

    /// A text delta, or `None` when there is neither text nor logprobs.
    pub fn delta(&mut self, text: String) -> Option<CompletionChunk> {
        if text.is_empty() && self.logprobs.is_empty() {
            return None;
        }
        let choice = self.choice(text, None);
        Some(self.chunk(vec![choice], None))
    }

    pub fn finish(&mut self, reason: FinishReason) -> CompletionChunk {
        let choice = self.choice(String::new(), Some(reason));
        self.chunk(vec![choice], None)
    }

    pub fn usage(&self, usage: Usage) -> CompletionChunk {
        self.chunk(Vec::new(), Some(usage))
    }
}

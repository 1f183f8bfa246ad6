//! The protocol layer of the OpenAI-compatible server, kept apart from the
//! engine: request validation into plain internal structs, response and
//! streaming-chunk types, and the incremental parsers that turn generated text
//! into reasoning, content and tool calls.
//!
//! Pipeline for one generated sequence (streaming or not):
//! detokenized text -> [`stop::StopMatcher`] -> [`reasoning::ReasoningParser`]
//! -> content -> [`tools::ToolCallParser`] -> content + tool-call deltas.
//! Non-streaming responses run the same parsers over the whole text, so the
//! two paths always agree.

pub mod anthropic;
pub mod error;
pub mod output;
pub mod reasoning;
pub mod request;
pub mod responses;
mod scan;
pub mod stop;
pub mod tools;
pub mod types;
pub mod validate;

pub use error::{ApiError, ErrorBody, ErrorKind};
pub use request::{
    ChatMessage, ChatRequest, CompletionRequest, GenerationParams, MessageContent, Prompt,
    ResponseFormat, SamplingDefaults, SamplingRequest, StructuredOutput, Tool, ToolChoice,
};
pub use validate::{
    ValidationOptions, parse_chat_request, parse_completion_request, parse_json_body,
};

//! Response bodies and streaming chunks, serialized as OpenAI (plus vLLM's
//! extensions) expects.

pub mod chat;
pub mod completion;
pub mod logprobs;
pub mod models;
pub mod prompt_logprobs;
pub mod sse;
pub mod tokenize;
pub mod usage;

pub use chat::*;
pub use completion::*;
pub use logprobs::*;
pub use models::*;
pub use prompt_logprobs::*;
pub use tokenize::*;
pub use usage::*;

use serde::{Deserialize, Serialize};

/// Why a choice ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// EOS, a stop string or a stop token.
    Stop,
    /// `max_tokens` or the end of the context.
    Length,
    /// The output ended in one or more tool calls.
    ToolCalls,
    /// Cancelled (client disconnect, shutdown).
    Abort,
    /// The engine failed for this request.
    Error,
}

//! The engine: admits requests, schedules forward passes and keeps each
//! sequence's cache state.
//!
//! * [`handle`]: the interface types shared with the server.
//! * [`Engine::spawn`] starts the engine loop on its own thread and returns an
//!   [`EngineHandle`]; [`EngineHandle::submit`] returns a [`RequestStream`].
//! * [`cache`]: KV pages, state slots and the prefix cache (plain bookkeeping).
//! * [`constraint`]: per-sequence output constraints (structured outputs).
//! * [`spec`]: speculative decoding (proposers; verification lives in the step).

pub mod cache;
mod choose;
mod client;
pub mod constraint;
mod engine;
pub mod handle;
mod logprobs;
pub mod prefill;
pub mod prompt_logprobs;
mod scheduler;
mod sequence;
pub mod spec;
mod step;
mod timing;

pub use choose::{RowSource, StepLogits};
pub use client::{EngineHandle, RequestStream};
pub use constraint::{Constraint, TokenConstraint};
pub use engine::{Engine, EngineOptions};
pub use handle::{
    EngineConfig, EngineEvent, EngineStats, GenerateRequest, PromptTokenLogprobs, SubmitError,
    Usage,
};
pub use step::LogitsObserver;

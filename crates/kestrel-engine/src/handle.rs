//! The engine's interface to the server: submit a request, receive its
//! tokens as events, drop the stream to cancel. The engine runs on its own
//! thread (`Engine::spawn`); everything here is cheap to clone and `Send`.
//!
//! Contract:
//! - `submit` answers at once: `QueueFull` when `max_queued_requests` are
//!   waiting (the server maps it to 429 with Retry-After), `Invalid` for a
//!   request the engine can never run (prompt + max_tokens over
//!   `max_model_len`, token ids outside the vocabulary, bad sampling params).
//! - Events arrive in order: the `PromptLogprobs` when asked for, zero or
//!   more `Tokens` (each after its `Logprobs` when the request asked for
//!   them), then exactly one
//!   `Finished` or `Error`, then the channel closes.
//! - Dropping the `RequestStream` before `Finished` aborts the request: the
//!   engine frees its pages and state slot at its next step, exactly once,
//!   whether it was waiting, prefilling or decoding.
//! - Stop strings are the server's business (they need text); when it sees
//!   one it calls `RequestStream::finish_on_stop_string` (dropping the stream
//!   works too, but counts as an abort in the statistics).

use kestrel_sampling::{FinishReason, SamplingParams, TokenLogprobs};

pub use crate::prompt_logprobs::PromptTokenLogprobs;

/// Engine limits, set once at start.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences running at once (vLLM `--max-num-seqs`).
    pub max_num_seqs: usize,
    /// Requests waiting for admission before `submit` answers `QueueFull`.
    pub max_queued_requests: usize,
    /// Tokens per forward step (prefill chunks + decode tokens), vLLM
    /// `--max-num-batched-tokens`; 32768 by default. One sequence's prefill
    /// chunk is the smaller of [`crate::prefill::MAX_PREFILL_CHUNK_TOKENS`]
    /// and this less a decode token per other sequence (see [`crate::prefill`]).
    pub max_num_batched_tokens: usize,
    /// Tokens per KV page.
    pub block_size: usize,
    /// KV pages in the pool.
    pub num_blocks: usize,
    /// Recurrent-state slots (hybrid models): running sequences plus prefix-cache snapshots.
    pub num_state_slots: usize,
    pub enable_prefix_cache: bool,
    /// Context length the server enforces (prompt + generated).
    pub max_model_len: usize,
    /// Test knob: preempt (by recompute) the newest running sequence whenever
    /// this many are running, to exercise preemption on small pools.
    pub force_preempt_at: Option<usize>,
    /// Ids the sampler may produce: the tokenizer's vocabulary when the
    /// model's embedding is padded beyond it (Qwen3.6: 248,077 of 248,320),
    /// so that no request gets an id that cannot be decoded. `None`: every id
    /// of the model.
    pub sampled_vocab: Option<usize>,
}

/// One generation request, already tokenised and validated by the server.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub request_id: String,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// Requests with different salts never share prefix-cache pages.
    pub cache_salt: Vec<u8>,
    /// Limits which tokens may be generated (structured outputs).
    pub constraint: Option<crate::Constraint>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EngineEvent {
    /// Newly generated token ids, in order (one per step without
    /// speculation; a speculative step emits its accepted drafts and the
    /// token after them at once).
    Tokens(Vec<u32>),
    /// The logprobs of the tokens of the `Tokens` event that follows, one
    /// per token; sent only for requests with `params.logprobs` set.
    Logprobs(Vec<TokenLogprobs>),
    /// Prompt logprobs of consecutive prompt tokens, the first event's
    /// starting at prompt position 1 (position 0 has none); sent only for
    /// requests with `params.prompt_logprobs` set, all of them before the
    /// first `Tokens` (or `Finished`).
    PromptLogprobs(Vec<PromptTokenLogprobs>),
    Finished {
        reason: FinishReason,
        /// The request's stop token id that ended it, if any.
        stop_token: Option<u32>,
        usage: Usage,
    },
    /// The engine failed this request; other requests are unaffected.
    Error(String),
}

#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SubmitError {
    #[error("too many requests are waiting ({0} queued)")]
    QueueFull(usize),
    #[error("{0}")]
    Invalid(String),
    #[error("the engine has stopped")]
    Stopped,
}

/// A snapshot of the engine's counters and gauges, for `/metrics`, `/health`
/// and the tests' leak checks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub num_free_blocks: usize,
    pub num_total_blocks: usize,
    /// Pages held only by the prefix cache (evictable); at idle
    /// `num_free_blocks + num_cached_blocks == num_total_blocks`.
    pub num_cached_blocks: usize,
    pub num_free_state_slots: usize,
    pub num_total_state_slots: usize,
    /// State slots holding prefix-cache snapshots (hybrid models); at idle
    /// `num_free_state_slots + num_cached_state_slots == num_total_state_slots`.
    pub num_cached_state_slots: usize,
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub num_preemptions_total: u64,
    pub prefix_cache_queries_total: u64,
    pub prefix_cache_hits_total: u64,
    pub requests_finished_stop: u64,
    pub requests_finished_length: u64,
    pub requests_finished_abort: u64,
    pub requests_failed: u64,
    pub engine_steps_total: u64,
    /// Steps the backend ran as two passes, decode and verify rows apart
    /// from prefill chunks (each reads the weights once more).
    pub engine_steps_split_total: u64,
    /// Speculative decoding, with vLLM's metric names: sequence-steps that
    /// carried drafts, draft tokens verified, drafts accepted, and drafts
    /// accepted at each draft position (index 0 = the first draft).
    pub spec_decode_num_drafts_total: u64,
    pub spec_decode_num_draft_tokens_total: u64,
    pub spec_decode_num_accepted_tokens_total: u64,
    pub spec_decode_num_accepted_tokens_per_pos_total: Vec<u64>,
}

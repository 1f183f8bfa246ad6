//! Speculative decoding: a proposer drafts tokens for a decoding sequence,
//! the target model verifies them in the sequence's next step (in the same
//! forward as other sequences' prefill chunks and plain decodes), and the
//! step keeps the longest prefix the target agrees with plus one token of
//! its own.
//!
//! Why the output never changes: each verify row is sampled by the
//! sequence's own sampler exactly as plain decoding samples that position
//! (same logits, same history, same RNG draw), and a draft is kept only if
//! the sampled token equals it. For drafts without a distribution (n-gram,
//! greedy MTP, external) this is Leviathan/Chen rejection sampling with a
//! Dirac q: the draft survives with probability p(d), and on rejection the
//! emitted token is distributed as p without d. So greedy output is
//! bit-identical with speculation on or off, and seeded sampled output is
//! too (one uniform per emitted token, as without speculation). Drafters
//! that sample from a distribution q go through
//! `kestrel_sampling::verify` instead.
//!
//! State: the KV of rejected positions is never marked computed (their
//! pages are overwritten by later steps); hybrid models write the recurrent
//! and conv state after each verified token into per-sequence checkpoint
//! slots (`SeqChunk::state_checkpoints`) and the step copies back the one of
//! the last accepted token. Verify chunks start after the prompt, so nothing
//! speculative is offered to the prefix cache.

pub mod ngram;

use std::sync::Arc;

pub use ngram::NgramConfig;

use crate::sequence::Sequence;

/// How drafts are made.
#[derive(Clone)]
pub enum SpeculativeMethod {
    /// Prompt lookup (vLLM's `ngram`).
    Ngram(NgramConfig),
    /// Drafts from outside the engine: adversarial drafts in tests, the
    /// replayed continuation of `bench-model`.
    External(Arc<dyn DraftSource>),
}

impl std::fmt::Debug for SpeculativeMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpeculativeMethod::Ngram(c) => write!(f, "Ngram({c:?})"),
            SpeculativeMethod::External(_) => write!(f, "External"),
        }
    }
}

/// Speculative decoding settings (vLLM's `--speculative-config`).
#[derive(Clone, Debug)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// Most drafts one sequence carries into a step (vLLM
    /// `num_speculative_tokens`); each step may carry fewer, or none.
    pub num_speculative_tokens: usize,
}

/// A source of drafts that needs no model: given a request's id, its tokens
/// (prompt + generated) and its prompt length, up to `max` tokens it
/// expects next. Any answer is safe: wrong drafts only cost speed.
pub trait DraftSource: Send + Sync {
    fn drafts(&self, request_id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32>;
}

/// The engine's proposer, built once from the configuration.
pub(crate) struct Proposer {
    method: SpeculativeMethod,
    max_drafts: usize,
}

impl Proposer {
    pub fn new(config: &SpeculativeConfig) -> Result<Self, String> {
        if config.num_speculative_tokens == 0 {
            return Err("num_speculative_tokens must be at least 1".into());
        }
        Ok(Self {
            method: config.method.clone(),
            max_drafts: config.num_speculative_tokens,
        })
    }

    /// Drafts for a decoding sequence's next step: at most `limit` (which
    /// the caller bounds by what the sequence may still generate).
    pub fn propose(&mut self, seq: &Sequence, limit: usize) -> Vec<u32> {
        let limit = limit.min(self.max_drafts);
        if limit == 0 {
            return Vec::new();
        }
        let mut drafts = match &self.method {
            SpeculativeMethod::Ngram(cfg) => ngram::propose(&seq.tokens, cfg, limit),
            SpeculativeMethod::External(source) => {
                source.drafts(&seq.request_id, &seq.tokens, seq.prompt_len, limit)
            }
        };
        drafts.truncate(limit);
        drafts
    }
}

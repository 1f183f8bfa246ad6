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
//! slots (`SeqChunk::state_checkpoints`), and the slot of the last accepted
//! token's checkpoint becomes the sequence's live slot (no state is copied).
//! Verify chunks start after the prompt, so nothing
//! speculative is offered to the prefix cache.

pub(crate) mod capture;
pub mod dflash;
pub(crate) mod draft_length;
pub mod draft_vocab;
pub(crate) mod mtp;
pub mod ngram;
pub mod prompt_replay;
pub mod replay;

use std::sync::Arc;

use kestrel_core::Backend;
use kestrel_models::Target;

pub use dflash::{DEFAULT_DRAFT_WINDOW, DflashOptions};
pub(crate) use draft_length::DraftLength;
pub use draft_vocab::DraftVocab;
pub use ngram::NgramConfig;

use crate::handle::EngineConfig;
use crate::sequence::SeqId;
use crate::sequence::Sequence;
use capture::StepReader;
use dflash::DflashProposer;
use mtp::MtpDrafter;

/// How drafts are made.
#[derive(Clone)]
pub enum SpeculativeMethod {
    /// Prompt lookup (vLLM's `ngram`).
    Ngram(NgramConfig),
    /// The model's multi-token-prediction head, chained (vLLM's
    /// `qwen3_next_mtp`).
    Mtp(MtpOptions),
    /// A DFlash block drafter reading the target's hidden states (z-lab
    /// checkpoints; vLLM's `dflash`).
    Dflash(DflashOptions),
    /// Drafts from outside the engine: adversarial drafts in tests, the
    /// replayed continuation of `bench-model`.
    External(Arc<dyn DraftSource>),
}

impl std::fmt::Debug for SpeculativeMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SpeculativeMethod::Ngram(c) => write!(f, "Ngram({c:?})"),
            SpeculativeMethod::Mtp(o) => write!(f, "Mtp({o:?})"),
            SpeculativeMethod::Dflash(o) => write!(f, "Dflash({o:?})"),
            SpeculativeMethod::External(source) => write!(f, "External({})", source.label()),
        }
    }
}

impl SpeculativeMethod {
    /// How logs and metrics name the method: `ngram`, `mtp`, `dflash`, or the
    /// external source's own label.
    pub fn label(&self) -> String {
        match self {
            SpeculativeMethod::Ngram(_) => "ngram".into(),
            SpeculativeMethod::Mtp(_) => "mtp".into(),
            SpeculativeMethod::Dflash(_) => "dflash".into(),
            SpeculativeMethod::External(source) => source.label(),
        }
    }
}

impl SpeculativeMethod {
    /// MTP drafting over the whole vocabulary.
    pub fn mtp() -> Self {
        SpeculativeMethod::Mtp(MtpOptions::default())
    }
}

/// Settings of MTP drafting.
#[derive(Clone, Debug, Default)]
pub struct MtpOptions {
    /// Draft only these ids, scoring only their rows of the lm_head;
    /// `None`: every id.
    pub draft_vocab: Option<Arc<DraftVocab>>,
}

/// Speculative decoding settings (vLLM's `--speculative-config`).
#[derive(Clone, Debug)]
pub struct SpeculativeConfig {
    pub method: SpeculativeMethod,
    /// Most drafts one sequence carries into a step (vLLM
    /// `num_speculative_tokens`); each step may carry fewer, or none.
    pub num_speculative_tokens: usize,
}

/// How many decode and verify rows a speculative step may bring; drafts are
/// shortened evenly across the decoding sequences to fit (a sequence keeps
/// at least its own row, so a budget below the batch drafts nothing).
/// Verification cost grows by steps on a GPU: rows past one product pass
/// read the weights again, and at 8 sequences a fourth row each (k = 3)
/// gains less than it costs where one more (k = 1) still pays.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftRows {
    /// What the backend runs in one pass (`Backend::decode_rows_hint`).
    #[default]
    Backend,
    /// No budget beyond `num_speculative_tokens`.
    Unlimited,
    /// At most this many rows.
    AtMost(usize),
}

impl DraftRows {
    /// The budget in rows for a backend whose hint is `hint`.
    pub fn resolve(self, hint: Option<usize>) -> Option<usize> {
        match self {
            DraftRows::Backend => hint,
            DraftRows::Unlimited => None,
            DraftRows::AtMost(n) => Some(n),
        }
    }
}

/// `auto` (the backend's), `all` (no budget) or a number of rows.
impl std::str::FromStr for DraftRows {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(DraftRows::Backend),
            "all" => Ok(DraftRows::Unlimited),
            n => match n.parse::<usize>() {
                Ok(n) if n > 0 => Ok(DraftRows::AtMost(n)),
                _ => Err(format!(
                    "draft rows must be `auto`, `all` or a positive number, not `{s}`"
                )),
            },
        }
    }
}

/// Drafts each of `sequences` decoding sequences may carry under a budget of
/// `rows` (`None`: none), at most `max`.
pub fn drafts_per_sequence(rows: Option<usize>, sequences: usize, max: usize) -> usize {
    match rows {
        None => max,
        Some(rows) => (rows / sequences.max(1)).saturating_sub(1).min(max),
    }
}

/// A source of drafts that needs no model: given a request's id, its tokens
/// (prompt + generated) and its prompt length, up to `max` tokens it
/// expects next. Any answer is safe: wrong drafts only cost speed.
pub trait DraftSource: Send + Sync {
    fn drafts(&self, request_id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32>;

    /// Whether sequences that sample (temperature > 0) are asked for
    /// drafts. A source that only knows greedy continuations says no, and
    /// those sequences decode plainly.
    fn drafts_sampled(&self) -> bool {
        true
    }

    /// A request left the engine (finished, aborted or failed), with its
    /// final tokens: a source that learns from outputs records them here.
    fn retired(&self, _request: &Retired<'_>) {}

    /// How logs and metrics name the source.
    fn label(&self) -> String {
        "external drafts".into()
    }
}

/// A request as it leaves the engine, for [`DraftSource::retired`].
#[derive(Clone, Copy, Debug)]
pub struct Retired<'a> {
    pub request_id: &'a str,
    /// Prompt followed by every generated token.
    pub tokens: &'a [u32],
    pub prompt_len: usize,
    /// Sampled greedily (temperature 0): the output is the target's argmax
    /// continuation.
    pub greedy: bool,
    /// Ended by a stop condition of its own (EOS, a stop token,
    /// `max_tokens`), not aborted, stopped by the client or failed.
    pub completed: bool,
}

/// The engine's proposer, built once from the configuration (on the
/// engine thread: the MTP head's cache lives on the device).
pub(crate) struct Proposer<B: Backend> {
    method: SpeculativeMethod,
    max_drafts: usize,
    /// The step's row budget ([`DraftRows`]).
    rows: Option<usize>,
    mtp: Option<MtpDrafter<B>>,
    dflash: Option<DflashProposer<B>>,
}

/// The settings a configuration must pass before the engine starts.
/// `vocab`: the ids sampling may choose.
pub(crate) fn check<B: Backend>(
    config: &SpeculativeConfig,
    model: &Target<B>,
    vocab: usize,
) -> Result<(), String> {
    if config.num_speculative_tokens == 0 {
        return Err("num_speculative_tokens must be at least 1".into());
    }
    let reads_states = matches!(
        config.method,
        SpeculativeMethod::Mtp(_) | SpeculativeMethod::Dflash(_)
    );
    let Some(model) = model.decoder_model() else {
        if reads_states {
            return Err(format!(
                "{} speculation is not available for {:?} models yet (its drafter reads the \
                 hidden states of the shared decoder); use ngram",
                config.method.label(),
                model.config().arch
            ));
        }
        return Ok(());
    };
    if let SpeculativeMethod::Mtp(options) = &config.method {
        if model.mtp.is_none() {
            return Err("MTP speculation needs a model with an MTP head (mtp.* weights)".into());
        }
        if let Some(v) = &options.draft_vocab {
            v.check(vocab)?;
        }
    }
    if let SpeculativeMethod::Dflash(options) = &config.method
        && let Some(v) = &options.draft_vocab
    {
        v.check(vocab)?;
    }
    Ok(())
}

impl<B: Backend> Proposer<B> {
    pub fn new(
        config: &SpeculativeConfig,
        backend: &B,
        target: &Target<B>,
        engine: &EngineConfig,
        rows: Option<usize>,
    ) -> anyhow::Result<Self> {
        let vocab = engine.sampled_vocab.unwrap_or(target.config().vocab_size);
        check(config, target, vocab).map_err(anyhow::Error::msg)?;
        // `check` refused the drafters that read the decoder for other models.
        let model = || {
            target
                .decoder_model()
                .ok_or_else(|| anyhow::anyhow!("this drafter needs a model on the shared decoder"))
        };
        let mtp = match &config.method {
            SpeculativeMethod::Mtp(options) => Some(MtpDrafter::new(
                backend,
                model()?,
                engine.num_blocks,
                engine.block_size,
                config.num_speculative_tokens,
                rows,
                vocab,
                options.draft_vocab.as_deref(),
            )?),
            _ => None,
        };
        let dflash = match &config.method {
            SpeculativeMethod::Dflash(options) => Some(DflashProposer::new(
                backend,
                model()?,
                options,
                config.num_speculative_tokens,
                rows,
                vocab,
            )?),
            _ => None,
        };
        Ok(Self {
            method: config.method.clone(),
            max_drafts: config.num_speculative_tokens,
            rows,
            mtp,
            dflash,
        })
    }

    /// The configured length: the most drafts a sequence ever carries.
    pub fn max_drafts(&self) -> usize {
        self.max_drafts
    }

    /// The most drafts each sequence carries into a step where `decoding`
    /// sequences decode.
    pub fn drafts_allowed(&self, decoding: usize) -> usize {
        drafts_per_sequence(self.rows, decoding, self.max_drafts)
    }

    /// Drafts for a decoding sequence's next step: at most `limit` (which
    /// the caller bounds by what the sequence may still generate and by
    /// [`Self::drafts_allowed`]).
    pub fn propose(&mut self, seq: &Sequence, limit: usize) -> Vec<u32> {
        let limit = limit.min(self.max_drafts);
        if limit == 0 {
            return Vec::new();
        }
        let mut drafts = match &self.method {
            SpeculativeMethod::Ngram(cfg) => ngram::propose(&seq.tokens, cfg, limit).to_vec(),
            SpeculativeMethod::External(source)
                if !source.drafts_sampled() && !seq.sampler.params().is_greedy() =>
            {
                Vec::new()
            }
            SpeculativeMethod::External(source) => {
                source.drafts(&seq.request_id, &seq.tokens, seq.prompt_len, limit)
            }
            SpeculativeMethod::Mtp(_) => self
                .mtp
                .as_ref()
                .map(|m| m.drafts(seq.id).to_vec())
                .unwrap_or_default(),
            SpeculativeMethod::Dflash(_) => self
                .dflash
                .as_ref()
                .map(|d| d.drafts(seq.id).to_vec())
                .unwrap_or_default(),
        };
        drafts.truncate(limit);
        drafts
    }

    /// The drafter that reads the target's hidden states after each step.
    pub(crate) fn hidden_reader(&mut self) -> Option<StepReader<'_, B>> {
        match (&mut self.mtp, &mut self.dflash) {
            (Some(m), _) => Some(StepReader::Mtp(m)),
            (None, Some(d)) => Some(StepReader::Dflash(d)),
            (None, None) => None,
        }
    }

    /// Forget what is kept for sequences that are no longer running
    /// (`running` says which are).
    pub fn retain(&mut self, running: impl Fn(SeqId) -> bool) {
        if let Some(d) = &mut self.dflash {
            d.retain(running);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_budget_shares_drafts_evenly_and_keeps_each_sequence_its_row() {
        // 16 rows: one sequence may verify 15 drafts, 4 three each, 8 one.
        assert_eq!(drafts_per_sequence(Some(16), 1, 15), 15);
        assert_eq!(drafts_per_sequence(Some(16), 4, 3), 3);
        assert_eq!(drafts_per_sequence(Some(16), 5, 3), 2);
        assert_eq!(drafts_per_sequence(Some(16), 8, 3), 1);
        // Past the budget's sequence count: plain decode.
        assert_eq!(drafts_per_sequence(Some(16), 9, 3), 0);
        assert_eq!(drafts_per_sequence(None, 64, 3), 3);
        assert_eq!(DraftRows::Backend.resolve(Some(16)), Some(16));
        assert_eq!(DraftRows::Unlimited.resolve(Some(16)), None);
        assert_eq!(DraftRows::AtMost(8).resolve(None), Some(8));
        assert_eq!("auto".parse(), Ok(DraftRows::Backend));
        assert_eq!("all".parse(), Ok(DraftRows::Unlimited));
        assert_eq!("12".parse(), Ok(DraftRows::AtMost(12)));
        assert!("0".parse::<DraftRows>().is_err() && "x".parse::<DraftRows>().is_err());
    }
}

//! One request inside the engine: its tokens, sampler, stop rules, cache
//! share and event channel; and the checks a request must pass to get in.

use kestrel_sampling::{Sampler, StopConditions};
use tokio::sync::mpsc::UnboundedSender;

use crate::cache::SequenceCache;
use crate::constraint::TokenConstraint;
use crate::handle::{EngineConfig, EngineEvent, GenerateRequest, SubmitError, Usage};
use crate::spec::DraftLength;
use crate::timing::FirstTokenTiming;

/// Engine-internal id of a request (the server's `request_id` need not be unique).
pub(crate) type SeqId = u64;

pub(crate) struct Sequence {
    pub id: SeqId,
    pub request_id: String,
    pub salt: Vec<u8>,
    /// Prompt followed by the generated tokens. All but the last are computed
    /// into the cache while decoding; after a preemption all of them are
    /// recomputed as a prompt.
    pub tokens: Vec<u32>,
    /// Length of the request's own prompt (generated tokens start here).
    pub prompt_len: usize,
    /// Kept across preemptions, so the RNG stream continues where it was.
    pub sampler: Sampler,
    pub stop: StopConditions,
    pub events: UnboundedSender<EngineEvent>,
    pub cache: SequenceCache,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: Option<usize>,
    /// Draft tokens proposed for the next step (speculative decoding); the
    /// scheduler may shorten them, the step consumes them.
    pub drafts: Vec<u32>,
    /// Arrival to first token, for the debug-level timing events.
    pub timing: FirstTokenTiming,
    /// Which tokens may come next (structured outputs), see [`crate::constraint`].
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// How many drafts it may carry, adapted to its acceptance or not.
    pub draft_length: DraftLength,
    /// The next prompt position whose prompt logprobs are to be sent (see
    /// [`crate::prompt_logprobs`]); position 0 has none.
    pub prompt_logprobs_sent: usize,
}

impl Sequence {
    pub fn new(
        id: SeqId,
        request: GenerateRequest,
        events: UnboundedSender<EngineEvent>,
        config: &EngineConfig,
        eos_token_ids: &[u32],
    ) -> Result<Self, String> {
        let prompt_len = request.prompt_ids.len();
        let sampler =
            Sampler::new(&request.params, prompt_len, eos_token_ids).map_err(|e| e.to_string())?;
        let stop = StopConditions::new(&request.params, eos_token_ids)
            .with_max_seq_len(config.max_model_len);
        Ok(Self {
            id,
            request_id: request.request_id,
            salt: request.cache_salt,
            tokens: request.prompt_ids,
            prompt_len,
            sampler,
            stop,
            events,
            cache: SequenceCache::new(),
            cached_tokens: None,
            drafts: Vec::new(),
            timing: FirstTokenTiming::new(),
            constraint: request.constraint.map(|c| c.0),
            draft_length: DraftLength::Configured,
            prompt_logprobs_sent: 1,
        })
    }

    pub fn num_generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Positions already in the cache.
    pub fn num_computed(&self) -> usize {
        self.cache.num_tokens()
    }

    /// Whether the next chunk is a single decode token.
    pub fn is_decoding(&self) -> bool {
        self.num_generated() > 0 && self.num_computed() + 1 == self.tokens.len()
    }

    /// Whether prompt logprobs were asked for and some are not sent yet: a
    /// prefix-cache hit would skip them.
    pub fn owes_prompt_logprobs(&self) -> bool {
        self.sampler.params().prompt_logprobs.is_some()
            && self.prompt_logprobs_sent < self.prompt_len
    }

    /// Tokens the sequence may still generate before a length finish.
    pub fn tokens_left(&self) -> usize {
        self.stop
            .tokens_left(self.num_generated(), self.tokens.len())
    }

    pub fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            completion_tokens: self.num_generated(),
            cached_tokens: self.cached_tokens.unwrap_or(0),
        }
    }

    /// Send an event; a closed channel means the client left, which the
    /// engine notices at its next step.
    pub fn emit(&self, event: EngineEvent) {
        let _ = self.events.send(event);
    }

    pub fn client_gone(&self) -> bool {
        self.events.is_closed()
    }
}

/// The checks `submit` makes before queueing: a request that passes can run
/// to completion on this engine.
pub(crate) fn validate_request(
    request: &GenerateRequest,
    config: &EngineConfig,
    vocab_size: usize,
) -> Result<(), SubmitError> {
    let invalid = |m: String| Err(SubmitError::Invalid(m));
    let prompt_len = request.prompt_ids.len();
    if prompt_len == 0 {
        return invalid("the prompt is empty".into());
    }
    if let Some(bad) = request
        .prompt_ids
        .iter()
        .find(|&&t| t as usize >= vocab_size)
    {
        return invalid(format!(
            "token id {bad} is outside the vocabulary (size {vocab_size})"
        ));
    }
    if let Err(e) = request.params.validate() {
        return invalid(e.to_string());
    }
    if let Some(bad) = request
        .params
        .stop_token_ids
        .iter()
        .find(|&&t| t as usize >= vocab_size)
    {
        return invalid(format!(
            "stop token id {bad} is outside the vocabulary (size {vocab_size})"
        ));
    }
    let max_len = config.max_model_len;
    let requested = request.params.max_tokens.unwrap_or(1);
    if prompt_len >= max_len || prompt_len.saturating_add(requested) > max_len {
        return invalid(format!(
            "This model's maximum context length is {max_len} tokens and your request has \
             {prompt_len} input tokens ({requested} more requested for the output)"
        ));
    }
    Ok(())
}

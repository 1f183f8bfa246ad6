//! The per-sequence sampler: RNG, token counts and reusable scratch buffers.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::filters::{
    argmax, collect_candidates, compute_weights, draw, min_p_threshold, top_k, top_p,
};
use crate::penalties::TokenCounts;
use crate::{InvalidParam, SamplingParams, StopConditions};

/// A logits row no token can be drawn from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("the logits row is empty")]
    EmptyLogits,
    #[error("no token has a finite logit (the row is all NaN or -inf)")]
    NoCandidate,
    #[error("the logits row contains +inf")]
    InfiniteLogit,
}

/// Samples the tokens of one sequence. Created at admission, kept for the
/// sequence's lifetime: it owns the RNG stream, so the same seed, prompt and
/// logits give the same tokens.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha20Rng,
    counts: TokenCounts,
    /// Ids masked while fewer than `min_tokens` were generated.
    stopping_ids: Vec<u32>,
    candidates: Vec<u32>,
    /// Indexed by token id; only candidates' entries are meaningful.
    weights: Vec<f32>,
    prompt_len: usize,
}

impl Sampler {
    /// `prompt_len` splits the history passed to [`Sampler::sample`] into
    /// prompt and output; `eos_token_ids` are the model's end ids.
    pub fn new(
        params: &SamplingParams,
        prompt_len: usize,
        eos_token_ids: &[u32],
    ) -> Result<Self, InvalidParam> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed),
            None => ChaCha20Rng::from_rng(&mut rand::rng()),
        };
        Ok(Self {
            params: params.clone(),
            rng,
            counts: TokenCounts::new(prompt_len, params.repetition_penalty != 1.0),
            stopping_ids: StopConditions::new(params, eos_token_ids).stopping_ids(),
            candidates: Vec::new(),
            weights: Vec::new(),
            prompt_len,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether the next token is simply the argmax of the raw logits: greedy,
    /// no penalties, and no end token masked by `min_tokens`. A backend can
    /// then pick it without copying the logits to the host; [`Sampler::sample`]
    /// would return the same token (except that it reports a row without any
    /// finite logit as an error). `history` as for `sample`.
    pub fn is_plain_argmax(&self, history: &[u32]) -> bool {
        let p = &self.params;
        p.is_greedy()
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && history.len().saturating_sub(self.prompt_len) >= p.min_tokens
    }

    /// Choose the next token. `logits` is the raw row for the next position
    /// (it is modified in place: penalties and masks); `history` is prompt +
    /// tokens generated so far and only ever grows between calls.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        self.counts.sync(history);
        if self.counts.num_output() < self.params.min_tokens {
            for &id in &self.stopping_ids {
                if let Some(logit) = logits.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        let p = &self.params;
        self.counts.apply(
            logits,
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        );
        if p.is_greedy() {
            return argmax(logits).ok_or(SampleError::NoCandidate);
        }

        let max_logit = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if max_logit == f32::NEG_INFINITY {
            return Err(SampleError::NoCandidate);
        }
        if max_logit == f32::INFINITY {
            return Err(SampleError::InfiniteLogit);
        }
        // vLLM order after temperature: min-p, then top-k, then top-p.
        let threshold = min_p_threshold(max_logit, p.temperature, p.min_p);
        collect_candidates(logits, threshold, &mut self.candidates);
        if let Some(k) = p.top_k_limit() {
            top_k(logits, &mut self.candidates, k);
        }
        let total = compute_weights(
            logits,
            &self.candidates,
            max_logit,
            1.0 / p.temperature,
            &mut self.weights,
        );
        top_p(logits, &mut self.candidates, p.top_p, &self.weights, total);
        let uniform: f64 = self.rng.random();
        draw(&self.candidates, &self.weights, uniform).ok_or(SampleError::NoCandidate)
    }
}

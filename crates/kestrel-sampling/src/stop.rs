//! When a sequence stops generating.
//!
//! Stop strings need detokenised text and live with the text layer; this
//! covers token ids (the model's EOS ids and the request's `stop_token_ids`)
//! and length limits.

use crate::SamplingParams;

/// Why a sequence finished, as the OpenAI API reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// An EOS id, a stop token id, or (decided by the text layer) a stop string.
    Stop,
    /// `max_tokens` or the model's context length was reached.
    Length,
    /// Cancelled by the client or the server.
    Abort,
}

impl FinishReason {
    /// The `finish_reason` string of the OpenAI API.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// The outcome of a stop check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finish {
    pub reason: FinishReason,
    /// The request's stop token that matched (vLLM's `stop_reason`);
    /// `None` for EOS and for length.
    pub stop_token: Option<u32>,
}

/// A sequence's stop rules, fixed at admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopConditions {
    eos_token_ids: Vec<u32>,
    stop_token_ids: Vec<u32>,
    ignore_eos: bool,
    min_tokens: usize,
    max_tokens: Option<usize>,
    max_seq_len: Option<usize>,
}

impl StopConditions {
    /// `eos_token_ids` are the model's end ids (generation config); they stop
    /// generation unless `ignore_eos` is set.
    pub fn new(params: &SamplingParams, eos_token_ids: &[u32]) -> Self {
        Self {
            eos_token_ids: eos_token_ids.to_vec(),
            stop_token_ids: params.stop_token_ids.clone(),
            ignore_eos: params.ignore_eos,
            min_tokens: params.min_tokens,
            max_tokens: params.max_tokens,
            max_seq_len: None,
        }
    }

    /// Also stop with `Length` once prompt + output reaches `max_seq_len`
    /// (the model's context length).
    pub fn with_max_seq_len(mut self, max_seq_len: usize) -> Self {
        self.max_seq_len = Some(max_seq_len);
        self
    }

    /// How many more tokens may still be generated before a `Length` finish
    /// (max_tokens or the context length), given `num_generated` so far and
    /// a sequence of `seq_len` tokens. Speculative decoding drafts no further.
    pub fn tokens_left(&self, num_generated: usize, seq_len: usize) -> usize {
        let by_tokens = self
            .max_tokens
            .map_or(usize::MAX, |m| m.saturating_sub(num_generated));
        let by_len = self
            .max_seq_len
            .map_or(usize::MAX, |m| m.saturating_sub(seq_len));
        by_tokens.min(by_len)
    }

    /// Ids that end generation: stop token ids, plus EOS unless ignored.
    /// These are the ids masked while fewer than `min_tokens` were generated.
    pub fn stopping_ids(&self) -> Vec<u32> {
        let mut ids = self.stop_token_ids.clone();
        if !self.ignore_eos {
            ids.extend_from_slice(&self.eos_token_ids);
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    pub fn min_tokens(&self) -> usize {
        self.min_tokens
    }

    /// Check the token just generated. `num_generated` counts it, `seq_len`
    /// is prompt + output including it. A stop token wins over a length limit
    /// reached on the same step, since the model ended on its own; stop tokens
    /// are not honoured before `min_tokens`.
    pub fn check(&self, token: u32, num_generated: usize, seq_len: usize) -> Option<Finish> {
        if num_generated >= self.min_tokens {
            if !self.ignore_eos && self.eos_token_ids.contains(&token) {
                return Some(Finish {
                    reason: FinishReason::Stop,
                    stop_token: None,
                });
            }
            if self.stop_token_ids.contains(&token) {
                return Some(Finish {
                    reason: FinishReason::Stop,
                    stop_token: Some(token),
                });
            }
        }
        let over_max_tokens = self.max_tokens.is_some_and(|m| num_generated >= m);
        let over_context = self.max_seq_len.is_some_and(|m| seq_len >= m);
        (over_max_tokens || over_context).then_some(Finish {
            reason: FinishReason::Length,
            stop_token: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOS: u32 = 2;

    fn params() -> SamplingParams {
        SamplingParams {
            stop_token_ids: vec![7],
            max_tokens: Some(5),
            ..SamplingParams::default()
        }
    }

    #[test]
    fn eos_and_stop_tokens_stop() {
        let stop = StopConditions::new(&params(), &[EOS]);
        assert_eq!(stop.check(3, 1, 10), None);
        let eos = stop.check(EOS, 1, 10).unwrap();
        assert_eq!((eos.reason, eos.stop_token), (FinishReason::Stop, None));
        let st = stop.check(7, 2, 11).unwrap();
        assert_eq!((st.reason, st.stop_token), (FinishReason::Stop, Some(7)));
        assert_eq!(FinishReason::Stop.as_str(), "stop");
    }

    #[test]
    fn length_limits() {
        let stop = StopConditions::new(&params(), &[EOS]).with_max_seq_len(12);
        assert_eq!(stop.check(3, 4, 8), None);
        assert_eq!(stop.check(3, 5, 9).unwrap().reason, FinishReason::Length);
        assert_eq!(stop.check(3, 2, 12).unwrap().reason, FinishReason::Length);
        // EOS on the last allowed step is still a natural stop.
        assert_eq!(stop.check(EOS, 5, 9).unwrap().reason, FinishReason::Stop);
        // Without max_tokens or a context limit, nothing but stop tokens ends it.
        let open = StopConditions::new(&SamplingParams::default(), &[EOS]);
        assert_eq!(open.check(3, 100_000, 100_100), None);
    }

    #[test]
    fn ignore_eos_and_min_tokens() {
        let p = SamplingParams {
            ignore_eos: true,
            min_tokens: 3,
            ..params()
        };
        let stop = StopConditions::new(&p, &[EOS]);
        assert_eq!(stop.check(EOS, 1, 5), None);
        assert_eq!(stop.check(EOS, 4, 8), None);
        assert_eq!(stop.check(7, 2, 6), None, "before min_tokens");
        assert_eq!(stop.check(7, 3, 7).unwrap().stop_token, Some(7));
        assert_eq!(stop.stopping_ids(), vec![7]);
        let with_eos = StopConditions::new(&params(), &[EOS, 7]);
        assert_eq!(with_eos.stopping_ids(), vec![EOS, 7]);
    }
}

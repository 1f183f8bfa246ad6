//! vLLM's `prompt_logprobs`: one entry per prompt token, `null` for the
//! first (nothing precedes it), then a map from token id (as a string) to
//! the token's log-probability at that position, its rank and its text: the
//! actual prompt token first, then the position's most likely ids.

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

use super::MIN_LOGPROB;

/// One id's entry in a prompt position's map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptLogprob {
    pub logprob: f32,
    /// 1 + the number of ids more likely at this position.
    pub rank: u32,
    pub decoded_token: String,
}

impl PromptLogprob {
    /// A logprob JSON can carry (no `-inf` or NaN, as for `logprobs`).
    pub fn new(logprob: f32, rank: u32, decoded_token: String) -> Self {
        let logprob = if logprob.is_nan() {
            MIN_LOGPROB
        } else {
            logprob.max(MIN_LOGPROB)
        };
        PromptLogprob {
            logprob,
            rank,
            decoded_token,
        }
    }
}

/// The `prompt_logprobs` field: position `i` holds the entries of prompt
/// token `i`; position 0 is `null`.
pub type PromptLogprobs = Vec<Option<IndexMap<String, PromptLogprob>>>;

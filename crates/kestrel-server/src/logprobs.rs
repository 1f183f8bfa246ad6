//! The engine's per-token logprobs (ids) as the API reports them (token
//! bytes and text, through the tokenizer).

use kestrel_api::types::{GeneratedLogprob, LogprobToken};
use kestrel_sampling::TokenLogprobs;
use kestrel_text::Tokenizer;

/// `lp` as the API reports it; `text_offset`: where the token's text starts
/// in the choice's text, in characters.
pub fn generated(
    tokenizer: &Tokenizer,
    lp: &TokenLogprobs,
    text_offset: usize,
) -> GeneratedLogprob {
    let token = |id: u32, logprob: f32| LogprobToken {
        // The engine samples only ids the tokenizer knows (`sampled_vocab`).
        bytes: tokenizer.token_bytes(id).unwrap_or_default(),
        logprob,
    };
    GeneratedLogprob {
        chosen: token(lp.token, lp.logprob),
        top: lp.top.iter().map(|&(id, v)| token(id, v)).collect(),
        text_offset: u32::try_from(text_offset).unwrap_or(u32::MAX),
    }
}

//! The engine's prompt logprobs (one entry per prompt token after the
//! first) as the API reports them: vLLM's `prompt_logprobs` field, and the
//! prompt half of an echoed completion's `logprobs`.

use indexmap::IndexMap;
use kestrel_api::types::{
    CompletionLogprobs, GeneratedLogprob, LogprobToken, PromptLogprob, PromptLogprobs,
};
use kestrel_engine::PromptTokenLogprobs;
use kestrel_text::Tokenizer;

/// What the route needs to know about a prompt to report on it.
pub struct EchoRequest<'a> {
    pub tokenizer: &'a Tokenizer,
    /// The prompt's first token (it has no entry: nothing precedes it).
    pub first_token: u32,
    /// The engine's entries, prompt positions 1 onwards.
    pub entries: &'a [PromptTokenLogprobs],
}

/// vLLM's `prompt_logprobs` with `top` alternatives per position: `null`
/// for the first token, then for each token a map from id to its entry,
/// the prompt token first, then the position's most likely ids.
pub fn prompt_logprobs_field(
    tokenizer: &Tokenizer,
    entries: &[PromptTokenLogprobs],
    top: usize,
) -> PromptLogprobs {
    let mut out: PromptLogprobs = Vec::with_capacity(entries.len() + 1);
    out.push(None);
    for e in entries {
        let mut map = IndexMap::new();
        let rank = u32::try_from(e.rank).unwrap_or(u32::MAX);
        map.insert(
            e.token.to_string(),
            PromptLogprob::new(e.logprob, rank, token_text(tokenizer, e.token)),
        );
        for &(id, logprob) in e.top.iter().take(top) {
            // `top` is best first, so every id more likely than this one
            // precedes it in the list.
            let better = e.top.iter().filter(|&&(_, v)| v > logprob).count();
            map.entry(id.to_string()).or_insert_with(|| {
                PromptLogprob::new(logprob, 1 + better as u32, token_text(tokenizer, id))
            });
        }
        out.push(Some(map));
    }
    out
}

/// The prompt tokens' part of an echoed completion's `logprobs` (`top`
/// alternatives each): the first token without a value, then each token's
/// value and alternatives; `text_offset`s count characters from the start
/// of the prompt's text.
pub fn echo_logprobs(req: &EchoRequest<'_>, top: usize) -> CompletionLogprobs {
    let bytes = |id: u32| req.tokenizer.token_bytes(id).unwrap_or_default();
    let mut spelled = bytes(req.first_token);
    let mut out = CompletionLogprobs::default();
    out.push_unscored(
        &LogprobToken {
            bytes: spelled.clone(),
            logprob: 0.0,
        },
        0,
    );
    let mut offsets = CharOffsets::default();
    let mut tokens = Vec::with_capacity(req.entries.len());
    for e in req.entries {
        let chosen = LogprobToken {
            bytes: bytes(e.token),
            logprob: e.logprob,
        };
        tokens.push(GeneratedLogprob {
            text_offset: offsets.complete_chars(&spelled),
            top: e
                .top
                .iter()
                .take(top)
                .map(|&(id, logprob)| LogprobToken {
                    bytes: bytes(id),
                    logprob,
                })
                .collect(),
            chosen: chosen.clone(),
        });
        spelled.extend_from_slice(&chosen.bytes);
    }
    out.append(CompletionLogprobs::from_tokens(&tokens));
    out
}

/// A token's text alone (a partial UTF-8 character shows as U+FFFD).
fn token_text(tokenizer: &Tokenizer, id: u32) -> String {
    String::from_utf8_lossy(&tokenizer.token_bytes(id).unwrap_or_default()).into_owned()
}

/// Characters of the text a growing byte string spells, not counting a
/// character it only begins (its token's text starts where that character
/// does). Counted from where the last call stopped, so offsets over a long
/// prompt cost linear, not quadratic, time.
#[derive(Default)]
struct CharOffsets {
    /// `bytes[..counted]` is valid UTF-8 and holds `chars` characters.
    counted: usize,
    chars: usize,
}

impl CharOffsets {
    /// `bytes` must extend the bytes of the previous call.
    fn complete_chars(&mut self, bytes: &[u8]) -> u32 {
        let rest = &bytes[self.counted..];
        let valid = match std::str::from_utf8(rest) {
            Ok(s) => s,
            // Safe: `valid_up_to` ends on a character boundary.
            Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or_default(),
        };
        self.counted += valid.len();
        self.chars += valid.chars().count();
        u32::try_from(self.chars).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::CharOffsets;

    fn complete_chars(bytes: &[u8]) -> u32 {
        CharOffsets::default().complete_chars(bytes)
    }

    #[test]
    fn offsets_count_only_whole_characters() {
        assert_eq!(complete_chars(b"ab"), 2);
        let e_acute = "é".as_bytes();
        assert_eq!(complete_chars(&[b'a', e_acute[0]]), 1);
        assert_eq!(complete_chars(&[b'a', e_acute[0], e_acute[1]]), 2);
        assert_eq!(complete_chars(&[]), 0);
    }

    #[test]
    fn counting_on_from_the_last_call_equals_counting_again() {
        let text = "a\u{e9}\u{4e2d}b\u{1f600}c".as_bytes();
        let mut bad = text.to_vec();
        bad.insert(3, 0xff);
        for bytes in [text, bad.as_slice()] {
            let mut offsets = CharOffsets::default();
            for end in 0..=bytes.len() {
                assert_eq!(
                    offsets.complete_chars(&bytes[..end]),
                    complete_chars(&bytes[..end]),
                    "{bytes:?} up to {end}"
                );
            }
        }
    }
}

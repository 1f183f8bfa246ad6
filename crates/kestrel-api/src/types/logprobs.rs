//! `logprobs` of a choice, in OpenAI's two shapes: chat's list of token
//! entries and the legacy completions' parallel arrays. Both are built from
//! the same per-token record, [`GeneratedLogprob`].

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// JSON has no `-inf`; a token the model gave no probability at all is
/// reported at this value (vLLM's choice).
pub const MIN_LOGPROB: f32 = -9999.0;

/// A token as the logprobs name it: its bytes and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct LogprobToken {
    /// What the token stands for; possibly part of a UTF-8 character.
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

impl LogprobToken {
    /// The token's text, with a replacement character for a partial one.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }

    fn reported_logprob(&self) -> f32 {
        if self.logprob.is_nan() {
            MIN_LOGPROB
        } else {
            self.logprob.max(MIN_LOGPROB)
        }
    }
}

/// One generated token: the chosen one, the row's most likely ones (best
/// first) and where its text starts in the choice's text, in characters.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedLogprob {
    pub chosen: LogprobToken,
    pub top: Vec<LogprobToken>,
    pub text_offset: u32,
}

/// `choices[].logprobs` of a chat completion or chunk.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    pub content: Vec<ChatTokenLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Option<Vec<u8>>,
}

impl TopLogprob {
    fn of(t: &LogprobToken) -> Self {
        TopLogprob {
            token: t.text(),
            logprob: t.reported_logprob(),
            bytes: Some(t.bytes.clone()),
        }
    }
}

impl ChatLogprobs {
    pub fn from_tokens(tokens: &[GeneratedLogprob]) -> Self {
        let content = tokens
            .iter()
            .map(|g| {
                let chosen = TopLogprob::of(&g.chosen);
                ChatTokenLogprob {
                    token: chosen.token,
                    logprob: chosen.logprob,
                    bytes: chosen.bytes,
                    top_logprobs: g.top.iter().map(TopLogprob::of).collect(),
                }
            })
            .collect();
        ChatLogprobs { content }
    }
}

/// `choices[].logprobs` of a text completion or chunk: one entry per token
/// in each array. `top_logprobs` maps token texts to log-probabilities: the
/// most likely ones and, as vLLM does, the chosen token too.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    pub text_offset: Vec<u32>,
    pub token_logprobs: Vec<Option<f32>>,
    pub tokens: Vec<String>,
    pub top_logprobs: Vec<Option<IndexMap<String, f32>>>,
}

impl CompletionLogprobs {
    pub fn from_tokens(tokens: &[GeneratedLogprob]) -> Self {
        let mut out = CompletionLogprobs::default();
        for g in tokens {
            out.text_offset.push(g.text_offset);
            out.token_logprobs.push(Some(g.chosen.reported_logprob()));
            out.tokens.push(g.chosen.text());
            let mut top = IndexMap::new();
            for t in g.top.iter().chain(std::iter::once(&g.chosen)) {
                top.entry(t.text()).or_insert(t.reported_logprob());
            }
            out.top_logprobs.push(Some(top));
        }
        out
    }

    /// A token reported without a log-probability (the first of an echoed
    /// prompt: nothing precedes it).
    pub fn push_unscored(&mut self, token: &LogprobToken, text_offset: u32) {
        self.text_offset.push(text_offset);
        self.token_logprobs.push(None);
        self.tokens.push(token.text());
        self.top_logprobs.push(None);
    }

    /// These entries with `chars` added to every `text_offset` (text that
    /// precedes them, an echoed prompt).
    pub fn shifted(mut self, chars: u32) -> Self {
        for o in &mut self.text_offset {
            *o = o.saturating_add(chars);
        }
        self
    }

    /// `other`'s entries after these.
    pub fn append(&mut self, other: CompletionLogprobs) {
        self.text_offset.extend(other.text_offset);
        self.token_logprobs.extend(other.token_logprobs);
        self.tokens.extend(other.tokens);
        self.top_logprobs.extend(other.top_logprobs);
    }
}

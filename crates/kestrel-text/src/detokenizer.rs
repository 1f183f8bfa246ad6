//! Incremental detokenisation for streaming.
//!
//! Decoding token by token is wrong in two ways: a byte-level BPE token can end
//! in the middle of a UTF-8 character, and some decoders (SentencePiece
//! `Metaspace`, cleanup rules) treat the first token of a decode differently
//! from the same token in the middle of a text. So the detokeniser decodes a
//! short window that starts a few tokens back (`prefix_offset`) and emits only
//! what the window adds beyond the part already emitted (`read_offset`). It
//! holds text back while the window ends in U+FFFD, the mark of an incomplete
//! character, and releases whatever is left in [`Detokenizer::finish`].

use anyhow::Result;

use crate::Tokenizer;

/// Replacement character that lossy UTF-8 decoding puts for incomplete bytes.
const REPLACEMENT: char = '\u{FFFD}';

/// Streams the text of generated token ids.
pub struct Detokenizer {
    tokenizer: Tokenizer,
    skip_special: bool,
    ids: Vec<u32>,
    /// Start of the decode window: tokens before it are never decoded again.
    prefix_offset: usize,
    /// Tokens before this point have had their text emitted.
    read_offset: usize,
}

impl Detokenizer {
    /// A detokeniser with no context.
    pub fn new(tokenizer: &Tokenizer, skip_special: bool) -> Self {
        Self::with_context(tokenizer, skip_special, &[])
    }

    /// A detokeniser whose first tokens are decoded as the continuation of
    /// `context` (e.g. the end of the prompt); the context itself is not
    /// emitted. Only the last few context tokens matter.
    pub fn with_context(tokenizer: &Tokenizer, skip_special: bool, context: &[u32]) -> Self {
        const CONTEXT_TOKENS: usize = 6;
        let start = context.len().saturating_sub(CONTEXT_TOKENS);
        let ids = context[start..].to_vec();
        let read_offset = ids.len();
        Self {
            tokenizer: tokenizer.clone(),
            skip_special,
            ids,
            prefix_offset: 0,
            read_offset,
        }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    /// An id outside the vocabulary is an error and is not added.
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.tokenizer.check_ids(&[id])?;
        self.ids.push(id);
        let window = &self.ids[self.prefix_offset..];
        let emitted = self.tokenizer.decode(
            &self.ids[self.prefix_offset..self.read_offset],
            self.skip_special,
        )?;
        let text = self.tokenizer.decode(window, self.skip_special)?;
        if text.len() > emitted.len()
            && !text.ends_with(REPLACEMENT)
            && text.is_char_boundary(emitted.len())
        {
            let delta = text[emitted.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    /// Adds several tokens and returns the text they complete.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<String> {
        let mut out = String::new();
        for &id in ids {
            out.push_str(&self.push(id)?);
        }
        Ok(out)
    }

    /// Releases text held back (an incomplete character at the very end
    /// comes out as U+FFFD, as in a full decode). The detokeniser can keep
    /// going afterwards.
    pub fn finish(&mut self) -> String {
        let decode = |ids: &[u32]| {
            self.tokenizer
                .decode(ids, self.skip_special)
                .unwrap_or_default()
        };
        let emitted = decode(&self.ids[self.prefix_offset..self.read_offset]);
        let text = decode(&self.ids[self.prefix_offset..]);
        let delta = if text.len() > emitted.len() && text.is_char_boundary(emitted.len()) {
            text[emitted.len()..].to_string()
        } else {
            String::new()
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        delta
    }

    /// The ids kept for decoding: the retained context followed by every id pushed.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}

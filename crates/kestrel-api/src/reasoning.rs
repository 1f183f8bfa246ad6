//! Streaming split of Qwen3 output into reasoning and content.
//!
//! Qwen3.5/3.6 templates (and Qwen3 thinking-2507) end the prompt with
//! `<think>\n`, so generation starts inside reasoning; with
//! `enable_thinking=false` the prompt ends with an empty think block and
//! generation starts in content. Qwen3 hybrid models emit `<think>`
//! themselves. The start state therefore comes from the prompt
//! ([`ReasoningParser::from_prompt`]), and a `<think>` at the very start of
//! content still opens reasoning.
//!
//! Newlines around the reasoning are trimmed as the Qwen templates do when
//! they re-render history (`reasoning.strip('\n')`, `content.lstrip('\n')`).
//! A `<tool_call>` inside reasoning ends it and is passed on as content for
//! the tool parser (vLLM #39056).

use crate::scan::{find_first, partial_suffix_len};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_CALL_OPEN: &str = "<tool_call>";

/// Text produced by one step of the parser.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    pub reasoning: String,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before any content: a `<think>` here (after whitespace) opens reasoning.
    ContentStart,
    Reasoning,
    Content,
}

#[derive(Debug, Clone)]
pub struct ReasoningParser {
    mode: Mode,
    /// Unprocessed text (may hold a partial tag).
    buf: String,
    /// Drop '\n' at the start of the current section.
    strip_leading_newlines: bool,
    /// Newlines at the end of reasoning, held back until more reasoning
    /// follows (they are dropped if reasoning ends).
    held_newlines: String,
}

impl ReasoningParser {
    /// `starts_in_reasoning`: the prompt opened a think block that is still open.
    pub fn new(starts_in_reasoning: bool) -> Self {
        ReasoningParser {
            mode: if starts_in_reasoning {
                Mode::Reasoning
            } else {
                Mode::ContentStart
            },
            buf: String::new(),
            strip_leading_newlines: starts_in_reasoning,
            held_newlines: String::new(),
        }
    }

    /// Start state from the rendered prompt: inside reasoning when the last
    /// assistant turn opened `<think>` without closing it.
    pub fn from_prompt(prompt: &str) -> Self {
        Self::new(prompt_opens_reasoning(prompt))
    }

    /// Whether generation is currently inside reasoning (structured-output
    /// grammars apply only once this is false).
    pub fn in_reasoning(&self) -> bool {
        self.mode == Mode::Reasoning
    }

    pub fn push(&mut self, text: &str) -> ReasoningDelta {
        self.buf.push_str(text);
        let mut out = ReasoningDelta::default();
        loop {
            let progressed = match self.mode {
                Mode::ContentStart => self.step_content_start(&mut out),
                Mode::Reasoning => self.step_reasoning(&mut out),
                Mode::Content => {
                    let rest = std::mem::take(&mut self.buf);
                    self.emit_content(&rest, &mut out);
                    false
                }
            };
            if !progressed {
                return out;
            }
        }
    }

    /// End of generation: withheld text was not a tag after all.
    pub fn finish(&mut self) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        let rest = std::mem::take(&mut self.buf);
        match self.mode {
            Mode::Reasoning => self.emit_reasoning(&rest, &mut out),
            Mode::ContentStart | Mode::Content => {
                self.mode = Mode::Content;
                self.emit_content(&rest, &mut out);
            }
        }
        self.held_newlines.clear();
        out
    }

    /// Returns true when the mode changed and the buffer must be re-scanned.
    fn step_content_start(&mut self, out: &mut ReasoningDelta) -> bool {
        let trimmed = self.buf.trim_start();
        if let Some(after) = trimmed.strip_prefix(THINK_OPEN) {
            self.buf = after.to_string();
            self.mode = Mode::Reasoning;
            self.strip_leading_newlines = true;
            return true;
        }
        if trimmed.is_empty() || THINK_OPEN.starts_with(trimmed) {
            return false; // wait: this may still become `<think>`
        }
        self.mode = Mode::Content;
        let rest = std::mem::take(&mut self.buf);
        self.emit_content(&rest, out);
        false
    }

    fn step_reasoning(&mut self, out: &mut ReasoningDelta) -> bool {
        match find_first(&self.buf, &[THINK_CLOSE, TOOL_CALL_OPEN]) {
            Some((pos, tag)) => {
                let before = self.buf[..pos].to_string();
                self.emit_reasoning(&before, out);
                self.held_newlines.clear();
                // `</think>` is consumed; `<tool_call>` stays for the tool parser.
                let consumed = if tag == 0 {
                    pos + THINK_CLOSE.len()
                } else {
                    pos
                };
                self.buf.drain(..consumed);
                self.mode = Mode::Content;
                self.strip_leading_newlines = true;
                true
            }
            None => {
                let keep = partial_suffix_len(&self.buf, &[THINK_CLOSE, TOOL_CALL_OPEN]);
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.emit_reasoning(&ready, out);
                false
            }
        }
    }

    fn emit_reasoning(&mut self, text: &str, out: &mut ReasoningDelta) {
        let text = self.strip_leading(text);
        if text.is_empty() {
            return;
        }
        let body = text.trim_end_matches('\n');
        if body.is_empty() {
            self.held_newlines.push_str(text);
            return;
        }
        out.reasoning.push_str(&self.held_newlines);
        out.reasoning.push_str(body);
        self.held_newlines.clear();
        self.held_newlines.push_str(&text[body.len()..]);
    }

    fn emit_content(&mut self, text: &str, out: &mut ReasoningDelta) {
        let text = self.strip_leading(text);
        out.content.push_str(text);
    }

    fn strip_leading<'t>(&mut self, text: &'t str) -> &'t str {
        if !self.strip_leading_newlines {
            return text;
        }
        let stripped = text.trim_start_matches('\n');
        if !stripped.is_empty() {
            self.strip_leading_newlines = false;
        }
        stripped
    }
}

/// True when the prompt's last assistant turn has an open `<think>`.
pub fn prompt_opens_reasoning(prompt: &str) -> bool {
    let tail = prompt
        .rfind("<|im_start|>assistant")
        .map_or(prompt, |i| &prompt[i..]);
    match (tail.rfind(THINK_OPEN), tail.rfind(THINK_CLOSE)) {
        (Some(open), Some(close)) => open > close,
        (Some(_), None) => true,
        _ => false,
    }
}

/// Non-streaming split: `(reasoning, content)`, each `None` when empty.
pub fn split_reasoning(starts_in_reasoning: bool, text: &str) -> (Option<String>, Option<String>) {
    let mut parser = ReasoningParser::new(starts_in_reasoning);
    let mut all = parser.push(text);
    let tail = parser.finish();
    all.reasoning.push_str(&tail.reasoning);
    all.content.push_str(&tail.content);
    let none_if_empty = |s: String| (!s.is_empty()).then_some(s);
    (none_if_empty(all.reasoning), none_if_empty(all.content))
}

//! Qwen3.5/3.6 (Qwen3-Coder style) XML tool calls, parsed incrementally:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=ARG>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! Values are text; they become JSON through the tool's schema
//! ([`super::schema::coerce_value`]). Each parameter is emitted as an
//! arguments fragment as soon as its `</parameter>` arrives.

use serde_json::Value;

use super::schema::{coerce_value, param_schema};

const FUNCTION_OPEN: &str = "<function=";
const FUNCTION_CLOSE: &str = "</function>";
const PARAM_OPEN: &str = "<parameter=";
const PARAM_CLOSE: &str = "</parameter>";

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum XmlEvent {
    /// A function call begins.
    Start(String),
    /// The next fragment of its arguments JSON.
    Args(String),
    /// The call's arguments are complete.
    End,
}

#[derive(Debug, Clone)]
enum State {
    ExpectFunction,
    InFunction {
        name: String,
        params: usize,
    },
    /// `search_from`: where `</parameter>` may start, so long values are
    /// not rescanned on every chunk.
    InParam {
        name: String,
        params: usize,
        param: String,
        value_start: usize,
        search_from: usize,
    },
}

/// Parses the body of one `<tool_call>` (the text after the tag), which
/// may hold several functions.
#[derive(Debug, Clone)]
pub(crate) struct XmlCallParser {
    pos: usize,
    state: State,
}

impl XmlCallParser {
    pub fn new() -> Self {
        XmlCallParser {
            pos: 0,
            state: State::ExpectFunction,
        }
    }

    /// Consumes the complete parts of `body[pos..]`. With `complete`, the
    /// body has ended (`</tool_call>` or end of output) and open elements
    /// are closed leniently.
    pub fn advance(
        &mut self,
        body: &str,
        complete: bool,
        schema_of: &dyn Fn(&str) -> Option<Value>,
    ) -> Vec<XmlEvent> {
        let mut events = Vec::new();
        loop {
            let rest = &body[self.pos..];
            let skipped = rest.len() - rest.trim_start().len();
            let tail = &rest[skipped..];
            match std::mem::replace(&mut self.state, State::ExpectFunction) {
                State::ExpectFunction => {
                    if let Some(name) = open_tag(tail, FUNCTION_OPEN) {
                        let (name, len) = name;
                        self.pos += skipped + len;
                        events.push(XmlEvent::Start(name.clone()));
                        self.state = State::InFunction { name, params: 0 };
                    } else if !self.skip_unknown(tail, skipped, &[FUNCTION_OPEN], complete) {
                        return events;
                    }
                }
                State::InFunction { name, params } => {
                    if let Some((param, len)) = open_tag(tail, PARAM_OPEN) {
                        self.pos += skipped + len;
                        let value_start = self.pos;
                        self.state = State::InParam {
                            name,
                            params,
                            param,
                            value_start,
                            search_from: value_start,
                        };
                    } else if tail.starts_with(FUNCTION_CLOSE) {
                        self.pos += skipped + FUNCTION_CLOSE.len();
                        events.push(close_args(params));
                        events.push(XmlEvent::End);
                    } else if complete && tail.is_empty() {
                        events.push(close_args(params));
                        events.push(XmlEvent::End);
                        return events;
                    } else {
                        self.state = State::InFunction { name, params };
                        if !self.skip_unknown(
                            tail,
                            skipped,
                            &[PARAM_OPEN, FUNCTION_CLOSE],
                            complete,
                        ) {
                            return events;
                        }
                    }
                }
                State::InParam {
                    name,
                    params,
                    param,
                    value_start,
                    search_from,
                } => {
                    let value_text = &body[value_start..];
                    let end = match body[search_from..].find(PARAM_CLOSE) {
                        Some(e) => {
                            let e = search_from - value_start + e;
                            Some((e, e + PARAM_CLOSE.len()))
                        }
                        // The model may drop `</parameter>`; only trust that at the very end.
                        None if complete => {
                            let e = value_text.find(FUNCTION_CLOSE).unwrap_or(value_text.len());
                            Some((e, e))
                        }
                        None => None,
                    };
                    let Some((value_end, consumed)) = end else {
                        let mut search_from = body
                            .len()
                            .saturating_sub(PARAM_CLOSE.len())
                            .max(value_start);
                        while !body.is_char_boundary(search_from) {
                            search_from -= 1;
                        }
                        self.state = State::InParam {
                            name,
                            params,
                            param,
                            value_start,
                            search_from,
                        };
                        return events;
                    };
                    let value = trim_one_newline(&value_text[..value_end]);
                    let json = coerce_value(
                        value,
                        schema_of(&name)
                            .as_ref()
                            .and_then(|s| param_schema(s, &param)),
                    );
                    let key = serde_json::to_string(&param).unwrap_or_default();
                    let val = serde_json::to_string(&json).unwrap_or_default();
                    let sep = if params == 0 { "{" } else { "," };
                    events.push(XmlEvent::Args(format!("{sep}{key}:{val}")));
                    self.pos = value_start + consumed;
                    self.state = State::InFunction {
                        name,
                        params: params + 1,
                    };
                }
            }
        }
    }

    /// Skips text that is not an expected tag. Returns false when it must
    /// wait for more input (the tail may still become a tag).
    fn skip_unknown(&mut self, tail: &str, skipped: usize, tags: &[&str], complete: bool) -> bool {
        if tail.is_empty() {
            self.pos += skipped;
            return false;
        }
        let could_be_tag = tags
            .iter()
            .any(|t| t.starts_with(tail) || (tail.starts_with(t) && !tail.contains('>')));
        if could_be_tag && !complete {
            self.pos += skipped;
            return false;
        }
        // Garbage: skip to the next '<' after the first character.
        let first = tail.chars().next().map_or(1, char::len_utf8);
        let next = tail[first..].find('<').map_or(tail.len(), |i| i + first);
        self.pos += skipped + next;
        true
    }
}

/// `<function=NAME>` or `<parameter=NAME>` at the start of `text`:
/// the name and the tag's byte length, once the closing `>` has arrived.
fn open_tag(text: &str, prefix: &str) -> Option<(String, usize)> {
    let after = text.strip_prefix(prefix)?;
    let close = after.find('>')?;
    let name = after[..close].trim();
    if name.is_empty() || name.contains('<') || name.contains('\n') {
        return None;
    }
    Some((name.to_string(), prefix.len() + close + 1))
}

fn close_args(params: usize) -> XmlEvent {
    XmlEvent::Args(if params == 0 { "{}".into() } else { "}".into() })
}

/// The template writes values as `\nVALUE\n`; drop exactly those newlines.
fn trim_one_newline(v: &str) -> &str {
    let v = v.strip_prefix('\n').unwrap_or(v);
    v.strip_suffix('\n').unwrap_or(v)
}

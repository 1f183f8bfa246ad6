//! Streaming tool-call extraction for Qwen3 models. Both Qwen formats are
//! recognised per call, by the first character after `<tool_call>`:
//! `{` is Qwen3 JSON ([`json`]), `<` is Qwen3.5/3.6 XML ([`xml`]).
//!
//! Output follows OpenAI streaming: the first delta of a call carries `id`,
//! `type`, `index` and `function.name`; later deltas carry `index` and
//! `function.arguments` fragments that concatenate to the arguments JSON.
//! XML calls stream one fragment per parameter; JSON calls are emitted
//! when their `</tool_call>` arrives. Text outside calls is content;
//! whitespace between content and calls is dropped. A call still open at
//! the end is returned as content.

pub mod json;
pub mod schema;
mod xml;

use rand::Rng;
use serde_json::Value;

use crate::request::Tool;
use crate::scan::partial_suffix_len;
use crate::types::{FunctionCall, FunctionCallDelta, ToolCall, ToolCallDelta};
use xml::{XmlCallParser, XmlEvent};

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// `call_` followed by 24 random alphanumerics.
pub fn new_call_id() -> String {
    let suffix: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(24)
        .map(char::from)
        .collect();
    format!("call_{suffix}")
}

/// What one step of the parser produced.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolParseDelta {
    pub content: String,
    pub tool_calls: Vec<ToolCallDelta>,
}

/// The last step, at the end of generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolParseEnd {
    pub delta: ToolParseDelta,
    /// A `<tool_call>` was still open: its text was returned as content.
    pub unterminated: bool,
    /// Index of a call whose first deltas were already streamed but which
    /// never completed; non-streaming results drop it.
    pub incomplete_call: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Format {
    Undecided,
    Json,
    Xml,
}

#[derive(Debug)]
struct CallInProgress {
    /// Whitespace between the content and `<tool_call>`, restored if the
    /// call turns out not to be one.
    lead_ws: String,
    /// Text after `<tool_call>`.
    body: String,
    format: Format,
    xml: XmlCallParser,
    /// Functions started inside this `<tool_call>`.
    started: usize,
}

/// An emitted call whose arguments are not complete yet.
#[derive(Debug, Clone, Copy)]
struct OpenCall {
    index: u32,
    suppressed: bool,
}

#[derive(Debug)]
pub struct ToolCallParser {
    schemas: Vec<(String, Value)>,
    max_calls: Option<usize>,
    /// Unprocessed text outside calls.
    buf: String,
    call: Option<CallInProgress>,
    open: Option<OpenCall>,
    calls_started: usize,
    /// Trailing whitespace of content, dropped if a call follows.
    held_ws: String,
    /// Drop whitespace right after `</tool_call>`.
    skip_ws: bool,
}

impl ToolCallParser {
    /// `parallel_tool_calls=false` keeps only the first call.
    pub fn new(tools: &[Tool], parallel_tool_calls: bool) -> Self {
        ToolCallParser {
            schemas: tools
                .iter()
                .map(|t| (t.name.clone(), t.parameters.clone()))
                .collect(),
            max_calls: (!parallel_tool_calls).then_some(1),
            buf: String::new(),
            call: None,
            open: None,
            calls_started: 0,
            held_ws: String::new(),
            skip_ws: false,
        }
    }

    pub fn push(&mut self, text: &str) -> ToolParseDelta {
        self.buf.push_str(text);
        let mut out = ToolParseDelta::default();
        while self.step(&mut out) {}
        out
    }

    /// End of generation: flushes held text; an open call becomes content.
    pub fn finish(&mut self) -> ToolParseEnd {
        let mut end = ToolParseEnd::default();
        match self.call.take() {
            Some(call) => {
                end.unterminated = true;
                end.incomplete_call = self.open.take().filter(|o| !o.suppressed).map(|o| o.index);
                end.delta.content = format!("{}{CALL_OPEN}{}{}", call.lead_ws, call.body, self.buf);
            }
            None => {
                end.delta.content = format!("{}{}", self.held_ws, self.buf);
            }
        }
        self.held_ws.clear();
        self.buf.clear();
        end
    }

    /// One step of the state machine; false when it needs more input.
    fn step(&mut self, out: &mut ToolParseDelta) -> bool {
        if self.call.is_some() {
            return self.step_call(out);
        }
        if self.skip_ws {
            let trimmed = self.buf.trim_start().len();
            self.buf.drain(..self.buf.len() - trimmed);
            if self.buf.is_empty() {
                return false;
            }
            self.skip_ws = false;
        }
        if let Some(p) = self.buf.find(CALL_OPEN) {
            let before: String = self.buf.drain(..p).collect();
            self.emit_content(&before, out);
            let lead_ws = std::mem::take(&mut self.held_ws);
            self.buf.drain(..CALL_OPEN.len());
            self.call = Some(CallInProgress {
                lead_ws,
                body: String::new(),
                format: Format::Undecided,
                xml: XmlCallParser::new(),
                started: 0,
            });
            return true;
        }
        let keep = partial_suffix_len(&self.buf, &[CALL_OPEN]);
        let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
        self.emit_content(&ready, out);
        false
    }

    fn step_call(&mut self, out: &mut ToolParseDelta) -> bool {
        let Some(mut call) = self.call.take() else {
            return false;
        };
        // Search only where a new close tag can start.
        let search_from =
            floor_char_boundary(&call.body, call.body.len().saturating_sub(CALL_CLOSE.len()));
        call.body.push_str(&self.buf);
        self.buf.clear();
        if call.format == Format::Undecided {
            call.format = match call.body.trim_start().chars().next() {
                None => Format::Undecided,
                Some('<') => Format::Xml,
                Some(_) => Format::Json,
            };
        }
        if let Some(rel) = call.body[search_from..].find(CALL_CLOSE) {
            let p = search_from + rel;
            self.buf = call.body[p + CALL_CLOSE.len()..].to_string();
            call.body.truncate(p);
            // Whitespace after a real call is layout; after a false one, text.
            self.skip_ws = self.complete_call(call, out);
            return true;
        }
        if call.format == Format::Xml {
            let safe = call.body.len() - partial_suffix_len(&call.body, &[CALL_CLOSE]);
            let events = call
                .xml
                .advance(&call.body[..safe], false, &|n| self.schema(n));
            call.started += self.apply_xml(events, out);
        }
        self.call = Some(call);
        false
    }

    /// Emits a finished call; false when the text was not a call after all.
    fn complete_call(&mut self, mut call: CallInProgress, out: &mut ToolParseDelta) -> bool {
        match call.format {
            Format::Xml => {
                let events = call.xml.advance(&call.body, true, &|n| self.schema(n));
                call.started += self.apply_xml(events, out);
                if call.started > 0 {
                    return true;
                }
            }
            Format::Json => {
                if let Some((name, arguments)) = json::parse_json_call(&call.body) {
                    self.apply_xml(
                        vec![
                            XmlEvent::Start(name),
                            XmlEvent::Args(arguments),
                            XmlEvent::End,
                        ],
                        out,
                    );
                    return true;
                }
            }
            Format::Undecided => {}
        }
        // Not a call after all: keep the text.
        out.content.push_str(&format!(
            "{}{CALL_OPEN}{}{CALL_CLOSE}",
            call.lead_ws, call.body
        ));
        false
    }

    /// Turns parser events into deltas; returns the number of calls started.
    fn apply_xml(&mut self, events: Vec<XmlEvent>, out: &mut ToolParseDelta) -> usize {
        let mut started = 0;
        for event in events {
            match event {
                XmlEvent::Start(name) => {
                    let suppressed = self.max_calls.is_some_and(|m| self.calls_started >= m);
                    let index = self.calls_started as u32;
                    self.calls_started += 1;
                    started += 1;
                    self.open = Some(OpenCall { index, suppressed });
                    if !suppressed {
                        out.tool_calls.push(ToolCallDelta {
                            index,
                            id: Some(new_call_id()),
                            kind: Some("function".into()),
                            function: FunctionCallDelta {
                                name: Some(name),
                                arguments: None,
                            },
                        });
                    }
                }
                XmlEvent::Args(fragment) => {
                    if let Some(open) = self.open.filter(|o| !o.suppressed) {
                        out.tool_calls.push(ToolCallDelta {
                            index: open.index,
                            id: None,
                            kind: None,
                            function: FunctionCallDelta {
                                name: None,
                                arguments: Some(fragment),
                            },
                        });
                    }
                }
                XmlEvent::End => self.open = None,
            }
        }
        started
    }

    fn schema(&self, name: &str) -> Option<Value> {
        self.schemas
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
    }

    /// Content, holding back trailing whitespace until we know whether a
    /// call follows.
    fn emit_content(&mut self, text: &str, out: &mut ToolParseDelta) {
        if text.is_empty() {
            return;
        }
        self.held_ws.push_str(text);
        let body_len = self.held_ws.trim_end().len();
        if body_len > 0 {
            out.content.push_str(&self.held_ws[..body_len]);
            self.held_ws.drain(..body_len);
        }
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Merges streamed deltas into complete calls, by index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolCallAccumulator {
    calls: Vec<ToolCall>,
}

impl ToolCallAccumulator {
    pub fn push(&mut self, delta: &ToolCallDelta) {
        let index = delta.index as usize;
        while self.calls.len() <= index {
            self.calls.push(ToolCall {
                id: String::new(),
                kind: "function".into(),
                function: FunctionCall {
                    name: String::new(),
                    arguments: String::new(),
                },
            });
        }
        let call = &mut self.calls[index];
        if let Some(id) = &delta.id {
            call.id = id.clone();
        }
        if let Some(name) = &delta.function.name {
            call.function.name.push_str(name);
        }
        if let Some(args) = &delta.function.arguments {
            call.function.arguments.push_str(args);
        }
    }

    pub fn into_calls(self) -> Vec<ToolCall> {
        self.calls
    }
}

/// Non-streaming result.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ParsedToolCalls {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// The output ended inside a `<tool_call>` (returned as content).
    pub unterminated: bool,
}

/// Parses a whole output with the same machinery as streaming, so both
/// paths give the same content and calls.
pub fn parse_complete(text: &str, tools: &[Tool], parallel_tool_calls: bool) -> ParsedToolCalls {
    let mut parser = ToolCallParser::new(tools, parallel_tool_calls);
    let mut acc = ToolCallAccumulator::default();
    let mut content = String::new();
    let step = parser.push(text);
    content.push_str(&step.content);
    step.tool_calls.iter().for_each(|d| acc.push(d));
    let end = parser.finish();
    content.push_str(&end.delta.content);
    end.delta.tool_calls.iter().for_each(|d| acc.push(d));
    let mut tool_calls = acc.into_calls();
    if let Some(i) = end.incomplete_call {
        tool_calls.truncate(i as usize);
    }
    ParsedToolCalls {
        content: (!content.is_empty()).then_some(content),
        tool_calls,
        unterminated: end.unterminated,
    }
}

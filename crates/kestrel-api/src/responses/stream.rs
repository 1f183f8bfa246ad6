//! A response built from the chat output parsers' deltas, with the
//! Responses stream events on the way: `response.created`,
//! `response.in_progress`, then per output item `response.output_item.added`,
//! its content part and deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`),
//! their `.done` events and `response.output_item.done`; at the end
//! `response.completed` (or `response.incomplete`) carrying the whole
//! response. Every event has a `sequence_number`, counted from 0.
//!
//! Non-streaming requests run the same builder and keep only the final
//! response, so both paths give the same output items.

use serde_json::{Map, Value, json};

use super::response::{ResponseUsage, incomplete_details, named_event, status};
use crate::types::sse::DeltaParts;
use crate::types::{FinishReason, ToolCallDelta};

/// The output item being streamed; one at a time, a change of kind
/// (reasoning -> text -> call) closes it.
#[derive(Debug, Clone)]
enum OpenItem {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        /// The call's index in the chat pipeline's numbering.
        chat_index: u32,
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

#[derive(Debug, Clone)]
pub struct ResponseBuilder {
    /// The response object without `output`, `status` and `usage`.
    base: Map<String, Value>,
    /// Makes item ids unique: `msg_<tag>_<output index>`.
    tag: String,
    sequence_number: u64,
    output: Vec<Value>,
    open: Option<OpenItem>,
    /// Whitespace that arrived while no message was open: sent only if real
    /// text follows, so the newlines before a tool call open no message.
    held_whitespace: String,
    reasoning: String,
}

impl ResponseBuilder {
    /// `echo`: the request fields the response repeats
    /// ([`super::ResponsesRequest::echo`]).
    pub fn new(tag: &str, model: &str, created_at: u64, echo: Map<String, Value>) -> Self {
        let mut base = Map::new();
        base.insert("id".into(), json!(format!("resp_{tag}")));
        base.insert("object".into(), json!("response"));
        base.insert("created_at".into(), json!(created_at));
        base.insert("error".into(), Value::Null);
        base.insert("incomplete_details".into(), Value::Null);
        base.insert("model".into(), json!(model));
        base.extend(echo);
        ResponseBuilder {
            base,
            tag: tag.to_string(),
            sequence_number: 0,
            output: Vec::new(),
            open: None,
            held_whitespace: String::new(),
            reasoning: String::new(),
        }
    }

    /// All reasoning text so far (to count its tokens).
    pub fn reasoning_text(&self) -> &str {
        &self.reasoning
    }

    /// `response.created` and `response.in_progress`.
    pub fn start(&mut self) -> Vec<String> {
        let snapshot = self.snapshot("in_progress", Value::Null);
        vec![
            self.event("response.created", json!({"response": snapshot})),
            self.event("response.in_progress", json!({"response": snapshot})),
        ]
    }

    /// Events for one step of the output parsers.
    pub fn delta(&mut self, mut parts: DeltaParts) -> Vec<String> {
        let mut out = Vec::new();
        // Arguments that continue the open call reach its item before any
        // content of this step closes it.
        let open_call = match &self.open {
            Some(OpenItem::Call { chat_index, .. }) => Some(*chat_index),
            _ => None,
        };
        let continued = parts.take_continuing_arguments(open_call);
        self.calls(continued, &mut out);
        if !parts.reasoning.is_empty() {
            self.reasoning_delta(&parts.reasoning, &mut out);
        }
        if !parts.content.is_empty() {
            self.text_delta(&parts.content, &mut out);
        }
        self.calls(parts.tool_calls, &mut out);
        out
    }

    /// Events for call deltas: a new call's item, or arguments for the open one.
    fn calls(&mut self, calls: Vec<ToolCallDelta>, out: &mut Vec<String>) {
        for call in calls {
            if call.id.is_some() || call.function.name.is_some() {
                self.close("completed", out);
                let id = self.item_id("fc");
                let item = json!({
                    "id": id, "type": "function_call", "status": "in_progress",
                    "call_id": call.id.clone().unwrap_or_default(),
                    "name": call.function.name.clone().unwrap_or_default(),
                    "arguments": "",
                });
                self.added(item, out);
                self.open = Some(OpenItem::Call {
                    chat_index: call.index,
                    id,
                    call_id: call.id.unwrap_or_default(),
                    name: call.function.name.unwrap_or_default(),
                    arguments: String::new(),
                });
            }
            let Some(args) = call.function.arguments.filter(|a| !a.is_empty()) else {
                continue;
            };
            let output_index = self.output.len();
            let fields = match &mut self.open {
                Some(OpenItem::Call {
                    chat_index,
                    id,
                    arguments,
                    ..
                }) if *chat_index == call.index => {
                    arguments.push_str(&args);
                    json!({"item_id": id, "output_index": output_index, "delta": args})
                }
                _ => continue,
            };
            out.push(self.event("response.function_call_arguments.delta", fields));
        }
    }

    /// The closing events; the response is final afterwards.
    pub fn finish(&mut self, reason: FinishReason, usage: ResponseUsage) -> Vec<String> {
        let mut out = Vec::new();
        let item_status = if reason == FinishReason::Length {
            "incomplete"
        } else {
            "completed"
        };
        self.close(item_status, &mut out);
        self.base
            .insert("incomplete_details".into(), incomplete_details(reason));
        let status = status(reason);
        let response = self.snapshot(status, json!(usage));
        self.base.insert("status".into(), json!(status));
        self.base.insert("usage".into(), json!(usage));
        out.push(self.event(&format!("response.{status}"), json!({"response": response})));
        out
    }

    /// A failure after the stream started: `response.failed`.
    pub fn failure(&mut self, message: &str) -> Vec<String> {
        let mut out = Vec::new();
        self.close("incomplete", &mut out);
        self.base.insert(
            "error".into(),
            json!({"code": "server_error", "message": message}),
        );
        let response = self.snapshot("failed", Value::Null);
        out.push(self.event("response.failed", json!({"response": response})));
        out
    }

    /// The response object as it stands (final after [`Self::finish`]).
    pub fn response(&self) -> Value {
        let mut r = self.base.clone();
        r.insert("output".into(), Value::Array(self.output.clone()));
        Value::Object(r)
    }

    fn snapshot(&self, status: &str, usage: Value) -> Value {
        let mut r = self.base.clone();
        r.insert("status".into(), json!(status));
        r.insert("output".into(), Value::Array(self.output.clone()));
        r.insert("usage".into(), usage);
        Value::Object(r)
    }

    fn event(&mut self, kind: &str, fields: Value) -> String {
        let mut data = Map::new();
        data.insert("type".into(), json!(kind));
        data.insert("sequence_number".into(), json!(self.sequence_number));
        if let Value::Object(f) = fields {
            data.extend(f);
        }
        self.sequence_number += 1;
        named_event(&Value::Object(data))
    }

    fn item_id(&self, prefix: &str) -> String {
        format!("{prefix}_{}_{}", self.tag, self.output.len())
    }

    fn added(&mut self, item: Value, out: &mut Vec<String>) {
        let fields = json!({"output_index": self.output.len(), "item": item});
        out.push(self.event("response.output_item.added", fields));
    }

    fn part_added(&mut self, id: &str, part: Value, out: &mut Vec<String>) {
        let fields = json!({
            "item_id": id, "output_index": self.output.len(), "content_index": 0, "part": part,
        });
        out.push(self.event("response.content_part.added", fields));
    }

    fn reasoning_delta(&mut self, delta: &str, out: &mut Vec<String>) {
        self.reasoning.push_str(delta);
        if !matches!(self.open, Some(OpenItem::Reasoning { .. })) {
            self.close("completed", out);
            let id = self.item_id("rs");
            let item = json!({"id": id, "type": "reasoning", "status": "in_progress",
                              "summary": [], "content": []});
            self.added(item, out);
            self.part_added(&id, json!({"type": "reasoning_text", "text": ""}), out);
            self.open = Some(OpenItem::Reasoning {
                id,
                text: String::new(),
            });
        }
        let output_index = self.output.len();
        let Some(OpenItem::Reasoning { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let fields = json!({"item_id": id, "output_index": output_index,
                            "content_index": 0, "delta": delta});
        out.push(self.event("response.reasoning_text.delta", fields));
    }

    fn text_delta(&mut self, delta: &str, out: &mut Vec<String>) {
        let message_open = matches!(self.open, Some(OpenItem::Message { .. }));
        if !message_open && delta.trim().is_empty() {
            self.held_whitespace.push_str(delta);
            return;
        }
        let delta = format!("{}{delta}", std::mem::take(&mut self.held_whitespace));
        if !message_open {
            self.close("completed", out);
            let id = self.item_id("msg");
            let item = json!({"id": id, "type": "message", "status": "in_progress",
                              "role": "assistant", "content": []});
            self.added(item, out);
            self.part_added(&id, output_text(""), out);
            self.open = Some(OpenItem::Message {
                id,
                text: String::new(),
            });
        }
        let output_index = self.output.len();
        let Some(OpenItem::Message { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(&delta);
        let fields = json!({"item_id": id, "output_index": output_index,
                            "content_index": 0, "delta": delta, "logprobs": []});
        out.push(self.event("response.output_text.delta", fields));
    }

    /// Closes the open item with its `.done` events; `status` is the item's
    /// final status (`incomplete` when the token limit cut it).
    fn close(&mut self, status: &str, out: &mut Vec<String>) {
        self.held_whitespace.clear();
        let Some(open) = self.open.take() else {
            return;
        };
        let output_index = self.output.len();
        let at =
            |id: &str| json!({"item_id": id, "output_index": output_index, "content_index": 0});
        let item = match open {
            OpenItem::Reasoning { id, text } => {
                let part = json!({"type": "reasoning_text", "text": text});
                out.push(self.event("response.reasoning_text.done", with(at(&id), "text", &text)));
                out.push(self.event("response.content_part.done", with(at(&id), "part", &part)));
                json!({"id": id, "type": "reasoning", "status": status,
                       "summary": [], "content": [part]})
            }
            OpenItem::Message { id, text } => {
                let part = output_text(&text);
                let done = with(with(at(&id), "text", &text), "logprobs", json!([]));
                out.push(self.event("response.output_text.done", done));
                out.push(self.event("response.content_part.done", with(at(&id), "part", &part)));
                json!({"id": id, "type": "message", "status": status,
                       "role": "assistant", "content": [part]})
            }
            OpenItem::Call {
                id,
                call_id,
                name,
                arguments,
                ..
            } => {
                let done = json!({"item_id": id, "output_index": output_index,
                                  "name": name, "arguments": arguments});
                out.push(self.event("response.function_call_arguments.done", done));
                json!({"id": id, "type": "function_call", "status": status,
                       "call_id": call_id, "name": name, "arguments": arguments})
            }
        };
        let fields = json!({"output_index": output_index, "item": item});
        out.push(self.event("response.output_item.done", fields));
        self.output.push(item);
    }
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `fields` with one more key.
fn with(mut fields: Value, key: &str, value: impl serde::Serialize) -> Value {
    fields[key] = json!(value);
    fields
}

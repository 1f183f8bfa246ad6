//! The event sequence of a streamed `/v1/messages` answer:
//! `message_start`, `ping`, then for each content block
//! `content_block_start`, its deltas (`thinking_delta`, `text_delta`,
//! `input_json_delta`) and `content_block_stop`; then `message_delta` with
//! the stop reason and usage, and `message_stop`. One block is open at a
//! time; a change of kind (reasoning -> text -> tool call) closes it.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::response::{MessageUsage, error_body, stop_reason};
use crate::error::{ApiError, ErrorKind};
use crate::types::FinishReason;
use crate::types::sse::DeltaParts;

/// `event: <type>\ndata: <json>\n\n`.
pub fn named_event(data: &Value) -> String {
    let name = data["type"].as_str().unwrap_or("error");
    format!("event: {name}\ndata: {data}\n\n")
}

/// A mid-stream failure as Anthropic sends it (an `error` event).
pub fn error_event(message: &str) -> String {
    named_event(&error_body(&ApiError::new(ErrorKind::Internal, message)))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// The tool call of this index (in the chat pipeline's numbering).
    Tool(u32),
}

#[derive(Debug, Clone)]
pub struct MessageStream {
    id: String,
    model: String,
    prompt_tokens: u32,
    open: Option<Open>,
    /// Index of the next block.
    next_index: u32,
    /// Whitespace that arrived while no text block was open: sent only if
    /// real text follows, so the newlines before a tool call open no block.
    held_whitespace: String,
    /// Block index of each tool call.
    tool_blocks: HashMap<u32, u32>,
}

impl MessageStream {
    pub fn new(id: String, model: String, prompt_tokens: u32) -> Self {
        MessageStream {
            id,
            model,
            prompt_tokens,
            open: None,
            next_index: 0,
            held_whitespace: String::new(),
            tool_blocks: HashMap::new(),
        }
    }

    /// `message_start` and a `ping`.
    pub fn start(&self) -> Vec<String> {
        let message = json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": MessageUsage::new(self.prompt_tokens, 0, 0),
        });
        vec![
            named_event(&json!({"type": "message_start", "message": message})),
            named_event(&json!({"type": "ping"})),
        ]
    }

    /// Events for one step of the output parsers.
    pub fn delta(&mut self, mut parts: DeltaParts) -> Vec<String> {
        let mut out = Vec::new();
        // Arguments that continue the open tool block reach it before any
        // content of this step closes it.
        let open_call = match self.open {
            Some(Open::Tool(index)) => Some(index),
            _ => None,
        };
        for call in parts.take_continuing_arguments(open_call) {
            self.arguments(call.index, call.function.arguments, &mut out);
        }
        if !parts.reasoning.is_empty() {
            self.ensure_open(Open::Thinking, &mut out);
            out.push(
                self.block_delta(json!({"type": "thinking_delta", "thinking": parts.reasoning})),
            );
        }
        if !parts.content.is_empty() {
            self.text(&parts.content, &mut out);
        }
        for call in parts.tool_calls {
            if call.id.is_some() || call.function.name.is_some() {
                self.close(&mut out);
                let index = self.next_index;
                self.tool_blocks.insert(call.index, index);
                self.open_block(
                    Open::Tool(call.index),
                    json!({
                        "type": "tool_use",
                        "id": call.id.unwrap_or_default(),
                        "name": call.function.name.unwrap_or_default(),
                        "input": {},
                    }),
                    &mut out,
                );
            }
            self.arguments(call.index, call.function.arguments, &mut out);
        }
        out
    }

    /// An `input_json_delta` for the block of call `call`, when there are
    /// arguments.
    fn arguments(&self, call: u32, args: Option<String>, out: &mut Vec<String>) {
        if let Some(args) = args.filter(|a| !a.is_empty()) {
            let index = self.tool_blocks.get(&call).copied();
            if let Some(index) = index {
                out.push(named_event(&json!({
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                })));
            }
        }
    }

    /// The closing events.
    pub fn finish(
        &mut self,
        reason: FinishReason,
        stop_sequence: Option<&str>,
        usage: MessageUsage,
    ) -> Vec<String> {
        let mut out = Vec::new();
        self.close(&mut out);
        out.push(named_event(&json!({
            "type": "message_delta",
            "delta": {
                "stop_reason": stop_reason(reason, stop_sequence),
                "stop_sequence": stop_sequence,
            },
            "usage": usage,
        })));
        out.push(named_event(&json!({"type": "message_stop"})));
        out
    }

    fn text(&mut self, text: &str, out: &mut Vec<String>) {
        if self.open != Some(Open::Text) && text.trim().is_empty() {
            self.held_whitespace.push_str(text);
            return;
        }
        self.ensure_open(Open::Text, out);
        let text = format!("{}{text}", std::mem::take(&mut self.held_whitespace));
        out.push(self.block_delta(json!({"type": "text_delta", "text": text})));
    }

    fn ensure_open(&mut self, kind: Open, out: &mut Vec<String>) {
        if self.open == Some(kind) {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        self.open_block(kind, block, out);
    }

    fn open_block(&mut self, kind: Open, block: Value, out: &mut Vec<String>) {
        out.push(named_event(&json!({
            "type": "content_block_start",
            "index": self.next_index,
            "content_block": block,
        })));
        self.open = Some(kind);
        self.next_index += 1;
    }

    fn block_delta(&self, delta: Value) -> String {
        named_event(&json!({
            "type": "content_block_delta",
            "index": self.next_index - 1,
            "delta": delta,
        }))
    }

    fn close(&mut self, out: &mut Vec<String>) {
        if let Some(kind) = self.open.take() {
            if kind == Open::Thinking {
                out.push(self.block_delta(json!({"type": "signature_delta", "signature": ""})));
            }
            out.push(named_event(&json!({
                "type": "content_block_stop",
                "index": self.next_index - 1,
            })));
        }
        self.held_whitespace.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{FunctionCallDelta, ToolCallDelta};

    fn types(events: &[String]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                let data: Value =
                    serde_json::from_str(e.split_once("data: ").unwrap().1.trim()).unwrap();
                let t = data["type"].as_str().unwrap().to_string();
                match data["delta"]["type"].as_str() {
                    Some(d) if t == "content_block_delta" => d.to_string(),
                    _ => t,
                }
            })
            .collect()
    }

    #[test]
    fn reasoning_text_and_a_tool_call_become_three_blocks_in_order() {
        let mut s = MessageStream::new("msg_1".into(), "m".into(), 5);
        let mut events = s.start();
        events.extend(s.delta(DeltaParts {
            reasoning: "hmm".into(),
            ..Default::default()
        }));
        events.extend(s.delta(DeltaParts {
            content: "Hi".into(),
            ..Default::default()
        }));
        events.extend(s.delta(DeltaParts {
            content: "\n\n".into(),
            ..Default::default()
        }));
        let call = |id: Option<&str>, args: &str| ToolCallDelta {
            index: 0,
            id: id.map(str::to_string),
            kind: None,
            function: FunctionCallDelta {
                name: id.map(|_| "get".to_string()),
                arguments: Some(args.into()),
            },
        };
        events.extend(s.delta(DeltaParts {
            tool_calls: vec![call(Some("c1"), "")],
            ..Default::default()
        }));
        events.extend(s.delta(DeltaParts {
            tool_calls: vec![call(None, "{\"a\":1}")],
            ..Default::default()
        }));
        events.extend(s.finish(FinishReason::ToolCalls, None, MessageUsage::new(5, 0, 9)));
        assert_eq!(
            types(&events),
            [
                "message_start",
                "ping",
                "content_block_start",
                "thinking_delta",
                "signature_delta",
                "content_block_stop",
                "content_block_start",
                "text_delta",
                "text_delta",
                "content_block_stop",
                "content_block_start",
                "input_json_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert!(
            events[13].contains("\"stop_reason\":\"tool_use\""),
            "{}",
            events[13]
        );
        assert!(events[10].contains("\"index\":2"), "{}", events[10]);
    }

    /// A step that ends the open call and goes on with text (a finding of
    /// the SSE fuzzer): the call's block gets its last arguments before the
    /// text closes it.
    #[test]
    fn arguments_that_end_the_open_call_come_before_the_text_after_it() {
        let mut s = MessageStream::new("msg_1".into(), "m".into(), 5);
        let call = |id: Option<&str>, args: &str| ToolCallDelta {
            index: 0,
            id: id.map(str::to_string),
            kind: None,
            function: FunctionCallDelta {
                name: id.map(|_| "get".to_string()),
                arguments: Some(args.into()),
            },
        };
        let mut events = s.delta(DeltaParts {
            tool_calls: vec![call(Some("c1"), "{\"a\":")],
            ..Default::default()
        });
        events.extend(s.delta(DeltaParts {
            content: "Done.".into(),
            tool_calls: vec![call(None, "1}")],
            ..Default::default()
        }));
        assert_eq!(
            types(&events),
            [
                "content_block_start",
                "input_json_delta",
                "input_json_delta",
                "content_block_stop",
                "content_block_start",
                "text_delta",
            ]
        );
        assert!(events[2].contains("\"index\":0"), "{}", events[2]);
    }

    #[test]
    fn whitespace_alone_opens_no_text_block() {
        let mut s = MessageStream::new("msg_1".into(), "m".into(), 5);
        let mut events = s.delta(DeltaParts {
            content: "\n".into(),
            ..Default::default()
        });
        events.extend(s.finish(FinishReason::Stop, Some("END"), MessageUsage::default()));
        assert_eq!(types(&events), ["message_delta", "message_stop"]);
        assert!(events[0].contains("\"stop_reason\":\"stop_sequence\""));
        assert!(events[0].contains("\"stop_sequence\":\"END\""));
    }
}

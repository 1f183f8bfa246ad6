//! The chain run over one chat choice's generated text: reasoning split,
//! then tool-call extraction from the content. Streaming feeds it deltas;
//! non-streaming feeds the whole text through the same chain, so both give
//! the same reasoning, content and tool calls.

use crate::reasoning::ReasoningParser;
use crate::request::Tool;
use crate::tools::{ToolCallAccumulator, ToolCallParser};
use crate::types::sse::DeltaParts;
use crate::types::{ChatResponseMessage, FinishReason};

/// How the output of one request is parsed.
#[derive(Debug, Clone, Default)]
pub struct OutputOptions<'a> {
    /// Split `<think>` reasoning (a reasoning parser is configured).
    pub reasoning: bool,
    /// The prompt left a think block open ([`crate::reasoning::prompt_opens_reasoning`]).
    pub starts_in_reasoning: bool,
    /// Extract tool calls with these tools; `None` when no tool parser is
    /// configured or `tool_choice` is "none".
    pub tools: Option<&'a [Tool]>,
    pub parallel_tool_calls: bool,
}

#[derive(Debug)]
pub struct ChatOutputParser {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolCallParser>,
    saw_tool_call: bool,
}

/// The last step's output and what it means for `finish_reason`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputEnd {
    pub parts: DeltaParts,
    /// Generation ended inside a `<tool_call>` (its text became content).
    pub unterminated_tool_call: bool,
    /// A call whose first deltas were streamed but never completed.
    pub incomplete_call: Option<u32>,
}

impl ChatOutputParser {
    pub fn new(opts: &OutputOptions) -> Self {
        ChatOutputParser {
            reasoning: opts
                .reasoning
                .then(|| ReasoningParser::new(opts.starts_in_reasoning)),
            tools: opts
                .tools
                .map(|t| ToolCallParser::new(t, opts.parallel_tool_calls)),
            saw_tool_call: false,
        }
    }

    /// Whether the model is still reasoning (grammars apply only after).
    pub fn in_reasoning(&self) -> bool {
        self.reasoning
            .as_ref()
            .is_some_and(ReasoningParser::in_reasoning)
    }

    pub fn push(&mut self, text: &str) -> DeltaParts {
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let d = r.push(text);
                (d.reasoning, d.content)
            }
            None => (String::new(), text.to_string()),
        };
        self.route_content(reasoning, &content)
    }

    pub fn finish(&mut self) -> OutputEnd {
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let d = r.finish();
                (d.reasoning, d.content)
            }
            None => (String::new(), String::new()),
        };
        let mut parts = self.route_content(reasoning, &content);
        let mut end = OutputEnd::default();
        if let Some(t) = &mut self.tools {
            let tail = t.finish();
            parts.content.push_str(&tail.delta.content);
            parts.tool_calls.extend(tail.delta.tool_calls);
            end.unterminated_tool_call = tail.unterminated;
            end.incomplete_call = tail.incomplete_call;
        }
        end.parts = parts;
        end
    }

    /// The `finish_reason` to report, given why the engine stopped:
    /// `tool_calls` when complete calls were produced and generation ended
    /// normally; `length` when it ended inside a call.
    pub fn finish_reason(&self, engine: FinishReason, end: &OutputEnd) -> FinishReason {
        if end.unterminated_tool_call && engine == FinishReason::Stop {
            return FinishReason::Length;
        }
        let complete_calls = self.saw_tool_call && end.incomplete_call != Some(0);
        if complete_calls && engine == FinishReason::Stop {
            return FinishReason::ToolCalls;
        }
        engine
    }

    fn route_content(&mut self, reasoning: String, content: &str) -> DeltaParts {
        let mut parts = DeltaParts {
            reasoning,
            ..Default::default()
        };
        match &mut self.tools {
            Some(t) => {
                let d = t.push(content);
                parts.content = d.content;
                self.saw_tool_call |= !d.tool_calls.is_empty();
                parts.tool_calls = d.tool_calls;
            }
            None => parts.content = content.to_string(),
        }
        parts
    }
}

/// Non-streaming: the assistant message for `text`, and its finish reason.
pub fn parse_chat_output(
    text: &str,
    opts: &OutputOptions,
    engine_reason: FinishReason,
) -> (ChatResponseMessage, FinishReason) {
    let mut parser = ChatOutputParser::new(opts);
    let mut all = parser.push(text);
    let end = parser.finish();
    all.reasoning.push_str(&end.parts.reasoning);
    all.content.push_str(&end.parts.content);
    all.tool_calls.extend(end.parts.tool_calls.iter().cloned());
    let mut acc = ToolCallAccumulator::default();
    all.tool_calls.iter().for_each(|d| acc.push(d));
    let mut tool_calls = acc.into_calls();
    if let Some(i) = end.incomplete_call {
        tool_calls.truncate(i as usize);
    }
    let reason = parser.finish_reason(engine_reason, &end);
    let reasoning = (!all.reasoning.is_empty()).then_some(all.reasoning);
    let message = ChatResponseMessage {
        content: (!all.content.is_empty()).then_some(all.content),
        reasoning_content: reasoning.clone(),
        reasoning,
        tool_calls,
        ..Default::default()
    };
    (message, reason)
}

//! The full chain (reasoning then tools), streamed vs non-streamed.

mod common;

use kestrel_api::output::{ChatOutputParser, OutputOptions, parse_chat_output};
use kestrel_api::tools::ToolCallAccumulator;
use kestrel_api::types::FinishReason;
use kestrel_api::{Tool, ValidationOptions, parse_chat_request};
use serde_json::json;

fn tools() -> Vec<Tool> {
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "add", "parameters": {"type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]});
    parse_chat_request(&body, &ValidationOptions::default())
        .unwrap()
        .tools
}

/// (reasoning, content, [(name, args)], finish_reason) from streaming.
fn streamed(
    chunks: &[String],
    opts: &OutputOptions,
    engine: FinishReason,
) -> (String, String, Vec<(String, String)>, FinishReason) {
    let mut p = ChatOutputParser::new(opts);
    let (mut r, mut c) = (String::new(), String::new());
    let mut acc = ToolCallAccumulator::default();
    for chunk in chunks {
        let d = p.push(chunk);
        r.push_str(&d.reasoning);
        c.push_str(&d.content);
        d.tool_calls.iter().for_each(|t| acc.push(t));
    }
    let end = p.finish();
    r.push_str(&end.parts.reasoning);
    c.push_str(&end.parts.content);
    end.parts.tool_calls.iter().for_each(|t| acc.push(t));
    let mut calls = acc.into_calls();
    if let Some(i) = end.incomplete_call {
        calls.truncate(i as usize);
    }
    let calls = calls
        .into_iter()
        .map(|t| (t.function.name, t.function.arguments))
        .collect();
    (r, c, calls, p.finish_reason(engine, &end))
}

#[track_caller]
fn check(
    text: &str,
    opts: &OutputOptions,
    engine: FinishReason,
) -> (String, String, Vec<(String, String)>, FinishReason) {
    let (msg, reason) = parse_chat_output(text, opts, engine);
    assert_eq!(msg.reasoning, msg.reasoning_content);
    let whole = (
        msg.reasoning.unwrap_or_default(),
        msg.content.unwrap_or_default(),
        msg.tool_calls
            .into_iter()
            .map(|t| (t.function.name, t.function.arguments))
            .collect::<Vec<_>>(),
        reason,
    );
    for chunks in common::chunkings(text) {
        assert_eq!(streamed(&chunks, opts, engine), whole, "chunks {chunks:?}");
    }
    assert!(!whole.1.contains("<think>") && !whole.1.contains("</think>"));
    whole
}

#[test]
fn reasoning_content_and_tool_calls() {
    let tools = tools();
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: true,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let text = "Need to add.\n</think>\n\nAdding now.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n3\n</parameter>\n</function>\n</tool_call>";
    let (r, c, calls, reason) = check(text, &opts, FinishReason::Stop);
    assert_eq!((r.as_str(), c.as_str()), ("Need to add.", "Adding now."));
    assert_eq!(
        calls,
        vec![("add".to_string(), "{\"a\":2,\"b\":3}".to_string())]
    );
    assert_eq!(reason, FinishReason::ToolCalls);
}

#[test]
fn plain_answer_and_thinking_disabled() {
    let tools = tools();
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: false,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let (r, c, calls, reason) = check("Just 5.", &opts, FinishReason::Stop);
    assert_eq!(
        (r.as_str(), c.as_str(), calls.len(), reason),
        ("", "Just 5.", 0, FinishReason::Stop)
    );
    let (_, c, _, reason) = check("Just 5", &opts, FinishReason::Length);
    assert_eq!((c.as_str(), reason), ("Just 5", FinishReason::Length));
}

#[test]
fn unterminated_call_reports_length() {
    let tools = tools();
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: true,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let text = "hmm</think><tool_call>\n<function=add>\n<parameter=a>\n2";
    let (r, c, calls, reason) = check(text, &opts, FinishReason::Length);
    assert_eq!(
        (r.as_str(), calls.len(), reason),
        ("hmm", 0, FinishReason::Length)
    );
    assert_eq!(c, "<tool_call>\n<function=add>\n<parameter=a>\n2");
    let (_, _, _, reason) = check(text, &opts, FinishReason::Stop);
    assert_eq!(reason, FinishReason::Length);
}

#[test]
fn no_parsers_pass_text_through() {
    let opts = OutputOptions::default();
    let text = "<think>x</think><tool_call>{}</tool_call>";
    let (r, c, calls) = parse_chat_output_summary(text, &opts);
    assert_eq!((r, c.as_str(), calls), (None, text, 0));
}

fn parse_chat_output_summary(text: &str, opts: &OutputOptions) -> (Option<String>, String, usize) {
    let (m, _) = parse_chat_output(text, opts, FinishReason::Stop);
    (
        m.reasoning,
        m.content.unwrap_or_default(),
        m.tool_calls.len(),
    )
}

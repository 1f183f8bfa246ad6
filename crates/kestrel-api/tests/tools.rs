//! Tool-call parsing: both Qwen formats, streamed in every chunking, equal
//! to the non-streamed result.

mod common;

use kestrel_api::reasoning::ReasoningParser;
use kestrel_api::tools::{ParsedToolCalls, ToolCallAccumulator, ToolCallParser, parse_complete};
use kestrel_api::types::ToolCallDelta;
use kestrel_api::{Tool, ValidationOptions, parse_chat_request};
use serde_json::{Value, json};

fn tools() -> Vec<Tool> {
    let body = json!({
        "messages": [{"role": "user", "content": "x"}],
        "tools": [
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
                "ratio": {"type": "number"}, "tags": {"type": "array"}, "filter": {"type": "object"},
                "extra": {"anyOf": [{"type": "object"}, {"type": "null"}]}}}}},
            {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "list_files"}}
        ]
    });
    parse_chat_request(&body, &ValidationOptions::default())
        .unwrap()
        .tools
}

/// Streams the chunks, checks the OpenAI delta shape, and returns the
/// same structure as the non-streamed parse.
fn stream(chunks: &[String], parallel: bool) -> ParsedToolCalls {
    let tools = tools();
    let mut parser = ToolCallParser::new(&tools, parallel);
    let mut content = String::new();
    let mut deltas: Vec<ToolCallDelta> = Vec::new();
    for chunk in chunks {
        let d = parser.push(chunk);
        content.push_str(&d.content);
        deltas.extend(d.tool_calls);
    }
    let end = parser.finish();
    content.push_str(&end.delta.content);
    deltas.extend(end.delta.tool_calls);
    check_delta_shape(&deltas);
    let mut acc = ToolCallAccumulator::default();
    deltas.iter().for_each(|d| acc.push(d));
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

/// The first delta of each call has id, type, name and no arguments; later
/// ones only index and arguments. Indices appear in order.
fn check_delta_shape(deltas: &[ToolCallDelta]) {
    let mut seen: Vec<u32> = Vec::new();
    for d in deltas {
        if !seen.contains(&d.index) {
            assert_eq!(d.index as usize, seen.len(), "indices in order");
            assert!(
                d.id.as_ref()
                    .is_some_and(|id| id.starts_with("call_") && id.len() > 10),
                "{d:?}"
            );
            assert_eq!(d.kind.as_deref(), Some("function"));
            assert!(
                d.function.name.is_some() && d.function.arguments.is_none(),
                "{d:?}"
            );
            seen.push(d.index);
        } else {
            assert!(
                d.id.is_none() && d.kind.is_none() && d.function.name.is_none(),
                "{d:?}"
            );
            assert!(d.function.arguments.is_some());
        }
    }
}

/// Parses `text` whole and in every chunking; all must agree (ids aside).
/// Returns the content and (name, arguments JSON) of each call.
#[track_caller]
fn parse_all_ways(text: &str) -> (Option<String>, Vec<(String, Value)>) {
    let whole = parse_complete(text, &tools(), true);
    let summary = |p: &ParsedToolCalls| {
        let calls = p
            .tool_calls
            .iter()
            .map(|c| {
                let args: Value = serde_json::from_str(&c.function.arguments).unwrap_or_else(|e| {
                    panic!("arguments not JSON ({e}): {}", c.function.arguments)
                });
                assert!(args.is_object());
                (c.function.name.clone(), args)
            })
            .collect::<Vec<_>>();
        let raw_args: Vec<String> = p
            .tool_calls
            .iter()
            .map(|c| c.function.arguments.clone())
            .collect();
        (p.content.clone(), calls, raw_args, p.unterminated)
    };
    let expected = summary(&whole);
    let mut ids: Vec<String> = whole.tool_calls.iter().map(|c| c.id.clone()).collect();
    for chunks in common::chunkings(text) {
        let streamed = stream(&chunks, true);
        assert_eq!(summary(&streamed), expected, "chunks {chunks:?}");
        ids.extend(streamed.tool_calls.iter().map(|c| c.id.clone()));
    }
    let unique: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "call ids are unique");
    (expected.0, expected.1)
}

#[test]
fn xml_values_are_coerced_by_schema() {
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=filter>\n{\"min\": {\"t\": 1}, \"list\": [1, {\"x\": null}]}\n</parameter>\n<parameter=extra>\n{\"k\": 1}\n</parameter>\n</function>\n</tool_call>";
    let (content, calls) = parse_all_ways(text);
    assert_eq!(content, None);
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0, "get_weather");
    assert_eq!(
        calls[0].1,
        json!({"city": "Paris", "days": 3, "metric": true, "ratio": 0.5, "tags": ["a", "b"],
               "filter": {"min": {"t": 1}, "list": [1, {"x": null}]}, "extra": {"k": 1}})
    );
}

#[test]
fn xml_strings_keep_multiline_and_xml_like_values() {
    let file = "fn main() {\n    println!(\"<b>hi</b>\");\n}\n\n<div class=\"x\">\n<parameter=fake>\n</div>";
    let text = format!(
        "<tool_call>\n<function=write_file>\n<parameter=path>\nsrc/main.rs\n</parameter>\n<parameter=content>\n{file}\n</parameter>\n</function>\n</tool_call>"
    );
    let (_, calls) = parse_all_ways(&text);
    assert_eq!(
        calls,
        vec![(
            "write_file".to_string(),
            json!({"path": "src/main.rs", "content": file})
        )]
    );
    // A string-typed value that looks like a number stays a string.
    let text = "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(parse_all_ways(text).1[0].1, json!({"city": "123"}));
}

#[test]
fn xml_empty_args_unknown_params_and_order() {
    let text = "Let me look.\n\n<tool_call>\n<function=list_files>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unknown>\n42\n</parameter>\n</function>\n</tool_call>\n";
    let (content, calls) = parse_all_ways(text);
    assert_eq!(content.as_deref(), Some("Let me look."));
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0], ("list_files".to_string(), json!({})));
    // Parameters outside the schema stay strings.
    assert_eq!(
        calls[1],
        (
            "get_weather".to_string(),
            json!({"city": "Oslo", "unknown": "42"})
        )
    );
}

#[test]
fn xml_arguments_keep_parameter_order() {
    let text = "<tool_call>\n<function=write_file>\n<parameter=content>\nx\n</parameter>\n<parameter=path>\na\n</parameter>\n</function>\n</tool_call>";
    let parsed = parse_complete(text, &tools(), true);
    assert_eq!(
        parsed.tool_calls[0].function.arguments,
        r#"{"content":"x","path":"a"}"#
    );
}

#[test]
fn xml_missing_closing_tags_are_tolerated_at_call_end() {
    let text =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n</tool_call>";
    assert_eq!(
        parse_all_ways(text).1,
        vec![("get_weather".to_string(), json!({"city": "Rome"}))]
    );
    let text =
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</tool_call>";
    assert_eq!(
        parse_all_ways(text).1,
        vec![("get_weather".to_string(), json!({"days": 2}))]
    );
}

#[test]
fn json_form_calls() {
    let text = "I'll check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"<tool_call> is text\\n\"}}\n</tool_call>";
    let (content, calls) = parse_all_ways(text);
    assert_eq!(content.as_deref(), Some("I'll check both."));
    assert_eq!(
        calls[0],
        (
            "get_weather".to_string(),
            json!({"city": "Paris", "days": 2})
        )
    );
    assert_eq!(
        calls[1],
        (
            "write_file".to_string(),
            json!({"path": "a.txt", "content": "<tool_call> is text\n"})
        )
    );
    let (_, calls) =
        parse_all_ways("<tool_call>\n{\"name\": \"list_files\", \"arguments\": {}}\n</tool_call>");
    assert_eq!(calls, vec![("list_files".to_string(), json!({}))]);
}

#[test]
fn malformed_json_call_is_kept_as_content() {
    let text = "<tool_call>\n{\"name\": oops}\n</tool_call>";
    let (content, calls) = parse_all_ways(text);
    assert!(calls.is_empty());
    assert_eq!(content.as_deref(), Some(text));
    let text = "before\n<tool_call>\nnot a call\n</tool_call>\nafter";
    assert_eq!(parse_all_ways(text).0.as_deref(), Some(text));
}

#[test]
fn unterminated_call_is_returned_as_content() {
    for text in [
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
        "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
        "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"argu",
        "Sure.\n<tool_call>",
    ] {
        let (content, calls) = parse_all_ways(text);
        assert!(calls.is_empty(), "{text}");
        assert_eq!(content.as_deref(), Some(text), "{text}");
        assert!(parse_complete(text, &tools(), true).unterminated);
    }
    // Complete calls before the open one are kept.
    let text = "<tool_call>\n{\"name\":\"list_files\"}\n</tool_call>\n<tool_call>\n<function=get_w";
    let (content, calls) = parse_all_ways(text);
    assert_eq!(calls.len(), 1);
    assert_eq!(content.as_deref(), Some("<tool_call>\n<function=get_w"));
}

#[test]
fn text_without_calls_passes_through() {
    for text in [
        "plain answer",
        "a < b and <tool_ is not a tag",
        "ends with <tool_c",
        "  spaced  \n",
        "日本語 <tool",
    ] {
        let (content, calls) = parse_all_ways(text);
        assert!(calls.is_empty());
        assert_eq!(content.as_deref(), Some(text));
    }
}

#[test]
fn parallel_tool_calls_false_keeps_only_the_first() {
    let text = "<tool_call>\n<function=list_files>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    let whole = parse_complete(text, &tools(), false);
    assert_eq!(whole.tool_calls.len(), 1);
    assert_eq!(whole.tool_calls[0].function.name, "list_files");
    assert_eq!(whole.content, None);
    for chunks in common::chunkings(text) {
        let s = stream(&chunks, false);
        assert_eq!(s.tool_calls.len(), 1);
        assert_eq!(s.content, None);
    }
}

#[test]
fn xml_arguments_stream_per_parameter() {
    let tools = tools();
    let mut p = ToolCallParser::new(&tools, true);
    let d = p.push("<tool_call>\n<function=get_weather>\n<parameter=city>\nPa");
    assert_eq!(d.tool_calls.len(), 1, "header as soon as the name is known");
    assert_eq!(
        d.tool_calls[0].function.name.as_deref(),
        Some("get_weather")
    );
    let d = p.push("ris\n</parameter>\n");
    assert_eq!(
        d.tool_calls[0].function.arguments.as_deref(),
        Some("{\"city\":\"Paris\"")
    );
    let d = p.push("<parameter=days>\n4\n</parameter>\n</function>\n</tool_call>");
    let args: Vec<&str> = d
        .tool_calls
        .iter()
        .filter_map(|t| t.function.arguments.as_deref())
        .collect();
    assert_eq!(args, vec![",\"days\":4", "}"]);
}

/// Reasoning and tool parsers chained as the server runs them: a tool call
/// inside `<think>` still becomes a tool call (vLLM #39056).
#[test]
fn tool_call_inside_reasoning_is_parsed() {
    let text = "The user wants weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n</tool_call>";
    for chunks in common::chunkings(text) {
        let tools = tools();
        let mut reasoning_parser = ReasoningParser::new(true);
        let mut tool_parser = ToolCallParser::new(&tools, true);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut acc = ToolCallAccumulator::default();
        let mut feed = |r: kestrel_api::reasoning::ReasoningDelta,
                        reasoning: &mut String,
                        content: &mut String| {
            reasoning.push_str(&r.reasoning);
            let t = tool_parser.push(&r.content);
            content.push_str(&t.content);
            t.tool_calls.iter().for_each(|d| acc.push(d));
        };
        for chunk in &chunks {
            let r = reasoning_parser.push(chunk);
            feed(r, &mut reasoning, &mut content);
        }
        let r = reasoning_parser.finish();
        feed(r, &mut reasoning, &mut content);
        let end = tool_parser.finish();
        content.push_str(&end.delta.content);
        let calls = acc.into_calls();
        assert_eq!(reasoning, "The user wants weather.");
        assert_eq!(content, "");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.arguments, "{\"city\":\"Lima\"}");
    }
}

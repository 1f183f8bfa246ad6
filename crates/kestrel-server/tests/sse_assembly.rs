//! The chat SSE assembly fed with scripted model text split one character
//! at a time: reasoning, content and streamed tool calls must come out
//! well framed and agree with the non-streaming parse of the same text.
//! Also the fuzzer's findings in the Messages and Responses streams.

use kestrel_api::Tool;
use kestrel_api::output::{OutputOptions, parse_chat_output};
use kestrel_api::responses::ResponseBuilder;
use kestrel_api::types::{FinishReason, Usage};
use kestrel_server::sse::{ChatSse, SseAssembler};
use kestrel_server::{MessagesSse, ResponseOutput};
use serde_json::{Map, Value, json};

fn weather_tool() -> Tool {
    let parameters = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    });
    Tool {
        name: "get_weather".into(),
        description: Some("Weather forecast".into()),
        parameters: parameters.clone(),
        raw: json!({"type": "function", "function": {"name": "get_weather", "parameters": parameters}}),
    }
}

struct Collected {
    reasoning: String,
    content: String,
    /// Per call index: (id, name, concatenated arguments).
    calls: Vec<(String, String, String)>,
    finish: String,
    usage: Value,
}

fn run(text: &str, opts: &OutputOptions, engine_reason: FinishReason) -> Collected {
    let mut sse = ChatSse::new("chatcmpl-t".into(), "m".into(), 1, 0, opts, true);
    let mut events = sse.start();
    for ch in text.chars() {
        events.extend(sse.text(&ch.to_string()));
    }
    events.extend(sse.finish(engine_reason, Usage::new(10, 5, Some(0))));
    assert_eq!(events.last().unwrap(), "data: [DONE]\n\n");
    let mut c = Collected {
        reasoning: String::new(),
        content: String::new(),
        calls: Vec::new(),
        finish: String::new(),
        usage: Value::Null,
    };
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| {
            let data = e
                .strip_prefix("data: ")
                .and_then(|d| d.strip_suffix("\n\n"))
                .unwrap();
            serde_json::from_str(data).unwrap()
        })
        .collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let choices = chunk["choices"].as_array().unwrap();
        if choices.is_empty() {
            assert_eq!(i, chunks.len() - 1, "the usage chunk comes last");
            c.usage = chunk["usage"].clone();
            continue;
        }
        let delta = &choices[0]["delta"];
        assert_eq!(delta.get("role").is_some(), i == 0);
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert_eq!(delta["reasoning"].as_str(), Some(r));
            c.reasoning.push_str(r);
        }
        if let Some(t) = delta["content"].as_str() {
            c.content.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap() as usize;
            if index == c.calls.len() {
                // The first delta of a call names it.
                assert!(call["id"].as_str().unwrap().starts_with("call_"));
                assert_eq!(call["type"], "function");
                let name = call["function"]["name"].as_str().unwrap().to_string();
                c.calls
                    .push((call["id"].as_str().unwrap().into(), name, String::new()));
            } else {
                assert!(call.get("id").is_none() && call["function"].get("name").is_none());
            }
            if let Some(a) = call["function"]["arguments"].as_str() {
                c.calls[index].2.push_str(a);
            }
        }
        if let Some(f) = choices[0]["finish_reason"].as_str() {
            assert!(c.finish.is_empty(), "one finish chunk");
            c.finish = f.into();
        }
    }
    c
}

#[test]
fn streamed_tool_calls_split_per_character() {
    let tools = [weather_tool()];
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: true,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let text = "The user wants the weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo\n</parameter>\n</function>\n</tool_call>";
    let got = run(text, &opts, FinishReason::Stop);
    assert_eq!(got.reasoning, "The user wants the weather.");
    assert_eq!(got.content, "Let me check.");
    assert_eq!(got.calls.len(), 2);
    assert_eq!(got.calls[0].1, "get_weather");
    let args0: Value = serde_json::from_str(&got.calls[0].2).unwrap();
    assert_eq!(args0, json!({"city": "Paris", "days": 3}));
    let args1: Value = serde_json::from_str(&got.calls[1].2).unwrap();
    assert_eq!(args1, json!({"city": "São Paulo"}));
    assert_ne!(got.calls[0].0, got.calls[1].0);
    assert_eq!(got.finish, "tool_calls");
    assert_eq!(got.usage["completion_tokens"], 5);

    // The non-streaming parse of the same text agrees.
    let (message, reason) = parse_chat_output(text, &opts, FinishReason::Stop);
    assert_eq!(reason, FinishReason::ToolCalls);
    assert_eq!(
        message.reasoning_content.as_deref(),
        Some(got.reasoning.as_str())
    );
    assert_eq!(message.content.as_deref(), Some(got.content.as_str()));
    assert_eq!(message.tool_calls.len(), 2);
    for (call, streamed) in message.tool_calls.iter().zip(&got.calls) {
        assert_eq!(call.function.name, streamed.1);
        let a: Value = serde_json::from_str(&call.function.arguments).unwrap();
        let b: Value = serde_json::from_str(&streamed.2).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn unterminated_tool_call_ends_as_length_with_content() {
    let tools = [weather_tool()];
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: false,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let text = "Sure.\n<tool_call>\n<function=get_wea";
    let got = run(text, &opts, FinishReason::Stop);
    assert_eq!(got.finish, "length");
    assert!(got.calls.is_empty());
    assert!(got.content.starts_with("Sure."), "{}", got.content);
    assert!(got.content.contains("<tool_call>"), "{}", got.content);
}

#[test]
fn plain_content_without_tools_or_reasoning() {
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: false,
        tools: None,
        parallel_tool_calls: true,
    };
    let text = "def f():\n    return '✓ ünïcödé'\n";
    let got = run(text, &opts, FinishReason::Length);
    assert_eq!(got.content, text);
    assert!(got.reasoning.is_empty());
    assert_eq!(got.finish, "length");
}

/// A forced tool call: the server writes the call's opening, the model
/// continues; the streamed and non-streamed parses see the same call.
#[test]
fn forced_call_prefix_is_parsed_as_model_output() {
    let tools = [weather_tool()];
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: false,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let prefix = "<tool_call>\n<function=get_weather>\n";
    let rest = "<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    let mut sse =
        ChatSse::new("c".into(), "m".into(), 1, 0, &opts, false).with_reply_prefix(prefix);
    let mut events = sse.start();
    for ch in rest.chars() {
        events.extend(sse.text(&ch.to_string()));
    }
    events.extend(sse.finish(FinishReason::Stop, Usage::new(10, 5, Some(0))));
    let joined = events.concat();
    assert!(joined.contains("\"name\":\"get_weather\""), "{joined}");
    assert!(
        joined.contains("\"finish_reason\":\"tool_calls\""),
        "{joined}"
    );
    let (message, reason) =
        parse_chat_output(&format!("{prefix}{rest}"), &opts, FinishReason::Stop);
    assert_eq!(reason, FinishReason::ToolCalls);
    let args: Value = serde_json::from_str(&message.tool_calls[0].function.arguments).unwrap();
    assert_eq!(args, json!({"city": "Oslo"}));
}

/// The SSE fuzzer's first finding (tests/fuzz_sse.rs): a step of text that
/// ends a call and goes on with text. The output parsers keep a step's
/// content and calls apart, not their order, and the Messages stream sent
/// the call's last arguments after the text had closed the call's block;
/// the Responses stream dropped them, leaving the call's arguments cut off.
#[test]
fn a_step_that_ends_a_call_and_goes_on_with_text_ends_the_call_first() {
    let tools = [weather_tool()];
    let opts = OutputOptions {
        reasoning: true,
        starts_in_reasoning: false,
        tools: Some(&tools),
        parallel_tool_calls: true,
    };
    let steps = [
        "Sure.<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n",
        "</function>\n</tool_call>Done.",
    ];
    let usage = Usage::new(10, 5, Some(0));

    let mut sse = MessagesSse::new("msg_t".into(), "m".into(), 10, &opts);
    let mut events = sse.start();
    for step in steps {
        events.extend(sse.text(step));
    }
    events.extend(sse.finish(FinishReason::Stop, usage));
    let data: Vec<Value> = events
        .iter()
        .map(|e| serde_json::from_str(e.split_once("\ndata: ").unwrap().1.trim_end()).unwrap())
        .collect();
    let outline: Vec<String> = data
        .iter()
        .map(|d| {
            let kind = d["delta"]["type"]
                .as_str()
                .unwrap_or(d["type"].as_str().unwrap());
            match d["index"].as_u64() {
                Some(i) => format!("{kind} {i}"),
                None => kind.to_string(),
            }
        })
        .collect();
    assert_eq!(
        outline,
        [
            "message_start",
            "ping",
            "content_block_start 0",
            "text_delta 0",
            "content_block_stop 0",
            "content_block_start 1",
            "input_json_delta 1",
            "input_json_delta 1",
            "content_block_stop 1",
            "content_block_start 2",
            "text_delta 2",
            "content_block_stop 2",
            "message_delta",
            "message_stop",
        ]
    );
    let input: String = data[6..8]
        .iter()
        .map(|d| d["delta"]["partial_json"].as_str().unwrap())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"city": "Paris"})
    );
    assert_eq!(data[10]["delta"]["text"], "Done.");

    let builder = ResponseBuilder::new("t", "m", 1, Map::new());
    let mut output = ResponseOutput::new(builder, &opts, |text| text.len() as u32);
    output.start();
    for step in steps {
        output.text(step);
    }
    output.finish(FinishReason::Stop, usage);
    let items = output.response()["output"].clone();
    let summary: Vec<(&str, &str)> = items
        .as_array()
        .unwrap()
        .iter()
        .map(|item| {
            let text = match item["type"].as_str().unwrap() {
                "function_call" => item["arguments"].as_str().unwrap(),
                _ => item["content"][0]["text"].as_str().unwrap(),
            };
            (item["type"].as_str().unwrap(), text)
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("message", "Sure."),
            ("function_call", "{\"city\":\"Paris\"}"),
            ("message", "Done."),
        ]
    );
}

//! No panic and no hang on arbitrary text in any chunking: the parsers run
//! on model output, which is request-reachable.

mod common;

use kestrel_api::reasoning::ReasoningParser;
use kestrel_api::stop::StopMatcher;
use kestrel_api::tools::{ToolCallParser, parse_complete};
use kestrel_api::{Tool, ValidationOptions, parse_chat_request, parse_json_body};
use serde_json::json;

/// Pieces that steer the parsers into every state.
const PIECES: &[&str] = &[
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<think>",
    "</think>",
    "get_weather>",
    "city>",
    "\n",
    " ",
    "{",
    "}",
    "\"name\":",
    "\"arguments\":",
    "\"f\"",
    "<",
    ">",
    "=",
    "é",
    "日本",
    "x",
    "42",
    "[1,",
    "null",
    "<tool_",
    "</para",
    "STOP",
    "ST",
];

fn random_text(seed: u64, len: usize) -> String {
    let mut state = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            PIECES[(state % PIECES.len() as u64) as usize]
        })
        .collect()
}

fn tools() -> Vec<Tool> {
    let body = json!({"messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "integer"}}}}}]});
    parse_chat_request(&body, &ValidationOptions::default())
        .unwrap()
        .tools
}

#[test]
fn parsers_survive_random_tag_soup() {
    let tools = tools();
    for seed in 0..300 {
        let text = random_text(seed, 40);
        for chunks in [
            common::split_every(&text, 1),
            common::split_random(&text, seed),
        ] {
            let mut r = ReasoningParser::new(seed % 2 == 0);
            let mut t = ToolCallParser::new(&tools, seed % 3 != 0);
            let mut s = StopMatcher::new(vec!["STOP".into(), "\n\n\n".into()], seed % 2 == 1);
            for c in &chunks {
                let st = s.push(c);
                let rd = r.push(&st.text);
                t.push(&rd.content);
            }
            let rest = s.finish();
            let rd = r.push(&rest);
            t.push(&rd.content);
            let rd = r.finish();
            t.push(&rd.content);
            t.finish();
        }
        let parsed = parse_complete(&text, &tools, true);
        for call in parsed.tool_calls {
            let args: serde_json::Value = serde_json::from_str(&call.function.arguments).unwrap();
            assert!(args.is_object(), "{text:?}");
        }
    }
}

#[test]
fn validation_survives_random_json_shapes() {
    let values = [
        json!(null),
        json!(-1),
        json!(1e308),
        json!("s"),
        json!([]),
        json!({}),
        json!([{}]),
        json!(true),
        json!(u64::MAX),
    ];
    let keys = [
        "messages",
        "temperature",
        "top_p",
        "top_k",
        "stop",
        "tools",
        "tool_choice",
        "seed",
        "n",
        "max_tokens",
        "response_format",
        "stream_options",
        "logprobs",
        "chat_template_kwargs",
        "prompt",
    ];
    let opts = ValidationOptions::default();
    for (i, k) in keys.iter().enumerate() {
        for (j, v) in values.iter().enumerate() {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            body[*k] = v.clone();
            body[keys[(i + j + 1) % keys.len()]] = values[(i * j) % values.len()].clone();
            let _ = parse_chat_request(&body, &opts);
            let _ = kestrel_api::parse_completion_request(&body, &opts);
            let text = body.to_string();
            for cut in [1, text.len() / 2, text.len() - 1] {
                assert_eq!(
                    parse_json_body(&text.as_bytes()[..cut])
                        .unwrap_err()
                        .status(),
                    400
                );
            }
        }
    }
}

/// Long values streamed token by token stay linear (no rescans).
#[test]
fn long_streamed_values_are_linear() {
    let tools = tools();
    let value = "line of code; ".repeat(20_000);
    for open in [
        "<tool_call>\n<function=get_weather>\n<parameter=note>\n",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"note\": \"",
    ] {
        let close = if open.contains('{') {
            "\"}}\n</tool_call>"
        } else {
            "\n</parameter>\n</function>\n</tool_call>"
        };
        let text = format!("{open}{value}{close}");
        let start = std::time::Instant::now();
        let mut p = ToolCallParser::new(&tools, true);
        let mut args = String::new();
        for chunk in common::split_every(&text, 3) {
            for d in p.push(&chunk).tool_calls {
                args.push_str(d.function.arguments.as_deref().unwrap_or(""));
            }
        }
        assert!(!p.finish().unterminated);
        let parsed: serde_json::Value = serde_json::from_str(&args).unwrap();
        assert_eq!(parsed["note"].as_str().map(str::len), Some(value.len()));
        assert!(start.elapsed().as_secs() < 5, "took {:?}", start.elapsed());
    }
}

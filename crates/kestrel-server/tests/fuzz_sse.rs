//! Seeded fuzzing of the SSE assemblers: chat and text completions (one
//! choice, or several interleaved as `n > 1` streams them), the Anthropic
//! Messages stream and the Responses stream. They are fed model output glued
//! from reasoning and tool-call tags, JSON fragments, SSE framing (`data:`,
//! blank lines, CRLF) and multi-byte text, split into random chunks with
//! random logprobs in between, and ended by a random finish reason (with a
//! stop sequence where the stream reports one) or a mid-stream failure.
//!
//! What must hold: no panic; every event is one well-formed SSE event
//! (`data: ...\n\n` or `event: ...\ndata: ...\n\n`, no line break inside the
//! data) whose data is JSON, `[DONE]` aside; the stream ends with its closing
//! events; what the deltas add up to equals the non-streamed parse of the
//! whole text (`parse_chat_output`, or the Responses builder fed the whole
//! text, as the non-streaming routes do); every logprob pushed is sent once.
//!
//! `KESTREL_FUZZ_ITERS` sets the iterations per target (default 300, for
//! `cargo test`); `KESTREL_FUZZ_SEED` the seed. Runs are deterministic for a
//! seed (tool-call ids aside, which no check compares), so a failure names
//! the iteration that reproduces it.

use kestrel_api::Tool;
use kestrel_api::anthropic::stop_reason;
use kestrel_api::output::{OutputOptions, parse_chat_output};
use kestrel_api::responses::ResponseBuilder;
use kestrel_api::types::sse::SSE_DONE;
use kestrel_api::types::{
    ChatResponseMessage, FinishReason, GeneratedLogprob, LogprobToken, MIN_LOGPROB, Usage,
};
use kestrel_server::sse::{ChatSse, ChoiceAssembler, CompletionSse, SseAssembler};
use kestrel_server::{MessagesSse, ResponseOutput};
use serde_json::{Map, Value, json};

#[path = "../../kestrel-api/tests/support/fuzz_harness.rs"]
mod fuzz_harness;

use fuzz_harness::{Rng, fuzz};

/// Pieces model output is made of: the reasoning and both tool-call
/// formats' tags and their fragments, JSON, SSE framing a careless writer
/// would pass through, whitespace and multi-byte text.
const PIECES: &[&str] = &[
    "<think>",
    "</think>",
    "<think>\n",
    "\n</think>\n\n",
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n",
    "\n</tool_call>",
    "<tool_call>\n<function=get>\n<parameter=a>\n7\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=f>\n<parameter=s>\nline 1\n\"q\" é\n</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"x\\ny\"}}\n</tool_call>",
    "<function=",
    "<function=get>",
    "<function=f>",
    "<function=nope>",
    "</function>",
    "<parameter=a>",
    "<parameter=s>",
    "<parameter=n>",
    "</parameter>",
    "<tool_",
    "call>",
    "</think",
    "<thi",
    "{\"name\": \"get\", \"arguments\": {\"a\": 1}}",
    "{\"name\": \"f\"",
    "\"arguments\": \"{\\\"n\\\": 2}\"",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "\\",
    ":",
    ",",
    "null",
    "-2.5e3",
    "1",
    "data:",
    "data: [DONE]",
    "event: ping",
    ": ping",
    "\n\n",
    "\r\n\r\n",
    "\r",
    "\n",
    " ",
    "\t",
    "\u{0}",
    "\u{1b}[0m",
    "\u{7f}",
    "\u{2028}",
    "\u{feff}",
    "é",
    "日本語",
    "🦀",
    "e\u{301}",
    "abc",
    "The answer is 42.",
];

fn random_output(rng: &mut Rng) -> String {
    (0..rng.below(30))
        .map(|_| *rng.pick(PIECES))
        .collect::<Vec<_>>()
        .concat()
}

/// Splits `text` at random character boundaries, now and then into an
/// empty piece too.
fn random_chunks(rng: &mut Rng, text: &str) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut current = String::new();
    let cut_one_in = 1 + rng.below(8);
    for c in text.chars() {
        current.push(c);
        if rng.chance(cut_one_in) {
            chunks.push(std::mem::take(&mut current));
            if rng.chance(16) {
                chunks.push(String::new());
            }
        }
    }
    chunks.push(current);
    chunks
}

/// Token bytes as a tokenizer reports them: whole or cut-off UTF-8 pieces
/// and raw high bytes.
fn random_bytes(rng: &mut Rng) -> Vec<u8> {
    let mut bytes = Vec::new();
    for _ in 0..rng.below(4) {
        let piece = rng.pick(PIECES).as_bytes();
        match rng.below(3) {
            0 => bytes.extend_from_slice(&piece[..rng.below(piece.len() + 1)]),
            1 => bytes.push(0x80 | rng.below(0x80) as u8),
            _ => bytes.extend_from_slice(piece),
        }
    }
    bytes
}

/// Log-probabilities the sampler can produce, the degenerate ones included.
/// (None is positive: a log-probability never is, and JSON has no infinity.)
fn random_logprob(rng: &mut Rng) -> f32 {
    *rng.pick(&[
        0.0,
        -0.0,
        -1e-45,
        -0.25,
        -3.5,
        MIN_LOGPROB,
        -1e30,
        f32::MIN,
        f32::NEG_INFINITY,
        f32::NAN,
    ])
}

fn random_token(rng: &mut Rng) -> LogprobToken {
    LogprobToken {
        bytes: random_bytes(rng),
        logprob: random_logprob(rng),
    }
}

fn random_logprobs(rng: &mut Rng) -> Vec<GeneratedLogprob> {
    (0..1 + rng.below(3))
        .map(|_| GeneratedLogprob {
            chosen: random_token(rng),
            top: (0..rng.below(4)).map(|_| random_token(rng)).collect(),
            text_offset: *rng.pick(&[0, 1, 17, u32::MAX]),
        })
        .collect()
}

fn random_reason(rng: &mut Rng) -> FinishReason {
    *rng.pick(&[
        FinishReason::Stop,
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::ToolCalls,
        FinishReason::Abort,
        FinishReason::Error,
    ])
}

fn random_usage(rng: &mut Rng) -> Usage {
    let prompt = *rng.pick(&[0u32, 1, 9, u32::MAX / 2]);
    let cached = *rng.pick(&[None, Some(0), Some(5), Some(u32::MAX / 2)]);
    Usage::new(prompt, rng.below(100) as u32, cached)
}

/// What one choice's generation sends, in order.
enum Step {
    Text(String),
    Logprobs(Vec<GeneratedLogprob>),
}

struct Script {
    /// The whole generated text (the concatenated `Text` steps).
    text: String,
    steps: Vec<Step>,
    /// Every logprob, in the order pushed.
    logprobs: Vec<GeneratedLogprob>,
    reason: FinishReason,
    usage: Usage,
}

fn random_script(rng: &mut Rng) -> Script {
    let text = random_output(rng);
    let mut steps = Vec::new();
    let mut logprobs = Vec::new();
    let mut maybe_logprobs = |rng: &mut Rng, steps: &mut Vec<Step>| {
        if rng.chance(3) {
            let l = random_logprobs(rng);
            logprobs.extend(l.iter().cloned());
            steps.push(Step::Logprobs(l));
        }
    };
    for chunk in random_chunks(rng, &text) {
        maybe_logprobs(rng, &mut steps);
        steps.push(Step::Text(chunk));
    }
    // Logprobs after the last text ride on the closing chunk.
    maybe_logprobs(rng, &mut steps);
    Script {
        text,
        steps,
        logprobs,
        reason: random_reason(rng),
        usage: random_usage(rng),
    }
}

/// A failure message a backend might report, framing characters included.
fn random_failure(rng: &mut Rng) -> String {
    format!("engine failed: {}", random_output(rng))
}

fn tools() -> Vec<Tool> {
    let parameters = json!({"type": "object", "properties": {
        "a": {"type": "integer"},
        "s": {"type": "string"},
        "n": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    }});
    ["f", "get"]
        .iter()
        .map(|name| Tool {
            name: name.to_string(),
            description: None,
            parameters: parameters.clone(),
            raw: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
        })
        .collect()
}

/// The options in a failure's message, without the tools' schemas.
fn describe(opts: &OutputOptions) -> String {
    format!(
        "reasoning {} (starting in it {}), tools {}, parallel calls {}",
        opts.reasoning,
        opts.starts_in_reasoning,
        opts.tools.is_some(),
        opts.parallel_tool_calls
    )
}

fn random_options<'a>(rng: &mut Rng, tools: &'a [Tool]) -> OutputOptions<'a> {
    OutputOptions {
        reasoning: !rng.chance(4),
        starts_in_reasoning: rng.chance(2),
        tools: (!rng.chance(4)).then_some(tools),
        parallel_tool_calls: rng.chance(2),
    }
}

/// One event's name (`event:` framing) and data, checked well-formed: one
/// `data:` line (after an `event:` line or not) and the blank line, no
/// carriage return, no other line break.
fn frame(event: &str) -> (Option<&str>, &str) {
    let body = event
        .strip_suffix("\n\n")
        .unwrap_or_else(|| panic!("event not ended by a blank line: {event:?}"));
    assert!(!body.contains('\r'), "carriage return in {event:?}");
    let lines: Vec<&str> = body.split('\n').collect();
    let (name, data) = match lines.as_slice() {
        [data] => (None, *data),
        [name, data] => {
            let name = name
                .strip_prefix("event: ")
                .unwrap_or_else(|| panic!("first of two lines is no event name: {event:?}"));
            assert!(!name.is_empty(), "empty event name: {event:?}");
            (Some(name), *data)
        }
        _ => panic!("an event of {} lines: {event:?}", lines.len()),
    };
    let data = data
        .strip_prefix("data: ")
        .unwrap_or_else(|| panic!("no data line: {event:?}"));
    (name, data)
}

/// Every event's data parsed: `None` for `[DONE]`, else the JSON (which it
/// must be). `named`: the stream frames events with `event:` lines naming
/// the data's type; otherwise it has none.
fn payloads(events: &[String], named: bool) -> Vec<Option<Value>> {
    events
        .iter()
        .map(|event| {
            let (name, data) = frame(event);
            if data == "[DONE]" {
                assert!(!named && name.is_none(), "{event:?}");
                return None;
            }
            let value: Value = serde_json::from_str(data)
                .unwrap_or_else(|e| panic!("data is not JSON ({e}): {event:?}"));
            match name {
                Some(name) => {
                    assert!(named, "unexpected event line: {event:?}");
                    assert_eq!(Some(name), value["type"].as_str(), "{event:?}");
                }
                None => assert!(!named, "no event line: {event:?}"),
            }
            Some(value)
        })
        .collect()
}

/// Plays one generation into a stream's assembler as the server's driver
/// does (`sse.rs`): the opening events, each step, then the closing events
/// (or a failure after `fail_at` steps).
fn play_one<A: SseAssembler>(
    rng: &mut Rng,
    assembler: &mut A,
    script: &Script,
    stop: Option<&str>,
) -> (Vec<String>, bool) {
    let fail_at = rng.chance(8).then(|| rng.below(script.steps.len() + 1));
    let mut events = assembler.start();
    for (k, step) in script.steps.iter().enumerate() {
        if fail_at == Some(k) {
            events.extend(assembler.failure(&random_failure(rng)));
            return (events, true);
        }
        match step {
            Step::Text(t) => events.extend(assembler.text(t)),
            Step::Logprobs(l) => assembler.logprobs(l),
        }
    }
    if fail_at == Some(script.steps.len()) {
        events.extend(assembler.failure(&random_failure(rng)));
        return (events, true);
    }
    events.extend(assembler.finish_at_stop(script.reason, script.usage, stop));
    (events, false)
}

/// Plays several choices' generations in a random interleaving, as the
/// server's `n > 1` stream does (`sse_choices.rs`): each choice's last chunk
/// when it ends, the closing events once, after all; a failure of any
/// choice ends the stream.
fn play_choices<A: ChoiceAssembler>(
    rng: &mut Rng,
    assemblers: &mut [A],
    scripts: &[Script],
) -> (Vec<String>, bool) {
    let total: usize = scripts.iter().map(|s| s.steps.len() + 1).sum();
    let fail_at = rng.chance(8).then(|| rng.below(total));
    let mut events = Vec::new();
    for a in assemblers.iter_mut() {
        events.extend(a.start());
    }
    let mut next = vec![0; scripts.len()];
    let mut done = 0;
    loop {
        let live: Vec<usize> = (0..scripts.len())
            .filter(|&i| next[i] <= scripts[i].steps.len())
            .collect();
        if live.is_empty() {
            break;
        }
        let i = *rng.pick(&live);
        if fail_at == Some(done) {
            events.extend(assemblers[i].failure(&random_failure(rng)));
            return (events, true);
        }
        match scripts[i].steps.get(next[i]) {
            Some(Step::Text(t)) => events.extend(assemblers[i].text(t)),
            Some(Step::Logprobs(l)) => assemblers[i].logprobs(l),
            None => events.extend(assemblers[i].finish_choice(scripts[i].reason)),
        }
        next[i] += 1;
        done += 1;
    }
    let usage: Vec<Usage> = scripts.iter().map(|s| s.usage).collect();
    events.extend(assemblers[0].close(Usage::of_choices(&usage)));
    (events, false)
}

/// `streamed` is `whole` with some runs of whitespace left out: what the
/// Messages and Responses streams do with whitespace that comes while no
/// text block is open (it is held, and dropped if no text follows).
fn assert_same_but_whitespace(streamed: &str, whole: &str, context: &str) {
    let mut s = streamed.chars().peekable();
    for c in whole.chars() {
        if s.peek() == Some(&c) {
            s.next();
        } else {
            assert!(
                c.is_whitespace(),
                "{context}: streamed text {streamed:?} is not the whole text {whole:?} less whitespace"
            );
        }
    }
    assert!(
        s.peek().is_none(),
        "{context}: streamed text {streamed:?} is not the whole text {whole:?} less whitespace"
    );
}

/// The chat chunks' logprobs entries, checked against what was pushed.
fn check_chat_logprobs(entries: &[Value], pushed: &[GeneratedLogprob], context: &str) {
    assert_eq!(entries.len(), pushed.len(), "{context}: logprobs entries");
    let check = |entry: &Value, token: &LogprobToken| {
        assert_eq!(
            entry["token"].as_str(),
            Some(String::from_utf8_lossy(&token.bytes).as_ref()),
            "{context}"
        );
        let bytes: Vec<u8> = serde_json::from_value(entry["bytes"].clone()).unwrap();
        assert_eq!(bytes, token.bytes, "{context}");
        let logprob = entry["logprob"]
            .as_f64()
            .unwrap_or_else(|| panic!("{context}: logprob {entry} is not a number"));
        assert!(
            (f64::from(MIN_LOGPROB)..=0.0).contains(&logprob),
            "{context}: {entry}"
        );
    };
    for (entry, g) in entries.iter().zip(pushed) {
        check(entry, &g.chosen);
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), g.top.len(), "{context}");
        top.iter().zip(&g.top).for_each(|(e, t)| check(e, t));
    }
}

/// What one chat choice's chunks add up to.
#[derive(Default)]
struct ChatChoice {
    reasoning: String,
    content: String,
    /// (id, name, concatenated arguments) per call index.
    calls: Vec<(String, String, String)>,
    finish: Option<String>,
    logprobs: Vec<Value>,
    chunks: usize,
}

fn collect_chat(chunks: &[Value], n: usize, context: &str) -> Vec<ChatChoice> {
    let mut choices: Vec<ChatChoice> = (0..n).map(|_| ChatChoice::default()).collect();
    for chunk in chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk", "{context}");
        assert_eq!(chunk["id"], "chatcmpl-fuzz", "{context}");
        let list = chunk["choices"].as_array().unwrap();
        assert_eq!(list.len(), 1, "{context}: {chunk}");
        let choice = &list[0];
        let index = choice["index"].as_u64().unwrap() as usize;
        let c = &mut choices[index];
        assert!(
            c.finish.is_none(),
            "{context}: a chunk after the finish: {chunk}"
        );
        let delta = &choice["delta"];
        assert_eq!(
            delta.get("role").is_some(),
            c.chunks == 0,
            "{context}: {chunk}"
        );
        c.chunks += 1;
        if let Some(r) = delta["reasoning_content"].as_str() {
            assert_eq!(delta["reasoning"].as_str(), Some(r), "{context}");
            assert!(!r.is_empty(), "{context}: {chunk}");
            c.reasoning.push_str(r);
        }
        if let Some(t) = delta["content"].as_str() {
            c.content.push_str(t);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if i == c.calls.len() {
                // A call's first delta names it; later ones add arguments.
                let id = call["id"].as_str().unwrap();
                assert!(id.starts_with("call_"), "{context}: {call}");
                assert_eq!(call["type"], "function", "{context}");
                let name = call["function"]["name"].as_str().unwrap();
                c.calls.push((id.into(), name.into(), String::new()));
            } else {
                assert!(i < c.calls.len(), "{context}: call index {i} skips");
                assert!(call.get("id").is_none(), "{context}: {call}");
                assert!(call["function"].get("name").is_none(), "{context}");
            }
            if let Some(a) = call["function"]["arguments"].as_str() {
                c.calls[i].2.push_str(a);
            }
        }
        if let Some(entries) = choice["logprobs"]["content"].as_array() {
            c.logprobs.extend(entries.iter().cloned());
        }
        match &choice["finish_reason"] {
            Value::Null => {}
            Value::String(f) => {
                assert_eq!(
                    delta,
                    &json!({}),
                    "{context}: the finish chunk has no delta"
                );
                c.finish = Some(f.clone());
            }
            other => panic!("{context}: finish_reason {other}"),
        }
    }
    choices
}

fn reason_name(reason: FinishReason) -> String {
    serde_json::to_value(reason)
        .unwrap()
        .as_str()
        .unwrap()
        .to_string()
}

/// The streamed calls agree with the whole parse's: the completed ones the
/// same, one more allowed (a call whose start streamed and that never
/// completed, which the whole parse drops).
fn check_calls(streamed: &[(String, String, String)], whole: &ChatResponseMessage, context: &str) {
    let n = whole.tool_calls.len();
    assert!(
        streamed.len() == n || streamed.len() == n + 1,
        "{context}: {} calls streamed, {n} in the whole parse",
        streamed.len()
    );
    for (s, w) in streamed.iter().zip(&whole.tool_calls) {
        assert_eq!(s.1, w.function.name, "{context}");
        assert_eq!(s.2, w.function.arguments, "{context}");
        let args: Value = serde_json::from_str(&s.2)
            .unwrap_or_else(|e| panic!("{context}: arguments {:?}: {e}", s.2));
        assert!(args.is_object(), "{context}");
    }
}

/// Forced tool calls start with text the server writes, parsed as output.
const REPLY_PREFIXES: &[&str] = &["", "<tool_call>\n<function=get>\n", "<think>\n"];

#[test]
fn chat_streams_are_well_formed_and_add_up_to_the_whole_parse() {
    let tools = tools();
    fuzz("chat sse", |rng| {
        let opts = random_options(rng, &tools);
        let include_usage = rng.chance(2);
        let prefix = *rng.pick(REPLY_PREFIXES);
        let n = if rng.chance(3) { 2 + rng.below(2) } else { 1 };
        let scripts: Vec<Script> = (0..n).map(|_| random_script(rng)).collect();
        let mut sses: Vec<ChatSse> = (0..n as u32)
            .map(|i| {
                ChatSse::new(
                    "chatcmpl-fuzz".into(),
                    "m".into(),
                    7,
                    i,
                    &opts,
                    include_usage,
                )
                .with_reply_prefix(prefix)
            })
            .collect();
        let (events, failed) = if n == 1 {
            play_one(rng, &mut sses[0], &scripts[0], None)
        } else {
            play_choices(rng, &mut sses, &scripts)
        };
        let texts: Vec<&str> = scripts.iter().map(|s| s.text.as_str()).collect();
        let context = format!("{} prefix {prefix:?} texts {texts:?}", describe(&opts));
        let values = payloads(&events, false);
        assert_eq!(
            events.last().map(String::as_str),
            Some(SSE_DONE),
            "{context}"
        );
        assert_eq!(
            values.iter().filter(|v| v.is_none()).count(),
            1,
            "{context}"
        );
        let mut chunks: Vec<Value> = values.into_iter().flatten().collect();
        if failed {
            let error = chunks.pop().unwrap();
            assert!(error["error"]["message"].is_string(), "{context}: {error}");
            collect_chat(&chunks, n, &context);
            return;
        }
        if include_usage {
            let usage = chunks.pop().unwrap();
            assert_eq!(usage["choices"], json!([]), "{context}");
            let all: Vec<Usage> = scripts.iter().map(|s| s.usage).collect();
            assert_eq!(usage["usage"], json!(Usage::of_choices(&all)), "{context}");
        }
        let choices = collect_chat(&chunks, n, &context);
        for (i, (got, script)) in choices.iter().zip(&scripts).enumerate() {
            let context = format!("{context}, choice {i}");
            let whole_text = format!("{prefix}{}", script.text);
            let (whole, reason) = parse_chat_output(&whole_text, &opts, script.reason);
            assert_eq!(got.finish, Some(reason_name(reason)), "{context}");
            assert_eq!(
                got.reasoning,
                whole.reasoning.clone().unwrap_or_default(),
                "{context}"
            );
            assert_eq!(
                got.content,
                whole.content.clone().unwrap_or_default(),
                "{context}"
            );
            check_calls(&got.calls, &whole, &context);
            check_chat_logprobs(&got.logprobs, &script.logprobs, &context);
        }
    });
}

#[test]
fn completion_streams_are_well_formed_and_add_up_to_the_text() {
    fuzz("completion sse", |rng| {
        let include_usage = rng.chance(2);
        let n = if rng.chance(3) { 2 + rng.below(2) } else { 1 };
        let scripts: Vec<Script> = (0..n).map(|_| random_script(rng)).collect();
        let mut sses: Vec<CompletionSse> = (0..n as u32)
            .map(|i| CompletionSse::new("cmpl-fuzz".into(), "m".into(), 7, i, include_usage))
            .collect();
        let (events, failed) = if n == 1 {
            play_one(rng, &mut sses[0], &scripts[0], None)
        } else {
            play_choices(rng, &mut sses, &scripts)
        };
        let texts: Vec<&str> = scripts.iter().map(|s| s.text.as_str()).collect();
        let context = format!("texts {texts:?}");
        let values = payloads(&events, false);
        assert_eq!(
            events.last().map(String::as_str),
            Some(SSE_DONE),
            "{context}"
        );
        assert_eq!(
            values.iter().filter(|v| v.is_none()).count(),
            1,
            "{context}"
        );
        let mut chunks: Vec<Value> = values.into_iter().flatten().collect();
        if failed {
            let error = chunks.pop().unwrap();
            assert!(error["error"]["message"].is_string(), "{context}: {error}");
        } else if include_usage {
            let usage = chunks.pop().unwrap();
            assert_eq!(usage["choices"], json!([]), "{context}");
        }
        let mut text = vec![String::new(); n];
        let mut finish: Vec<Option<String>> = vec![None; n];
        let mut offsets = vec![Vec::new(); n];
        for chunk in &chunks {
            assert_eq!(chunk["object"], "text_completion", "{context}");
            let list = chunk["choices"].as_array().unwrap();
            assert_eq!(list.len(), 1, "{context}: {chunk}");
            let choice = &list[0];
            let i = choice["index"].as_u64().unwrap() as usize;
            assert!(finish[i].is_none(), "{context}: a chunk after the finish");
            text[i].push_str(choice["text"].as_str().unwrap());
            finish[i] = choice["finish_reason"].as_str().map(str::to_string);
            let lp = &choice["logprobs"];
            if !lp.is_null() {
                let len = lp["tokens"].as_array().unwrap().len();
                for key in ["text_offset", "token_logprobs", "top_logprobs"] {
                    assert_eq!(lp[key].as_array().unwrap().len(), len, "{context}: {lp}");
                }
                for (k, token) in lp["tokens"].as_array().unwrap().iter().enumerate() {
                    // vLLM's top_logprobs include the chosen token.
                    let top = lp["top_logprobs"][k].as_object().unwrap();
                    assert!(top.contains_key(token.as_str().unwrap()), "{context}: {lp}");
                    assert!(lp["token_logprobs"][k].is_number(), "{context}: {lp}");
                }
                offsets[i].extend(lp["text_offset"].as_array().unwrap().iter().cloned());
            }
        }
        if failed {
            return;
        }
        for (i, script) in scripts.iter().enumerate() {
            assert_eq!(text[i], script.text, "{context}, choice {i}");
            assert_eq!(finish[i], Some(reason_name(script.reason)), "{context}");
            let pushed: Vec<Value> = script
                .logprobs
                .iter()
                .map(|g| json!(g.text_offset))
                .collect();
            assert_eq!(offsets[i], pushed, "{context}, choice {i}");
        }
    });
}

/// Stop sequences as the Messages stream reports them.
const STOPS: &[Option<&str>] = &[
    None,
    None,
    Some("END"),
    Some("\n\n"),
    Some("data: \"x\"\r\n"),
    Some(""),
];

#[test]
fn messages_streams_are_well_formed_and_add_up_to_the_whole_parse() {
    let tools = tools();
    fuzz("messages sse", |rng| {
        let opts = random_options(rng, &tools);
        let script = random_script(rng);
        let stop = *rng.pick(STOPS);
        let prompt_tokens = *rng.pick(&[0u32, 3, u32::MAX]);
        let mut sse = MessagesSse::new("msg_fuzz".into(), "m".into(), prompt_tokens, &opts);
        let (events, failed) = play_one(rng, &mut sse, &script, stop);
        let context = format!("{} text {:?} stop {stop:?}", describe(&opts), script.text);
        let values: Vec<Value> = payloads(&events, true)
            .into_iter()
            .map(|v| v.unwrap_or_else(|| panic!("{context}: [DONE] in a Messages stream")))
            .collect();
        let kinds: Vec<&str> = values.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(kinds[..2], ["message_start", "ping"], "{context}");
        assert_eq!(
            values[0]["message"]["usage"]["input_tokens"], prompt_tokens,
            "{context}"
        );
        let end = if failed {
            assert_eq!(kinds.last(), Some(&"error"), "{context}");
            assert!(values.last().unwrap()["error"]["message"].is_string());
            values.len() - 1
        } else {
            assert_eq!(
                kinds[kinds.len() - 2..],
                ["message_delta", "message_stop"],
                "{context}"
            );
            values.len() - 2
        };

        // Blocks: started in index order, one open at a time, deltas of the
        // open block's kind, each stopped before the next starts.
        let mut open: Option<(u64, String)> = None;
        let mut started = 0u64;
        let (mut thinking, mut text) = (String::new(), String::new());
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for v in &values[2..end] {
            match v["type"].as_str().unwrap() {
                "content_block_start" => {
                    assert!(open.is_none(), "{context}: a block starts inside another");
                    assert_eq!(v["index"], started, "{context}");
                    let block = &v["content_block"];
                    let kind = block["type"].as_str().unwrap().to_string();
                    if kind == "tool_use" {
                        let id = block["id"].as_str().unwrap();
                        assert!(id.starts_with("call_"), "{context}: {v}");
                        assert_eq!(block["input"], json!({}), "{context}");
                        let name = block["name"].as_str().unwrap();
                        calls.push((id.into(), name.into(), String::new()));
                    }
                    open = Some((started, kind));
                    started += 1;
                }
                "content_block_delta" => {
                    let (index, kind) = open.as_ref().expect("a delta outside any block");
                    assert_eq!(&v["index"], index, "{context}");
                    let delta = &v["delta"];
                    match (kind.as_str(), delta["type"].as_str().unwrap()) {
                        ("thinking", "thinking_delta") => {
                            thinking.push_str(delta["thinking"].as_str().unwrap())
                        }
                        ("thinking", "signature_delta") => {}
                        ("text", "text_delta") => text.push_str(delta["text"].as_str().unwrap()),
                        ("tool_use", "input_json_delta") => calls
                            .last_mut()
                            .unwrap()
                            .2
                            .push_str(delta["partial_json"].as_str().unwrap()),
                        (block, delta) => panic!("{context}: a {delta} in a {block} block"),
                    }
                }
                "content_block_stop" => {
                    let (index, _) = open.take().expect("a stop outside any block");
                    assert_eq!(v["index"], index, "{context}");
                }
                other => panic!("{context}: {other} inside the message"),
            }
        }
        if failed {
            return;
        }
        assert!(open.is_none(), "{context}: a block left open");
        let (whole, reason) = parse_chat_output(&script.text, &opts, script.reason);
        let delta = &values[values.len() - 2];
        assert_eq!(
            delta["delta"]["stop_reason"],
            stop_reason(reason, stop),
            "{context}"
        );
        assert_eq!(delta["delta"]["stop_sequence"], json!(stop), "{context}");
        assert_eq!(
            delta["usage"]["output_tokens"],
            script.usage.completion_tokens
        );
        assert_eq!(
            thinking,
            whole.reasoning.clone().unwrap_or_default(),
            "{context}"
        );
        let whole_text = whole.content.clone().unwrap_or_default();
        assert_same_but_whitespace(&text, &whole_text, &context);
        if whole_text.trim().is_empty() {
            // As in the non-streamed answer: no text block for whitespace.
            assert!(text.is_empty(), "{context}");
        }
        check_calls(&calls, &whole, &context);
    });
}

/// The Responses items a stream's events describe, checked against the
/// events' own bookkeeping: sequence numbers from 0, items added and done in
/// output order, each item's deltas adding up to its done text.
fn collect_responses(values: &[Value], context: &str) -> Vec<Value> {
    let mut items: Vec<Value> = Vec::new();
    // The open item: its id, type and the text its deltas added up to.
    let mut open: Option<(String, String, String)> = None;
    for (k, v) in values.iter().enumerate() {
        assert_eq!(v["sequence_number"], k, "{context}: {v}");
        let kind = v["type"].as_str().unwrap();
        let at = |v: &Value| {
            assert_eq!(v["output_index"], items.len(), "{context}: {v}");
            let (id, _, _) = open.as_ref().expect("an item event outside any item");
            assert_eq!(v["item_id"].as_str(), Some(id.as_str()), "{context}: {v}");
        };
        match kind {
            "response.output_item.added" => {
                assert!(open.is_none(), "{context}: an item added inside another");
                assert_eq!(v["output_index"], items.len(), "{context}");
                let item = &v["item"];
                assert_eq!(item["status"], "in_progress", "{context}");
                let id = item["id"].as_str().unwrap().to_string();
                open = Some((id, item["type"].as_str().unwrap().into(), String::new()));
            }
            "response.content_part.added" | "response.content_part.done" => at(v),
            "response.reasoning_text.delta"
            | "response.output_text.delta"
            | "response.function_call_arguments.delta" => {
                if kind == "response.function_call_arguments.delta" {
                    assert_eq!(v["output_index"], items.len(), "{context}: {v}");
                } else {
                    at(v);
                }
                let (_, item_kind, text) = open.as_mut().unwrap();
                let expected = match kind {
                    "response.reasoning_text.delta" => "reasoning",
                    "response.output_text.delta" => "message",
                    _ => "function_call",
                };
                assert_eq!(item_kind, expected, "{context}: {v}");
                text.push_str(v["delta"].as_str().unwrap());
            }
            "response.reasoning_text.done" | "response.output_text.done" => {
                at(v);
                let (_, _, text) = open.as_ref().unwrap();
                assert_eq!(v["text"].as_str(), Some(text.as_str()), "{context}");
            }
            "response.function_call_arguments.done" => {
                let (_, _, text) = open.as_ref().expect("arguments done outside a call");
                assert_eq!(v["arguments"].as_str(), Some(text.as_str()), "{context}");
            }
            "response.output_item.done" => {
                let (id, item_kind, text) = open.take().expect("an item done but none open");
                let item = &v["item"];
                assert_eq!(item["id"].as_str(), Some(id.as_str()), "{context}");
                assert_eq!(item["type"].as_str(), Some(item_kind.as_str()), "{context}");
                let done_text = match item_kind.as_str() {
                    "function_call" => item["arguments"].clone(),
                    _ => item["content"][0]["text"].clone(),
                };
                assert_eq!(done_text.as_str(), Some(text.as_str()), "{context}: {item}");
                items.push(item.clone());
            }
            "response.created" | "response.in_progress" => {
                assert!(k < 2, "{context}: {kind} at {k}");
            }
            "response.completed" | "response.incomplete" | "response.failed" => {
                assert_eq!(k, values.len() - 1, "{context}: {kind} before the end");
                assert!(
                    open.is_none(),
                    "{context}: the response ends with an item open"
                );
                assert_eq!(v["response"]["output"], json!(items), "{context}");
            }
            other => panic!("{context}: unknown event {other}"),
        }
    }
    items
}

/// Messages' texts, reasoning texts and (name, arguments) of the calls, in
/// output order.
fn item_texts(items: &[Value]) -> (String, String, Vec<(String, String)>) {
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for item in items {
        match item["type"].as_str().unwrap() {
            "message" => text.push_str(item["content"][0]["text"].as_str().unwrap()),
            "reasoning" => reasoning.push_str(item["content"][0]["text"].as_str().unwrap()),
            _ => calls.push((
                item["name"].as_str().unwrap().to_string(),
                item["arguments"].as_str().unwrap().to_string(),
            )),
        }
    }
    (text, reasoning, calls)
}

/// A stand-in token count for the reasoning (the route uses the model's
/// tokenizer): one per character.
fn count_chars(text: &str) -> u32 {
    text.chars().count() as u32
}

#[test]
fn responses_streams_are_well_formed_and_add_up_to_the_whole_text() {
    let tools = tools();
    fuzz("responses sse", |rng| {
        let opts = random_options(rng, &tools);
        let script = random_script(rng);
        let mut echo = Map::new();
        echo.insert("instructions".into(), json!(random_output(rng)));
        let builder = || ResponseBuilder::new("fuzz", "m", 7, echo.clone());
        let mut output = ResponseOutput::new(builder(), &opts, count_chars);
        let (events, failed) = play_one(rng, &mut output, &script, None);
        let context = format!("{} text {:?}", describe(&opts), script.text);
        let values: Vec<Value> = payloads(&events, true)
            .into_iter()
            .map(|v| v.unwrap_or_else(|| panic!("{context}: [DONE] in a Responses stream")))
            .collect();
        let kinds: Vec<&str> = values.iter().map(|v| v["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds[..2],
            ["response.created", "response.in_progress"],
            "{context}"
        );
        let items = collect_responses(&values, &context);
        let last = values.last().unwrap();
        if failed {
            assert_eq!(last["type"], "response.failed", "{context}");
            assert_eq!(last["response"]["status"], "failed", "{context}");
            assert!(
                last["response"]["error"]["message"].is_string(),
                "{context}"
            );
            return;
        }
        // The non-streaming route: the same builder fed the whole text.
        let mut whole_output = ResponseOutput::new(builder(), &opts, count_chars);
        whole_output.start();
        whole_output.text(&script.text);
        whole_output.finish(script.reason, script.usage);
        let whole = whole_output.response();

        let (parsed, reason) = parse_chat_output(&script.text, &opts, script.reason);
        let status = if reason == FinishReason::Length {
            "incomplete"
        } else {
            "completed"
        };
        assert_eq!(last["type"], format!("response.{status}"), "{context}");
        // The last event carries the response the stream's builder returns.
        assert_eq!(last["response"], output.response(), "{context}");
        assert_eq!(whole["status"], status, "{context}");
        let usage = &last["response"]["usage"];
        assert_eq!(usage["output_tokens"], script.usage.completion_tokens);

        let (text, reasoning, calls) = item_texts(&items);
        let (whole_text, whole_reasoning, whole_calls) =
            item_texts(whole["output"].as_array().unwrap());
        assert_eq!(reasoning, whole_reasoning, "{context}");
        let reasoning_tokens = count_chars(&reasoning).min(script.usage.completion_tokens);
        assert_eq!(
            usage["output_tokens_details"]["reasoning_tokens"],
            reasoning_tokens
        );
        // Both builders hold whitespace while no message is open and drop
        // it when none follows, at places that depend on the chunking: both
        // texts are the parsed content less some whitespace.
        let parsed = parsed.content.unwrap_or_default();
        assert_same_but_whitespace(&text, &parsed, &context);
        assert_same_but_whitespace(&whole_text, &parsed, &context);
        assert_eq!(calls, whole_calls, "{context}");
    });
}

//! Hostile requests on the agent routes (`/v1/messages`, its
//! `count_tokens`, `/v1/responses`) and on structured outputs: malformed
//! blocks and items, wrong types, huge and deeply nested schemas,
//! pathological regexes, grammars that do not parse. Each refusal is a 4xx
//! in the route's own error shape with a message that names the problem,
//! answered within a bound; afterwards the server is healthy and gives a
//! normal request the same answer as before, and a greedy stream running
//! while the hostile requests arrive gives the same text as alone.

#[path = "hostile_agent/cases.rs"]
mod cases;
mod common;
#[path = "hostile_agent/responses.rs"]
mod responses;
#[path = "hostile_agent/structured.rs"]
mod structured;

use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

pub use cases::{Case, Expect};

/// Longest any one hostile request may take to be answered.
const ANSWER_BOUND: Duration = Duration::from_secs(30);

fn server() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| spawn_server(|c| c.max_body_bytes = 32 * 1024 * 1024))
}

/// POSTs `case`'s raw body; panics if no answer comes within the bound.
async fn send(base: &str, case: &Case) -> (u16, Value) {
    let request = client()
        .post(format!("{base}{}", case.path))
        .header("content-type", "application/json")
        .body(case.body.clone())
        .send();
    let answer = async {
        let r = request
            .await
            .unwrap_or_else(|e| panic!("{}: connection failed: {e}", case.what()));
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    };
    tokio::time::timeout(ANSWER_BOUND, answer)
        .await
        .unwrap_or_else(|_| panic!("{}: no answer within {ANSWER_BOUND:?}", case.what()))
}

/// The error message of a refusal, after checking the body is the error
/// shape of `path`'s API: Anthropic's `{"type": "error", "error": {"type",
/// "message"}}` on `/v1/messages*`, OpenAI's `{"error": {"message",
/// "type"}}` elsewhere.
fn error_message(path: &str, status: u16, body: &Value) -> Result<String, String> {
    if !(400..500).contains(&status) {
        return Err(format!("status {status}, body {body}"));
    }
    let shaped = if path.starts_with("/v1/messages") {
        body["type"] == "error" && body["error"]["type"].is_string()
    } else {
        body.get("type").is_none() && body["error"]["type"].is_string()
    };
    let message = body["error"]["message"].as_str().unwrap_or_default();
    if !shaped || message.is_empty() {
        return Err(format!("not {path}'s error shape: {body}"));
    }
    Ok(message.to_string())
}

/// Sends `case` and checks its answer against what it expects.
async fn check(base: &str, case: &Case) -> Result<(), String> {
    let (status, body) = send(base, case).await;
    match case.expect {
        Expect::Refused(says) => {
            let message = error_message(case.path, status, &body)?;
            if !message.to_lowercase().contains(&says.to_lowercase()) {
                return Err(format!("the message {message:?} does not say {says:?}"));
            }
        }
        // Legal but expensive: served, or refused with a proper error.
        Expect::ServedOrRefused if status == 200 => {}
        Expect::ServedOrRefused => {
            error_message(case.path, status, &body)?;
        }
    }
    Ok(())
}

/// Checks every case, then fails listing each one answered wrongly.
async fn check_all(base: &str, cases: &[Case]) {
    let mut wrong = Vec::new();
    for case in cases {
        if let Err(e) = check(base, case).await {
            wrong.push(format!("{}\n    {e}", case.what()));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} answered wrongly:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
}

fn plain_chat(stream: bool) -> Value {
    json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a haiku about rivers."}],
        "max_tokens": 24,
        "temperature": 0,
        "stream": stream,
        "chat_template_kwargs": {"enable_thinking": false},
    })
}

/// A normal greedy chat completion's text.
async fn plain_text(base: &str) -> String {
    let (s, v) = post(base, "/v1/chat/completions", &plain_chat(false)).await;
    assert_eq!(s, 200, "{v}");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

/// The same completion streamed: its content deltas joined.
async fn streamed_text(base: &str) -> String {
    let (s, data) = post_stream(base, "/v1/chat/completions", &plain_chat(true)).await;
    assert_eq!(s, 200);
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    data.iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).expect("chunk is JSON"))
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

/// Healthy, and a normal request still gets `reference`.
async fn still_serves(base: &str, reference: &str) {
    let (s, page) = get(base, "/health").await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(plain_text(base).await, reference);
}

#[tokio::test]
async fn hostile_messages_get_anthropic_errors() {
    let base = server();
    let reference = plain_text(base).await;
    check_all(base, &cases::messages()).await;
    still_serves(base, &reference).await;
}

#[tokio::test]
async fn hostile_responses_get_openai_errors() {
    let base = server();
    let reference = plain_text(base).await;
    check_all(base, &responses::cases()).await;
    still_serves(base, &reference).await;
}

#[tokio::test]
async fn hostile_structured_outputs_get_openai_errors() {
    let base = server();
    let reference = plain_text(base).await;
    check_all(base, &structured::cases()).await;
    still_serves(base, &reference).await;
}

/// Every hostile case, sent while greedy streams run one after another: each
/// stream's text equals the text of the same stream alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_unaffected_by_hostile_requests_alongside() {
    let base = server();
    let alone = streamed_text(base).await;
    assert!(!alone.is_empty());
    let reference = plain_text(base).await;
    assert_eq!(alone, reference, "stream and non-stream differ");
    let hostile = tokio::spawn(async move {
        let mut all = cases::messages();
        all.extend(responses::cases());
        all.extend(structured::cases());
        check_all(base, &all).await;
        all.len()
    });
    let mut streams = 0;
    while streams == 0 || !hostile.is_finished() {
        assert_eq!(streamed_text(base).await, alone, "stream {streams}");
        streams += 1;
    }
    let sent = hostile.await.expect("hostile requests answered");
    assert!(sent >= 100, "only {sent} hostile requests");
    still_serves(base, &reference).await;
}

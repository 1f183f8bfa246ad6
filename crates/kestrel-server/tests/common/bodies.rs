//! Request bodies and stream parsing shared by the logprobs tests.

use serde_json::{Value, json};

use super::MODEL;

/// A short greedy chat request, `extra` merged in.
pub fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "def parse_args(argv):"}],
        "max_tokens": 12,
        "ignore_eos": true,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// A short greedy completion request, `extra` merged in.
pub fn completion(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "prompt": "import sys\n\ndef main(argv):\n",
        "max_tokens": 12,
        "ignore_eos": true,
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The chunks of a stream, checking it ends with one `[DONE]`.
pub fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

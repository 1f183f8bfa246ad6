//! Logprobs and `n > 1` on `/v1/chat/completions` and `/v1/completions`
//! against a real server with the bundled model.

mod common;

use std::collections::BTreeMap;

use common::*;
use serde_json::{Value, json};

fn chat(extra: Value) -> Value {
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

fn completion(extra: Value) -> Value {
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
fn chunks(events: &[String]) -> Vec<Value> {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

/// Checks one chat `logprobs.content` entry and returns (token, logprob).
fn chat_entry(e: &Value, top: usize) -> (String, f64) {
    let token = e["token"].as_str().unwrap().to_string();
    let logprob = e["logprob"].as_f64().unwrap();
    let bytes: Vec<u8> = e["bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b.as_u64().unwrap() as u8)
        .collect();
    assert_eq!(String::from_utf8_lossy(&bytes), token);
    assert!(logprob <= 0.0);
    let alternatives = e["top_logprobs"].as_array().unwrap();
    assert_eq!(alternatives.len(), top, "{e}");
    let values: Vec<f64> = alternatives
        .iter()
        .map(|t| {
            assert!(t["token"].is_string() && t["bytes"].is_array(), "{t}");
            t["logprob"].as_f64().unwrap()
        })
        .collect();
    assert!(values.windows(2).all(|w| w[0] >= w[1]), "best first: {e}");
    (token, logprob)
}

#[tokio::test]
async fn chat_logprobs_are_the_raw_distribution_streaming_or_not() {
    let base = shared_server();
    let (status, full) = post(
        base,
        "/v1/chat/completions",
        &chat(json!({
            "logprobs": true, "top_logprobs": 4, "temperature": 0
        })),
    )
    .await;
    assert_eq!(status, 200, "{full}");
    let choice = &full["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        full["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let entries: Vec<(String, f64)> = content.iter().map(|e| chat_entry(e, 4)).collect();
    // Greedy: each chosen token is the best alternative.
    for e in content {
        assert_eq!(e["token"], e["top_logprobs"][0]["token"], "{e}");
        assert_eq!(e["logprob"], e["top_logprobs"][0]["logprob"], "{e}");
    }
    // The tokens' bytes spell the text (no special token with EOS ignored).
    let spelled: Vec<u8> = content
        .iter()
        .flat_map(|e| {
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8)
        })
        .collect();
    assert_eq!(
        String::from_utf8(spelled).unwrap(),
        choice["message"]["content"].as_str().unwrap()
    );

    let (status, events) = post_stream(
        base,
        "/v1/chat/completions",
        &chat(json!({
            "logprobs": true, "top_logprobs": 4, "temperature": 0, "stream": true
        })),
    )
    .await;
    assert_eq!(status, 200);
    let streamed: Vec<(String, f64)> = chunks(&events)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|e| chat_entry(&e, 4))
        .collect();
    assert_eq!(streamed, entries);

    // The values come before temperature and filters: the first token's
    // row depends on the prompt alone.
    let (_, hot) = post(
        base,
        "/v1/chat/completions",
        &chat(json!({
            "logprobs": true, "top_logprobs": 4, "temperature": 1.9, "top_k": 2, "seed": 1,
            "repetition_penalty": 1.8
        })),
    )
    .await;
    let first = &hot["choices"][0]["logprobs"]["content"][0];
    assert_eq!(first["top_logprobs"], content[0]["top_logprobs"]);

    // Without logprobs the field is null.
    let (_, plain) = post(
        base,
        "/v1/chat/completions",
        &chat(json!({"temperature": 0})),
    )
    .await;
    assert_eq!(plain["choices"][0]["logprobs"], Value::Null);
    assert_eq!(plain["choices"][0]["message"], choice["message"]);
}

#[tokio::test]
async fn completion_logprobs_in_the_legacy_shape_streaming_or_not() {
    let base = shared_server();
    let body = completion(json!({"logprobs": 3, "temperature": 0.8, "seed": 9}));
    let (status, full) = post(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{full}");
    let choice = &full["choices"][0];
    let lp = &choice["logprobs"];
    let tokens: Vec<String> = serde_json::from_value(lp["tokens"].clone()).unwrap();
    let values: Vec<f64> = serde_json::from_value(lp["token_logprobs"].clone()).unwrap();
    let offsets: Vec<usize> = serde_json::from_value(lp["text_offset"].clone()).unwrap();
    let top: Vec<BTreeMap<String, f64>> =
        serde_json::from_value(lp["top_logprobs"].clone()).unwrap();
    assert_eq!(tokens.len(), 12);
    assert!(values.len() == 12 && offsets.len() == 12 && top.len() == 12);
    let text = choice["text"].as_str().unwrap();
    assert_eq!(tokens.concat(), text);
    let mut at = 0;
    for ((token, value), (offset, alternatives)) in
        tokens.iter().zip(&values).zip(offsets.iter().zip(&top))
    {
        assert_eq!(*offset, at, "text_offset of {token:?}");
        at += token.chars().count();
        assert!(*value <= 0.0);
        // The best three and the chosen token.
        assert!((3..=4).contains(&alternatives.len()), "{alternatives:?}");
        assert_eq!(alternatives.get(token), Some(value));
    }

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let (_, events) = post_stream(base, "/v1/completions", &stream_body).await;
    let (mut s_tokens, mut s_values, mut s_offsets) = (Vec::new(), Vec::new(), Vec::new());
    for c in chunks(&events) {
        let lp = &c["choices"][0]["logprobs"];
        if lp.is_object() {
            s_tokens.extend(serde_json::from_value::<Vec<String>>(lp["tokens"].clone()).unwrap());
            s_values
                .extend(serde_json::from_value::<Vec<f64>>(lp["token_logprobs"].clone()).unwrap());
            s_offsets
                .extend(serde_json::from_value::<Vec<usize>>(lp["text_offset"].clone()).unwrap());
        }
    }
    assert_eq!((s_tokens, s_values, s_offsets), (tokens, values, offsets));
}

#[tokio::test]
async fn logprob_and_choice_limits_are_400s() {
    let base = shared_server();
    for (path, body, param) in [
        (
            "/v1/chat/completions",
            chat(json!({"logprobs": true, "top_logprobs": 21})),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"top_logprobs": 2})),
            "top_logprobs",
        ),
        ("/v1/chat/completions", chat(json!({"n": 17})), "n"),
        (
            "/v1/completions",
            completion(json!({"logprobs": 21})),
            "logprobs",
        ),
        (
            "/v1/completions",
            completion(json!({"prompt_logprobs": 21})),
            "prompt_logprobs",
        ),
        (
            "/v1/chat/completions",
            chat(json!({"prompt_logprobs": -1})),
            "prompt_logprobs",
        ),
        ("/v1/completions", completion(json!({"n": 0})), "n"),
    ] {
        let (status, err) = post(base, path, &body).await;
        assert_client_error(status, &err, &body.to_string());
        assert_eq!(err["error"]["param"], param, "{body}");
    }
}

#[tokio::test]
async fn n_choices_are_the_seeded_requests_and_share_the_prefill() {
    // A server of its own, so that the prefix-cache counter is this test's.
    let base = &spawn_server(|_| {});
    let prompt = format!(
        "class Registry:\n{}",
        "    def entry(self): return 1\n".repeat(10)
    );
    let body = |n: u32, seed: u64| {
        completion(
            json!({"prompt": prompt, "n": n, "seed": seed, "temperature": 1.0, "max_tokens": 8}),
        )
    };
    let hits_before = metric(base, "vllm:prefix_cache_hits_total").await;
    let (status, four) = post(base, "/v1/completions", &body(4, 100)).await;
    assert_eq!(status, 200, "{four}");
    wait_idle(base, std::time::Duration::from_secs(30)).await;
    let hits = metric(base, "vllm:prefix_cache_hits_total").await - hits_before;
    let prompt_tokens = four["usage"]["prompt_tokens"].as_u64().unwrap();
    // Choices 1..3 found choice 0's prompt pages (at least one each).
    assert!(
        hits >= 3.0 * 16.0,
        "{hits} tokens hit for a prompt of {prompt_tokens}"
    );
    assert_eq!(four["usage"]["completion_tokens"], 4 * 8);
    assert_eq!(
        four["usage"]["total_tokens"].as_u64().unwrap(),
        prompt_tokens + 32
    );
    let choices = four["choices"].as_array().unwrap();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        // Choice i samples with seed + i: it is the one-choice request of that seed.
        let (_, one) = post(base, "/v1/completions", &body(1, 100 + i as u64)).await;
        assert_eq!(c["text"], one["choices"][0]["text"], "choice {i}");
    }

    // Streaming: the chunks of three choices interleave, each choice ends
    // once, one usage chunk closes the stream; each choice's text is the
    // non-streaming one.
    let mut stream_body = body(3, 100);
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let (status, events) = post_stream(base, "/v1/completions", &stream_body).await;
    assert_eq!(status, 200);
    let chunks = chunks(&events);
    let (usage, choice_chunks) = chunks.split_last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3 * 8);
    let mut texts = vec![String::new(); 3];
    let mut finishes = vec![0; 3];
    for c in choice_chunks {
        assert_eq!(c["usage"], Value::Null);
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["text"].as_str().unwrap());
        finishes[i] += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(finishes, [1, 1, 1]);
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            text,
            choices[i]["text"].as_str().unwrap(),
            "streamed choice {i}"
        );
    }
}

#[tokio::test]
async fn n_chat_choices_streaming_or_not() {
    let base = shared_server();
    let (status, full) = post(
        base,
        "/v1/chat/completions",
        &chat(json!({
            "n": 3, "temperature": 0, "logprobs": true, "max_tokens": 6
        })),
    )
    .await;
    assert_eq!(status, 200, "{full}");
    let choices = full["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    // Greedy: every choice is the same, logprobs too.
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"], choices[0]["message"]);
        assert_eq!(c["logprobs"], choices[0]["logprobs"]);
    }
    assert_eq!(full["usage"]["completion_tokens"], 18);

    let (status, events) = post_stream(
        base,
        "/v1/chat/completions",
        &chat(json!({
            "n": 3, "temperature": 0, "max_tokens": 6, "stream": true
        })),
    )
    .await;
    assert_eq!(status, 200);
    let mut content = vec![String::new(); 3];
    let mut roles = vec![0; 3];
    for c in chunks(&events) {
        let choice = &c["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        roles[i] += usize::from(choice["delta"]["role"] == "assistant");
        content[i].push_str(choice["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(roles, [1, 1, 1], "one role chunk per choice");
    for text in &content {
        assert_eq!(text, choices[0]["message"]["content"].as_str().unwrap());
    }
}

/// A completion's `logprobs` arrays, as (tokens, values, text offsets).
type Legacy = (Vec<String>, Vec<Option<f64>>, Vec<usize>);

fn legacy(lp: &Value) -> Legacy {
    (
        serde_json::from_value(lp["tokens"].clone()).unwrap(),
        serde_json::from_value(lp["token_logprobs"].clone()).unwrap(),
        serde_json::from_value(lp["text_offset"].clone()).unwrap(),
    )
}

fn extend(all: &mut Legacy, lp: &Value) {
    if lp.is_object() {
        let (t, v, o) = legacy(lp);
        all.0.extend(t);
        all.1.extend(v);
        all.2.extend(o);
    }
}

/// A streamed completion's choice `index`: its text, its logprobs and the
/// `prompt_logprobs` of its first chunk (no other chunk carries them).
async fn streamed_completion(base: &str, body: &Value, index: u64) -> (String, Legacy, Value) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, events) = post_stream(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{events:?}");
    let mut text = String::new();
    let mut lp: Legacy = Default::default();
    let mut prompt_logprobs = Vec::new();
    let choices: Vec<Value> = chunks(&events)
        .into_iter()
        .map(|c| c["choices"][0].clone())
        .filter(|c| c["index"] == index)
        .collect();
    for (i, c) in choices.iter().enumerate() {
        text.push_str(c["text"].as_str().unwrap());
        extend(&mut lp, &c["logprobs"]);
        if let Some(p) = c.get("prompt_logprobs") {
            assert_eq!(i, 0, "prompt_logprobs on a later chunk");
            prompt_logprobs.push(p.clone());
        }
    }
    (text, lp, prompt_logprobs.pop().unwrap_or(Value::Null))
}

/// Checks vLLM's `prompt_logprobs` against the echoed tokens and values:
/// one entry per prompt token, the first null, each a map whose first key
/// is the prompt token with the echoed value, then `top` alternatives.
fn check_prompt_logprobs(
    prompt_logprobs: &Value,
    echoed: &Legacy,
    prompt_tokens: usize,
    top: usize,
) {
    let entries = prompt_logprobs.as_array().expect("prompt_logprobs");
    assert_eq!(entries.len(), prompt_tokens);
    assert_eq!(entries[0], Value::Null);
    for (i, e) in entries.iter().enumerate().skip(1) {
        let map = e.as_object().unwrap();
        let (_, actual) = map.iter().next().unwrap();
        assert_eq!(
            actual["decoded_token"],
            echoed.0[i].as_str(),
            "position {i}"
        );
        assert_eq!(actual["logprob"].as_f64(), echoed.1[i], "position {i}");
        let rank = actual["rank"].as_u64().unwrap();
        assert!(rank >= 1);
        // The prompt token, then the best `top` (the token appears once):
        // ranks 1..=top, and the token's own when it is not among them.
        let mut ranks: Vec<u64> = map.values().map(|v| v["rank"].as_u64().unwrap()).collect();
        ranks.sort_unstable();
        let mut want: Vec<u64> = (1..=top as u64).collect();
        if rank > top as u64 {
            want.push(rank);
        }
        assert_eq!(ranks, want, "position {i}: {e}");
        let by_rank = |r: u64| map.values().find(|v| v["rank"] == r).unwrap()["logprob"].as_f64();
        assert!(
            (2..=top as u64).all(|r| by_rank(r - 1) >= by_rank(r)),
            "{e}"
        );
    }
}

#[tokio::test]
async fn echo_gives_the_prompt_and_its_teacher_forced_logprobs() {
    let base = shared_server();
    let prompt = "import sys\n\ndef main(argv):\n";
    let body = completion(json!({
        "echo": true, "logprobs": 2, "prompt_logprobs": 3, "temperature": 0, "max_tokens": 8
    }));
    let (status, full) = post(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{full}");
    let choice = &full["choices"][0];
    let prompt_tokens = full["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let text = choice["text"].as_str().unwrap();
    let (tokens, values, offsets) = legacy(&choice["logprobs"]);
    assert_eq!(tokens.len(), prompt_tokens + 8);
    assert_eq!(tokens.concat(), text);
    assert_eq!(
        tokens[..prompt_tokens].concat(),
        prompt,
        "the echo is the prompt"
    );
    assert_eq!(values[0], None, "nothing precedes the first token");
    assert!(values[1..].iter().all(|v| v.is_some_and(|v| v <= 0.0)));
    assert_eq!(choice["logprobs"]["top_logprobs"][0], Value::Null);
    let mut at = 0;
    for (token, offset) in tokens.iter().zip(&offsets) {
        assert_eq!(*offset, at, "text_offset of {token:?}");
        at += token.chars().count();
    }
    check_prompt_logprobs(
        &choice["prompt_logprobs"],
        &(tokens.clone(), values.clone(), offsets.clone()),
        prompt_tokens,
        3,
    );

    // Without echo: the same completion after no prompt.
    let (_, plain) = post(
        base,
        "/v1/completions",
        &completion(json!({"logprobs": 2, "temperature": 0, "max_tokens": 8})),
    )
    .await;
    let generated = &plain["choices"][0];
    assert_eq!(
        format!("{prompt}{}", generated["text"].as_str().unwrap()),
        text
    );
    assert_eq!(generated.get("prompt_logprobs"), None);
    assert_eq!(legacy(&generated["logprobs"]).1, values[prompt_tokens..]);

    // Teacher forcing: the prompt extended by the generated text gives its
    // tokens, as prompt tokens, the values they had when generated (the
    // rows come from one prefill instead of one decode step each).
    let extended = completion(json!({
        "prompt": text, "echo": true, "logprobs": 2, "max_tokens": 0
    }));
    let (status, forced) = post(base, "/v1/completions", &extended).await;
    assert_eq!(status, 200, "{forced}");
    let forced_choice = &forced["choices"][0];
    assert_eq!(forced_choice["text"], text);
    assert_eq!(forced_choice["finish_reason"], "length");
    assert_eq!(forced["usage"]["completion_tokens"], 0);
    let (f_tokens, f_values, _) = legacy(&forced_choice["logprobs"]);
    assert_eq!(f_tokens, tokens, "the text tokenizes as it was generated");
    for (i, (forced, generated)) in f_values.iter().zip(&values).enumerate().skip(1) {
        let (forced, generated) = (forced.unwrap(), generated.unwrap());
        assert!(
            (forced - generated).abs() < 2e-3,
            "token {i} {:?}: {forced} teacher-forced, {generated} generated",
            tokens[i]
        );
    }
    // The echoed alternatives are the prompt rows' best two and the token.
    let top: Vec<Option<BTreeMap<String, f64>>> =
        serde_json::from_value(forced_choice["logprobs"]["top_logprobs"].clone()).unwrap();
    for (i, alternatives) in top.iter().enumerate().skip(1) {
        let alternatives = alternatives.as_ref().unwrap();
        assert!((2..=3).contains(&alternatives.len()), "{alternatives:?}");
        assert_eq!(alternatives.get(&tokens[i]).copied(), f_values[i]);
    }

    // Streaming: the same text, logprobs and prompt_logprobs; the prompt's
    // come on the first chunk.
    let (s_text, s_lp, s_prompt_logprobs) = streamed_completion(base, &body, 0).await;
    assert_eq!(s_text, text);
    assert_eq!(s_lp, (tokens, values, offsets));
    assert_eq!(s_prompt_logprobs, choice["prompt_logprobs"]);
}

#[tokio::test]
async fn max_tokens_zero_with_echo_returns_just_the_prompt() {
    let base = shared_server();
    let prompt = "fn main() {\n    println!(\"héllo\");\n}\n";
    for stream in [false, true] {
        let body = completion(json!({"prompt": prompt, "echo": true, "max_tokens": 0}));
        let (text, lp) = if stream {
            let (text, lp, _) = streamed_completion(base, &body, 0).await;
            (text, lp)
        } else {
            let (status, full) = post(base, "/v1/completions", &body).await;
            assert_eq!(status, 200, "{full}");
            assert_eq!(full["usage"]["completion_tokens"], 0);
            assert_eq!(full["choices"][0]["finish_reason"], "length");
            assert_eq!(full["choices"][0]["logprobs"], Value::Null);
            (
                full["choices"][0]["text"].as_str().unwrap().to_string(),
                Legacy::default(),
            )
        };
        assert_eq!(text, prompt, "stream {stream}");
        assert!(lp.0.is_empty());
    }
    // A prompt of token ids echoes their text.
    let (_, ids) = post(
        base,
        "/tokenize",
        &json!({"model": MODEL, "prompt": prompt}),
    )
    .await;
    let body =
        completion(json!({"prompt": ids["tokens"], "echo": true, "max_tokens": 0, "logprobs": 0}));
    let (status, full) = post(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{full}");
    let choice = &full["choices"][0];
    assert_eq!(choice["text"], prompt);
    let (tokens, _, offsets) = legacy(&choice["logprobs"]);
    assert_eq!(tokens.len(), ids["tokens"].as_array().unwrap().len());
    // Offsets count characters ("é" is two bytes).
    assert_eq!(
        *offsets.last().unwrap() + tokens.last().unwrap().chars().count(),
        prompt.chars().count()
    );
}

#[tokio::test]
async fn every_choice_echoes() {
    let base = shared_server();
    let prompt = "import sys\n\ndef main(argv):\n";
    let body = completion(json!({
        "n": 3, "seed": 4, "temperature": 1.0, "echo": true, "logprobs": 1,
        "prompt_logprobs": 1, "max_tokens": 5
    }));
    let (status, full) = post(base, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{full}");
    let choices = full["choices"].as_array().unwrap();
    let prompt_tokens = full["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    for (i, c) in choices.iter().enumerate() {
        assert!(
            c["text"].as_str().unwrap().starts_with(prompt),
            "choice {i}"
        );
        let (tokens, values, _) = legacy(&c["logprobs"]);
        assert_eq!(tokens.len(), prompt_tokens + 5, "choice {i}");
        assert_eq!(
            values[..prompt_tokens],
            legacy(&choices[0]["logprobs"]).1[..prompt_tokens]
        );
        assert_eq!(c["prompt_logprobs"], choices[0]["prompt_logprobs"]);
        assert_eq!(
            c["prompt_logprobs"].as_array().unwrap().len(),
            prompt_tokens
        );
        let (s_text, s_lp, s_prompt_logprobs) = streamed_completion(base, &body, i as u64).await;
        assert_eq!(s_text, c["text"].as_str().unwrap(), "streamed choice {i}");
        assert_eq!(s_lp, legacy(&c["logprobs"]), "streamed choice {i}");
        assert_eq!(
            s_prompt_logprobs, c["prompt_logprobs"],
            "streamed choice {i}"
        );
    }
}

#[tokio::test]
async fn chat_prompt_logprobs_streaming_or_not() {
    let base = shared_server();
    let body = chat(json!({"prompt_logprobs": 2, "temperature": 0, "max_tokens": 4}));
    let (status, full) = post(base, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{full}");
    let entries = full["prompt_logprobs"].as_array().unwrap();
    assert_eq!(
        entries.len() as u64,
        full["usage"]["prompt_tokens"].as_u64().unwrap()
    );
    assert_eq!(entries[0], Value::Null);
    for e in &entries[1..] {
        let map = e.as_object().unwrap();
        assert!((2..=3).contains(&map.len()), "{e}");
        assert!(map.values().all(|v| v["logprob"].as_f64().unwrap() <= 0.0));
    }
    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let (status, events) = post_stream(base, "/v1/chat/completions", &stream_body).await;
    assert_eq!(status, 200);
    let chunks = chunks(&events);
    assert_eq!(chunks[0]["prompt_logprobs"], full["prompt_logprobs"]);
    assert!(
        chunks[1..]
            .iter()
            .all(|c| c.get("prompt_logprobs").is_none())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_and_prompt_logprobs_are_the_same_with_speculation() {
    use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
    let spec = spawn_server(|c| {
        c.speculative = Some(SpeculativeConfig {
            method: SpeculativeMethod::Ngram(NgramConfig::new(1, 3, 4).unwrap()),
            num_speculative_tokens: 3,
        })
    });
    let plain = shared_server();
    // A repetitive prompt, so that the n-gram drafts are accepted.
    let prompt = format!(
        "class Registry:\n{}",
        "    def entry(self): return 1\n".repeat(6)
    );
    let body = completion(json!({
        "prompt": prompt, "echo": true, "logprobs": 2, "prompt_logprobs": 2,
        "temperature": 0, "max_tokens": 24
    }));
    let (status, want) = post(plain, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{want}");
    let (status, got) = post(&spec, "/v1/completions", &body).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["choices"], want["choices"]);
    let streamed = streamed_completion(&spec, &body, 0).await;
    let choice = &want["choices"][0];
    assert_eq!(
        streamed,
        (
            choice["text"].as_str().unwrap().to_string(),
            legacy(&choice["logprobs"]),
            choice["prompt_logprobs"].clone()
        )
    );
    let accepted = metric(&spec, "vllm:spec_decode_num_accepted_tokens_total").await;
    assert!(accepted > 0.0, "no draft was accepted");
}

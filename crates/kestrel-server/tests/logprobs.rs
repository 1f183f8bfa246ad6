//! Logprobs and `n > 1` on `/v1/chat/completions` and `/v1/completions`
//! against a real server with the bundled model.

mod common;

use std::collections::BTreeMap;

use common::bodies::{chat, chunks, completion};
use common::*;
use serde_json::{Value, json};

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

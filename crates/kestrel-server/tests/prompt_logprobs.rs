//! Prompt logprobs and `echo` on `/v1/completions` (and `prompt_logprobs`
//! on `/v1/chat/completions`) against a real server with the bundled model.

mod common;

use std::collections::BTreeMap;

use common::bodies::{chat, chunks, completion};
use common::*;
use serde_json::{Value, json};

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

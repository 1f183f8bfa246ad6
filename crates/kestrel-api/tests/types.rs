//! Serialized shapes of responses and stream chunks.

use kestrel_api::types::sse::{
    ChatStream, CompletionStream, DeltaParts, SSE_DONE, sse_error, sse_event,
};
use kestrel_api::types::*;
use kestrel_api::{ApiError, ErrorKind};
use serde_json::{Value, json};

fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

#[test]
fn chat_stream_keeps_openai_invariants() {
    let mut s = ChatStream::new("chatcmpl-1", "qwen", 1700000000);
    let first = to_value(&s.start());
    assert_eq!(
        first["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(first["usage"], Value::Null);
    assert_eq!(first["object"], "chat.completion.chunk");
    assert!(
        s.delta(DeltaParts::default()).is_none(),
        "nothing to send, no chunk"
    );
    let reasoning = to_value(
        &s.delta(DeltaParts {
            reasoning: "hm".into(),
            ..Default::default()
        })
        .unwrap(),
    );
    assert_eq!(
        reasoning["choices"][0]["delta"],
        json!({"reasoning": "hm", "reasoning_content": "hm"})
    );
    let call = ToolCallDelta {
        index: 0,
        id: Some("call_x".into()),
        kind: Some("function".into()),
        function: FunctionCallDelta {
            name: Some("f".into()),
            arguments: None,
        },
    };
    let tool = to_value(
        &s.delta(DeltaParts {
            tool_calls: vec![call],
            ..Default::default()
        })
        .unwrap(),
    );
    assert_eq!(
        tool["choices"][0]["delta"],
        json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function", "function": {"name": "f"}}]})
    );
    let last = to_value(&s.finish(FinishReason::ToolCalls));
    assert_eq!(last["choices"][0]["delta"], json!({}));
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    let usage = to_value(&s.usage(Usage::new(10, 5, Some(8))));
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15, "prompt_tokens_details": {"cached_tokens": 8}})
    );
    for chunk in [&first, &reasoning, &tool, &last, &usage] {
        assert_eq!(
            (chunk["id"].as_str(), chunk["created"].as_u64()),
            (Some("chatcmpl-1"), Some(1700000000))
        );
    }
    assert_eq!(SSE_DONE, "data: [DONE]\n\n");
    let ev = sse_event(&json!({"a": 1}));
    assert_eq!(ev, "data: {\"a\":1}\n\n");
    let err = sse_error(&ApiError::new(ErrorKind::Internal, "engine died"));
    assert!(err.starts_with("data: {\"error\":") && err.ends_with("\n\n"));
}

#[test]
fn non_streaming_shapes() {
    let resp = ChatCompletionResponse {
        id: "chatcmpl-2".into(),
        object: "chat.completion".into(),
        created: 1,
        model: "qwen".into(),
        choices: vec![ChatChoice {
            index: 0,
            message: ChatResponseMessage {
                content: None,
                reasoning: Some("r".into()),
                reasoning_content: Some("r".into()),
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    kind: "function".into(),
                    function: FunctionCall {
                        name: "f".into(),
                        arguments: "{}".into(),
                    },
                }],
                ..Default::default()
            },
            logprobs: None,
            finish_reason: Some(FinishReason::ToolCalls),
        }],
        usage: Usage::new(3, 4, None),
        prompt_logprobs: None,
    };
    let v = to_value(&resp);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        Value::Null,
        "content key present even when null"
    );
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["type"],
        "function"
    );
    assert!(v["usage"].get("prompt_tokens_details").is_none());
    let back: ChatCompletionResponse = serde_json::from_value(v).unwrap();
    assert_eq!(back, resp);

    let models = to_value(&ModelList::new(
        &["qwen".into(), "alias".into()],
        5,
        "kestrel",
        4096,
    ));
    assert_eq!(models["object"], "list");
    assert_eq!(
        models["data"][1],
        json!({"id": "alias", "object": "model", "created": 5, "owned_by": "kestrel", "max_model_len": 4096})
    );
    assert_eq!(to_value(&FinishReason::Length), json!("length"));
    let tok = to_value(&TokenizeResponse {
        tokens: vec![1, 2],
        count: 2,
        max_model_len: 10,
        token_strs: None,
    });
    assert_eq!(
        tok,
        json!({"tokens": [1, 2], "count": 2, "max_model_len": 10})
    );
}

#[test]
fn completion_stream_and_status_errors() {
    let mut s = CompletionStream::new("cmpl-1", "qwen", 9);
    assert!(s.delta(String::new()).is_none());
    let d = to_value(&s.delta("hi".into()).unwrap());
    assert_eq!(d["object"], "text_completion");
    assert_eq!(d["choices"][0]["text"], "hi");
    assert_eq!(d["choices"][0]["finish_reason"], Value::Null);
    let f = to_value(&s.finish(FinishReason::Stop));
    assert_eq!(
        (
            f["choices"][0]["text"].as_str(),
            f["choices"][0]["finish_reason"].as_str()
        ),
        (Some(""), Some("stop"))
    );
    assert_eq!(
        to_value(&s.usage(Usage::new(1, 2, None)))["choices"],
        json!([])
    );

    let loading = to_value(&ApiError::unavailable("Loading model").body_with_status_code());
    assert_eq!(
        loading,
        json!({"error": {"message": "Loading model", "type": "unavailable_error", "param": null, "code": 503}})
    );
    let e = ApiError::unauthorized();
    assert_eq!(
        (
            e.status(),
            to_value(&e.body_with_status_code())["error"]["type"].as_str()
        ),
        (401, Some("authentication_error"))
    );
    let busy = ApiError::queue_full(256);
    assert_eq!(
        (busy.status(), busy.kind.type_name()),
        (429, "rate_limit_error")
    );
}

fn generated(
    bytes: &[u8],
    logprob: f32,
    top: &[(&[u8], f32)],
    text_offset: u32,
) -> GeneratedLogprob {
    let token = |bytes: &[u8], logprob| LogprobToken {
        bytes: bytes.to_vec(),
        logprob,
    };
    GeneratedLogprob {
        chosen: token(bytes, logprob),
        top: top.iter().map(|&(b, l)| token(b, l)).collect(),
        text_offset,
    }
}

#[test]
fn logprobs_in_openai_shapes() {
    // "é" split over two tokens: each alone is a partial character.
    let tokens = [
        generated(b"hi", -0.5, &[(b"hi", -0.5), (b"ho", -1.5)], 0),
        generated(&[0xC3], -0.25, &[(b"x", -0.125)], 2),
        generated(&[0xA9], f32::NEG_INFINITY, &[], 3),
    ];
    let chat = to_value(&ChatLogprobs::from_tokens(&tokens));
    assert_eq!(
        chat["content"][0],
        json!({"token": "hi", "logprob": -0.5, "bytes": [104, 105], "top_logprobs": [
            {"token": "hi", "logprob": -0.5, "bytes": [104, 105]},
            {"token": "ho", "logprob": -1.5, "bytes": [104, 111]},
        ]})
    );
    assert_eq!(chat["content"][1]["token"], "\u{FFFD}");
    assert_eq!(chat["content"][1]["bytes"], json!([0xC3]));
    // JSON has no -inf.
    assert_eq!(chat["content"][2]["logprob"], json!(MIN_LOGPROB));

    let completion = to_value(&CompletionLogprobs::from_tokens(&tokens));
    assert_eq!(completion["tokens"], json!(["hi", "\u{FFFD}", "\u{FFFD}"]));
    assert_eq!(
        completion["token_logprobs"],
        json!([-0.5, -0.25, MIN_LOGPROB])
    );
    assert_eq!(completion["text_offset"], json!([0, 2, 3]));
    // The best ones and the chosen one.
    assert_eq!(
        completion["top_logprobs"][0],
        json!({"hi": -0.5, "ho": -1.5})
    );
    assert_eq!(
        completion["top_logprobs"][1],
        json!({"x": -0.125, "\u{FFFD}": -0.25})
    );
}

#[test]
fn stream_chunks_carry_their_choice_index_and_waiting_logprobs() {
    let mut chat = ChatStream::new("c", "m", 1).with_index(2);
    assert_eq!(to_value(&chat.start())["choices"][0]["index"], 2);
    assert!(chat.delta(DeltaParts::default()).is_none());
    chat.push_logprobs(&[generated(b"a", -1.0, &[], 0)]);
    // Logprobs alone make a chunk (the text may be held by a parser).
    let c = to_value(&chat.delta(DeltaParts::default()).unwrap());
    assert_eq!(c["choices"][0]["logprobs"]["content"][0]["token"], "a");
    assert_eq!(c["choices"][0]["delta"], json!({}));
    let c = to_value(&chat.finish(FinishReason::Length));
    assert_eq!(c["choices"][0]["logprobs"], Value::Null, "sent once");

    let mut text = CompletionStream::new("t", "m", 1).with_index(1);
    text.push_logprobs(&[generated(b"b", -2.0, &[], 0)]);
    let f = to_value(&text.finish(FinishReason::Stop));
    assert_eq!(f["choices"][0]["index"], 1);
    assert_eq!(f["choices"][0]["logprobs"]["tokens"], json!(["b"]));
}

#[test]
fn usage_of_several_choices_counts_the_prompt_once() {
    let u = Usage::of_choices(&[
        Usage::new(10, 3, Some(0)),
        Usage::new(10, 5, Some(8)),
        Usage::new(10, 2, None),
    ]);
    assert_eq!(
        (u.prompt_tokens, u.completion_tokens, u.total_tokens),
        (10, 10, 20)
    );
    assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, 0);
}

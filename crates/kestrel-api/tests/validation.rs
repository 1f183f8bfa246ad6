//! Hostile and malformed request bodies: each is a 400 naming the parameter.

use kestrel_api::validate::{
    check_context_length, check_token_ids, parse_detokenize_request, parse_tokenize_request,
};
use kestrel_api::{
    ApiError, ChatRequest, MessageContent, Prompt, ResponseFormat, ToolChoice, ValidationOptions,
    parse_chat_request, parse_completion_request, parse_json_body,
};
use serde_json::{Value, json};

const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

fn chat(body: &str) -> Result<ChatRequest, ApiError> {
    chat_with(body, &ValidationOptions::default())
}

fn chat_with(body: &str, opts: &ValidationOptions) -> Result<ChatRequest, ApiError> {
    let value = parse_json_body(body.as_bytes())?;
    parse_chat_request(&value, opts)
}

/// A chat body with the standard message plus `extra` fields.
fn with(extra: &str) -> String {
    format!("{{{MSG},{extra}}}")
}

#[track_caller]
fn rejected(body: &str, param: &str) -> ApiError {
    let err = chat(body).expect_err(&format!("accepted: {body}"));
    assert_eq!(err.status(), 400, "{body}: {err:?}");
    assert_eq!(err.param.as_deref(), Some(param), "{body}: {err:?}");
    let json: Value = serde_json::from_str(&err.to_json()).unwrap();
    assert_eq!(json["error"]["type"], "invalid_request_error");
    assert_eq!(json["error"]["param"], param);
    err
}

#[test]
fn sampling_ranges_and_types_name_the_parameter() {
    let cases: &[(&str, &str)] = &[
        (r#""temperature":-0.1"#, "temperature"),
        (r#""temperature":2.01"#, "temperature"),
        (r#""temperature":"hot""#, "temperature"),
        (r#""temperature":true"#, "temperature"),
        (r#""temperature":[1]"#, "temperature"),
        (r#""temperature":1e300"#, "temperature"),
        (r#""top_p":0"#, "top_p"),
        (r#""top_p":1.5"#, "top_p"),
        (r#""top_p":-1"#, "top_p"),
        (r#""top_p":{}"#, "top_p"),
        (r#""top_k":-2"#, "top_k"),
        (r#""top_k":1.5"#, "top_k"),
        (r#""top_k":"5""#, "top_k"),
        (r#""min_p":-0.01"#, "min_p"),
        (r#""min_p":1.01"#, "min_p"),
        (r#""presence_penalty":2.5"#, "presence_penalty"),
        (r#""presence_penalty":-2.5"#, "presence_penalty"),
        (r#""frequency_penalty":3"#, "frequency_penalty"),
        (r#""frequency_penalty":"0""#, "frequency_penalty"),
        (r#""repetition_penalty":0"#, "repetition_penalty"),
        (r#""repetition_penalty":-1"#, "repetition_penalty"),
        (r#""repeat_penalty":0"#, "repeat_penalty"),
        (r#""repetition_penalty":1e39"#, "repetition_penalty"),
        (r#""max_tokens":0"#, "max_tokens"),
        (r#""max_tokens":-5"#, "max_tokens"),
        (r#""max_tokens":1.5"#, "max_tokens"),
        (r#""max_tokens":"100""#, "max_tokens"),
        (r#""max_tokens":99999999999"#, "max_tokens"),
        (r#""max_completion_tokens":0"#, "max_completion_tokens"),
        (r#""min_tokens":-1"#, "min_tokens"),
        (r#""min_tokens":20,"max_tokens":10"#, "min_tokens"),
        (r#""n":0"#, "n"),
        (r#""n":-1"#, "n"),
        (r#""n":2"#, "n"),
        (r#""n":"1""#, "n"),
        (r#""seed":-1"#, "seed"),
        (r#""seed":18446744073709551616"#, "seed"),
        (r#""seed":1.5"#, "seed"),
        (r#""seed":"42""#, "seed"),
        (r#""stop":["a","b","c","d","e","f","g","h","i"]"#, "stop"),
        (r#""stop":5"#, "stop"),
        (r#""stop":[1]"#, "stop[0]"),
        (r#""stop":["ok",null]"#, "stop[1]"),
        (r##""stop":"""##, "stop"),
        (r#""stop_token_ids":[-1]"#, "stop_token_ids[0]"),
        (r#""stop_token_ids":"1""#, "stop_token_ids"),
        (r#""ignore_eos":"yes""#, "ignore_eos"),
        (
            r#""include_stop_str_in_output":1"#,
            "include_stop_str_in_output",
        ),
        (r#""skip_special_tokens":"false""#, "skip_special_tokens"),
        (r#""top_logprobs":21,"logprobs":true"#, "top_logprobs"),
        (r#""top_logprobs":2"#, "top_logprobs"),
        (r#""top_logprobs":-1,"logprobs":true"#, "top_logprobs"),
        (r#""logprobs":"yes""#, "logprobs"),
        (r#""stream":"true""#, "stream"),
        (
            r#""stream_options":{"include_usage":true}"#,
            "stream_options",
        ),
        (
            r#""stream":true,"stream_options":{"include_usage":"yes"}"#,
            "stream_options.include_usage",
        ),
        (r#""stream":true,"stream_options":[]"#, "stream_options"),
        (r#""model":5"#, "model"),
        (r#""user":{}"#, "user"),
        (r#""truncate_prompt_tokens":0"#, "truncate_prompt_tokens"),
    ];
    for (extra, param) in cases {
        rejected(&with(extra), param);
    }
}

#[test]
fn unsupported_parameters_are_refused_not_ignored() {
    let cases: &[(&str, &str)] = &[
        (r#""logit_bias":{"42":10}"#, "logit_bias"),
        (r#""best_of":2"#, "best_of"),
        (r#""use_beam_search":true"#, "use_beam_search"),
        (r#""prompt_embeds":"AAAA""#, "prompt_embeds"),
        (r#""prompt_logprobs":1"#, "prompt_logprobs"),
        (r#""guided_json":{}"#, "guided_json"),
        (r#""guided_regex":"a+""#, "guided_regex"),
        (r#""chat_template":"{{ 7*7 }}""#, "chat_template"),
        (r#""logprobs":true"#, "logprobs"),
        (r#""functions":[]"#, "functions"),
        (r#""audio":{"voice":"x"}"#, "audio"),
        (r#""modalities":["text","audio"]"#, "modalities"),
        (r#""echo":true"#, "echo"),
        (
            r#""response_format":{"type":"json_object"}"#,
            "response_format",
        ),
        (
            r#""response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}"#,
            "response_format",
        ),
        (
            r#""stream":true,"stream_options":{"continuous_usage_stats":true}"#,
            "stream_options.continuous_usage_stats",
        ),
    ];
    for (extra, param) in cases {
        let err = rejected(&with(extra), param);
        assert!(
            err.message.contains("not supported"),
            "{extra}: {}",
            err.message
        );
    }
}

#[test]
fn messages_shape_is_checked() {
    let cases: &[(&str, &str)] = &[
        (r#"{}"#, "messages"),
        (r#"{"messages":null}"#, "messages"),
        (r#"{"messages":"hello"}"#, "messages"),
        (r#"{"messages":{}}"#, "messages"),
        (r#"{"messages":[]}"#, "messages"),
        (r#"{"messages":[123]}"#, "messages[0]"),
        (r#"{"messages":[null]}"#, "messages[0]"),
        (r#"{"messages":["hi"]}"#, "messages[0]"),
        (r#"{"messages":[{}]}"#, "messages[0].role"),
        (
            r#"{"messages":[{"role":1,"content":"x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"messages":[{"role":null,"content":"x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"messages":[{"role":"wizard","content":"x"}]}"#,
            "messages[0].role",
        ),
        (r#"{"messages":[{"role":"user"}]}"#, "messages[0].content"),
        (
            r#"{"messages":[{"role":"user","content":null}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user","content":5}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user","content":{"text":"x"}}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user","content":[5]}]}"#,
            "messages[0].content[0]",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{}]}]}"#,
            "messages[0].content[0].type",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            "messages[0].content[0].text",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":7}]}]}"#,
            "messages[0].content[0].text",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"file:///etc/passwd"}}]}]}"#,
            "messages[0].content[0].type",
        ),
        (
            r#"{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b","tool_calls":{}}]}"#,
            "messages[1].tool_calls",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{bad"}}]}]}"#,
            "messages[0].tool_calls[0].function.arguments",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"function","function":{"arguments":"{}"}}]}]}"#,
            "messages[0].tool_calls[0].function.name",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[{"type":"function"}]}]}"#,
            "messages[0].tool_calls[0].function",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x","tool_calls":[]}]}"#,
            "messages[0].tool_calls",
        ),
        (
            r#"{"messages":[{"role":"assistant","content":"x","reasoning_content":5}]}"#,
            "messages[0].reasoning_content",
        ),
        (
            r#"{"messages":[{"role":"tool","content":"x","tool_call_id":3}]}"#,
            "messages[0].tool_call_id",
        ),
    ];
    for (body, param) in cases {
        rejected(body, param);
    }
}

#[test]
fn tools_and_tool_choice_are_checked() {
    let tool =
        r#"{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}"#;
    let cases: Vec<(String, &str)> = vec![
        (with(r#""tools":{}"#), "tools"),
        (with(r#""tools":[5]"#), "tools[0]"),
        (with(r#""tools":[{"type":"retrieval"}]"#), "tools[0].type"),
        (
            with(r#""tools":[{"type":"function"}]"#),
            "tools[0].function",
        ),
        (
            with(r#""tools":[{"type":"function","function":{"name":""}}]"#),
            "tools[0].function.name",
        ),
        (
            with(r#""tools":[{"type":"function","function":{"name":"f","parameters":"x"}}]"#),
            "tools[0].function.parameters",
        ),
        (
            with(&format!(r#""tools":[{tool},{tool}]"#)),
            "tools[1].function.name",
        ),
        (with(r#""tool_choice":"sometimes""#), "tool_choice"),
        (with(r#""tool_choice":5"#), "tool_choice"),
        (with(r#""tool_choice":"required""#), "tool_choice"),
        (
            with(&format!(
                r#""tools":[{tool}],"tool_choice":{{"type":"function","function":{{}}}}"#
            )),
            "tool_choice.function.name",
        ),
        (
            with(&format!(r#""tools":[{tool}],"tool_choice":{{"type":"x"}}"#)),
            "tool_choice.type",
        ),
        (
            with(&format!(r#""tools":[{tool}],"parallel_tool_calls":"no""#)),
            "parallel_tool_calls",
        ),
        (
            with(r#""chat_template_kwargs":"x""#),
            "chat_template_kwargs",
        ),
        (
            with(r#""chat_template_kwargs":{"enable_thinking":"no"}"#),
            "chat_template_kwargs.enable_thinking",
        ),
        (
            with(r#""response_format":{"type":"xml"}"#),
            "response_format.type",
        ),
        (with(r#""response_format":"json""#), "response_format"),
        (
            with(r#""continue_final_message":true"#),
            "continue_final_message",
        ),
    ];
    for (body, param) in &cases {
        rejected(body, param);
    }
    // Forced choices, once supported, must name an existing tool.
    let opts = ValidationOptions {
        forced_tool_choice_supported: true,
        ..Default::default()
    };
    let body = with(&format!(
        r#""tools":[{tool}],"tool_choice":{{"type":"function","function":{{"name":"nope"}}}}"#
    ));
    assert_eq!(
        chat_with(&body, &opts).unwrap_err().param.as_deref(),
        Some("tool_choice.function.name")
    );
    let body = with(&format!(
        r#""tools":[{tool}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#
    ));
    assert_eq!(
        chat_with(&body, &opts).unwrap().tool_choice,
        ToolChoice::Named("get_weather".into())
    );
    // "auto" with tools needs a configured parser.
    let opts = ValidationOptions {
        tool_parser_enabled: false,
        ..Default::default()
    };
    let err = chat_with(&with(&format!(r#""tools":[{tool}]"#)), &opts).unwrap_err();
    assert!(
        err.message.contains("--tool-call-parser"),
        "{}",
        err.message
    );
    // json_schema without a schema is a 400 even when structured outputs exist.
    let opts = ValidationOptions {
        structured_outputs_supported: true,
        ..Default::default()
    };
    let body = with(r#""response_format":{"type":"json_schema","json_schema":{"name":"x"}}"#);
    assert_eq!(
        chat_with(&body, &opts).unwrap_err().param.as_deref(),
        Some("response_format.json_schema.schema")
    );
    let body = with(
        r#""response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}}"#,
    );
    assert!(matches!(
        chat_with(&body, &opts).unwrap().response_format,
        ResponseFormat::JsonSchema { .. }
    ));
}

#[test]
fn bad_bodies_are_400_without_param() {
    for body in [
        "",
        "nul",
        "[1,2]",
        "\"text\"",
        "42",
        "null",
        "{\"a\":NaN}",
        "{\"temperature\":Infinity}",
        "{\"a\":1e999}",
        "{",
        "\u{0}",
    ] {
        let err = parse_json_body(body.as_bytes()).expect_err(body);
        assert_eq!(err.status(), 400, "{body}");
    }
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert_eq!(
        parse_json_body(format!("{{\"a\":{deep}}}").as_bytes())
            .unwrap_err()
            .status(),
        400
    );
    assert_eq!(parse_json_body(&[0xff, 0xfe]).unwrap_err().status(), 400);
    // A non-object value handed straight to the parser is also a 400.
    assert_eq!(
        parse_chat_request(&json!([1]), &ValidationOptions::default())
            .unwrap_err()
            .status(),
        400
    );
}

#[test]
fn valid_request_is_parsed_with_aliases_and_defaults() {
    let body = r#"{
        "model":"qwen","messages":[
            {"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
            {"role":"assistant","content":null,"reasoning":"thought","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}}]},
            {"role":"tool","content":"42","tool_call_id":"call_1"}],
        "temperature":0.7,"top_p":0.8,"top_k":-1,"min_p":0,"repeat_penalty":1.05,
        "max_tokens":100,"max_completion_tokens":50,"seed":18446744073709551615,
        "stop":"END","ignore_eos":true,"min_tokens":3,"include_stop_str_in_output":true,
        "skip_special_tokens":false,"stream":true,"stream_options":{"include_usage":true},
        "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],
        "tool_choice":"auto","parallel_tool_calls":false,
        "chat_template_kwargs":{"enable_thinking":false},
        "logit_bias":{},"best_of":1,"use_beam_search":false,"n":1,"frequency_penalty":null,
        "some_future_field":{"x":1},"store":false
    }"#;
    let r = chat(body).unwrap();
    assert_eq!(r.model.as_deref(), Some("qwen"));
    assert_eq!(r.messages.len(), 4);
    assert_eq!(
        r.messages[1].content,
        Some(MessageContent::Parts(vec!["a".into(), "b".into()]))
    );
    assert_eq!(r.messages[2].reasoning_content.as_deref(), Some("thought"));
    assert_eq!(r.messages[2].tool_calls[0].arguments, json!({"x":1}));
    let s = &r.sampling;
    assert_eq!(
        (s.temperature, s.top_p, s.top_k, s.min_p),
        (Some(0.7), Some(0.8), Some(0), Some(0.0))
    );
    assert_eq!(s.repetition_penalty, Some(1.05));
    assert_eq!(s.max_tokens, Some(50), "max_completion_tokens wins");
    assert_eq!(s.seed, Some(u64::MAX));
    assert_eq!(s.stop, vec!["END".to_string()]);
    assert!(s.ignore_eos && s.include_stop_str_in_output && !s.skip_special_tokens);
    assert_eq!(s.min_tokens, 3);
    assert_eq!(s.frequency_penalty, None);
    assert!(r.stream && r.include_usage);
    assert_eq!(r.tool_choice, ToolChoice::Auto);
    assert!(!r.parallel_tool_calls);
    assert_eq!(r.enable_thinking, Some(false));
    assert_eq!(r.ignored_keys, vec!["some_future_field".to_string()]);
    let params = s.resolve(&Default::default());
    assert_eq!(params.frequency_penalty, 0.0);
    assert_eq!(params.temperature, 0.7);

    let strict = ValidationOptions {
        strict_params: true,
        ..Default::default()
    };
    assert_eq!(
        chat_with(body, &strict).unwrap_err().param.as_deref(),
        Some("some_future_field")
    );

    let minimal = chat(&format!("{{{MSG}}}")).unwrap();
    assert_eq!(minimal.tool_choice, ToolChoice::None);
    assert!(minimal.sampling.skip_special_tokens && minimal.sampling.max_tokens.is_none());
    // Integral floats are integers (pydantic's lax mode).
    assert_eq!(
        chat(&with(r#""max_tokens":5.0"#))
            .unwrap()
            .sampling
            .max_tokens,
        Some(5)
    );
}

#[test]
fn completion_requests() {
    let opts = ValidationOptions::default();
    let parse = |b: &str| parse_completion_request(&parse_json_body(b.as_bytes())?, &opts);
    assert_eq!(
        parse(r#"{"prompt":"hi"}"#).unwrap().prompt,
        Prompt::Text("hi".into())
    );
    assert_eq!(
        parse(r#"{"prompt":[1,2,3]}"#).unwrap().prompt,
        Prompt::Tokens(vec![1, 2, 3])
    );
    assert_eq!(
        parse(r#"{"prompt":[[4,5]]}"#).unwrap().prompt,
        Prompt::Tokens(vec![4, 5])
    );
    assert_eq!(
        parse(r#"{"prompt":["x"]}"#).unwrap().prompt,
        Prompt::Text("x".into())
    );
    let cases: &[(&str, &str)] = &[
        (r#"{}"#, "prompt"),
        (r#"{"prompt":""}"#, "prompt"),
        (r#"{"prompt":[]}"#, "prompt"),
        (r#"{"prompt":5}"#, "prompt"),
        (r#"{"prompt":["a","b"]}"#, "prompt"),
        (r#"{"prompt":[1,-2]}"#, "prompt[1]"),
        (r#"{"prompt":[1,"a"]}"#, "prompt[1]"),
        (r#"{"prompt":[[1],[2]]}"#, "prompt"),
        (r#"{"prompt":[{}]}"#, "prompt[0]"),
        (r#"{"prompt":"x","logprobs":2}"#, "logprobs"),
        (r#"{"prompt":"x","logprobs":30}"#, "logprobs"),
        (r#"{"prompt":"x","suffix":"y"}"#, "suffix"),
        (r#"{"prompt":"x","max_tokens":-1}"#, "max_tokens"),
        (r#"{"prompt":"x","prompt_logprobs":1}"#, "prompt_logprobs"),
        (r#"{"prompt":"x","temperature":3}"#, "temperature"),
        (r#"{"prompt":"x","n":3}"#, "n"),
    ];
    for (body, param) in cases {
        let err = parse(body).expect_err(body);
        assert_eq!(
            (err.status(), err.param.as_deref()),
            (400, Some(*param)),
            "{body}"
        );
    }
    let with_logprobs = ValidationOptions {
        logprobs_supported: true,
        ..Default::default()
    };
    let r = parse_completion_request(&json!({"prompt":"x","logprobs":3}), &with_logprobs).unwrap();
    assert_eq!(r.sampling.logprobs, Some(3));
}

#[test]
fn tokenize_and_detokenize() {
    let opts = ValidationOptions::default();
    let r =
        parse_tokenize_request(&json!({"prompt":"hi","add_special_tokens":false}), &opts).unwrap();
    assert_eq!(r.add_special_tokens, Some(false));
    assert!(parse_tokenize_request(&json!({"content":"hi"}), &opts).is_ok());
    assert!(
        parse_tokenize_request(&json!({"messages":[{"role":"user","content":"x"}]}), &opts).is_ok()
    );
    assert_eq!(
        parse_tokenize_request(&json!({}), &opts)
            .unwrap_err()
            .param
            .as_deref(),
        Some("prompt")
    );
    assert_eq!(
        parse_tokenize_request(&json!({"prompt":1}), &opts)
            .unwrap_err()
            .param
            .as_deref(),
        Some("prompt")
    );
    assert_eq!(
        parse_tokenize_request(&json!({"messages":[{}]}), &opts)
            .unwrap_err()
            .param
            .as_deref(),
        Some("messages[0].role")
    );
    assert_eq!(
        parse_detokenize_request(&json!({"tokens":[1,2]}))
            .unwrap()
            .tokens,
        vec![1, 2]
    );
    for (body, param) in [
        (json!({}), "tokens"),
        (json!({"tokens":"1"}), "tokens"),
        (json!({"tokens":[1,-1]}), "tokens[1]"),
        (json!({"tokens":[4294967296u64]}), "tokens[0]"),
    ] {
        assert_eq!(
            parse_detokenize_request(&body)
                .unwrap_err()
                .param
                .as_deref(),
            Some(param)
        );
    }
    assert!(check_token_ids(&[0, 9], 10, "tokens").is_ok());
    assert_eq!(
        check_token_ids(&[0, 10], 10, "tokens")
            .unwrap_err()
            .param
            .as_deref(),
        Some("tokens[1]")
    );
}

#[test]
fn context_length_checks() {
    assert_eq!(check_context_length(10, None, 100).unwrap(), 90);
    assert_eq!(check_context_length(10, Some(90), 100).unwrap(), 90);
    let err = check_context_length(10, Some(91), 100).unwrap_err();
    assert_eq!(
        (err.status(), err.param.as_deref()),
        (400, Some("max_tokens"))
    );
    assert!(
        err.message
            .contains("maximum context length is 100 tokens and your request has 10 input tokens")
    );
    let err = check_context_length(100, None, 100).unwrap_err();
    assert_eq!(err.param.as_deref(), Some("messages"));
}

#[test]
fn error_bodies_have_openai_shape() {
    let e = ApiError::model_not_found("gpt-5");
    assert_eq!(e.status(), 404);
    let v: Value = serde_json::from_str(&e.to_json()).unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-5"));
    let v: Value = serde_json::to_value(ApiError::unsupported("best_of").body()).unwrap();
    assert_eq!(v["error"]["message"], "best_of is not supported");
    assert_eq!(v["error"]["type"], "invalid_request_error");
}

#[test]
fn logprobs_and_n_where_the_server_supports_them() {
    let opts = ValidationOptions {
        max_n: 16,
        logprobs_supported: true,
        ..Default::default()
    };
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut body = json!({"messages": msgs});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        parse_chat_request(&body, &opts)
    };
    let r = chat(json!({"logprobs": true, "top_logprobs": 5, "n": 4})).unwrap();
    assert_eq!((r.sampling.logprobs, r.n), (Some(5), 4));
    let r = chat(json!({"logprobs": true})).unwrap();
    assert_eq!((r.sampling.logprobs, r.n), (Some(0), 1));
    let r = chat(json!({"logprobs": false, "n": 16})).unwrap();
    assert_eq!((r.sampling.logprobs, r.n), (None, 16));
    for (extra, param) in [
        (json!({"n": 17}), "n"),
        (json!({"n": 0}), "n"),
        (json!({"top_logprobs": 3}), "top_logprobs"),
        (
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
    ] {
        let err = chat(extra.clone()).expect_err(&extra.to_string());
        assert_eq!(err.param.as_deref(), Some(param), "{extra}");
    }
    let r =
        parse_completion_request(&json!({"prompt": "x", "logprobs": 0, "n": 3}), &opts).unwrap();
    assert_eq!((r.sampling.logprobs, r.n), (Some(0), 3));
    let r = parse_completion_request(
        &json!({"prompt": "x", "logprobs": 2, "echo": true, "max_tokens": 0}),
        &opts,
    )
    .unwrap();
    assert!(r.echo);
    assert_eq!(r.sampling.max_tokens, Some(0));
    for (extra, param) in [
        (json!({"prompt_logprobs": 21}), "prompt_logprobs"),
        (json!({"prompt_logprobs": -1}), "prompt_logprobs"),
        (json!({"prompt_logprobs": 1.5}), "prompt_logprobs"),
    ] {
        let mut body = extra.clone();
        body["prompt"] = json!("x");
        let err = parse_completion_request(&body, &opts).expect_err(&extra.to_string());
        assert_eq!(err.param.as_deref(), Some(param), "{extra}");
        let err = chat(extra.clone()).expect_err(&extra.to_string());
        assert_eq!(err.param.as_deref(), Some(param), "{extra}");
    }
    let r =
        parse_completion_request(&json!({"prompt": "x", "prompt_logprobs": 20}), &opts).unwrap();
    assert_eq!(r.sampling.prompt_logprobs, Some(20));
}

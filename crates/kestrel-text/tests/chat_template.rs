mod common;

use common::{qwen_dir, qwen_model_dir, read_json, testdata};
use kestrel_text::{ChatTemplate, TemplateError};
use serde_json::{Map, Value, json};

fn qwen_template() -> ChatTemplate {
    ChatTemplate::from_model_dir(qwen_dir())
        .expect("load")
        .expect("the Qwen folder has a template")
}

fn render_simple(template: &ChatTemplate, messages: Value) -> Result<String, TemplateError> {
    template.render(messages.as_array().unwrap(), None, true, &Map::new())
}

#[test]
fn renders_like_transformers_for_every_case() {
    let template = qwen_template();
    let doc = read_json(&testdata().join("chat_template/qwen3_6_cases.json"));
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let messages = case["messages"].as_array().unwrap();
        let tools = case["tools"].as_array().map(Vec::as_slice);
        let add_generation_prompt = case["add_generation_prompt"].as_bool().unwrap();
        let kwargs = case["kwargs"].as_object().unwrap();
        let result = template.render(messages, tools, add_generation_prompt, kwargs);
        match (result, case.get("expected"), case.get("expected_error")) {
            (Ok(text), Some(Value::String(expected)), _) if &text == expected => {}
            (Ok(text), Some(Value::String(expected)), _) => {
                let at = text
                    .bytes()
                    .zip(expected.bytes())
                    .take_while(|(a, b)| a == b)
                    .count();
                failures.push(format!(
                    "{name}: differs at byte {at}\n  kestrel:      {:?}\n  transformers: {:?}",
                    &text[at.saturating_sub(40).min(text.len())..(at + 60).min(text.len())],
                    &expected
                        [at.saturating_sub(40).min(expected.len())..(at + 60).min(expected.len())],
                ));
            }
            (Err(TemplateError::Raised(msg)), None, Some(Value::String(expected)))
                if &msg == expected => {}
            (other, _, _) => failures.push(format!("{name}: unexpected result {other:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases fail:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn jinja_file_takes_precedence_and_named_templates_are_picked() {
    let dir = qwen_model_dir();
    std::fs::write(
        dir.path().join("chat_template.jinja"),
        "FILE {{ messages[0].content }}",
    )
    .unwrap();
    let template = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
    assert_eq!(
        render_simple(&template, json!([{"role": "user", "content": "x"}])).unwrap(),
        "FILE x"
    );

    let named = tempfile::tempdir().unwrap();
    let config = json!({
        "eos_token": {"content": "<eos>"},
        "chat_template": [
            {"name": "default", "template": "D {{ eos_token }}"},
            {"name": "tool_use", "template": "T {{ tools | length }}"}
        ]
    });
    std::fs::write(
        named.path().join("tokenizer_config.json"),
        config.to_string(),
    )
    .unwrap();
    let template = ChatTemplate::from_model_dir(named.path()).unwrap().unwrap();
    let msgs = [json!({"role": "user", "content": "x"})];
    assert_eq!(
        template.render(&msgs, None, false, &Map::new()).unwrap(),
        "D <eos>"
    );
    let tools = [json!({"type": "function"})];
    assert_eq!(
        template
            .render(&msgs, Some(&tools), false, &Map::new())
            .unwrap(),
        "T 1"
    );

    let none = tempfile::tempdir().unwrap();
    std::fs::write(none.path().join("tokenizer_config.json"), "{}").unwrap();
    assert!(ChatTemplate::from_model_dir(none.path()).unwrap().is_none());
}

#[test]
fn broken_template_sources_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "{% if %}"}"#,
    )
    .unwrap();
    let err = format!(
        "{:#}",
        ChatTemplate::from_model_dir(dir.path()).unwrap_err()
    );
    assert!(
        err.contains("tokenizer_config.json") && err.contains("does not compile"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": "#,
    )
    .unwrap();
    let err = format!(
        "{:#}",
        ChatTemplate::from_model_dir(dir.path()).unwrap_err()
    );
    assert!(err.contains("tokenizer_config.json"), "{err}");

    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"chat_template": 5}"#,
    )
    .unwrap();
    assert!(ChatTemplate::from_model_dir(dir.path()).is_err());
}

#[test]
fn tojson_follows_python_json_dumps() {
    let source = concat!(
        "{{ v | tojson }}|{{ v | tojson(indent=2) }}|{{ v | tojson(sort_keys=true) }}|",
        "{{ v | tojson(separators=(',', ':')) }}|{{ s | tojson }}|{{ s | tojson(ensure_ascii=true) }}|",
        "{{ e | tojson(indent=2) }}|{{ v | tojson(none, 1) }}"
    );
    let template = ChatTemplate::from_source(source, "inline", Map::new()).unwrap();
    let extra: Map<String, Value> = serde_json::from_value(json!({
        "v": {"b": [1, 2.5, {"z": null}], "a": true},
        "s": "<é \"q\" & 😀>\n",
        "e": {"l": [], "m": {}}
    }))
    .unwrap();
    let out = template.render(&[], None, false, &extra).unwrap();
    let expected = [
        r#"{"b": [1, 2.5, {"z": null}], "a": true}"#,
        "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"z\": null\n    }\n  ],\n  \"a\": true\n}",
        r#"{"a": true, "b": [1, 2.5, {"z": null}]}"#,
        r#"{"b":[1,2.5,{"z":null}],"a":true}"#,
        "\"<é \\\"q\\\" & 😀>\\n\"",
        "\"<\\u00e9 \\\"q\\\" & \\ud83d\\ude00>\\n\"",
        "{\n  \"l\": [],\n  \"m\": {}\n}",
        "{\n \"b\": [\n  1,\n  2.5,\n  {\n   \"z\": null\n  }\n ],\n \"a\": true\n}",
    ]
    .join("|");
    assert_eq!(out, expected);
}

#[test]
fn globals_and_python_methods() {
    let source = "{{ strftime_now('%Y') }}|{{ ' a b '.strip() }}|{{ 'x,y'.split(',')[1] }}|\
                  {{ 'abc'.startswith('ab') }}|{{ '\u{1f} t \u{1f}' | trim }}|{% for i in [1,2,3] %}\
                  {% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}";
    let template = ChatTemplate::from_source(source, "inline", Map::new()).unwrap();
    let out = template.render(&[], None, false, &Map::new()).unwrap();
    let year = out.split('|').next().unwrap();
    assert!(year.len() == 4 && year.starts_with("20"), "{out}");
    assert_eq!(&out[4..], "|a b|y|True|t|13");

    let raising =
        ChatTemplate::from_source("{{ raise_exception('nope: ' ~ x) }}", "inline", Map::new())
            .unwrap();
    let extra: Map<String, Value> = serde_json::from_value(json!({"x": 1})).unwrap();
    match raising.render(&[], None, false, &extra) {
        Err(TemplateError::Raised(msg)) => assert_eq!(msg, "nope: 1"),
        other => panic!("expected Raised, got {other:?}"),
    }
    let bad_format =
        ChatTemplate::from_source("{{ strftime_now('%Q') }}", "inline", Map::new()).unwrap();
    assert!(matches!(
        bad_format.render(&[], None, false, &Map::new()),
        Err(TemplateError::Render(_))
    ));
}

#[test]
fn reserved_variables_cannot_be_overridden_and_bad_input_does_not_panic() {
    let template = qwen_template();
    let extra: Map<String, Value> = serde_json::from_value(json!({"messages": []})).unwrap();
    let msgs = [json!({"role": "user", "content": "hi"})];
    assert!(matches!(
        template.render(&msgs, None, true, &extra),
        Err(TemplateError::Render(_))
    ));
    // Hostile shapes: errors, never panics.
    for messages in [
        json!([]),
        json!([{}]),
        json!([123]),
        json!([{"role": "user", "content": 5}]),
    ] {
        let result = render_simple(&template, messages.clone());
        assert!(result.is_err(), "{messages} rendered: {result:?}");
    }
}

#[test]
fn stored_template_file_and_tokenizer_config_agree() {
    let config = read_json(&qwen_dir().join("tokenizer_config.json"));
    let file = std::fs::read_to_string(testdata().join("chat_template/qwen3_6.jinja")).unwrap();
    assert_eq!(config["chat_template"].as_str(), Some(file.as_str()));
    assert_eq!(config["eos_token"], "<|im_end|>");
}

/// Found by fuzzing mutated template sources (tests/fuzz_template.rs): the
/// bundled template with its empty-conversation check edited away, given no
/// messages, reached `messages[::-1]`, and minijinja 2.24 panics on a slice
/// with a negative step of an empty sequence or string (index out of
/// bounds). Such a render fails with an error instead; other slices still
/// render as Python's do.
#[test]
fn slices_the_engine_panics_on_are_render_errors() {
    let render = |source: &str, messages: &[Value]| {
        let template = ChatTemplate::from_source(source, "inline", Map::new()).unwrap();
        template.render(messages, None, false, &Map::new())
    };
    for source in [
        "{% for m in messages[::-1] %}{{ m.role }}{% endfor %}",
        "{{ ''[::-1] }}",
        "{{ [][::-2] | list }}",
        "{{ ''[3::-1] }}",
    ] {
        match render(source, &[]) {
            Err(TemplateError::Render(msg)) => {
                assert!(msg.contains("template engine failed"), "{source}: {msg}")
            }
            other => panic!("{source}: {other:?}"),
        }
    }
    // A stop past the start overflows where overflow checks are on; either
    // way, no panic leaves the renderer.
    let _ = render("{{ [1, 2, 3][0:2:-1] | list }}", &[]);
    let user = json!({"role": "user", "content": "hi"});
    let reversed = "{% for m in messages[::-1] %}{{ m.role }} {% endfor %}{{ 'abc'[::-1] }}";
    let messages = [json!({"role": "system", "content": "s"}), user];
    assert_eq!(render(reversed, &messages).unwrap(), "user system cba");
}

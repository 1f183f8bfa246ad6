//! Hostile structured outputs: huge, deeply nested and invalid JSON
//! schemas, pathological regexes, Lark that does not parse, bad choice
//! lists; on chat completions mostly, and through the Responses
//! `text.format` and the Anthropic forced tool call.

use serde_json::{Value, json};

use super::cases::{Case, Expect, nested_arrays};
use super::common::MODEL;

fn chat(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "chat_template_kwargs": {"enable_thinking": false},
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn with_schema(schema: Value) -> Value {
    chat(json!({"response_format": {"type": "json_schema",
        "json_schema": {"name": "out", "schema": schema}}}))
}

/// An object schema `depth` objects deep (twice that in JSON nesting), as
/// JSON text.
fn nested_schema(depth: usize) -> String {
    format!(
        "{}{{\"type\":\"string\"}}{}",
        r#"{"type":"object","required":["a"],"properties":{"a":"#.repeat(depth),
        "}}".repeat(depth)
    )
}

/// A chat body with `schema` (JSON text) as its json_schema.
fn raw_schema_chat(schema: &str) -> String {
    format!(
        r#"{{"model":"{MODEL}","max_tokens":8,"messages":[{{"role":"user","content":"hi"}}],"response_format":{{"type":"json_schema","json_schema":{{"name":"out","schema":{schema}}}}}}}"#
    )
}

fn many_properties(n: usize) -> Value {
    let properties: serde_json::Map<String, Value> = (0..n)
        .map(|i| (format!("field_{i}"), json!({"type": "integer"})))
        .collect();
    let required: Vec<String> = properties.keys().cloned().collect();
    json!({"type": "object", "properties": properties, "required": required})
}

/// A schema whose only instances are infinite.
fn endless_ref() -> Value {
    json!({
        "$defs": {"node": {"type": "object", "required": ["next"],
            "properties": {"next": {"$ref": "#/$defs/node"}}}},
        "$ref": "#/$defs/node",
    })
}

pub fn cases() -> Vec<Case> {
    use Expect::{Refused, ServedOrRefused};
    let chat_path = "/v1/chat/completions";
    let mut cases = Vec::new();
    let mut add = |body: Value, expect: Expect| cases.push(Case::new(chat_path, body, expect));
    // Invalid schemas.
    for schema in [
        json!({"type": 5}),
        json!({"type": "object", "properties": "x"}),
        json!({"type": "object", "required": "a"}),
        json!({"$ref": "#/$defs/missing"}),
        json!({"$ref": "https://example.com/schema.json"}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!({"type": "string", "minLength": 5, "maxLength": 2}),
        json!({"type": "array", "minItems": 3, "maxItems": 1}),
        json!({"enum": []}),
        json!({"allOf": [{"type": "string"}, {"type": "integer"}]}),
    ] {
        add(with_schema(schema), Refused("does not compile"));
    }
    for (format, says) in [
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}),
            "schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "text"}}),
            "schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": "x"}),
            "json_schema",
        ),
        (json!({"type": "bogus"}), "response_format"),
        (json!({"type": 5}), "response_format"),
    ] {
        add(chat(json!({"response_format": format})), Refused(says));
    }
    // vLLM's fields with wrong types or values.
    let deep_text = nested_arrays(10_000, "1");
    for (extra, says) in [
        (json!({"guided_json": deep_text}), "guided_json"),
        (json!({"guided_json": "{not json"}), "guided_json"),
        (json!({"guided_json": 5}), "guided_json"),
        (json!({"guided_regex": 5}), "guided_regex"),
        (json!({"guided_regex": ""}), "guided_regex"),
        (json!({"guided_regex": "(?<=a)b"}), "does not compile"),
        (json!({"guided_regex": "(a)\\1"}), "does not compile"),
        (json!({"guided_regex": "[z-a]"}), "does not compile"),
        (json!({"guided_regex": "a{5,2}"}), "does not compile"),
        (json!({"guided_grammar": 5}), "guided_grammar"),
        (
            json!({"guided_grammar": "start: /unclosed"}),
            "does not compile",
        ),
        (
            json!({"guided_grammar": "start: x\nx: start"}),
            "does not compile",
        ),
        (
            json!({"guided_grammar": "no rules at all"}),
            "does not compile",
        ),
        (json!({"guided_choice": []}), "guided_choice"),
        (json!({"guided_choice": [1, 2]}), "guided_choice"),
        (json!({"guided_choice": ["a", null]}), "guided_choice"),
        (json!({"guided_choice": "a"}), "guided_choice"),
        (json!({"guided_choice": {}}), "guided_choice"),
        (json!({"structured_outputs": "x"}), "structured_outputs"),
        (json!({"structured_outputs": {}}), "structured_outputs"),
        (
            json!({"structured_outputs": {"regex": 5}}),
            "structured_outputs.regex",
        ),
        (
            json!({"guided_regex": "a", "guided_choice": ["b"]}),
            "only one",
        ),
    ] {
        add(chat(extra), Refused(says));
    }
    // Legal but costly: each is served, or refused, within the bound.
    for schema in [
        many_properties(3000),
        json!({"enum": (0..20_000).map(|i| format!("v{i}")).collect::<Vec<_>>()}),
        endless_ref(),
        json!({"type": "string", "minLength": 100_000_000}),
        json!({"type": "array", "minItems": 100_000_000, "items": {"type": "integer"}}),
        json!({"type": "string", "pattern": "^(a+)+$"}),
        json!({"type": "string", "format": "no-such-format"}),
    ] {
        add(with_schema(schema), ServedOrRefused);
    }
    for regex in [
        "(a+)+$",
        "(a|aa)*c",
        "(.*a){20}",
        "a{100000}{100000}",
        "(((a{1000}){1000}){1000})",
        "[a-z]{0,4294967295}",
        "(x+x+)+y",
    ] {
        add(chat(json!({"guided_regex": regex})), ServedOrRefused);
    }
    let many_rules: String = (0..3000)
        .map(|i| format!("r{i}: \"t{i}\" | r{}\n", i + 1))
        .chain(["r3000: \"end\"\nstart: r0\n".to_string()])
        .collect();
    for grammar in [
        // An empty rule and an empty alternative match the empty string.
        "start: ".to_string(),
        "start: \"a\" |".to_string(),
        "start: x\nx: \"(\" x \")\" | \"a\"".to_string(),
        many_rules,
    ] {
        add(chat(json!({"guided_grammar": grammar})), ServedOrRefused);
    }
    // Rule chains: the Lark compiler recurses along them. The longest
    // chain the size limit lets through, and a grammar past the limit.
    let chain = |rules: usize| -> String {
        (0..rules)
            .map(|i| format!("r{i}: r{}\n", i + 1))
            .chain([format!("r{rules}: \"end\"\nstart: r0\n")])
            .collect()
    };
    let longest = (1..)
        .take_while(|&n| chain(n).len() <= 128 << 10)
        .last()
        .unwrap();
    add(
        chat(json!({"guided_grammar": chain(longest)})),
        ServedOrRefused,
    );
    add(
        chat(json!({"guided_grammar": chain(longest + 1)})),
        Refused("at most"),
    );
    // The same for a chain of schema references.
    let defs: serde_json::Map<String, Value> = (0..5000)
        .map(|i| {
            (
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            )
        })
        .chain([("d5000".to_string(), json!({"type": "integer"}))])
        .collect();
    add(
        with_schema(json!({"$defs": defs, "$ref": "#/$defs/d0"})),
        ServedOrRefused,
    );
    let many_choices: Vec<String> = (0..20_000).map(|i| format!("choice {i}")).collect();
    add(
        chat(json!({"guided_choice": many_choices})),
        ServedOrRefused,
    );
    // Nesting past the JSON parser's limit, and just inside it.
    cases.push(Case {
        path: chat_path,
        body: raw_schema_chat(&nested_schema(10_000)),
        expect: Refused("recursion limit"),
    });
    cases.push(Case {
        path: chat_path,
        body: raw_schema_chat(&nested_schema(60)),
        expect: ServedOrRefused,
    });
    // The same on the other routes, in their shapes.
    for regex in ["(a+)+$", "(?<=a)b"] {
        let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 8, "guided_regex": regex});
        cases.push(Case::new("/v1/completions", body, ServedOrRefused));
    }
    let text_format = |schema: Value| {
        json!({"model": MODEL, "input": "hi", "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}}})
    };
    cases.push(Case::new(
        "/v1/responses",
        text_format(json!({"type": 5})),
        Refused("does not compile"),
    ));
    cases.push(Case::new(
        "/v1/responses",
        text_format(many_properties(3000)),
        ServedOrRefused,
    ));
    let forced_tool = |schema: Value| {
        json!({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": schema}], "tool_choice": {"type": "any"}})
    };
    cases.push(Case::new(
        "/v1/messages",
        forced_tool(json!({"type": "object", "properties": {"a": {"type": 5}}})),
        Refused("does not compile"),
    ));
    cases.push(Case::new(
        "/v1/messages",
        forced_tool(many_properties(3000)),
        ServedOrRefused,
    ));
    cases
}

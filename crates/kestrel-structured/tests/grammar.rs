//! Grammars compiled against the bundled model's vocabulary, driven with
//! the tokens the model's tokenizer gives for valid and invalid outputs.

use kestrel_api::{StructuredOutput, Tool};
use kestrel_engine::Constraint;
use kestrel_structured::grammar::GrammarStart;
use kestrel_structured::{CompileError, GrammarCompiler, OutputGrammar, ToolCallFormat};
use kestrel_text::Tokenizer;
use serde_json::{Value, json};

fn model_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35")
}

fn setup() -> (Tokenizer, GrammarCompiler) {
    let tokenizer = Tokenizer::from_model_dir(model_dir()).unwrap();
    let compiler = GrammarCompiler::from_tokenizer_file(
        model_dir().join("tokenizer.json"),
        tokenizer.eos_token_ids(),
    );
    (tokenizer, compiler)
}

fn compile(c: &GrammarCompiler, output: StructuredOutput) -> Result<Constraint, CompileError> {
    c.compile(&OutputGrammar::Structured(&output), GrammarStart::default())
}

/// Feeds `text`'s tokens one by one, each checked against the mask first;
/// returns whether all were allowed and whether the grammar completed.
fn drive(t: &Tokenizer, mut constraint: Constraint, text: &str) -> (bool, bool) {
    let ids = t.encode(text, false).unwrap();
    for &id in &ids {
        let mut row = vec![0.0f32; t.vocab_size()];
        constraint.0.mask(&mut row).unwrap();
        if row[id as usize] == f32::NEG_INFINITY {
            return (false, false);
        }
        constraint.0.accept(id).unwrap();
    }
    (true, constraint.0.is_complete())
}

#[test]
fn a_json_schema_allows_conforming_output_and_completes_on_it() {
    let (t, c) = setup();
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["name", "n"],
        "additionalProperties": false,
    });
    let good = compile(&c, StructuredOutput::JsonSchema(schema.clone())).unwrap();
    assert_eq!(drive(&t, good, r#"{"name": "x", "n": 3}"#), (true, true));
    let bad = compile(&c, StructuredOutput::JsonSchema(schema)).unwrap();
    assert!(!drive(&t, bad, r#"{"name": 3}"#).0);
}

#[test]
fn a_regex_and_a_choice_allow_only_their_strings() {
    let (t, c) = setup();
    let rx = || compile(&c, StructuredOutput::Regex("[0-9]{3}-[a-z]+".into())).unwrap();
    assert!(drive(&t, rx(), "123-abc").0);
    assert!(!drive(&t, rx(), "12a").0);
    let choice = || {
        compile(
            &c,
            StructuredOutput::Choice(vec!["yes".into(), "no".into()]),
        )
        .unwrap()
    };
    assert_eq!(drive(&t, choice(), "yes"), (true, true));
    assert!(!drive(&t, choice(), "maybe").0);
}

#[test]
fn bad_schemas_regexes_and_grammars_are_invalid_with_a_reason() {
    let (_, c) = setup();
    let cases = [
        StructuredOutput::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 2})),
        StructuredOutput::JsonSchema(json!({"type": "frobnicate"})),
        StructuredOutput::Regex("(unclosed".into()),
        StructuredOutput::Lark("start: missing_rule".into()),
    ];
    for case in cases {
        match compile(&c, case.clone()) {
            Err(CompileError::Invalid(reason)) => assert!(!reason.is_empty(), "{case:?}"),
            Err(other) => panic!("{case:?}: {other}"),
            Ok(_) => panic!("{case:?} compiled"),
        }
    }
}

#[test]
fn after_reasoning_the_constraint_starts_at_the_think_end() {
    let (t, c) = setup();
    let end = t.token_id("</think>").unwrap();
    let output = StructuredOutput::JsonObject;
    let start = GrammarStart {
        reasoning_end: Some(end),
    };
    let constraint = || {
        c.compile(&OutputGrammar::Structured(&output), start)
            .unwrap()
    };
    let text = "Let me think: not JSON at all.\n</think>\n\n{\"a\": 1}";
    assert_eq!(drive(&t, constraint(), text), (true, true));
    assert!(!drive(&t, constraint(), "thinking</think>\n\nnot json").0);
}

fn tool(name: &str, parameters: Value) -> Tool {
    Tool {
        name: name.into(),
        description: None,
        parameters: parameters.clone(),
        raw: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
    }
}

#[test]
fn a_forced_tool_call_names_a_declared_tool_with_valid_arguments() {
    let (t, c) = setup();
    let tools = [
        tool(
            "get_weather",
            json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
        ),
        tool("ping", json!({})),
    ];
    let call = || {
        c.compile(
            &OutputGrammar::ToolCall {
                tools: &tools,
                parallel: false,
                format: ToolCallFormat::Json,
            },
            GrammarStart::default(),
        )
        .unwrap()
    };
    let good = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    assert_eq!(drive(&t, call(), good), (true, true));
    let invented = "<tool_call>\n{\"name\": \"search\"";
    assert!(!drive(&t, call(), invented).0);
    let missing = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}";
    assert!(!drive(&t, call(), missing).0);
}

#[test]
fn drafts_are_valid_up_to_the_first_rejected_token() {
    let (t, c) = setup();
    let mut constraint = compile(&c, StructuredOutput::Choice(vec!["hello world".into()])).unwrap();
    let mut ids = t.encode("hello world", false).unwrap();
    let valid = ids.len();
    ids.extend(t.encode("!!", false).unwrap());
    assert_eq!(constraint.0.valid_prefix(&ids), valid);
    // Validating does not advance the grammar.
    assert_eq!(constraint.0.valid_prefix(&ids), valid);
}

#[test]
fn a_panic_inside_llguidance_is_a_reason_without_a_backtrace() {
    let (_, c) = setup();
    // llguidance 1.9 overflows negating this bound.
    let schema = json!({"type": "integer", "minimum": i64::MIN, "maximum": 3});
    match compile(&c, StructuredOutput::JsonSchema(schema)) {
        Err(CompileError::Invalid(reason)) => {
            assert!(!reason.contains("backtrace"), "{reason}");
            assert!(!reason.is_empty());
        }
        // A later llguidance that compiles it is fine too.
        Ok(_) => {}
        Err(other) => panic!("{other}"),
    }
}

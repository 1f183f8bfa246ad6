//! Forced tool calls in the XML format (Qwen3.5/3.6), compiled against the
//! bundled model's vocabulary: the matcher allows calls to declared tools
//! with their own parameters and valid values, and rejects the rest; and
//! whatever it lets a sampler write parses back, through the real tool
//! parser, into a declared tool with arguments valid against its schema.

#[path = "../../kestrel-server/tests/structured/schema_check.rs"]
mod schema_check;

use kestrel_api::Tool;
use kestrel_api::tools::parse_complete;
use kestrel_engine::Constraint;
use kestrel_structured::grammar::GrammarStart;
use kestrel_structured::{GrammarCompiler, OutputGrammar, ToolCallFormat};
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

fn tool(name: &str, parameters: Value) -> Tool {
    Tool {
        name: name.into(),
        description: None,
        parameters: parameters.clone(),
        raw: json!({"type": "function", "function": {"name": name, "parameters": parameters}}),
    }
}

fn tools() -> Vec<Tool> {
    let digit = json!({"type": "integer", "minimum": 0, "maximum": 9});
    vec![
        tool(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            }, "required": ["city", "unit"], "additionalProperties": false}),
        ),
        tool(
            "add",
            json!({"type": "object", "properties": {"a": digit, "b": digit},
                "required": ["a", "b"], "additionalProperties": false}),
        ),
        tool(
            "note",
            json!({"type": "object", "properties": {
                "text": {"type": "string", "minLength": 1},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
                "meta": {"type": "object"},
                "maybe": {"anyOf": [{"type": "string", "maxLength": 5}, {"type": "null"}]},
                "flag": {"type": "boolean"},
            }, "required": ["text"]}),
        ),
        tool("ping", json!({})),
    ]
}

fn compile(c: &GrammarCompiler, tools: &[Tool], parallel: bool) -> Constraint {
    c.compile(
        &OutputGrammar::ToolCall {
            tools,
            parallel,
            format: ToolCallFormat::Xml,
        },
        GrammarStart::default(),
    )
    .unwrap()
}

/// Feeds `text`'s tokens, each checked against the mask first: whether all
/// were allowed, and whether the output may then end (EOS allowed).
fn drive(t: &Tokenizer, mut constraint: Constraint, text: &str) -> (bool, bool) {
    let mask = |c: &mut Constraint| {
        let mut row = vec![0.0f32; t.vocab_size()];
        c.0.mask(&mut row).unwrap();
        row
    };
    for id in t.encode(text, false).unwrap() {
        if mask(&mut constraint)[id as usize] == f32::NEG_INFINITY {
            return (false, false);
        }
        constraint.0.accept(id).unwrap();
    }
    let eos = t.eos_token_ids()[0] as usize;
    (true, mask(&mut constraint)[eos] != f32::NEG_INFINITY)
}

fn call(name: &str, params: &[(&str, &str)]) -> String {
    let params: String = params
        .iter()
        .map(|(p, v)| format!("<parameter={p}>\n{v}\n</parameter>\n"))
        .collect();
    format!("<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>")
}

#[test]
fn valid_xml_calls_are_allowed_and_complete() {
    let (t, c) = setup();
    let tools = tools();
    let good = [
        call("get_weather", &[("city", "Oslo"), ("unit", "celsius")]),
        call(
            "get_weather",
            &[("city", "New York"), ("unit", "fahrenheit"), ("days", "3")],
        ),
        call("add", &[("a", "1"), ("b", "9")]),
        call(
            "note",
            &[
                ("text", "line 1\n<b>bold</b> & </function>\nline 3"),
                ("tags", "[\"a\", \"b\"]"),
                ("meta", "{\"k\": [1, null]}"),
                ("maybe", "null"),
                ("flag", "true"),
            ],
        ),
        call("note", &[("text", "x"), ("maybe", "hi")]),
        call("ping", &[]),
    ];
    for text in &good {
        assert_eq!(
            drive(&t, compile(&c, &tools, false), text),
            (true, true),
            "{text}"
        );
        // What the grammar allowed parses back into valid arguments.
        let parsed = parse_complete(text, &tools, false);
        assert_eq!(parsed.tool_calls.len(), 1, "{text}");
        assert_valid(&parsed.tool_calls[0].function, &tools);
    }
    let two = format!("{}\n{}", good[2], good[5]);
    assert_eq!(drive(&t, compile(&c, &tools, true), &two), (true, true));
    assert!(!drive(&t, compile(&c, &tools, false), &two).0);
}

/// JSON values take the response formats' fixed layout: a weak model
/// offered free whitespace inside one wrote blank space until its token
/// budget ran out.
#[test]
fn json_values_have_one_layout() {
    let (t, c) = setup();
    let tools = tools();
    let meta = |v: &str| call("note", &[("text", "x"), ("meta", v)]);
    let allowed = |text: &str| drive(&t, compile(&c, &tools, false), text).0;
    assert!(allowed(&meta("{\"k\": [1, null], \"j\": {}}")));
    assert!(!allowed(&meta("{\"k\": [1,  null]}")));
    assert!(!allowed(&meta("{\"k\":\n [1, null]}")));
    assert!(!allowed(&meta("{ \"k\": 1}")));
}

#[test]
fn wrong_names_parameters_and_values_are_rejected() {
    let (t, c) = setup();
    let tools = tools();
    let bad = [
        // Not a declared tool.
        "<tool_call>\n<function=search>".to_string(),
        // The JSON format.
        "<tool_call>\n{\"name\": \"add\"".into(),
        // Not one of the tool's properties.
        "<tool_call>\n<function=add>\n<parameter=c>".into(),
        // A required parameter missing.
        call("add", &[("a", "1")]),
        call("get_weather", &[("unit", "celsius")]),
        // Values outside their schemas.
        call("add", &[("a", "12"), ("b", "1")]),
        call("add", &[("a", "one"), ("b", "1")]),
        call("get_weather", &[("city", "Oslo"), ("unit", "kelvin")]),
        call(
            "get_weather",
            &[("city", "Llanfairpwllgwyngyll"), ("unit", "celsius")],
        ),
        call("note", &[("text", "x"), ("flag", "yes")]),
        call("note", &[("text", "x"), ("tags", "[\"toolongtag\"]")]),
        // A string-or-null value that would read as null without being "null".
        call("note", &[("text", "x"), ("maybe", "None")]),
        call("note", &[("text", "")]),
        // Text after the value's closing tag.
        "<tool_call>\n<function=note>\n<parameter=text>\na</parameter>b".into(),
        // A repeated parameter.
        call("add", &[("a", "1"), ("a", "2"), ("b", "3")]),
    ];
    for text in &bad {
        let (allowed, complete) = drive(&t, compile(&c, &tools, false), text);
        assert!(!(allowed && complete), "{text:?} was allowed");
    }
}

#[test]
fn tools_the_format_cannot_name_are_left_out() {
    let (t, c) = setup();
    let tools = [
        tool("bad>name", json!({})),
        tool(
            "odd",
            json!({"properties": {"a b>": {"type": "string"}, "x": {"type": "integer"}}}),
        ),
    ];
    let constraint = compile(&c, &tools, false);
    assert_eq!(
        drive(&t, constraint, &call("odd", &[("x", "5")])),
        (true, true)
    );
    assert!(!drive(&t, compile(&c, &tools, false), "<tool_call>\n<function=bad").0);
    let none = [tool("a<b", json!({}))];
    let Err(err) = c.compile(
        &OutputGrammar::ToolCall {
            tools: &none,
            parallel: false,
            format: ToolCallFormat::Xml,
        },
        GrammarStart::default(),
    ) else {
        panic!("no callable tool must be an error");
    };
    assert!(err.to_string().contains("XML"), "{err}");
}

fn assert_valid(call: &kestrel_api::types::FunctionCall, tools: &[Tool]) {
    let tool = tools
        .iter()
        .find(|t| t.name == call.name)
        .unwrap_or_else(|| panic!("{} is not a declared tool", call.name));
    let args: Value = serde_json::from_str(&call.arguments).unwrap();
    let mut schema = tool.parameters.clone();
    if schema.as_object().is_some_and(|m| m.is_empty()) {
        schema = json!({"type": "object"});
    }
    if let Err(e) = schema_check::check(&args, &schema) {
        panic!("{}({}) is not valid: {e}", call.name, call.arguments);
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

#[test]
fn whatever_the_grammar_lets_a_sampler_write_parses_into_valid_arguments() {
    let (t, c) = setup();
    let tools = tools();
    let eos = t.eos_token_ids().to_vec();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut completed = 0;
    for _ in 0..60 {
        let mut constraint = compile(&c, &tools, true);
        let mut ids = Vec::new();
        let mut ended = false;
        while ids.len() < 400 && !ended {
            let words = constraint.0.allowed(t.vocab_size()).unwrap();
            let allowed: Vec<u32> = (0..t.vocab_size() as u32)
                .filter(|&i| words[i as usize / 32] >> (i % 32) & 1 == 1)
                .collect();
            assert!(
                !allowed.is_empty(),
                "a dead end after {:?}",
                t.decode(&ids, false)
            );
            if allowed.iter().all(|i| eos.contains(i)) {
                ended = true;
                break;
            }
            // Lean towards tags, so that open values end within the budget.
            let tags: Vec<u32> = allowed
                .iter()
                .copied()
                .filter(|&i| !eos.contains(&i))
                .filter(|&i| {
                    t.token_bytes(i)
                        .is_some_and(|b| b.first().is_some_and(|c| b"\n<\"]}".contains(c)))
                })
                .collect();
            let pool = if !tags.is_empty() && rng.below(2) == 0 {
                &tags
            } else {
                &allowed
            };
            let id = pool[rng.below(pool.len())];
            if eos.contains(&id) {
                ended = true;
                break;
            }
            constraint.0.accept(id).unwrap();
            ids.push(id);
        }
        if !ended {
            continue;
        }
        completed += 1;
        let text = t.decode(&ids, false).unwrap();
        let parsed = parse_complete(&text, &tools, true);
        assert!(!parsed.tool_calls.is_empty(), "{text:?}");
        assert_eq!(parsed.content, None, "{text:?}");
        for call in &parsed.tool_calls {
            assert_valid(&call.function, &tools);
        }
    }
    assert!(completed >= 20, "only {completed} samples completed");
}

#[test]
fn string_patterns_hold_for_raw_values() {
    let (t, c) = setup();
    let tools = [tool(
        "code",
        json!({"properties": {
            "whole": {"type": "string", "pattern": "^[0-9]{3}$"},
            "part": {"type": "string", "pattern": "ab"},
        }, "required": ["whole", "part"]}),
    )];
    let ok = call("code", &[("whole", "123"), ("part", "xxabyy")]);
    assert_eq!(drive(&t, compile(&c, &tools, false), &ok), (true, true));
    for bad in [
        call("code", &[("whole", "12a"), ("part", "ab")]),
        call("code", &[("whole", "1234"), ("part", "ab")]),
        call("code", &[("whole", "123"), ("part", "ba")]),
    ] {
        let (allowed, complete) = drive(&t, compile(&c, &tools, false), &bad);
        assert!(!(allowed && complete), "{bad:?} was allowed");
    }
}

/// A raw string value with a length bound is the product of the bound,
/// the closing tag and the excluded `</tool_call>`: its first masks over
/// a whole vocabulary took more than llguidance's default lexer budget,
/// and the request failed ("too many expressions constructed") as soon as
/// the value opened.
#[test]
fn a_length_bounded_raw_value_stays_within_the_lexer_budget() {
    let (t, c) = setup();
    let tools = [tool(
        "read_file",
        json!({"type": "object", "properties": {
            "path": {"type": "string", "maxLength": 40},
            "offset": {"type": "integer", "minimum": 0, "maximum": 10000}},
            "required": ["path"], "additionalProperties": false}),
    )];
    let eos = t.eos_token_ids().to_vec();
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut completed = 0;
    for _ in 0..8 {
        let mut constraint = compile(&c, &tools, false);
        let mut ids = Vec::new();
        while ids.len() < 200 {
            let words = constraint
                .0
                .allowed(t.vocab_size())
                .unwrap_or_else(|e| panic!("after {:?}: {e}", t.decode(&ids, false)));
            let allowed: Vec<u32> = (0..t.vocab_size() as u32)
                .filter(|&i| words[i as usize / 32] >> (i % 32) & 1 == 1)
                .collect();
            let id = allowed[rng.below(allowed.len())];
            if eos.contains(&id) {
                completed += 1;
                let text = t.decode(&ids, false).unwrap();
                let parsed = parse_complete(&text, &tools, false);
                assert_eq!(parsed.tool_calls.len(), 1, "{text:?}");
                assert_valid(&parsed.tool_calls[0].function, &tools);
                break;
            }
            constraint.0.accept(id).unwrap();
            ids.push(id);
        }
    }
    assert!(completed >= 4, "only {completed} of 8 samples completed");
}

//! Seeded fuzzing of the chat-template renderer: the bundled model's
//! template and the Qwen3.6 one (`testdata/tokenizer/qwen3_6`) given random
//! conversations (the transformers-rendered cases of
//! `testdata/chat_template/qwen3_6_cases.json`, mutated, and conversations
//! built from scratch: every role, content as text or parts, tool calls with
//! arguments as objects or strings, reasoning, odd unicode, huge and empty
//! strings, missing fields, wrong types), random tools and kwargs; mutated
//! template sources that call the Python-compatible filters and methods with
//! odd arguments; and the `tojson` filter, the `strip` family and value
//! printing on their own, against what Python does.
//!
//! A render may fail (an error is the answer for a bad conversation), never
//! panic, and the same input renders the same twice and on a second load of
//! the template.
//!
//! `KESTREL_FUZZ_ITERS` sets the iterations per target (default 300, for
//! `cargo test`); `KESTREL_FUZZ_SEED` the seed. Runs are deterministic for a
//! seed, so a failure names the iteration that reproduces it.

mod common;

use std::path::{Path, PathBuf};

use common::{qwen_dir, read_json, testdata};
use kestrel_text::{ChatTemplate, TemplateError};
use serde_json::{Map, Value, json};

#[path = "../../kestrel-api/tests/support/fuzz_harness.rs"]
mod fuzz_harness;

use fuzz_harness::{Rng, fuzz};

fn bundled_model_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35")
}

/// The templates under test, each loaded twice: a second load must render
/// the same (no state kept between renders or shared between loads).
fn templates() -> Vec<(&'static str, ChatTemplate, ChatTemplate)> {
    let load = |dir: &Path| {
        ChatTemplate::from_model_dir(dir)
            .unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()))
            .unwrap_or_else(|| panic!("{} has no chat template", dir.display()))
    };
    vec![
        (
            "bundled",
            load(&bundled_model_dir()),
            load(&bundled_model_dir()),
        ),
        ("qwen3_6", load(&qwen_dir()), load(&qwen_dir())),
    ]
}

/// One conversation as `ChatTemplate::render` takes it.
#[derive(Clone, Debug)]
struct Input {
    messages: Vec<Value>,
    tools: Option<Vec<Value>>,
    add_generation_prompt: bool,
    kwargs: Map<String, Value>,
}

impl Input {
    fn render(&self, template: &ChatTemplate) -> Result<String, TemplateError> {
        template.render(
            &self.messages,
            self.tools.as_deref(),
            self.add_generation_prompt,
            &self.kwargs,
        )
    }
}

/// The transformers-rendered cases: valid conversations to mutate.
fn seed_inputs() -> Vec<Input> {
    let doc = read_json(&testdata().join("chat_template/qwen3_6_cases.json"));
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| Input {
            messages: case["messages"].as_array().unwrap().clone(),
            tools: case["tools"].as_array().cloned(),
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        })
        .collect()
}

/// Pieces of message text: the template's own markers, Jinja syntax (which
/// must come out as text), whitespace Python and Rust disagree on, control
/// and multi-byte characters.
const TEXT_PIECES: &[&str] = &[
    "Hello",
    "What is the weather in Paris?",
    " ",
    "\n",
    "\n\n",
    "\t",
    "\r\n",
    "\u{1c}",
    "\u{1f}",
    "\u{a0}",
    "\u{3000}",
    "\u{85}",
    "\u{0}",
    "\u{7f}",
    "\u{2028}",
    "\u{feff}",
    "\u{fffd}",
    "é",
    "日本語",
    "🦀",
    "👩‍👩‍👧",
    "e\u{301}",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<function=get_weather>",
    "<parameter=city>",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "{{ messages }}",
    "{% raw %}",
    "{#",
    "'",
    "\"",
    "\\",
    "{\"a\": 1}",
    "None",
    "True",
];

fn random_text(rng: &mut Rng) -> String {
    if rng.chance(60) {
        // Huge: a long message must render (or fail) like a short one.
        return rng.pick(TEXT_PIECES).repeat(1 + rng.below(20_000));
    }
    (0..rng.below(8))
        .map(|_| *rng.pick(TEXT_PIECES))
        .collect::<Vec<_>>()
        .concat()
}

/// JSON values: every type, extremes, and nesting.
fn random_value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 8 } else { 10 }) {
        0 => Value::Null,
        1 => json!(rng.chance(2)),
        2 => json!(*rng.pick(&[0i64, -1, 7, i64::MIN, i64::MAX])),
        3 => json!(*rng.pick(&[u64::MAX, 1 << 53, (1 << 53) + 1])),
        4 => json!(*rng.pick(&[
            0.0,
            -0.0,
            1.5,
            -2.5e-7,
            0.1,
            1e16,
            1e300,
            -1.7976931348623157e308,
            5e-324,
            123456.789,
            1.0,
        ])),
        5..=7 => json!(random_text(rng)),
        8 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "city", "unit", "a", "", " ", "é", "type", "role", "content", "name", "0", "1",
            ];
            Value::Object(
                (0..rng.below(4))
                    .map(|_| (rng.pick(&keys).to_string(), random_value(rng, depth + 1)))
                    .collect(),
            )
        }
    }
}

fn random_content(rng: &mut Rng) -> Value {
    match rng.below(8) {
        0..=3 => json!(random_text(rng)),
        4 | 5 => {
            let parts: Vec<Value> = (0..rng.below(4))
                .map(|_| match rng.below(4) {
                    0 => json!({"type": "image"}),
                    1 => json!({"type": "image_url", "image_url": {"url": "data:,"}}),
                    2 => random_value(rng, 2),
                    _ => json!({"type": "text", "text": random_text(rng)}),
                })
                .collect();
            json!(parts)
        }
        6 => Value::Null,
        _ => random_value(rng, 1),
    }
}

fn random_tool_call(rng: &mut Rng) -> Value {
    let name = *rng.pick(&["get_weather", "search_files", "", "a b", "<x>", "é"]);
    let arguments = match rng.below(5) {
        0 | 1 => random_value(rng, 3)
            .as_object()
            .cloned()
            .map_or(json!({}), Value::Object),
        2 => json!(random_value(rng, 2).to_string()),
        3 => json!({"city": random_text(rng), "days": random_value(rng, 3)}),
        _ => random_value(rng, 1),
    };
    let function = json!({"name": name, "arguments": arguments});
    match rng.below(4) {
        // The flat form the templates also read.
        0 => function,
        1 => json!({"type": "function", "function": random_value(rng, 2)}),
        _ => json!({"id": "call_1", "type": "function", "function": function}),
    }
}

fn random_message(rng: &mut Rng) -> Value {
    let mut m = Map::new();
    let role = *rng.pick(&[
        "system",
        "user",
        "user",
        "assistant",
        "assistant",
        "tool",
        "developer",
        "",
    ]);
    match rng.below(12) {
        0 => {}
        1 => {
            m.insert("role".into(), random_value(rng, 3));
        }
        _ => {
            m.insert("role".into(), json!(role));
        }
    }
    if !rng.chance(10) {
        m.insert("content".into(), random_content(rng));
    }
    if role == "assistant" {
        if rng.chance(2) {
            let reasoning = if rng.chance(5) {
                random_value(rng, 3)
            } else {
                json!(random_text(rng))
            };
            m.insert("reasoning_content".into(), reasoning);
        }
        if rng.chance(2) {
            let calls = match rng.below(6) {
                0 => random_value(rng, 2),
                _ => Value::Array((0..rng.below(4)).map(|_| random_tool_call(rng)).collect()),
            };
            m.insert("tool_calls".into(), calls);
        }
    }
    if role == "tool" && rng.chance(2) {
        m.insert("tool_call_id".into(), json!("call_1"));
        m.insert("name".into(), json!("get_weather"));
    }
    Value::Object(m)
}

fn random_tools(rng: &mut Rng, seeds: &[Input]) -> Option<Vec<Value>> {
    match rng.below(4) {
        0 => None,
        1 => Some(Vec::new()),
        2 => seeds[rng.below(seeds.len())].tools.clone(),
        _ => Some(
            (0..1 + rng.below(3))
                .map(|_| match rng.below(3) {
                    0 => random_value(rng, 1),
                    1 => json!({"type": "function", "function": {
                        "name": random_text(rng), "description": random_text(rng),
                        "parameters": random_value(rng, 1)}}),
                    _ => json!({"name": "flat", "parameters": {"type": "object"}}),
                })
                .collect(),
        ),
    }
}

/// Template variables a request can set: the thinking switches with values
/// of every type, others the templates ignore, and now and then a reserved
/// name (which must be refused).
fn random_kwargs(rng: &mut Rng) -> Map<String, Value> {
    let mut kwargs = Map::new();
    let values = [
        json!(true),
        json!(false),
        Value::Null,
        json!("false"),
        json!(0),
        json!(1),
        json!([]),
    ];
    for key in ["enable_thinking", "preserve_thinking"] {
        if rng.chance(2) {
            kwargs.insert(key.into(), rng.pick(&values).clone());
        }
    }
    if rng.chance(6) {
        let key = *rng.pick(&["bos_token", "eos_token", "custom", "tools_in_user_message"]);
        kwargs.insert(key.into(), random_value(rng, 2));
    }
    if rng.chance(40) {
        let key = *rng.pick(&["messages", "tools", "documents", "add_generation_prompt"]);
        kwargs.insert(key.into(), json!([]));
    }
    kwargs
}

/// One mutation somewhere in `v`: a value replaced, a key deleted or
/// inserted, an array item dropped or duplicated.
fn mutate(rng: &mut Rng, v: &mut Value, depth: usize) {
    let descend = depth < 6 && !rng.chance(3);
    match v {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(rng.below(map.len()))
                .cloned()
                .unwrap_or_default();
            if descend && let Some(child) = map.get_mut(&key) {
                return mutate(rng, child, depth + 1);
            }
            match rng.below(3) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    map.insert(key, random_value(rng, depth));
                }
                _ => {
                    let keys = [
                        "role",
                        "content",
                        "reasoning_content",
                        "tool_calls",
                        "function",
                        "arguments",
                        "name",
                        "type",
                        "text",
                    ];
                    map.insert(rng.pick(&keys).to_string(), random_value(rng, depth));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.below(items.len());
            if descend {
                return mutate(rng, &mut items[i], depth + 1);
            }
            match rng.below(3) {
                0 => drop(items.remove(i)),
                1 => items[i] = random_value(rng, depth),
                _ => {
                    let copy = items[i].clone();
                    items.insert(i, copy);
                }
            }
        }
        other => *other = random_value(rng, depth),
    }
}

fn random_input(rng: &mut Rng, seeds: &[Input]) -> Input {
    if rng.chance(2) {
        let mut input = seeds[rng.below(seeds.len())].clone();
        let mut messages = Value::Array(input.messages);
        for _ in 0..rng.below(4) {
            mutate(rng, &mut messages, 0);
        }
        input.messages = match messages {
            Value::Array(m) => m,
            other => vec![other],
        };
        if rng.chance(3) {
            let mut tools = Value::Array(input.tools.unwrap_or_default());
            mutate(rng, &mut tools, 0);
            input.tools = tools.as_array().cloned();
        }
        if rng.chance(3) {
            input.kwargs = random_kwargs(rng);
        }
        return input;
    }
    let mut messages: Vec<Value> = (0..rng.below(7)).map(|_| random_message(rng)).collect();
    if rng.chance(20) {
        messages.push(random_value(rng, 2));
    }
    Input {
        messages,
        tools: random_tools(rng, seeds),
        add_generation_prompt: rng.chance(2),
        kwargs: random_kwargs(rng),
    }
}

/// The same rendering, or errors of the same kind and message.
fn same(a: &Result<String, TemplateError>, b: &Result<String, TemplateError>) -> bool {
    match (a, b) {
        (Ok(a), Ok(b)) => a == b,
        (Err(TemplateError::Raised(a)), Err(TemplateError::Raised(b)))
        | (Err(TemplateError::Render(a)), Err(TemplateError::Render(b))) => a == b,
        _ => false,
    }
}

#[test]
fn templates_render_random_conversations_deterministically() {
    let templates = templates();
    let seeds = seed_inputs();
    let (mut rendered, mut refused) = (0u64, 0u64);
    fuzz("template conversations", |rng| {
        let (name, template, second_load) = rng.pick(&templates);
        let input = random_input(rng, &seeds);
        let first = input.render(template);
        let again = input.render(template);
        let other = input.render(second_load);
        assert!(
            same(&first, &again),
            "{name}: {first:?} then {again:?} for {input:?}"
        );
        assert!(
            same(&first, &other),
            "{name}: {first:?}, second load {other:?}, for {input:?}"
        );
        let reserved = ["messages", "tools", "documents", "add_generation_prompt"];
        if reserved.iter().any(|k| input.kwargs.contains_key(*k)) {
            assert!(
                matches!(first, Err(TemplateError::Render(_))),
                "{name}: {input:?}"
            );
        }
        if first.is_ok() {
            rendered += 1
        } else {
            refused += 1
        }
    });
    eprintln!("template conversations: {rendered} rendered, {refused} refused");
}

/// Expressions to call filters and methods on, and their odd arguments.
const OPERANDS: &[&str] = &[
    "messages",
    "messages[0]",
    "messages[0].content",
    "messages[-1].tool_calls",
    "tools",
    "tools[0]",
    "enable_thinking",
    "v",
    "none",
    "undefined_name",
    "1.5",
    "-0.0",
    "1e308",
    "9223372036854775807",
    "'é\\n '",
    "''",
    "[1, 'a', none]",
    "{'b': 1, 'a': [2.5]}",
    "true",
    "loop",
];

/// No argument is a huge number (`v` may be one, so it is only an
/// operand): the engine's own filters that take a size (`indent`, `batch`)
/// allocate it, and an absurd one aborts the process for want of memory,
/// which no error can report. Only a template can pass such a size; kestrel's
/// `tojson` caps its indent.
const ARGUMENTS: &[&str] = &[
    "none",
    "0",
    "2",
    "-1",
    "1024",
    "1.5",
    "true",
    "''",
    "' '",
    "'\\t'",
    "'ab'",
    "'é'",
    "(',', ':')",
    "[',']",
    "('a',)",
    "'role'",
    "messages",
    "'%Y-%m-%d %H'",
    "'%Q'",
    "'%'",
    "'%-d%e'",
    "'%.3f%:z%#z'",
    "'%E'",
];

/// Snippets that call the filters, methods and globals; `X` and `A` are
/// replaced by an operand and an argument.
const SNIPPETS: &[&str] = &[
    "{{ X | tojson }}",
    "{{ X | tojson(indent=A) }}",
    "{{ X | tojson(A, A, A, A) }}",
    "{{ X | tojson(A, A, A, A, A) }}",
    "{{ X | tojson(separators=A) }}",
    "{{ X | tojson(sort_keys=A, ensure_ascii=A) }}",
    "{{ X | tojson(ensure_ascii=A, indent=A) }}",
    "{{ X | tojson(bogus=A) }}",
    "{{ X | tojson(A, indent=A) }}",
    "{{ X | string }}",
    "{{ X }}",
    "{{ X | trim }}",
    "{{ X | trim(A) }}",
    "{{ X.strip(A) }}",
    "{{ X.lstrip() }}",
    "{{ X.rstrip(A, A) }}",
    "{{ X.split(A) }}",
    "{{ X.startswith(A) }}",
    "{{ X.endswith(A) }}",
    "{{ X.replace(A, A) }}",
    "{{ X.upper() }}",
    "{{ X.items() | list }}",
    "{{ X.get(A) }}",
    "{{ X[A] }}",
    "{{ X[A:] }}",
    "{{ X[::A] }}",
    "{{ X | length }}",
    "{{ X | join(A) }}",
    "{{ X | default(A) }}",
    "{{ X | first }}",
    "{{ X | int }}",
    "{{ X | float }}",
    "{{ X | round(A) }}",
    "{{ X | batch(A) | list }}",
    "{{ X | indent(A) }}",
    "{{ X | map(attribute=A) | list }}",
    "{{ X ~ A }}",
    "{{ X + A }}",
    "{{ X in A }}",
    "{{ strftime_now(A) }}",
    "{{ raise_exception(X) }}",
    "{% if X is mapping %}m{% elif X is string %}s{% endif %}",
    "{% for k in X %}{{ loop.index }}{{ k | tojson }}{% endfor %}",
    "{% set ns = namespace(a=X) %}{{ ns.a | tojson(indent=A) }}",
    "{%- ",
    " -%}",
    "{% endif %}",
    "{% endfor %}",
    "}}",
];

fn random_snippet(rng: &mut Rng) -> String {
    let mut s = rng.pick(SNIPPETS).to_string();
    while let Some(p) = s.find('X') {
        let operand = *rng.pick(OPERANDS);
        s.replace_range(p..p + 1, operand);
    }
    while let Some(p) = s.find('A') {
        let argument = *rng.pick(ARGUMENTS);
        s.replace_range(p..p + 1, argument);
    }
    s
}

/// A character boundary of `s`, at random.
fn boundary(rng: &mut Rng, s: &str) -> usize {
    let mut p = rng.below(s.len() + 1);
    while !s.is_char_boundary(p) {
        p -= 1;
    }
    p
}

/// Where a tag or a line ends in `s` (or its start), at random: edits
/// there keep the source compiling more often than anywhere.
fn tag_end(rng: &mut Rng, s: &str) -> usize {
    let ends: Vec<usize> = s.match_indices(['}', '\n']).map(|(p, _)| p + 1).collect();
    if ends.is_empty() { 0 } else { *rng.pick(&ends) }
}

/// One edit of a template source: a range deleted or duplicated, or a
/// snippet inserted.
fn mutate_source(rng: &mut Rng, source: &mut String) {
    let start = if rng.chance(2) {
        tag_end(rng, source)
    } else {
        boundary(rng, source)
    };
    let mut end = (start + 1 + rng.below(40)).min(source.len());
    while !source.is_char_boundary(end) {
        end += 1;
    }
    match rng.below(4) {
        0 => drop(source.drain(start..end)),
        1 => {
            let copy = source[start..end].to_string();
            source.insert_str(end, &copy);
        }
        _ => source.insert_str(start, &random_snippet(rng)),
    }
}

#[test]
fn mutated_template_sources_compile_or_fail_without_panicking() {
    let mut sources = vec![
        std::fs::read_to_string(bundled_model_dir().join("chat_template.jinja")).unwrap(),
        std::fs::read_to_string(testdata().join("chat_template/qwen3_6.jinja")).unwrap(),
    ];
    // Small templates, so that most snippets land where they run.
    sources.push("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}".into());
    sources.push(String::new());
    let seeds = seed_inputs();
    let (mut compiled, mut rendered) = (0u64, 0u64);
    fuzz("template sources", |rng| {
        let mut source = rng.pick(&sources).clone();
        for _ in 0..1 + rng.below(3) {
            mutate_source(rng, &mut source);
        }
        let mut special = Map::new();
        if rng.chance(2) {
            special.insert("eos_token".into(), json!("<|im_end|>"));
        }
        let Ok(template) = ChatTemplate::from_source(&source, "fuzz", special) else {
            return;
        };
        compiled += 1;
        let mut input = random_input(rng, &seeds);
        input.kwargs.insert("v".into(), random_value(rng, 0));
        let first = input.render(&template);
        rendered += u64::from(first.is_ok());
        // strftime_now reads the clock: the one source of difference.
        if !source.contains("strftime_now") {
            let again = input.render(&template);
            assert!(
                same(&first, &again),
                "{first:?} then {again:?}: {source:?} {input:?}"
            );
        }
    });
    eprintln!("template sources: {compiled} compiled, {rendered} rendered");
}

/// `a` and `b` are the same JSON, floats equal to within a few units in the
/// last place (what the JSON parser promises), object keys in `b`'s order.
fn assert_same_json(a: &Value, b: &Value, context: &str) {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            let close = x == y || (x - y).abs() <= 4.0 * f64::EPSILON * x.abs().max(y.abs());
            assert!(close, "{context}: {x:e} came back as {y:e}");
        }
        (Value::Array(x), Value::Array(y)) => {
            assert_eq!(x.len(), y.len(), "{context}");
            x.iter()
                .zip(y)
                .for_each(|(x, y)| assert_same_json(x, y, context));
        }
        (Value::Object(x), Value::Object(y)) => {
            let kx: Vec<&String> = x.keys().collect();
            let ky: Vec<&String> = y.keys().collect();
            assert_eq!(kx, ky, "{context}: keys");
            x.values()
                .zip(y.values())
                .for_each(|(x, y)| assert_same_json(x, y, context));
        }
        _ => assert_eq!(a, b, "{context}"),
    }
}

/// `v` with every object's keys sorted (what `sort_keys` writes).
fn sorted_keys(v: &Value) -> Value {
    match v {
        Value::Array(items) => Value::Array(items.iter().map(sorted_keys).collect()),
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.cmp(b.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k.clone(), sorted_keys(v)))
                    .collect(),
            )
        }
        other => other.clone(),
    }
}

#[test]
fn tojson_output_parses_back_to_its_input() {
    // The options arrive as variables, by keyword or by position; `none`
    // stands for one not given.
    let keyword = ChatTemplate::from_source(
        "{{ v | tojson(ensure_ascii=ea, indent=ind, separators=sep, sort_keys=sk) }}",
        "keyword",
        Map::new(),
    )
    .unwrap();
    let positional = ChatTemplate::from_source(
        "{{ v | tojson(ea, ind, sep, sk) }}",
        "positional",
        Map::new(),
    )
    .unwrap();
    fuzz("tojson", |rng| {
        let v = random_value(rng, 0);
        let mut kwargs = Map::new();
        let ensure_ascii = rng.chance(2);
        kwargs.insert("ea".into(), json!(ensure_ascii));
        // Indents and separators that keep the output JSON: whitespace.
        let indent = rng
            .pick(&[
                Value::Null,
                json!(0),
                json!(2),
                json!(-3),
                json!("\t"),
                json!(" \n"),
            ])
            .clone();
        kwargs.insert("ind".into(), indent.clone());
        let separators = rng
            .pick(&[Value::Null, json!([",", ":"]), json!([" ,\n", "\t: "])])
            .clone();
        kwargs.insert("sep".into(), separators.clone());
        let sort_keys = rng.chance(2);
        kwargs.insert("sk".into(), json!(sort_keys));
        kwargs.insert("v".into(), v.clone());
        let template = if rng.chance(2) { &keyword } else { &positional };
        let out = template
            .render(&[], None, false, &kwargs)
            .unwrap_or_else(|e| panic!("{v}: {e}"));
        let context = format!("{v} with {kwargs:?} gave {out:?}");
        let back: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{context}: not JSON: {e}"));
        let expected = if sort_keys {
            sorted_keys(&v)
        } else {
            v.clone()
        };
        assert_same_json(&expected, &back, &context);
        if ensure_ascii {
            assert!(out.is_ascii(), "{context}");
        }
        // Characters below U+0020 are escaped in strings (json.dumps leaves
        // U+007F and above as they are): raw ones are the layout's.
        let layout = !indent.is_null() || !separators.is_null();
        for c in out.chars().filter(|c| *c < ' ') {
            assert!(layout && matches!(c, '\n' | '\t'), "{context}: raw {c:?}");
        }
    });
}

/// Python's `str.isspace()` for one character: Rust's whitespace and the
/// separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// What Python's `strip` (both ends), `lstrip` (`start`) or `rstrip`
/// (`end`) leaves of `s`, removing the characters `set` holds.
fn python_strip<'a>(s: &'a str, set: &dyn Fn(char) -> bool, start: bool, end: bool) -> &'a str {
    let s = if start { s.trim_start_matches(set) } else { s };
    if end { s.trim_end_matches(set) } else { s }
}

#[test]
fn the_strip_family_and_printing_follow_python() {
    let strip = ChatTemplate::from_source(
        "{{ [s.strip(c), s.lstrip(c), s.rstrip(c), s | trim(c), s.strip(), s | trim] | tojson }}",
        "strip",
        Map::new(),
    )
    .unwrap();
    let print = ChatTemplate::from_source("{{ x }}", "print", Map::new()).unwrap();
    let string = ChatTemplate::from_source("{{ x | string }}", "string", Map::new()).unwrap();
    fuzz("strip and print", |rng| {
        let s = random_text(rng);
        let chars = match rng.below(4) {
            0 => Value::Null,
            1 => json!(""),
            _ => json!(random_text(rng).chars().take(3).collect::<String>()),
        };
        let mut kwargs = Map::new();
        kwargs.insert("s".into(), json!(s));
        kwargs.insert("c".into(), chars.clone());
        let out = strip.render(&[], None, false, &kwargs).unwrap();
        let got: Vec<String> = serde_json::from_str(&out).unwrap();
        let context = format!("{s:?} stripped of {chars}");
        let in_set = |c: char| match chars.as_str() {
            Some(set) => set.contains(c),
            None => python_space(c),
        };
        let expected = [
            python_strip(&s, &in_set, true, true),
            python_strip(&s, &in_set, true, false),
            python_strip(&s, &in_set, false, true),
            python_strip(&s, &in_set, true, true),
            python_strip(&s, &python_space, true, true),
            python_strip(&s, &python_space, true, true),
        ];
        assert_eq!(
            got, expected,
            "{context}: strip, lstrip, rstrip, trim; strip(), trim"
        );

        // Scalars print as Python's str() writes them.
        let x = match rng.below(4) {
            0 => random_value(rng, 4),
            _ => json!(*rng.pick(&[0.5, -0.0, 1e16, 1e-5, 2.0, 1e300, 5e-324, -123.25])),
        };
        let mut kwargs = Map::new();
        kwargs.insert("x".into(), x.clone());
        let printed = print.render(&[], None, false, &kwargs).unwrap();
        let as_string = string.render(&[], None, false, &kwargs).unwrap();
        assert_eq!(printed, as_string, "{x}");
        match &x {
            Value::Null => assert_eq!(printed, "None"),
            Value::Bool(b) => assert_eq!(printed, if *b { "True" } else { "False" }),
            Value::String(text) => assert_eq!(&printed, text),
            Value::Number(n) if n.is_f64() => {
                let f: f64 = printed
                    .parse()
                    .unwrap_or_else(|e| panic!("{x} printed {printed:?}: {e}"));
                assert_eq!(f, n.as_f64().unwrap(), "{x} printed {printed:?}");
                // A float always shows it is one: 2.0, 1e+16.
                assert!(printed.contains(['.', 'e']), "{x} printed {printed:?}");
            }
            Value::Number(n) => assert_eq!(printed, n.to_string()),
            _ => {}
        }
    });
}

//! Seeded fuzzing of the grammar compiler: random JSON schemas (valid,
//! contradictory and malformed) as structured outputs and as the
//! parameters of forced tool calls in both call formats. Compiling may
//! fail with a reason, never panic.
//!
//! `KESTREL_FUZZ_ITERS` sets the iterations (default 100, for `cargo
//! test`); `KESTREL_FUZZ_SEED` the seed.

use kestrel_api::{StructuredOutput, Tool};
use kestrel_structured::grammar::GrammarStart;
use kestrel_structured::{GrammarCompiler, OutputGrammar, ToolCallFormat};
use kestrel_text::Tokenizer;
use serde_json::{Map, Value, json};

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % n.max(1) as u64) as usize
    }
    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

const NAMES: &[&str] = &[
    "a", "b", "city", "n", "x y", " s", "a>b", "<p", "é", "$ref", "",
];

fn random_schema(rng: &mut Rng, depth: usize) -> Value {
    let leaf = depth > 3;
    match rng.below(if leaf { 9 } else { 16 }) {
        0 => {
            json!({"type": rng.pick(&["string", "integer", "number", "boolean", "null", "float", "nope"])})
        }
        1 => json!({"type": "string", "minLength": rng.below(4), "maxLength": rng.below(12)}),
        2 => {
            json!({"type": "string", "pattern": rng.pick(&["^[a-z]+$", "ab", "\\d{2}", "(", "^$", "a/b", "[^<]*", "\\w+@\\w+"])})
        }
        3 => {
            json!({"type": "integer", "minimum": rng.pick(&[json!(-5), json!(i64::MIN), json!(0.5), json!(null)]), "maximum": rng.pick(&[json!(9), json!(u64::MAX), json!(-10)])})
        }
        4 => {
            json!({"enum": rng.pick(&[json!(["a", "b"]), json!([1, "1", null, true]), json!([]), json!("x"), json!([{"k": 1}, [2]])])})
        }
        5 => {
            json!({"const": rng.pick(&[json!("</parameter>"), json!(3), json!(null), json!("None"), json!({"a": []})])})
        }
        6 => rng.pick(&[
            json!(true),
            json!(false),
            json!({}),
            json!(null),
            json!(3),
            json!("s"),
        ]),
        7 => {
            json!({"type": ["string", rng.pick(&["null", "integer", "boolean", "object", "array"])]})
        }
        8 => json!({"$ref": rng.pick(&["#/$defs/d", "#/definitions/d", "#/nowhere", "http://x"])}),
        9..=11 => {
            let mut props = Map::new();
            for _ in 0..rng.below(4) {
                props.insert(rng.pick(NAMES).to_string(), random_schema(rng, depth + 1));
            }
            let required: Vec<Value> = (0..rng.below(3)).map(|_| json!(rng.pick(NAMES))).collect();
            let mut schema = json!({"type": "object", "properties": props, "required": required});
            if rng.below(2) == 0 {
                schema["additionalProperties"] =
                    rng.pick(&[json!(false), json!(true), json!({"type": "integer"})]);
            }
            if rng.below(3) == 0 {
                schema["$defs"] = json!({"d": random_schema(rng, depth + 1)});
            }
            schema
        }
        12 => {
            json!({"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.below(4)})
        }
        13 => json!({"anyOf": [random_schema(rng, depth + 1), random_schema(rng, depth + 1)]}),
        14 => {
            json!({"oneOf": [random_schema(rng, depth + 1)], "allOf": [random_schema(rng, depth + 1)]})
        }
        _ => json!({"type": "object", "patternProperties": {"^x": random_schema(rng, depth + 1)}}),
    }
}

#[test]
fn random_schemas_compile_or_fail_without_panicking() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35");
    let tokenizer = Tokenizer::from_model_dir(&dir).unwrap();
    let compiler =
        GrammarCompiler::from_tokenizer_file(dir.join("tokenizer.json"), tokenizer.eos_token_ids());
    let (n, seed) = (
        env_or("KESTREL_FUZZ_ITERS", 100),
        env_or("KESTREL_FUZZ_SEED", 0x5eed),
    );
    let (mut compiled, mut refused) = (0u64, 0u64);
    for i in 0..n {
        let mut rng = Rng(seed ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let schema = random_schema(&mut rng, 0);
        let tools: Vec<Tool> = (0..1 + rng.below(3))
            .map(|t| Tool {
                name: rng.pick(&["f", "g", "a<b", "f"]).to_string() + &t.to_string(),
                description: None,
                parameters: if t == 0 {
                    schema.clone()
                } else {
                    random_schema(&mut rng, 1)
                },
                raw: json!({}),
            })
            .collect();
        let structured = StructuredOutput::JsonSchema(schema.clone());
        let outputs = [
            OutputGrammar::Structured(&structured),
            OutputGrammar::ToolCall {
                tools: &tools,
                parallel: rng.below(2) == 0,
                format: ToolCallFormat::Json,
            },
            OutputGrammar::ToolCall {
                tools: &tools,
                parallel: rng.below(2) == 0,
                format: ToolCallFormat::Xml,
            },
        ];
        for output in &outputs {
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                compiler.compile(output, GrammarStart::default())
            }));
            match result {
                Ok(Ok(_)) => compiled += 1,
                Ok(Err(_)) => refused += 1,
                Err(_) => panic!("iteration {i} of seed {seed} panicked on {schema}"),
            }
        }
    }
    eprintln!(
        "grammar compiler: {n} iterations, seed {seed}: {compiled} compiled, {refused} refused"
    );
    assert!(compiled > 0);
}

//! A request's output constraint as an llguidance grammar.
//!
//! Each kind of constraint becomes one grammar: JSON schemas go to
//! llguidance's schema compiler (with a fixed `", "` / `": "` layout and no
//! free whitespace, so a weak model cannot wander off into blank lines;
//! a schema's own `x-guidance` options win), regexes and Lark grammars to
//! its Lark compiler, a choice to a Lark alternation of literals, and a
//! forced tool call to the call format the model was trained on
//! ([`ToolCallFormat`]): Qwen3's JSON
//! (`<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`) with the
//! name one of the declared tools and the arguments that tool's parameter
//! schema, or Qwen3.5/3.6's XML ([`crate::xml_call`]).
//!
//! When generation starts inside reasoning (the prompt ends with an open
//! `<think>`), the grammar is wrapped: any tokens but `</think>`, then
//! `</think>` and optional whitespace, then the constraint. So the reasoning
//! is never constrained and the content always is, with thinking on or off.

use kestrel_api::{StructuredOutput, Tool};
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use serde_json::{Map, Value, json};

use crate::layout::with_layout;
use crate::xml_call::xml_call_lark;

/// What the output must be.
#[derive(Clone, Copy, Debug)]
pub enum OutputGrammar<'a> {
    /// `response_format` or vLLM's `structured_outputs` / `guided_*`.
    Structured(&'a StructuredOutput),
    /// A tool call to one of `tools` (`tool_choice` `required`, or the
    /// named tool alone); with `parallel`, one or more calls.
    ToolCall {
        tools: &'a [Tool],
        parallel: bool,
        format: ToolCallFormat,
    },
}

/// How a model writes tool calls (the tool parser reads both).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ToolCallFormat {
    /// Qwen3: a JSON object inside `<tool_call>`.
    #[default]
    Json,
    /// Qwen3.5/3.6 and Qwen3-Coder: `<function=NAME>` with one
    /// `<parameter=P>` element per argument.
    Xml,
}

impl ToolCallFormat {
    /// The format a chat template writes: XML when it renders calls as
    /// `<function=...>`. `template_contains` searches the template source.
    pub fn of_template(template_contains: impl Fn(&str) -> bool) -> Self {
        if template_contains("<function=") {
            ToolCallFormat::Xml
        } else {
            ToolCallFormat::Json
        }
    }
}

/// Where the constraint starts.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrammarStart {
    /// `Some(id of </think>)` when generation starts inside reasoning.
    pub reasoning_end: Option<u32>,
}

/// Name of the constraint's grammar when it is wrapped after reasoning.
const BODY: &str = "body";

/// The llguidance grammar of `output`; `Err` with the reason when the
/// request's constraint cannot be expressed.
pub fn top_level(
    output: &OutputGrammar<'_>,
    start: GrammarStart,
) -> Result<TopLevelGrammar, String> {
    let body = body_grammar(output)?;
    Ok(match start.reasoning_end {
        None => TopLevelGrammar::from_grammar(body),
        Some(end) => {
            let wrapper = format!("start: <[^{end}]>* <[{end}]> /[ \\t\\r\\n]*/ @{BODY}\n");
            let body = GrammarWithLexer {
                name: Some(BODY.into()),
                ..body
            };
            TopLevelGrammar {
                grammars: vec![GrammarWithLexer::from_lark(wrapper), body],
                max_tokens: None,
            }
        }
    })
}

fn body_grammar(output: &OutputGrammar<'_>) -> Result<GrammarWithLexer, String> {
    Ok(match output {
        OutputGrammar::Structured(StructuredOutput::JsonSchema(schema)) => {
            GrammarWithLexer::from_json_schema(with_layout(schema.clone()))
        }
        OutputGrammar::Structured(StructuredOutput::JsonObject) => {
            GrammarWithLexer::from_json_schema(with_layout(json!({"type": "object"})))
        }
        OutputGrammar::Structured(StructuredOutput::Regex(rx)) => GrammarWithLexer::from_regex(rx),
        OutputGrammar::Structured(StructuredOutput::Choice(choices)) => {
            GrammarWithLexer::from_lark(format!("start: {}\n", alternatives(choices)))
        }
        OutputGrammar::Structured(StructuredOutput::Lark(lark)) => {
            GrammarWithLexer::from_lark(lark.clone())
        }
        OutputGrammar::ToolCall {
            tools,
            parallel,
            format: ToolCallFormat::Json,
        } => GrammarWithLexer::from_lark(tool_call_lark(tools, *parallel)),
        OutputGrammar::ToolCall {
            tools,
            parallel,
            format: ToolCallFormat::Xml,
        } => GrammarWithLexer::from_lark(xml_call_lark(tools, *parallel)?),
    })
}

/// `"a" | "b" | ...`, each choice a JSON-quoted Lark literal.
fn alternatives(choices: &[String]) -> String {
    choices
        .iter()
        .map(|c| Value::String(c.clone()).to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One Qwen3 JSON tool call (or several, one per line, with `parallel`),
/// its name one of `tools` and its arguments that tool's schema.
fn tool_call_lark(tools: &[Tool], parallel: bool) -> String {
    let calls: Vec<Value> = tools.iter().map(call_schema).collect();
    let schema = with_layout(json!({ "anyOf": calls }));
    let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
    format!("start: call{repeat}\ncall: \"<tool_call>\\n\" %json {schema} \"\\n</tool_call>\"\n")
}

/// `{"name": <the tool's name>, "arguments": <its parameter schema>}`.
fn call_schema(tool: &Tool) -> Value {
    let arguments = match &tool.parameters {
        Value::Object(m) if m.is_empty() => json!({"type": "object"}),
        Value::Object(_) => tool.parameters.clone(),
        _ => json!({"type": "object"}),
    };
    let mut properties = Map::new();
    properties.insert("name".into(), json!({"const": tool.name}));
    properties.insert("arguments".into(), arguments);
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

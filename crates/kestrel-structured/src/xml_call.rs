//! A forced tool call in the Qwen3.5/3.6 (Qwen3-Coder) XML format, as the
//! chat templates of those models write it and the XML tool parser reads
//! it:
//!
//! ```text
//! <tool_call>
//! <function=NAME>
//! <parameter=P>
//! VALUE
//! </parameter>
//! </function>
//! </tool_call>
//! ```
//!
//! The name is one of the declared tools; the parameters are that tool's
//! properties in their declared order, the required ones always present
//! and the others optional, each value constrained by its schema
//! ([`crate::xml_value`]). A fixed order is what lets the grammar require
//! parameters without repeating any. Tools, and optional parameters, whose
//! names the parser would not read back unchanged (with `<`, `>` or a line
//! break, or surrounding spaces) are left out.

use std::collections::HashSet;

use kestrel_api::Tool;
use serde_json::{Map, Value};

use crate::layout::with_layout;
use crate::xml_value::{ValueGrammar, value_grammar};

/// Value terminals may not hold a second `</parameter>` or any
/// `</tool_call>` (the parser ends values and calls at the first).
const VALUE_END: &str = r"~/(?s:.)*<\/parameter>(?s:.)+/ & ~/(?s:.)*<\/tool_call>(?s:.)*/";

/// The Lark grammar of one XML call to one of `tools` (or several, one a
/// line, with `parallel`). `Err` when no tool can be called this way.
pub(crate) fn xml_call_lark(tools: &[Tool], parallel: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut functions = Vec::new();
    let mut seen = HashSet::new();
    let mut skipped = Vec::new();
    for tool in tools {
        if !seen.insert(tool.name.as_str()) {
            continue;
        }
        let index = functions.len();
        match function_rules(tool, index, &mut out) {
            Ok(()) => functions.push(format!("fn{index}")),
            Err(e) => skipped.push(format!("{}: {e}", tool.name)),
        }
    }
    if functions.is_empty() {
        return Err(format!(
            "no tool can be called in the model's XML format ({})",
            skipped.join("; ")
        ));
    }
    let repeat = if parallel { " (\"\\n\" call)*" } else { "" };
    Ok(format!(
        "start: call{repeat}\ncall: \"<tool_call>\\n\" ({}) \"\\n</tool_call>\"\n{out}",
        functions.join(" | ")
    ))
}

/// Whether the parser reads `<function=NAME>` / `<parameter=NAME>` back as
/// exactly `name`.
fn readable_name(name: &str) -> bool {
    !name.is_empty() && name.trim() == name && !name.contains(['<', '>', '\n'])
}

/// The rules of tool number `index`, appended to `out`.
fn function_rules(tool: &Tool, index: usize, out: &mut String) -> Result<(), String> {
    if !readable_name(&tool.name) {
        return Err("its name cannot be written in the XML format".into());
    }
    let parameters = &tool.parameters;
    let properties = parameters
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<&str> = parameters
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let defs = definitions(parameters);
    let mut names: Vec<&str> = properties.keys().map(String::as_str).collect();
    // A required name without a property schema stays a text value.
    names.extend(required.iter().filter(|r| !properties.contains_key(**r)));
    let mut sequence = Vec::new();
    for (p, name) in names.iter().enumerate() {
        let is_required = required.contains(name);
        if !readable_name(name) {
            if is_required {
                return Err(format!("its parameter {name:?} cannot be written"));
            }
            continue;
        }
        let rule = format!("p{index}_{p}");
        match value_grammar(properties.get(*name), &defs) {
            Ok(grammar) => out.push_str(&parameter_rule(&rule, name, grammar)),
            Err(e) if is_required => return Err(format!("parameter {name:?}: {e}")),
            Err(_) => continue,
        }
        sequence.push(if is_required {
            rule
        } else {
            format!("{rule}?")
        });
    }
    let open = Value::String(format!("<function={}>\n", tool.name)).to_string();
    out.push_str(&format!(
        "fn{index}: {open} {} \"</function>\"\n",
        sequence.join(" ")
    ));
    Ok(())
}

/// The `$defs` and `definitions` of a tool schema, where `$ref`s point.
fn definitions(parameters: &Value) -> Map<String, Value> {
    let mut defs = Map::new();
    for key in ["definitions", "$defs"] {
        if let Some(Value::Object(m)) = parameters.get(key) {
            defs.extend(m.clone());
        }
    }
    defs
}

/// `<parameter=NAME>\nVALUE\n</parameter>\n` as rule `rule` (plus the
/// terminals of a raw value).
fn parameter_rule(rule: &str, name: &str, grammar: ValueGrammar) -> String {
    let open = Value::String(format!("<parameter={name}>")).to_string();
    let open_nl = Value::String(format!("<parameter={name}>\n")).to_string();
    match grammar {
        ValueGrammar::Raw(alternatives) => {
            let terminal = rule.to_uppercase();
            // The value and its closing tag are one terminal: the lexer
            // then ends the value at the first `</parameter>`.
            format!(
                "{rule}: {open} {terminal} \"\\n\"\n\
                 {terminal}_TEXT: {}\n\
                 {terminal}: \"\\n\" {terminal}_TEXT \"\\n</parameter>\" & {VALUE_END}\n",
                alternatives
                    .iter()
                    .map(|a| format!("({a})"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            )
        }
        ValueGrammar::Json(schema) => {
            // The fixed layout of response formats: free whitespace inside
            // a JSON value lets a weak model write blank space until its
            // token budget runs out.
            let schema = with_layout(schema);
            format!("{rule}: {open_nl} %json {schema} \"\\n</parameter>\\n\"\n")
        }
    }
}

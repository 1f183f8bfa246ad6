//! Structured outputs: OpenAI's `response_format` and vLLM's extra-body
//! fields (`structured_outputs`, and the older `guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`) folded into one
//! [`StructuredOutput`]. Only the shape is checked here; whether a schema,
//! regex or grammar compiles is the grammar compiler's call (the server
//! answers 400 with its reason).

use serde_json::Value;

use super::ValidationOptions;
use super::fields::{Fields, Result, type_name};
use crate::error::ApiError;
use crate::request::{ResponseFormat, StructuredOutput};

/// The older vLLM fields, each a constraint of its own.
const GUIDED: [&str; 4] = [
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
];

/// The keys of `structured_outputs` that name a constraint.
const STRUCTURED_KINDS: [&str; 5] = ["json", "regex", "choice", "grammar", "json_object"];

/// The request's output constraint from `response_format` (already parsed)
/// and the vLLM fields of the body; at most one may be given.
pub(crate) fn parse_structured_output(
    f: &mut Fields,
    format: &ResponseFormat,
    opts: &ValidationOptions,
) -> Result<Option<StructuredOutput>> {
    let mut found: Vec<(String, StructuredOutput)> = Vec::new();
    match format {
        ResponseFormat::Text => {}
        ResponseFormat::JsonObject => {
            found.push(("response_format".into(), StructuredOutput::JsonObject))
        }
        ResponseFormat::JsonSchema { schema, .. } => found.push((
            "response_format".into(),
            StructuredOutput::JsonSchema(schema.clone()),
        )),
    }
    for name in GUIDED {
        if let Some(value) = f.get(name) {
            if !opts.structured_outputs_supported {
                return Err(ApiError::unsupported(name));
            }
            let kind = name.trim_start_matches("guided_");
            found.push((name.into(), constraint(kind, value, name)?));
        }
    }
    // Accepted for compatibility: there is one backend.
    if let Some(v) = f.get("guided_decoding_backend")
        && !v.is_string()
    {
        return Err(ApiError::invalid(
            "guided_decoding_backend",
            "guided_decoding_backend must be a string",
        ));
    }
    if let Some(value) = f.get("structured_outputs") {
        if !opts.structured_outputs_supported {
            return Err(ApiError::unsupported("structured_outputs"));
        }
        found.extend(structured_outputs(value)?);
    }
    match found.len() {
        0 | 1 => Ok(found.pop().map(|(_, c)| c)),
        _ => {
            let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
            Err(ApiError::invalid(
                names[1],
                format!(
                    "only one output constraint may be given, got {}",
                    names.join(" and ")
                ),
            ))
        }
    }
}

/// vLLM's `structured_outputs` object: exactly one constraint key.
fn structured_outputs(value: &Value) -> Result<Vec<(String, StructuredOutput)>> {
    let mut o = Fields::of(value, "structured_outputs")?;
    let mut found = Vec::new();
    for kind in STRUCTURED_KINDS {
        let param = o.param(kind);
        if let Some(v) = o.get(kind) {
            found.push((param.clone(), constraint(kind, v, &param)?));
        }
    }
    // Options of vLLM's backends that do not change what is allowed here.
    o.accept(&["disable_fallback", "disable_additional_properties"]);
    if let Some(k) = o.unknown_keys().first() {
        return Err(ApiError::unsupported(format!("structured_outputs.{k}")));
    }
    if found.is_empty() {
        return Err(ApiError::invalid(
            "structured_outputs",
            format!(
                "structured_outputs needs one of {}",
                STRUCTURED_KINDS.join(", ")
            ),
        ));
    }
    Ok(found)
}

/// One constraint value: `kind` is json, json_object, regex, choice or grammar.
fn constraint(kind: &str, value: &Value, param: &str) -> Result<StructuredOutput> {
    let wrong = |expected: &str| {
        ApiError::invalid(
            param,
            format!("{param} must be {expected}, got {}", type_name(value)),
        )
    };
    let nonempty = |s: &str| -> Result<String> {
        if s.trim().is_empty() {
            return Err(ApiError::invalid(
                param,
                format!("{param} must not be empty"),
            ));
        }
        Ok(s.to_string())
    };
    Ok(match (kind, value) {
        ("json", Value::Object(_) | Value::Bool(_)) => StructuredOutput::JsonSchema(value.clone()),
        // vLLM also takes the schema as JSON text.
        ("json", Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ (Value::Object(_) | Value::Bool(_))) => StructuredOutput::JsonSchema(v),
            _ => return Err(wrong("a JSON schema (an object, or its JSON text)")),
        },
        ("json", _) => return Err(wrong("a JSON schema object")),
        ("json_object", Value::Bool(true)) => StructuredOutput::JsonObject,
        ("json_object", _) => return Err(wrong("true")),
        ("regex", Value::String(s)) => StructuredOutput::Regex(nonempty(s)?),
        ("regex", _) => return Err(wrong("a string")),
        ("grammar", Value::String(s)) => StructuredOutput::Lark(nonempty(s)?),
        ("grammar", _) => return Err(wrong("a string (a Lark grammar)")),
        ("choice", Value::Array(items)) if !items.is_empty() => StructuredOutput::Choice(
            items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| wrong("an array of strings"))?,
        ),
        ("choice", _) => return Err(wrong("a non-empty array of strings")),
        _ => unreachable!("constraint kinds are fixed above"),
    })
}

//! How one parameter value of an XML tool call is constrained.
//!
//! The XML tool parser reads a value as text and converts it with the
//! tool's schema for that parameter (`kestrel_api::tools::schema::
//! coerce_value`): a parameter whose schema allows only strings keeps the
//! text as it is; otherwise the trimmed text becomes null, a number, a
//! boolean, an object or an array when it reads as one of the allowed
//! types, and stays a string when it reads as none. The grammar follows the
//! same decision ([`allowed_types`]), so whatever it allows converts back
//! into a value that the schema accepts:
//!
//! * a finite set (`enum`, `const`): exactly the texts that convert to a
//!   member;
//! * strings only: raw text within the string constraints (length,
//!   pattern, alternatives);
//! * strings and scalars: raw text that does not read as another allowed
//!   type, or the text of an unconstrained null, boolean, integer or
//!   number; objects and arrays are not offered alongside strings;
//! * anything else: JSON of the schema, restricted to the allowed types
//!   ([`crate::xml_json`]).
//!
//! Raw values may hold anything but `</parameter>` and `</tool_call>`.

use kestrel_api::tools::schema::{allowed_types, coerce_value};
use serde_json::{Map, Value};

use crate::xml_json::json_value_schema;

/// The value grammar of one parameter.
pub(crate) enum ValueGrammar {
    /// Raw text: Lark terminal alternatives (each a terminal expression).
    Raw(Vec<String>),
    /// JSON text of this schema.
    Json(Value),
}

/// Regexes (Lark `/.../` bodies) of trimmed texts the parser reads as
/// each non-string type, so raw strings can leave them out.
const READS_AS_NULL: &str = r"\s*(null|None)\s*";
const READS_AS_NUMBER: &str = r"\s*[+\-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+\-]?[0-9]+)?\s*";
const READS_AS_BOOLEAN: &str = r"\s*(?i:true|false)\s*";
const READS_AS_OBJECT: &str = r"\s*\{(?s:.)*";
const READS_AS_ARRAY: &str = r"\s*\[(?s:.)*";
/// Integers and numbers the raw path may write: digits few enough for an
/// `i64`, and decimals `f64` reads back finite.
const INTEGER_TEXT: &str = r"-?(0|[1-9][0-9]{0,17})";
const NUMBER_TEXT: &str = r"-?(0|[1-9][0-9]{0,17})(\.[0-9]{1,17})?";

/// The grammar of a parameter whose schema is `schema` (`None`: the tool
/// does not declare it, and the value stays text). `defs` are the tool
/// schema's `$defs`/`definitions`, which `$ref`s inside point to.
pub(crate) fn value_grammar(
    schema: Option<&Value>,
    defs: &Map<String, Value>,
) -> Result<ValueGrammar, String> {
    let Some(schema) = schema else {
        return Ok(ValueGrammar::Raw(vec!["/(?s:.)*/".into()]));
    };
    if let Some(members) = finite_members(schema) {
        return finite_texts(schema, &members).map(ValueGrammar::Raw);
    }
    let types = allowed_types(schema);
    if types.is_empty() {
        return Ok(ValueGrammar::Json(json_value_schema(schema, None, defs)));
    }
    if !types.iter().any(|t| t == "string") {
        return Ok(ValueGrammar::Json(json_value_schema(
            schema,
            Some(&types),
            defs,
        )));
    }
    let allows = |t: &str| {
        types
            .iter()
            .any(|x| x == t || (t == "number" && x == "float"))
    };
    let only_string = types.iter().all(|t| t == "string");
    let strings = string_terminal(schema, defs, 0)?
        .ok_or_else(|| "a string parameter admits no string".to_string())?;
    if only_string {
        return Ok(ValueGrammar::Raw(vec![strings]));
    }
    // Texts the parser would turn into another type are not strings.
    let mut raw = strings;
    let mut alternatives = Vec::new();
    let unconstrained = !has_scalar_constraints(schema);
    for (ty, reads_as, text) in [
        ("null", READS_AS_NULL, Some("\"null\"".to_string())),
        (
            "boolean",
            READS_AS_BOOLEAN,
            Some("\"true\" | \"false\"".into()),
        ),
        (
            "integer",
            READS_AS_NUMBER,
            Some(format!("/{INTEGER_TEXT}/")),
        ),
        ("number", READS_AS_NUMBER, Some(format!("/{NUMBER_TEXT}/"))),
        ("object", READS_AS_OBJECT, None),
        ("array", READS_AS_ARRAY, None),
    ] {
        if allows(ty) {
            raw = format!("({raw}) & ~/{reads_as}/");
            if let Some(text) = text.filter(|_| unconstrained) {
                alternatives.push(text);
            }
        }
    }
    alternatives.insert(0, raw);
    Ok(ValueGrammar::Raw(alternatives))
}

/// The members of an `enum` or `const` schema.
fn finite_members(schema: &Value) -> Option<Vec<Value>> {
    if let Some(c) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    schema.get("enum")?.as_array().cloned()
}

/// Lark literals of the texts that convert back to a member, each the
/// member's own text (strings raw, others as JSON).
fn finite_texts(schema: &Value, members: &[Value]) -> Result<Vec<String>, String> {
    let texts: Vec<String> = members
        .iter()
        .filter_map(|m| {
            let text = match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (coerce_value(&text, Some(schema)) == *m && !closes_a_tag(&text))
                .then(|| Value::String(text).to_string())
        })
        .collect();
    if texts.is_empty() {
        return Err("no value of the enum can be written as an XML parameter".into());
    }
    Ok(vec![texts.join(" | ")])
}

fn closes_a_tag(text: &str) -> bool {
    text.contains("</parameter>") || text.contains("</tool_call>")
}

/// Whether numbers, booleans or nulls are narrowed anywhere in the schema
/// (such values are then left to strings' side only when unconstrained).
fn has_scalar_constraints(schema: &Value) -> bool {
    const KEYS: [&str; 6] = [
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "not",
    ];
    let Some(map) = schema.as_object() else {
        return false;
    };
    KEYS.iter().any(|k| map.contains_key(*k))
        || map.contains_key("$ref")
        || map.contains_key("allOf")
        || ["anyOf", "oneOf"].iter().any(|k| {
            map.get(*k)
                .and_then(Value::as_array)
                .is_some_and(|bs| bs.iter().any(has_scalar_constraints))
        })
}

/// A Lark terminal expression for the raw strings `schema` accepts, or
/// `None` when it accepts no string. `$ref`s resolve through `defs`.
fn string_terminal(
    schema: &Value,
    defs: &Map<String, Value>,
    depth: usize,
) -> Result<Option<String>, String> {
    if depth > 16 {
        return Err("schema references nest too deeply".into());
    }
    let map = match schema {
        Value::Bool(true) => return Ok(Some("/(?s:.)*/".into())),
        Value::Object(m) => m,
        _ => return Ok(None),
    };
    if let Some(members) = finite_members(schema) {
        let strings: Vec<String> = members
            .iter()
            .filter_map(Value::as_str)
            .filter(|s| !closes_a_tag(s))
            .map(|s| Value::String(s.into()).to_string())
            .collect();
        return Ok((!strings.is_empty()).then(|| format!("({})", strings.join(" | "))));
    }
    let types = allowed_types(schema);
    if map.contains_key("type") && !types.iter().any(|t| t == "string") {
        return Ok(None);
    }
    let mut conjuncts = Vec::new();
    let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0);
    let max = map.get("maxLength").and_then(Value::as_u64);
    if min > 0 || max.is_some() {
        let max = max.map_or(String::new(), |m| m.to_string());
        conjuncts.push(format!("/(?s:.){{{min},{max}}}/"));
    }
    if let Some(pattern) = map.get("pattern").and_then(Value::as_str) {
        conjuncts.push(format!("/{}/", search_regex(pattern)));
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = map.get(key).and_then(Value::as_array) {
            let mut union = Vec::new();
            for b in branches {
                union.extend(string_terminal(b, defs, depth + 1)?);
            }
            if union.is_empty() {
                return Ok(None);
            }
            conjuncts.push(format!("({})", union.join(" | ")));
        }
    }
    for b in map
        .get("allOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match string_terminal(b, defs, depth + 1)? {
            Some(t) => conjuncts.push(t),
            None => return Ok(None),
        }
    }
    if let Some(target) = map.get("$ref").and_then(Value::as_str) {
        match resolve(target, defs) {
            Some(s) => match string_terminal(s, defs, depth + 1)? {
                Some(t) => conjuncts.push(t),
                None => return Ok(None),
            },
            None => return Err(format!("cannot resolve $ref {target:?}")),
        }
    }
    Ok(Some(if conjuncts.is_empty() {
        "/(?s:.)*/".into()
    } else {
        conjuncts
            .into_iter()
            .map(|c| format!("({c})"))
            .collect::<Vec<_>>()
            .join(" & ")
    }))
}

/// `#/$defs/NAME` or `#/definitions/NAME`.
pub(crate) fn resolve<'a>(target: &str, defs: &'a Map<String, Value>) -> Option<&'a Value> {
    let name = target
        .strip_prefix("#/$defs/")
        .or_else(|| target.strip_prefix("#/definitions/"))?;
    defs.get(name)
}

/// A JSON-schema `pattern` (which may match anywhere, with ECMAScript's
/// ASCII `\d` and `\w`) as a whole-text regex inside Lark's `/.../`.
fn search_regex(pattern: &str) -> String {
    let rx = llguidance::regex_to_lark(pattern, "dw");
    let start = rx.strip_prefix('^');
    let anchored_end = rx.ends_with('$') && !rx.ends_with("\\$");
    match (start, anchored_end) {
        (Some(inner), true) => format!("(?:{})", &inner[..inner.len() - 1]),
        (Some(inner), false) => format!("(?:{inner})(?s:.)*"),
        (None, true) => format!("(?s:.)*(?:{})", &rx[..rx.len() - 1]),
        (None, false) => format!("(?s:.)*(?:{rx})(?s:.)*"),
    }
}

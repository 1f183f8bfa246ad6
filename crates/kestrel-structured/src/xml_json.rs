//! The JSON schema that an XML tool-call parameter written as JSON is
//! generated from: the parameter's own schema, made safe for the XML
//! format and for the parser's conversion.
//!
//! * Its type is narrowed to the types the parser converts to
//!   (`allowed_types`, strings left out when they would be written raw), so
//!   a value is never read back as a string of JSON text.
//! * No string and no object key holds `</` (JSON writes `/` as itself, and
//!   `</parameter>` or `</tool_call>` would end the value early). Where the
//!   schema leaves a value or its keys open, that is said explicitly with
//!   a JSON value grammar that keeps to this rule.
//! * Integers stay within `i64` and numbers within `f64`'s finite range, as
//!   the parser reads them.
//! * The tool schema's `$defs`/`definitions` come along, so `$ref`s inside
//!   resolve; they are made safe the same way.

use serde_json::{Map, Value, json};

/// Strings without `</` (a whole-text JSON-schema pattern).
const NO_CLOSING_TAG: &str = "^([^<]|<+[^</])*<*$";
const INTEGER_LIMIT: i64 = 999_999_999_999_999_999;
/// Name of the open JSON value grammar among the `$defs`.
const ANY: &str = "kestrel_open_json_value";
/// Keywords that constrain a value (a schema with none of them accepts
/// any JSON value).
const CONSTRAINING: [&str; 30] = [
    "type",
    "enum",
    "const",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$ref",
    "properties",
    "patternProperties",
    "additionalProperties",
    "required",
    "minProperties",
    "maxProperties",
    "items",
    "prefixItems",
    "additionalItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "contains",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
];

/// `schema` as the JSON a parameter value is generated from. `types`: the
/// types the parser converts to (`None` for an untyped schema).
pub(crate) fn json_value_schema(
    schema: &Value,
    types: Option<&[String]>,
    defs: &Map<String, Value>,
) -> Value {
    let mut root = schema.clone();
    safe(&mut root);
    if let (Some(types), Value::Object(map)) = (types, &mut root) {
        let json_types: Vec<Value> = types
            .iter()
            .filter(|t| t.as_str() != "string")
            .map(|t| if t == "float" { "number" } else { t.as_str() })
            .map(|t| Value::String(t.into()))
            .collect();
        map.insert("type".into(), Value::Array(json_types));
    }
    let mut all_defs = defs.clone();
    for def in all_defs.values_mut() {
        safe(def);
    }
    all_defs.insert(ANY.into(), open_value());
    if let Value::Object(map) = &mut root {
        map.remove("definitions");
        map.insert("$defs".into(), Value::Object(all_defs));
    }
    root
}

fn any_ref() -> Value {
    json!({ "$ref": format!("#/$defs/{ANY}") })
}

/// Any JSON value whose strings and keys hold no `</`.
fn open_value() -> Value {
    json!({"anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        integer_bounds(json!({"type": "integer"})),
        number_bounds(json!({"type": "number"})),
        {"type": "string", "pattern": NO_CLOSING_TAG},
        {"type": "array", "items": any_ref()},
        {"type": "object", "patternProperties": {NO_CLOSING_TAG: any_ref()}, "additionalProperties": false},
    ]})
}

fn integer_bounds(mut schema: Value) -> Value {
    // Eighteen digits: within i64, and clear of llguidance's overflow at
    // its extremes.
    bound(&mut schema, "minimum", json!(-INTEGER_LIMIT), |a, b| {
        a.max(b)
    });
    bound(&mut schema, "maximum", json!(INTEGER_LIMIT), |a, b| {
        a.min(b)
    });
    schema
}

fn number_bounds(mut schema: Value) -> Value {
    bound(&mut schema, "minimum", json!(-1e15), |a, b| a.max(b));
    bound(&mut schema, "maximum", json!(1e15), |a, b| a.min(b));
    schema
}

/// Sets `key` to `limit`, or to the tighter of it and the schema's own.
fn bound(schema: &mut Value, key: &str, limit: Value, tighter: fn(f64, f64) -> f64) {
    let Value::Object(map) = schema else { return };
    let value = match map.get(key).and_then(Value::as_f64) {
        Some(own) if tighter(own, limit.as_f64().unwrap_or(own)) == own => return,
        _ => limit,
    };
    map.insert(key.into(), value);
}

fn types_of(map: &Map<String, Value>) -> Vec<&str> {
    match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    }
}

/// Makes `schema` and every schema inside it safe (see the module docs).
fn safe(schema: &mut Value) {
    let map = match schema {
        Value::Bool(true) => {
            *schema = any_ref();
            return;
        }
        Value::Object(map) => map,
        _ => return,
    };
    if !CONSTRAINING.iter().any(|k| map.contains_key(*k)) {
        *schema = any_ref();
        return;
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        if let Some(Value::Object(subs)) = map.get_mut(key) {
            subs.values_mut().for_each(safe);
        }
    }
    for key in ["anyOf", "oneOf", "allOf", "prefixItems"] {
        if let Some(Value::Array(subs)) = map.get_mut(key) {
            subs.iter_mut().for_each(safe);
        }
    }
    for key in ["additionalProperties", "items", "additionalItems", "not"] {
        match map.get_mut(key) {
            Some(Value::Array(subs)) => subs.iter_mut().for_each(safe),
            Some(sub) if key != "not" => safe(sub),
            _ => {}
        }
    }
    let types: Vec<String> = types_of(map).into_iter().map(String::from).collect();
    let has = |t: &str| types.iter().any(|x| x == t);
    if has("string") {
        if map.contains_key("pattern") {
            let own = map.remove("pattern").unwrap_or_default();
            let mut all_of = match map.remove("allOf") {
                Some(Value::Array(a)) => a,
                _ => Vec::new(),
            };
            all_of.push(json!({"pattern": own}));
            all_of.push(json!({"pattern": NO_CLOSING_TAG}));
            map.insert("allOf".into(), Value::Array(all_of));
        } else {
            map.insert("pattern".into(), NO_CLOSING_TAG.into());
        }
    }
    if has("object") {
        let open_keys = match map.get("additionalProperties") {
            None | Some(Value::Bool(true)) => true,
            Some(Value::Object(m)) => m.get("$ref") == any_ref().get("$ref"),
            _ => false,
        };
        if open_keys && !map.contains_key("patternProperties") {
            map.insert(
                "patternProperties".into(),
                json!({ NO_CLOSING_TAG: any_ref() }),
            );
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    if has("array") && !map.contains_key("items") {
        map.insert("items".into(), any_ref());
    }
    if has("integer") {
        *schema = integer_bounds(std::mem::take(schema));
    } else if has("number") {
        *schema = number_bounds(std::mem::take(schema));
    }
}

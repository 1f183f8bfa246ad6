//! A small JSON-schema checker for the keywords the tests' schemas use
//! (type, properties, required, additionalProperties, items, minItems,
//! maxItems, enum, const, anyOf, minLength, maxLength, minimum, maximum),
//! so the tests need no schema library. Unknown keywords fail the check,
//! so a schema cannot silently test less than it says.

use serde_json::Value;

/// `Err` names the first violation with its JSON path.
pub fn check(value: &Value, schema: &Value) -> Result<(), String> {
    check_at(value, schema, "$")
}

fn check_at(v: &Value, schema: &Value, path: &str) -> Result<(), String> {
    let Some(s) = schema.as_object() else {
        return Err(format!("{path}: schema is not an object"));
    };
    let fail = |what: String| Err(format!("{path}: {what} (value {v})"));
    for (key, want) in s {
        match key.as_str() {
            "type" => {
                let ok = match want.as_str() {
                    Some("object") => v.is_object(),
                    Some("array") => v.is_array(),
                    Some("string") => v.is_string(),
                    Some("integer") => v.is_i64() || v.is_u64(),
                    Some("number") => v.is_number(),
                    Some("boolean") => v.is_boolean(),
                    Some("null") => v.is_null(),
                    _ => return fail(format!("unknown type {want}")),
                };
                if !ok {
                    return fail(format!("not of type {want}"));
                }
            }
            "properties" => {
                if let Some(o) = v.as_object() {
                    for (name, sub) in want.as_object().into_iter().flatten() {
                        if let Some(x) = o.get(name) {
                            check_at(x, sub, &format!("{path}.{name}"))?;
                        }
                    }
                }
            }
            "required" => {
                for name in want.as_array().into_iter().flatten() {
                    let name = name.as_str().unwrap_or_default();
                    if v.as_object().is_some_and(|o| !o.contains_key(name)) {
                        return fail(format!("missing required {name}"));
                    }
                }
            }
            "additionalProperties" => {
                let known = s.get("properties").and_then(Value::as_object);
                for (name, x) in v.as_object().into_iter().flatten() {
                    if known.is_some_and(|k| k.contains_key(name)) {
                        continue;
                    }
                    match want {
                        Value::Bool(false) => return fail(format!("extra property {name}")),
                        Value::Bool(true) => {}
                        sub => check_at(x, sub, &format!("{path}.{name}"))?,
                    }
                }
            }
            "items" => {
                for (i, x) in v.as_array().into_iter().flatten().enumerate() {
                    check_at(x, want, &format!("{path}[{i}]"))?;
                }
            }
            "minItems" | "maxItems" | "minLength" | "maxLength" => {
                let n = want.as_u64().unwrap_or(0) as usize;
                let len = match v {
                    Value::Array(a) => a.len(),
                    Value::String(s) => s.chars().count(),
                    _ => continue,
                };
                let ok = if key.starts_with("min") {
                    len >= n
                } else {
                    len <= n
                };
                if !ok {
                    return fail(format!("{key} {n}, has {len}"));
                }
            }
            "minimum" | "maximum" => {
                let (Some(x), Some(bound)) = (v.as_f64(), want.as_f64()) else {
                    continue;
                };
                if (key == "minimum" && x < bound) || (key == "maximum" && x > bound) {
                    return fail(format!("{key} {bound}"));
                }
            }
            "enum" => {
                if !want.as_array().is_some_and(|a| a.contains(v)) {
                    return fail(format!("not in enum {want}"));
                }
            }
            "const" => {
                if v != want {
                    return fail(format!("not const {want}"));
                }
            }
            "anyOf" => {
                let branches = want.as_array().cloned().unwrap_or_default();
                if !branches.iter().any(|b| check_at(v, b, path).is_ok()) {
                    return fail("matches no anyOf branch".into());
                }
            }
            "description" | "title" => {}
            other => return fail(format!("the checker does not know {other:?}")),
        }
    }
    Ok(())
}

#[test]
fn the_checker_rejects_what_it_should() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"a": {"type": "integer", "maximum": 3}, "b": {"enum": ["x"]}},
        "required": ["a"],
        "additionalProperties": false,
    });
    assert!(check(&serde_json::json!({"a": 2, "b": "x"}), &schema).is_ok());
    for bad in [
        serde_json::json!({"b": "x"}),
        serde_json::json!({"a": 4}),
        serde_json::json!({"a": 1, "b": "y"}),
        serde_json::json!({"a": 1, "c": 0}),
        serde_json::json!([1]),
    ] {
        assert!(check(&bad, &schema).is_err(), "{bad}");
    }
}

//! Converting an XML tool-call parameter (always text) to a JSON value,
//! guided by the tool's JSON schema for that parameter.

use serde_json::{Number, Value};

/// JSON types a schema allows, from `type` (string or list) and the
/// branches of `anyOf`/`oneOf`. Empty when the schema says nothing.
/// [`coerce_value`] decides by these; a grammar that writes values for the
/// XML format must decide the same way.
pub fn allowed_types(schema: &Value) -> Vec<String> {
    let mut types = Vec::new();
    match schema.get("type") {
        Some(Value::String(t)) => types.push(t.clone()),
        Some(Value::Array(ts)) => {
            types.extend(ts.iter().filter_map(|t| t.as_str().map(str::to_string)))
        }
        _ => {}
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = schema.get(key) {
            for b in branches {
                types.extend(allowed_types(b));
            }
        }
    }
    if types.is_empty() {
        if schema.get("properties").is_some() {
            types.push("object".into());
        } else if schema.get("items").is_some() {
            types.push("array".into());
        } else if let Some(Value::Array(options)) = schema.get("enum") {
            types.extend(options.iter().map(|o| json_type(o).to_string()));
        }
    }
    types
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Coerces `raw` to the type the schema asks for. Without a schema the text
/// stays a string; text that does not parse as any allowed type also stays
/// a string, so nothing the model wrote is lost.
pub fn coerce_value(raw: &str, schema: Option<&Value>) -> Value {
    let Some(schema) = schema else {
        return Value::String(raw.to_string());
    };
    let types = allowed_types(schema);
    let allows = |t: &str| {
        types
            .iter()
            .any(|x| x == t || (t == "number" && x == "float"))
    };
    let only_string = !types.is_empty() && types.iter().all(|t| t == "string");
    if only_string {
        return Value::String(raw.to_string());
    }
    let text = raw.trim();
    if types.is_empty() {
        // Untyped schema: take valid JSON as such.
        return serde_json::from_str(text).unwrap_or_else(|_| Value::String(raw.to_string()));
    }
    if allows("null") && (text == "null" || text == "None") {
        return Value::Null;
    }
    if allows("integer")
        && let Ok(i) = text.parse::<i64>()
    {
        return Value::Number(i.into());
    }
    if allows("number") {
        if let Ok(i) = text.parse::<i64>() {
            return Value::Number(i.into());
        }
        if let Some(n) = text.parse::<f64>().ok().and_then(Number::from_f64) {
            return Value::Number(n);
        }
    }
    if allows("boolean") {
        match text.to_ascii_lowercase().as_str() {
            "true" => return Value::Bool(true),
            "false" => return Value::Bool(false),
            _ => {}
        }
    }
    if (allows("object") || allows("array"))
        && let Ok(v) = serde_json::from_str::<Value>(text)
        && ((v.is_object() && allows("object")) || (v.is_array() && allows("array")))
    {
        return v;
    }
    Value::String(raw.to_string())
}

/// The schema of parameter `param` of `tool`, from `parameters.properties`.
pub fn param_schema<'a>(parameters: &'a Value, param: &str) -> Option<&'a Value> {
    parameters.get("properties")?.get(param)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn coerces_by_type() {
        assert_eq!(
            coerce_value("5", Some(&json!({"type":"integer"}))),
            json!(5)
        );
        assert_eq!(
            coerce_value("2.5", Some(&json!({"type":"number"}))),
            json!(2.5)
        );
        assert_eq!(
            coerce_value("True", Some(&json!({"type":"boolean"}))),
            json!(true)
        );
        assert_eq!(
            coerce_value("5", Some(&json!({"type":"string"}))),
            json!("5")
        );
        assert_eq!(
            coerce_value("[1,2]", Some(&json!({"type":"array"}))),
            json!([1, 2])
        );
        assert_eq!(
            coerce_value("{\"a\":1}", Some(&json!({"type":"object"}))),
            json!({"a":1})
        );
        assert_eq!(
            coerce_value("abc", Some(&json!({"type":"integer"}))),
            json!("abc")
        );
        assert_eq!(coerce_value("5", None), json!("5"));
    }

    #[test]
    fn any_of_object_is_not_double_encoded() {
        let schema = json!({"anyOf":[{"type":"object"},{"type":"null"}]});
        assert_eq!(
            coerce_value("{\"k\": [1]}", Some(&schema)),
            json!({"k":[1]})
        );
        assert_eq!(coerce_value("null", Some(&schema)), Value::Null);
        let types = json!({"type":["integer","string"]});
        assert_eq!(coerce_value("7", Some(&types)), json!(7));
        assert_eq!(coerce_value("seven", Some(&types)), json!("seven"));
    }
}

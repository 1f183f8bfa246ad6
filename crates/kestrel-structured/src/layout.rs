//! The layout of JSON the grammars generate.

use serde_json::{Value, json};

/// The schema with the JSON layout the Qwen tool parser and most clients
/// expect, unless the schema sets its own.
pub(crate) fn with_layout(schema: Value) -> Value {
    let mut schema = match schema {
        Value::Bool(true) => json!({}),
        Value::Bool(false) => json!({"not": {}}),
        other => other,
    };
    if let Value::Object(map) = &mut schema
        && !map.contains_key("x-guidance")
    {
        map.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
            }),
        );
    }
    schema
}

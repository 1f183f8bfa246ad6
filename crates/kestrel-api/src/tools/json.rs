//! Qwen3 (hermes-style) tool calls:
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.

use serde_json::Value;

/// Name and arguments (compact JSON object text) of one call body, or
/// `None` when the body is not a valid call (it is then kept as content).
pub fn parse_json_call(body: &str) -> Option<(String, String)> {
    let value: Value = serde_json::from_str(body.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let args = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v.clone(),
        // Some models double-encode the arguments as a string.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => return None,
        },
        Some(_) => return None,
    };
    Some((name, serde_json::to_string(&args).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_name_and_arguments() {
        let (n, a) =
            parse_json_call("\n{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": [true]}}\n")
                .unwrap();
        assert_eq!(n, "f");
        assert_eq!(a, "{\"b\":1,\"a\":[true]}");
        let (_, a) = parse_json_call("{\"name\":\"f\",\"arguments\":\"{\\\"x\\\":2}\"}").unwrap();
        assert_eq!(a, "{\"x\":2}");
        let (_, a) = parse_json_call("{\"name\":\"f\"}").unwrap();
        assert_eq!(a, "{}");
    }

    #[test]
    fn rejects_malformed() {
        assert!(parse_json_call("{\"name\": \"f\", \"arguments\": {").is_none());
        assert!(parse_json_call("{\"arguments\": {}}").is_none());
        assert!(parse_json_call("{\"name\": 3}").is_none());
        assert!(parse_json_call("{\"name\": \"f\", \"arguments\": [1]}").is_none());
        assert!(parse_json_call("not json").is_none());
    }
}

//! `tools`, `tool_choice`, and `response_format`.

use serde_json::Value;

use super::ValidationOptions;
use super::fields::{Fields, Result, type_name};
use crate::error::ApiError;
use crate::request::{ResponseFormat, Tool, ToolChoice};

pub(crate) fn parse_tools(value: Option<&Value>) -> Result<Vec<Tool>> {
    let items = match value {
        None => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(other) => {
            return Err(ApiError::invalid(
                "tools",
                format!("tools must be an array, got {}", type_name(other)),
            ));
        }
    };
    let tools = items
        .iter()
        .enumerate()
        .map(|(i, t)| parse_tool(t, &format!("tools[{i}]")))
        .collect::<Result<Vec<Tool>>>()?;
    for (i, t) in tools.iter().enumerate() {
        if tools[..i].iter().any(|earlier| earlier.name == t.name) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("duplicate tool name {:?}", t.name),
            ));
        }
    }
    Ok(tools)
}

fn parse_tool(value: &Value, path: &str) -> Result<Tool> {
    let mut f = Fields::of(value, path)?;
    match f.string("type")? {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                f.param("type"),
                format!("tool type {other:?} is not supported"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                f.param("type"),
                format!("{} is required", f.param("type")),
            ));
        }
    }
    let function = f.get("function").ok_or_else(|| {
        ApiError::invalid(
            f.param("function"),
            format!("{} is required", f.param("function")),
        )
    })?;
    let mut func = Fields::of(function, &f.param("function"))?;
    let name = match func.string("name")? {
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            return Err(ApiError::invalid(
                func.param("name"),
                format!("{} must be a non-empty string", func.param("name")),
            ));
        }
    };
    let description = func.string("description")?.map(str::to_string);
    let parameters = match func.get("parameters") {
        None => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(ApiError::invalid(
                func.param("parameters"),
                format!(
                    "{} must be a JSON schema object, got {}",
                    func.param("parameters"),
                    type_name(other)
                ),
            ));
        }
    };
    func.bool("strict")?;
    Ok(Tool {
        name,
        description,
        parameters,
        raw: value.clone(),
    })
}

pub(crate) fn parse_tool_choice(
    value: Option<&Value>,
    tools: &[Tool],
    opts: &ValidationOptions,
) -> Result<ToolChoice> {
    let choice = match value {
        // OpenAI: "none" without tools, "auto" with them.
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got {other:?}"
                    ),
                ));
            }
        },
        Some(v @ Value::Object(_)) => named_choice(v)?,
        Some(other) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice must be a string or an object, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    match &choice {
        ToolChoice::None => {}
        ToolChoice::Auto if tools.is_empty() => {}
        ToolChoice::Auto if !opts.tool_parser_enabled => {
            return Err(ApiError::invalid(
                "tool_choice",
                "\"auto\" tool choice requires the server to be started with --tool-call-parser",
            ));
        }
        ToolChoice::Auto => {}
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice requires tools",
            ));
        }
        ToolChoice::Required | ToolChoice::Named(_) if !opts.forced_tool_choice_supported => {
            return Err(ApiError::unsupported(match choice {
                ToolChoice::Required => "tool_choice \"required\"",
                _ => "named tool_choice",
            })
            .with_param("tool_choice"));
        }
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            return Err(ApiError::invalid(
                "tool_choice.function.name",
                format!("tool_choice names {name:?}, which is not among the tools"),
            ));
        }
        _ => {}
    }
    Ok(choice)
}

fn named_choice(value: &Value) -> Result<ToolChoice> {
    let mut f = Fields::of(value, "tool_choice")?;
    if f.string("type")? != Some("function") {
        return Err(ApiError::invalid(
            "tool_choice.type",
            "tool_choice.type must be \"function\"",
        ));
    }
    let function = f.get("function").ok_or_else(|| {
        ApiError::invalid("tool_choice.function", "tool_choice.function is required")
    })?;
    let mut func = Fields::of(function, "tool_choice.function")?;
    match func.string("name")? {
        Some(n) if !n.is_empty() => Ok(ToolChoice::Named(n.to_string())),
        _ => Err(ApiError::invalid(
            "tool_choice.function.name",
            "tool_choice.function.name must be a non-empty string",
        )),
    }
}

pub(crate) fn parse_response_format(
    value: Option<&Value>,
    opts: &ValidationOptions,
) -> Result<ResponseFormat> {
    let Some(value) = value else {
        return Ok(ResponseFormat::Text);
    };
    let mut f = Fields::of(value, "response_format")?;
    let format = match f.string("type")? {
        Some("text") => ResponseFormat::Text,
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => {
            let js = f.get("json_schema").ok_or_else(|| {
                ApiError::invalid(
                    "response_format.json_schema",
                    "response_format.json_schema is required",
                )
            })?;
            let mut js = Fields::of(js, "response_format.json_schema")?;
            let name = js.string("name")?.map(str::to_string);
            let strict = js.bool("strict")?.unwrap_or(false);
            let schema = match js.get("schema") {
                Some(s @ Value::Object(_)) => s.clone(),
                Some(Value::Bool(b)) => Value::Bool(*b),
                Some(other) => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        format!(
                            "response_format.json_schema.schema must be an object, got {}",
                            type_name(other)
                        ),
                    ));
                }
                None => {
                    return Err(ApiError::invalid(
                        "response_format.json_schema.schema",
                        "response_format.json_schema.schema is required",
                    ));
                }
            };
            ResponseFormat::JsonSchema {
                name,
                schema,
                strict,
            }
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "response_format.type",
                format!("response_format.type {other:?} is not supported"),
            ));
        }
        None => {
            return Err(ApiError::invalid(
                "response_format.type",
                "response_format.type is required",
            ));
        }
    };
    match format {
        ResponseFormat::JsonObject if !opts.structured_outputs_supported => {
            Err(ApiError::unsupported("response_format json_object").with_param("response_format"))
        }
        ResponseFormat::JsonSchema { .. } if !opts.structured_outputs_supported => {
            Err(ApiError::unsupported("response_format json_schema").with_param("response_format"))
        }
        f => Ok(f),
    }
}

//! `POST /v1/responses` bodies, typed, and their translation into the
//! OpenAI chat body the rest of the pipeline already validates and renders
//! (as for the Anthropic Messages API: one set of range, tool-schema and
//! message checks for every API).
//!
//! kestrel keeps no server-side state, so everything that needs a stored
//! response (`previous_response_id`, `conversation`, `background`, item
//! references) is refused with a 400 that says so.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::fields::typed;
use crate::error::ApiError;

/// The top level of a Responses request. Unknown keys (`service_tier`,
/// `prompt_cache_key`, `safety_identifier`, `stream_options`, ...) are
/// accepted and ignored. `input` stays raw here: its items are parsed one
/// at a time ([`super::input`]) so an error names the item at fault.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub input: Option<Value>,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<ToolDefinition>>,
    /// Kept raw: it is echoed back as sent.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
    #[serde(default)]
    pub stream: Option<bool>,
    /// Accepted either way; nothing is ever stored.
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub reasoning: Option<ReasoningParam>,
    #[serde(default)]
    pub text: Option<TextParam>,
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub truncation: Option<String>,
    /// Accepted (Codex sends `reasoning.encrypted_content`); kestrel has no
    /// extra output to include.
    #[serde(default)]
    pub include: Option<Vec<String>>,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub conversation: Option<Value>,
    #[serde(default)]
    pub background: Option<bool>,
    #[serde(default)]
    pub prompt: Option<Value>,
    #[serde(default)]
    pub max_tool_calls: Option<u64>,
}

/// A tool in the Responses form: flat, `{"type": "function", "name", ...}`.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolDefinition {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default)]
    pub strict: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ReasoningParam {
    #[serde(default)]
    pub effort: Option<ReasoningEffort>,
    /// Accepted; the reasoning comes back as its full text, never summarised.
    #[serde(default)]
    pub summary: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReasoningEffort {
    None,
    Minimal,
    Low,
    Medium,
    High,
    Xhigh,
}

impl ReasoningEffort {
    pub fn as_str(self) -> &'static str {
        match self {
            ReasoningEffort::None => "none",
            ReasoningEffort::Minimal => "minimal",
            ReasoningEffort::Low => "low",
            ReasoningEffort::Medium => "medium",
            ReasoningEffort::High => "high",
            ReasoningEffort::Xhigh => "xhigh",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct TextParam {
    #[serde(default)]
    pub format: Option<TextFormat>,
    #[serde(default)]
    pub verbosity: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    Text {},
    JsonObject {},
    JsonSchema {
        name: String,
        schema: Value,
        #[serde(default)]
        description: Option<String>,
        #[serde(default)]
        strict: Option<bool>,
    },
}

/// A 400 for a feature that needs responses stored on the server.
fn not_stored(param: &str) -> ApiError {
    ApiError::invalid(
        param,
        format!(
            "{param} is not supported: this server does not store responses; \
             send the whole conversation in `input` instead"
        ),
    )
    .with_code("unsupported_parameter")
}

/// Parses a Responses body and refuses what this server cannot do.
pub fn parse_responses_body(body: &Value) -> Result<ResponsesRequest, ApiError> {
    let req: ResponsesRequest = typed(body, "")?;
    if req.previous_response_id.is_some() {
        return Err(not_stored("previous_response_id"));
    }
    if req.conversation.is_some() {
        return Err(not_stored("conversation"));
    }
    if req.background == Some(true) {
        return Err(not_stored("background"));
    }
    if req.prompt.is_some() {
        return Err(ApiError::unsupported("prompt"));
    }
    if req.max_tool_calls.is_some() {
        return Err(ApiError::unsupported("max_tool_calls"));
    }
    if req.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::unsupported("top_logprobs"));
    }
    if let Some(t) = req.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(ApiError::invalid(
            "truncation",
            format!("truncation {t:?} is not supported; only \"disabled\" is"),
        ));
    }
    if req.input.is_none() {
        return Err(ApiError::invalid("input", "input: Field required"));
    }
    if req.max_output_tokens == Some(0) {
        return Err(ApiError::invalid(
            "max_output_tokens",
            "max_output_tokens: must be greater than or equal to 1",
        ));
    }
    Ok(req)
}

impl ResponsesRequest {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub(super) fn tools(&self) -> &[ToolDefinition] {
        self.tools.as_deref().unwrap_or_default()
    }

    /// The equivalent `/v1/chat/completions` body.
    pub fn to_chat_body(&self) -> Result<Value, ApiError> {
        let mut chat = Map::new();
        if let Some(m) = &self.model {
            chat.insert("model".into(), json!(m));
        }
        let input = self.input.as_ref().unwrap_or(&Value::Null);
        let messages = super::input::chat_messages(self.instructions.as_deref(), input)?;
        chat.insert("messages".into(), Value::Array(messages));
        if let Some(n) = self.max_output_tokens {
            chat.insert("max_tokens".into(), json!(n));
        }
        for (key, v) in [("temperature", self.temperature), ("top_p", self.top_p)] {
            if let Some(v) = v {
                chat.insert(key.into(), json!(v));
            }
        }
        if self.stream() {
            chat.insert("stream".into(), json!(true));
        }
        if !self.tools().is_empty() {
            chat.insert("tools".into(), self.chat_tools()?);
        }
        if let Some(choice) = &self.tool_choice {
            chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
        }
        if let Some(p) = self.parallel_tool_calls {
            chat.insert("parallel_tool_calls".into(), json!(p));
        }
        if let Some(effort) = self.reasoning.as_ref().and_then(|r| r.effort) {
            let on = effort != ReasoningEffort::None;
            chat.insert(
                "chat_template_kwargs".into(),
                json!({"enable_thinking": on}),
            );
        }
        if let Some(format) = self.text.as_ref().and_then(|t| t.format.as_ref()) {
            chat.insert("response_format".into(), response_format(format));
        }
        if let Some(user) = &self.user {
            chat.insert("user".into(), json!(user));
        }
        Ok(Value::Object(chat))
    }

    fn chat_tools(&self) -> Result<Value, ApiError> {
        let mut out = Vec::with_capacity(self.tools().len());
        for (i, t) in self.tools().iter().enumerate() {
            if t.kind != "function" {
                return Err(ApiError::unsupported(format!("tool type {:?}", t.kind))
                    .with_param(format!("tools[{i}].type")));
            }
            let name = t.name.as_ref().ok_or_else(|| {
                ApiError::invalid(
                    format!("tools[{i}].name"),
                    format!("tools[{i}].name: Field required"),
                )
            })?;
            out.push(json!({"type": "function", "function": chat_function(t, name)}));
        }
        Ok(Value::Array(out))
    }
}

fn chat_function(t: &ToolDefinition, name: &str) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), json!(name));
    if let Some(d) = &t.description {
        function.insert("description".into(), json!(d));
    }
    let schema = t
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
    function.insert("parameters".into(), schema);
    if let Some(s) = t.strict {
        function.insert("strict".into(), json!(s));
    }
    Value::Object(function)
}

/// `none` / `auto` / `required` pass as they are; `{"type": "function",
/// "name": N}` becomes the chat form; hosted-tool and `allowed_tools`
/// choices are refused.
fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    let bad = |msg: String| ApiError::invalid("tool_choice", msg);
    match choice {
        Value::String(_) => Ok(choice.clone()),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some("function") => match o.get("name").and_then(Value::as_str) {
                Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
                None => Err(bad("tool_choice.name: Field required".into())),
            },
            Some(other) => Err(ApiError::unsupported(format!("tool_choice type {other:?}"))
                .with_param("tool_choice.type")),
            None => Err(bad("tool_choice.type: Field required".into())),
        },
        other => Err(bad(format!(
            "tool_choice must be a string or an object, got {}",
            crate::validate::type_name(other)
        ))),
    }
}

pub(super) fn response_format(format: &TextFormat) -> Value {
    match format {
        TextFormat::Text {} => json!({"type": "text"}),
        TextFormat::JsonObject {} => json!({"type": "json_object"}),
        TextFormat::JsonSchema {
            name,
            schema,
            strict,
            ..
        } => json!({
            "type": "json_schema",
            "json_schema": {"name": name, "schema": schema, "strict": strict.unwrap_or(false)},
        }),
    }
}

/// Chat-validation errors name chat fields; this names the Responses field
/// the client actually sent. (Chat message indices do not match input item
/// indices, so a message error points at `input` as a whole; the items are
/// checked before translation, so that is rare.)
pub fn in_responses_terms(mut e: ApiError) -> ApiError {
    const RENAMES: [(&str, &str); 3] = [
        ("max_tokens", "max_output_tokens"),
        ("response_format.json_schema", "text.format"),
        ("response_format", "text.format"),
    ];
    let Some(param) = e.param.take() else {
        return e;
    };
    if param.starts_with("messages") {
        e.param = Some("input".into());
        return e;
    }
    let mut renamed = tool_field(&param);
    for (from, to) in RENAMES {
        if let Some(rest) = renamed.strip_prefix(from) {
            renamed = format!("{to}{rest}");
            break;
        }
    }
    if let Some(rest) = e.message.strip_prefix(param.as_str()) {
        e.message = format!("{renamed}{rest}");
    }
    e.param = Some(renamed);
    e
}

/// `tools[0].function.parameters` -> `tools[0].parameters`.
fn tool_field(param: &str) -> String {
    match param.split_once("].function") {
        Some((head, tail)) if head.starts_with("tools[") => format!("{head}]{tail}"),
        _ => param.to_string(),
    }
}

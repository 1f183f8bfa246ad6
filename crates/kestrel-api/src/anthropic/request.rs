//! `POST /v1/messages` bodies, typed, and their translation into the
//! OpenAI chat body the rest of the pipeline already validates and renders.
//!
//! Translating to the chat body (rather than to the validated struct
//! directly) keeps one set of range checks, tool-schema checks and message
//! rules for both APIs: an Anthropic request is accepted exactly when its
//! chat translation is.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The top level of a Messages request. Unknown keys (`service_tier`,
/// `container`, `cache_control` on blocks, ...) are accepted and ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    #[serde(default)]
    pub model: Option<String>,
    /// Required by `/v1/messages`, not by `count_tokens`.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    pub messages: Vec<InputMessage>,
    #[serde(default)]
    pub system: Option<Content>,
    #[serde(default)]
    pub stop_sequences: Vec<String>,
    #[serde(default)]
    pub temperature: Option<f64>,
    #[serde(default)]
    pub top_p: Option<f64>,
    #[serde(default)]
    pub top_k: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub tools: Vec<ToolDefinition>,
    #[serde(default)]
    pub tool_choice: Option<ToolChoiceParam>,
    #[serde(default)]
    pub thinking: Option<ThinkingParam>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct InputMessage {
    pub role: Role,
    pub content: Content,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    User,
    Assistant,
    /// Instructions between the turns (Claude Code sends its environment
    /// and tool notes this way); text blocks only.
    System,
}

/// A string, or a list of content blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(items) => items
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    serde_json::from_value(v)
                        .map_err(|e| D::Error::custom(format!("content block {i}: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(Content::Blocks),
            other => Err(D::Error::custom(format!(
                "expected a string or an array of content blocks, got {}",
                crate::validate::type_name(&other)
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        #[serde(default)]
        input: Value,
    },
    ToolResult {
        tool_use_id: String,
        #[serde(default)]
        content: Option<Content>,
        #[serde(default)]
        is_error: bool,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    /// Encrypted reasoning from another provider: nothing to render.
    RedactedThinking {},
    Image {},
    Document {},
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolDefinition {
    /// Absent or `custom`; server tools (`web_search_...`, `bash_...`) are refused.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub input_schema: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoiceParam {
    Auto {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    Any {
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    Tool {
        name: String,
        #[serde(default)]
        disable_parallel_tool_use: bool,
    },
    None {},
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ThinkingParam {
    Enabled {
        #[serde(default)]
        budget_tokens: Option<u64>,
    },
    /// The model decides; rendered as thinking on.
    Adaptive {},
    Disabled {},
}

#[derive(Debug, Clone, Deserialize)]
pub struct Metadata {
    #[serde(default)]
    pub user_id: Option<String>,
}

/// How the system prompt is rewritten before rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Normalization {
    /// Drop `x-anthropic-billing-header:` lines (see [`strip_billing_header`]).
    pub strip_billing_header: bool,
    /// Whether the chat template renders a `system` message after the
    /// conversation has started. When it does, a `system` message of
    /// `messages` that follows a user or assistant turn stays a `system`
    /// message in place; when it does not (Qwen3.6's template refuses one),
    /// its text joins the user turn at that point. `system` messages before
    /// the first turn always join the system prompt.
    pub late_system_messages: bool,
}

impl Default for Normalization {
    fn default() -> Self {
        Normalization {
            strip_billing_header: true,
            late_system_messages: true,
        }
    }
}

/// The line prefix Claude Code writes at the top of its system prompt.
pub const BILLING_HEADER_PREFIX: &str = "x-anthropic-billing-header:";

/// Removes Claude Code's `x-anthropic-billing-header: cc_version=...;
/// cc_entrypoint=...; cch=...;` lines. The line carries telemetry, not
/// instructions, and its `cch` hash changes with every request; left in, it
/// sits at the very start of the prompt and no two requests share a cached
/// prefix.
pub fn strip_billing_header(text: &str) -> String {
    if !text.contains(BILLING_HEADER_PREFIX) {
        return text.to_string();
    }
    text.split_inclusive('\n')
        .filter(|line| !line.trim_start().starts_with(BILLING_HEADER_PREFIX))
        .collect()
}

/// Parses a Messages body. `count_tokens` passes `require_max_tokens = false`.
pub fn parse_messages_body(
    body: &Value,
    require_max_tokens: bool,
) -> Result<MessagesRequest, ApiError> {
    let req: MessagesRequest = serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let param = if path == "." { None } else { Some(path) };
        let inner = e.into_inner().to_string();
        let mut err = ApiError::new(
            crate::ErrorKind::InvalidRequest,
            match &param {
                Some(p) => format!("{p}: {inner}"),
                None => inner,
            },
        );
        err.param = param;
        err
    })?;
    if require_max_tokens && req.max_tokens.is_none() {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: Field required",
        ));
    }
    if req.max_tokens == Some(0) {
        return Err(ApiError::invalid(
            "max_tokens",
            "max_tokens: must be greater than or equal to 1",
        ));
    }
    // `system` messages are notes between the turns, not a turn: a
    // conversation of them alone has nothing to answer.
    if !req.messages.is_empty() && req.messages.iter().all(|m| m.role == Role::System) {
        return Err(ApiError::invalid(
            "messages",
            "messages: at least one message with role user or assistant is required",
        ));
    }
    Ok(req)
}

/// The context-length check of `/v1/messages`, worded as Anthropic's API
/// words it: clients read these messages (Claude Code retries with the
/// `max_tokens` that fits when it finds the three numbers).
pub fn check_context(
    prompt_tokens: usize,
    max_tokens: u32,
    max_model_len: usize,
) -> Result<(), ApiError> {
    if prompt_tokens >= max_model_len {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "prompt is too long: {prompt_tokens} tokens > {} maximum",
                max_model_len.saturating_sub(1)
            ),
        ));
    }
    if prompt_tokens + max_tokens as usize > max_model_len {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "input length and `max_tokens` exceed context limit: \
                 {prompt_tokens} + {max_tokens} > {max_model_len}, \
                 decrease input length or `max_tokens` and try again"
            ),
        ));
    }
    Ok(())
}

impl MessagesRequest {
    /// The equivalent `/v1/chat/completions` body.
    pub fn to_chat_body(&self, norm: Normalization) -> Result<Value, ApiError> {
        let mut chat = Map::new();
        if let Some(m) = &self.model {
            chat.insert("model".into(), json!(m));
        }
        chat.insert("messages".into(), Value::Array(self.chat_messages(norm)?));
        if let Some(n) = self.max_tokens {
            chat.insert("max_tokens".into(), json!(n));
        }
        for (key, v) in [("temperature", self.temperature), ("top_p", self.top_p)] {
            if let Some(v) = v {
                chat.insert(key.into(), json!(v));
            }
        }
        if let Some(k) = self.top_k {
            chat.insert("top_k".into(), json!(k));
        }
        if !self.stop_sequences.is_empty() {
            chat.insert("stop".into(), json!(self.stop_sequences));
        }
        if self.stream {
            chat.insert("stream".into(), json!(true));
        }
        if !self.tools.is_empty() {
            chat.insert("tools".into(), self.chat_tools()?);
        }
        if let Some(choice) = &self.tool_choice {
            let (value, no_parallel) = match choice {
                ToolChoiceParam::Auto {
                    disable_parallel_tool_use,
                } => (json!("auto"), *disable_parallel_tool_use),
                ToolChoiceParam::Any {
                    disable_parallel_tool_use,
                } => (json!("required"), *disable_parallel_tool_use),
                ToolChoiceParam::Tool {
                    name,
                    disable_parallel_tool_use,
                } => (
                    json!({"type": "function", "function": {"name": name}}),
                    *disable_parallel_tool_use,
                ),
                ToolChoiceParam::None {} => (json!("none"), false),
            };
            // `auto` without tools means no tools; a forced choice without
            // them is refused by the chat validation.
            if !self.tools.is_empty() || value != "auto" {
                chat.insert("tool_choice".into(), value);
            }
            if no_parallel {
                chat.insert("parallel_tool_calls".into(), json!(false));
            }
        }
        // Anthropic's models think only when asked: without `thinking` (as
        // Claude Code sends with thinking switched off) there is none, even
        // where the chat template thinks by default.
        let thinking = matches!(
            self.thinking,
            Some(ThinkingParam::Enabled { .. } | ThinkingParam::Adaptive {})
        );
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": thinking}),
        );
        if let Some(user) = self.metadata.as_ref().and_then(|m| m.user_id.as_ref()) {
            chat.insert("user".into(), json!(user));
        }
        Ok(Value::Object(chat))
    }

    fn chat_tools(&self) -> Result<Value, ApiError> {
        let mut out = Vec::with_capacity(self.tools.len());
        for (i, t) in self.tools.iter().enumerate() {
            if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
                return Err(ApiError::unsupported(format!("server tool type {kind:?}"))
                    .with_param(format!("tools[{i}].type")));
            }
            let mut function = Map::new();
            function.insert("name".into(), json!(t.name));
            if let Some(d) = &t.description {
                function.insert("description".into(), json!(d));
            }
            let schema = t
                .input_schema
                .clone()
                .unwrap_or_else(|| json!({"type": "object"}));
            function.insert("parameters".into(), schema);
            out.push(json!({"type": "function", "function": function}));
        }
        Ok(Value::Array(out))
    }
}

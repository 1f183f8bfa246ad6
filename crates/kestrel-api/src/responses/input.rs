//! The Responses `input` as chat messages: `instructions` and leading
//! system/developer messages become one system message; message items keep
//! their role (`developer` is a system message); `function_call` items join
//! the assistant turn they belong to as tool calls; `function_call_output`
//! items become `tool` messages; a `reasoning` item becomes the
//! `reasoning_content` of the assistant turn that follows it.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::fields::typed;
use crate::error::{ApiError, ErrorKind};

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    FunctionCallOutput(FunctionCallOutputItem),
    Reasoning(ReasoningItem),
    ItemReference {},
}

/// A message; `type: "message"` may be left out (the "easy" input form).
#[derive(Debug, Clone, Deserialize)]
struct MessageItem {
    role: Role,
    content: MessageContent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    System,
    Developer,
    Assistant,
}

/// A string, or a list of content parts.
#[derive(Debug, Clone)]
enum MessageContent {
    Text(String),
    Parts(Vec<Part>),
}

impl<'de> Deserialize<'de> for MessageContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match Value::deserialize(d)? {
            Value::String(s) => Ok(MessageContent::Text(s)),
            Value::Array(parts) => parts
                .into_iter()
                .enumerate()
                .map(|(i, v)| {
                    serde_json::from_value(v)
                        .map_err(|e| D::Error::custom(format!("content part {i}: {e}")))
                })
                .collect::<Result<_, _>>()
                .map(MessageContent::Parts),
            other => Err(D::Error::custom(format!(
                "expected a string or an array of content parts, got {}",
                crate::validate::type_name(&other)
            ))),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part {
    InputText { text: String },
    OutputText { text: String },
    Refusal { refusal: String },
    InputImage {},
    InputFile {},
    InputAudio {},
}

#[derive(Debug, Clone, Deserialize)]
struct FunctionCallItem {
    call_id: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Clone, Deserialize)]
struct FunctionCallOutputItem {
    call_id: String,
    output: MessageContent,
}

#[derive(Debug, Clone, Deserialize)]
struct ReasoningItem {
    #[serde(default)]
    summary: Vec<TextPart>,
    #[serde(default)]
    content: Option<Vec<TextPart>>,
}

/// A `summary_text` or `reasoning_text` part.
#[derive(Debug, Clone, Deserialize)]
struct TextPart {
    text: String,
}

/// The chat messages for `instructions` and `input`.
pub(super) fn chat_messages(
    instructions: Option<&str>,
    input: &Value,
) -> Result<Vec<Value>, ApiError> {
    let mut conv = Conversation::default();
    if let Some(text) = instructions.filter(|t| !t.is_empty()) {
        conv.system(text);
    }
    match input {
        Value::String(text) => conv.push(json!({"role": "user", "content": text})),
        Value::Array(items) => {
            for (i, raw) in items.iter().enumerate() {
                let param = format!("input[{i}]");
                let item = parse_item(raw, &param)?;
                conv.item(item).map_err(|e| prefixed(e, &param))?;
            }
        }
        other => {
            return Err(ApiError::invalid(
                "input",
                format!(
                    "input must be a string or an array of items, got {}",
                    crate::validate::type_name(other)
                ),
            ));
        }
    }
    Ok(conv.messages)
}

fn parse_item(raw: &Value, param: &str) -> Result<InputItem, ApiError> {
    let untyped_message = raw.is_object() && raw.get("type").is_none_or(Value::is_null);
    if untyped_message {
        return typed(raw, param).map(InputItem::Message);
    }
    // The known types parsed as their own structs, so an error names the
    // field at fault (a tagged enum's error does not).
    match raw.get("type").and_then(Value::as_str) {
        Some("message") => typed(raw, param).map(InputItem::Message),
        Some("function_call") => typed(raw, param).map(InputItem::FunctionCall),
        Some("function_call_output") => typed(raw, param).map(InputItem::FunctionCallOutput),
        Some("reasoning") => typed(raw, param).map(InputItem::Reasoning),
        _ => typed(raw, param),
    }
}

fn prefixed(mut e: ApiError, param: &str) -> ApiError {
    e.message = format!("{param}: {}", e.message);
    e.param = Some(param.to_string());
    e
}

#[derive(Default)]
struct Conversation {
    messages: Vec<Value>,
    /// Reasoning sent back from an earlier turn, waiting for that turn's
    /// assistant message or call.
    reasoning: Option<String>,
    /// The last message is an assistant turn that tool calls may join.
    assistant_open: bool,
    /// The `call_id`s of the function calls so far: a function call output
    /// must answer one of them.
    call_ids: Vec<String>,
}

impl Conversation {
    fn push(&mut self, message: Value) {
        self.assistant_open = message["role"] == "assistant";
        self.messages.push(message);
    }

    /// A system message: merged into the first one while nothing else came
    /// before it (templates expect at most one, at the start).
    fn system(&mut self, text: &str) {
        let only_system = self.messages.iter().all(|m| m["role"] == "system");
        match self.messages.first_mut() {
            Some(first) if only_system => {
                let joined = format!("{}\n\n{text}", first["content"].as_str().unwrap_or(""));
                first["content"] = json!(joined);
            }
            _ => self.push(json!({"role": "system", "content": text})),
        }
    }

    fn item(&mut self, item: InputItem) -> Result<(), ApiError> {
        match item {
            InputItem::Message(m) => self.message(m)?,
            InputItem::FunctionCall(call) => self.function_call(call)?,
            InputItem::FunctionCallOutput(out) => {
                if !self.call_ids.contains(&out.call_id) {
                    return Err(ApiError::new(
                        ErrorKind::InvalidRequest,
                        format!(
                            "no function_call item before it has call_id {:?}",
                            out.call_id
                        ),
                    ));
                }
                let text = content_text(&out.output)?;
                self.push(json!({"role": "tool", "tool_call_id": out.call_id, "content": text}));
            }
            InputItem::Reasoning(r) => {
                let text = reasoning_text(&r);
                match &mut self.reasoning {
                    Some(held) => {
                        held.push('\n');
                        held.push_str(&text);
                    }
                    None => self.reasoning = Some(text),
                }
            }
            InputItem::ItemReference {} => {
                return Err(ApiError::new(
                    ErrorKind::InvalidRequest,
                    "item_reference is not supported: this server does not store items; \
                     send the items themselves",
                ));
            }
        }
        Ok(())
    }

    fn message(&mut self, m: MessageItem) -> Result<(), ApiError> {
        match m.role {
            Role::System | Role::Developer => {
                let text = content_text(&m.content)?;
                self.system(&text);
            }
            Role::User => {
                let content = match &m.content {
                    MessageContent::Text(t) => json!(t),
                    MessageContent::Parts(_) => {
                        let text = content_text(&m.content)?;
                        json!([{"type": "text", "text": text}])
                    }
                };
                self.push(json!({"role": "user", "content": content}));
            }
            Role::Assistant => {
                let text = content_text(&m.content)?;
                let mut message = Map::new();
                message.insert("role".into(), json!("assistant"));
                message.insert("content".into(), json!(text));
                if let Some(r) = self.reasoning.take() {
                    message.insert("reasoning_content".into(), json!(r));
                }
                self.push(Value::Object(message));
            }
        }
        Ok(())
    }

    fn function_call(&mut self, call: FunctionCallItem) -> Result<(), ApiError> {
        if call.name.is_empty() {
            return Err(ApiError::new(
                ErrorKind::InvalidRequest,
                "name must be a non-empty string",
            ));
        }
        let arguments_ok = call.arguments.trim().is_empty()
            || matches!(serde_json::from_str(&call.arguments), Ok(Value::Object(_)));
        if !arguments_ok {
            return Err(ApiError::new(
                ErrorKind::InvalidRequest,
                "arguments must be a JSON object encoded as a string",
            ));
        }
        self.call_ids.push(call.call_id.clone());
        let tool_call = json!({
            "id": call.call_id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        });
        let joins = self.assistant_open && self.reasoning.is_none();
        if let (true, Some(last)) = (joins, self.messages.last_mut()) {
            match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                Some(calls) => calls.push(tool_call),
                None => last["tool_calls"] = json!([tool_call]),
            }
            return Ok(());
        }
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(""));
        if let Some(r) = self.reasoning.take() {
            message.insert("reasoning_content".into(), json!(r));
        }
        message.insert("tool_calls".into(), json!([tool_call]));
        self.push(Value::Object(message));
        Ok(())
    }
}

/// The text of a message's content (parts joined with "\n"); images, files
/// and audio are refused.
fn content_text(content: &MessageContent) -> Result<String, ApiError> {
    let parts = match content {
        MessageContent::Text(t) => return Ok(t.clone()),
        MessageContent::Parts(parts) => parts,
    };
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        match part {
            Part::InputText { text } | Part::OutputText { text } => texts.push(text.as_str()),
            Part::Refusal { refusal } => texts.push(refusal.as_str()),
            Part::InputImage {} | Part::InputFile {} | Part::InputAudio {} => {
                let kind = match part {
                    Part::InputImage {} => "input_image",
                    Part::InputFile {} => "input_file",
                    _ => "input_audio",
                };
                return Err(ApiError::unsupported(format!("{kind} content")));
            }
        }
    }
    Ok(texts.join("\n"))
}

/// A reasoning item's text: its full content when sent, else its summary.
fn reasoning_text(r: &ReasoningItem) -> String {
    let parts = match &r.content {
        Some(c) if !c.is_empty() => c,
        _ => &r.summary,
    };
    parts
        .iter()
        .map(|p| p.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

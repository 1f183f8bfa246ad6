//! Validated internal requests. Everything here has passed range and type
//! checks; the server maps it to the engine's sampling parameters.

use serde_json::{Map, Value};

/// Sampling and stopping fields as the client gave them, with vLLM's names.
/// `None` means "not given": the server fills it from the model's
/// generation config or vLLM's neutral defaults via [`SamplingRequest::resolve`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingRequest {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// 0 means disabled (the client's -1 is mapped to 0).
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Also accepted as `repeat_penalty`.
    pub repetition_penalty: Option<f32>,
    /// From `max_completion_tokens`, else `max_tokens`. `None`: until EOS or
    /// the end of the context (see [`crate::validate::check_context_length`]).
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    /// Number of top logprobs per token when logprobs were asked for
    /// (only when [`crate::ValidationOptions::logprobs_supported`]): chat's
    /// `top_logprobs` (0 when not given), completions' `logprobs`.
    pub logprobs: Option<u32>,
    /// vLLM's `prompt_logprobs`: alternatives per prompt position.
    pub prompt_logprobs: Option<u32>,
}

/// Defaults for fields the client left out (model generation config or
/// vLLM's neutral values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
}

impl Default for SamplingDefaults {
    /// vLLM's `SamplingParams` defaults: no filtering, no penalties.
    fn default() -> Self {
        SamplingDefaults {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
        }
    }
}

/// Sampling fields as plain numbers, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationParams {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub repetition_penalty: f32,
    pub max_tokens: Option<u32>,
    pub min_tokens: u32,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub include_stop_str_in_output: bool,
    pub skip_special_tokens: bool,
    pub spaces_between_special_tokens: bool,
    pub logprobs: Option<u32>,
    pub prompt_logprobs: Option<u32>,
}

impl SamplingRequest {
    pub fn resolve(&self, d: &SamplingDefaults) -> GenerationParams {
        GenerationParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_p: self.top_p.unwrap_or(d.top_p),
            top_k: self.top_k.unwrap_or(d.top_k),
            min_p: self.min_p.unwrap_or(d.min_p),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            max_tokens: self.max_tokens,
            min_tokens: self.min_tokens,
            seed: self.seed,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            include_stop_str_in_output: self.include_stop_str_in_output,
            skip_special_tokens: self.skip_special_tokens,
            spaces_between_special_tokens: self.spaces_between_special_tokens,
            logprobs: self.logprobs,
            prompt_logprobs: self.prompt_logprobs,
        }
    }
}

/// A message's content: a plain string or a list of text parts.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageContent {
    Text(String),
    /// Text of each `{"type":"text","text":...}` part, in order. Kept apart
    /// because chat templates may render parts individually.
    Parts(Vec<String>),
}

impl MessageContent {
    /// All text joined with `sep` (vLLM joins parts with "\n").
    pub fn joined(&self, sep: &str) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(p) => p.join(sep),
        }
    }
}

/// An assistant's earlier tool call, as given in the history.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryToolCall {
    pub id: Option<String>,
    pub name: String,
    /// Parsed arguments (templates iterate them as a mapping). A string that
    /// does not parse as JSON is rejected at validation.
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatMessage {
    /// system, developer, user, assistant or tool.
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    /// From `reasoning_content` or `reasoning` (both accepted).
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<HistoryToolCall>,
    pub tool_call_id: Option<String>,
}

/// One function tool from the request.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// JSON schema of the arguments (`{}` when absent); drives the
    /// coercion of XML tool-call values.
    pub parameters: Value,
    /// The tool object exactly as sent, for the chat template.
    pub raw: Value,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    None,
    Auto,
    Required,
    Named(String),
}

#[derive(Debug, Clone, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    /// The schema object of `json_schema.schema`.
    JsonSchema {
        name: Option<String>,
        schema: Value,
        strict: bool,
    },
}

/// What the output must match, from `response_format` or vLLM's
/// `structured_outputs` / `guided_*` fields (see `validate::structured`).
#[derive(Debug, Clone, PartialEq)]
pub enum StructuredOutput {
    /// A JSON schema (`response_format` json_schema, `guided_json`).
    JsonSchema(Value),
    /// Any JSON object (`response_format` json_object).
    JsonObject,
    /// A regular expression the whole output matches.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A grammar in llguidance's Lark syntax (`guided_grammar`).
    Lark(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub model: Option<String>,
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// Passed to the chat template as keyword arguments.
    pub chat_template_kwargs: Map<String, Value>,
    /// `chat_template_kwargs.enable_thinking` (or a top-level
    /// `enable_thinking`); `None` means the template's default.
    pub enable_thinking: Option<bool>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    pub response_format: ResponseFormat,
    /// The output constraint, from `response_format` or the vLLM fields.
    pub structured_output: Option<StructuredOutput>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplingRequest,
    /// Number of choices, each generated on its own (1 when not given).
    pub n: u32,
    pub truncate_prompt_tokens: Option<u32>,
    pub user: Option<String>,
    /// Top-level keys that were not recognised (accepted; log at debug).
    pub ignored_keys: Vec<String>,
}

/// A completions prompt: text, or token ids.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: Prompt,
    /// Return the prompt before the completion (and, with `logprobs`, the
    /// prompt tokens' logprobs first).
    pub echo: bool,
    pub response_format: ResponseFormat,
    pub structured_output: Option<StructuredOutput>,
    pub stream: bool,
    pub include_usage: bool,
    pub sampling: SamplingRequest,
    /// Number of choices, each generated on its own (1 when not given).
    pub n: u32,
    pub truncate_prompt_tokens: Option<u32>,
    pub user: Option<String>,
    pub ignored_keys: Vec<String>,
}

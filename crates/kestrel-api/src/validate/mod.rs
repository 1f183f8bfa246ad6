//! Request validation: JSON body -> validated internal request, where every
//! problem is a 400 naming the parameter (never a panic, never a 5xx).

mod chat;
mod completion;
mod fields;
mod messages;
mod sampling;
mod structured;
mod tokenize;
mod tools;

use serde_json::Value;

pub use chat::parse_chat_request;
pub use completion::parse_completion_request;
pub use sampling::{MAX_STOP_STRING_BYTES, MAX_STOP_STRINGS, MAX_TOP_LOGPROBS};
pub use tokenize::{
    DetokenizeRequest, TokenizeInput, TokenizeRequest, check_token_ids, parse_detokenize_request,
    parse_tokenize_request,
};

use crate::error::ApiError;
pub(crate) use fields::type_name;
use fields::{Fields, Result};

/// What the server implements, and its limits; requests for anything else
/// are refused with a 400 instead of being silently ignored.
#[derive(Debug, Clone)]
pub struct ValidationOptions {
    /// Largest `n`; 1 means `n > 1` is "not supported".
    pub max_n: u32,
    pub logprobs_supported: bool,
    /// `response_format` json_object / json_schema.
    pub structured_outputs_supported: bool,
    /// A tool-call parser is configured (needed for `tool_choice: "auto"`).
    pub tool_parser_enabled: bool,
    /// `tool_choice: "required"` or a named function can be enforced.
    pub forced_tool_choice_supported: bool,
    /// Reject unknown top-level keys instead of accepting them.
    pub strict_params: bool,
    pub max_messages: usize,
}

impl Default for ValidationOptions {
    fn default() -> Self {
        ValidationOptions {
            max_n: 1,
            logprobs_supported: false,
            structured_outputs_supported: false,
            tool_parser_enabled: true,
            forced_tool_choice_supported: false,
            strict_params: false,
            max_messages: 100_000,
        }
    }
}

/// Parses a request body; invalid JSON, nesting deeper than serde_json's
/// limit of 128, or a non-object body -> 400.
pub fn parse_json_body(bytes: &[u8]) -> std::result::Result<Value, ApiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            crate::ErrorKind::InvalidRequest,
            format!("request body is not valid JSON: {e}"),
        )
    })?;
    if !value.is_object() {
        return Err(ApiError::new(
            crate::ErrorKind::InvalidRequest,
            format!(
                "request body must be a JSON object, got {}",
                fields::type_name(&value)
            ),
        ));
    }
    Ok(value)
}

/// Root object of a request body.
fn root(body: &Value) -> Result<Fields<'_>> {
    match body {
        Value::Object(map) => Ok(Fields::new(map, "")),
        other => Err(ApiError::new(
            crate::ErrorKind::InvalidRequest,
            format!(
                "request body must be a JSON object, got {}",
                fields::type_name(other)
            ),
        )),
    }
}

/// `stream` and `stream_options.include_usage`.
fn parse_stream(f: &mut Fields) -> Result<(bool, bool)> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let Some(opts) = f.get("stream_options") else {
        return Ok((stream, false));
    };
    if !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    let mut o = Fields::of(opts, "stream_options")?;
    let include_usage = o.bool("include_usage")?.unwrap_or(false);
    if o.bool("continuous_usage_stats")?.unwrap_or(false) {
        return Err(ApiError::unsupported(
            "stream_options.continuous_usage_stats",
        ));
    }
    Ok((stream, include_usage))
}

/// Unknown top-level keys: returned for a debug log, or a 400 in strict mode.
fn unknown_keys(f: &mut Fields, opts: &ValidationOptions) -> Result<Vec<String>> {
    // Harmless OpenAI fields with no effect on generation here.
    f.accept(&[
        "store",
        "metadata",
        "service_tier",
        "request_id",
        "priority",
    ]);
    let keys = f.unknown_keys();
    if opts.strict_params
        && let Some(k) = keys.first()
    {
        return Err(ApiError::invalid(
            k.clone(),
            format!("unknown parameter {k:?}"),
        ));
    }
    Ok(keys)
}

fn truncate_prompt_tokens(f: &mut Fields) -> Result<Option<u32>> {
    Ok(f.int_in("truncate_prompt_tokens", 1, u32::MAX as i128)?
        .map(|v| v as u32))
}

/// Checks prompt length plus `max_tokens` against the context and returns
/// the number of tokens to generate (an omitted `max_tokens` means "up to the
/// end of the context", as vLLM does, since thinking models need room).
pub fn check_context_length(
    prompt_tokens: usize,
    max_tokens: Option<u32>,
    max_model_len: usize,
) -> std::result::Result<u32, ApiError> {
    if prompt_tokens >= max_model_len {
        return Err(ApiError::invalid(
            "messages",
            format!(
                "This model's maximum context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens. Please reduce the length of the input."
            ),
        ));
    }
    let room = max_model_len - prompt_tokens;
    match max_tokens {
        None => Ok(room.min(u32::MAX as usize) as u32),
        Some(m) if m as usize <= room => Ok(m),
        Some(m) => Err(ApiError::invalid(
            "max_tokens",
            format!(
                "This model's maximum context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens ({m} > {max_model_len} - {prompt_tokens}). Please reduce the length of the input or of max_tokens."
            ),
        )),
    }
}

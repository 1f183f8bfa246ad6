//! `POST /v1/completions` bodies.

use serde_json::Value;

use super::fields::{Result, type_name};
use super::sampling::{
    MAX_TOP_LOGPROBS, parse_n, parse_prompt_logprobs, parse_sampling, reject_unsupported, token_id,
};
use super::structured::parse_structured_output;
use super::tools::parse_response_format;
use super::{ValidationOptions, parse_stream, root, truncate_prompt_tokens, unknown_keys};
use crate::error::ApiError;
use crate::request::{CompletionRequest, Prompt};

pub fn parse_completion_request(
    body: &Value,
    opts: &ValidationOptions,
) -> Result<CompletionRequest> {
    let mut f = root(body)?;
    let model = f.string("model")?.map(str::to_string);
    let prompt = parse_prompt(f.get("prompt"))?;
    reject_unsupported(&mut f)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    if f.get("suffix").is_some() {
        return Err(ApiError::unsupported("suffix"));
    }
    // `max_tokens: 0` computes the prompt alone (its echo and logprobs).
    let mut sampling = parse_sampling(&mut f, 0)?;
    sampling.prompt_logprobs = parse_prompt_logprobs(&mut f, opts)?;
    let n = parse_n(&mut f, opts)?;
    if let Some(n) = f.int_in("logprobs", 0, MAX_TOP_LOGPROBS)? {
        if !opts.logprobs_supported {
            return Err(ApiError::unsupported("logprobs"));
        }
        sampling.logprobs = Some(n as u32);
    }
    let response_format = parse_response_format(f.get("response_format"), opts)?;
    let structured_output = parse_structured_output(&mut f, &response_format, opts)?;
    let (stream, include_usage) = parse_stream(&mut f)?;
    let truncate_prompt_tokens = truncate_prompt_tokens(&mut f)?;
    let user = f.string("user")?.map(str::to_string);
    let ignored_keys = unknown_keys(&mut f, opts)?;
    Ok(CompletionRequest {
        model,
        prompt,
        echo,
        response_format,
        structured_output,
        stream,
        include_usage,
        sampling,
        n,
        truncate_prompt_tokens,
        user,
        ignored_keys,
    })
}

/// A string, a list of token ids, or a one-element batch of either.
fn parse_prompt(value: Option<&Value>) -> Result<Prompt> {
    let prompt = match value {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(items)) => match items.first() {
            None => return Err(ApiError::invalid("prompt", "prompt must not be empty")),
            Some(Value::Number(_)) => Prompt::Tokens(token_ids(items, "prompt")?),
            Some(Value::String(_)) | Some(Value::Array(_)) if items.len() > 1 => {
                return Err(ApiError::unsupported("batched prompts").with_param("prompt"));
            }
            Some(Value::String(s)) => Prompt::Text(s.clone()),
            Some(Value::Array(ids)) => Prompt::Tokens(token_ids(ids, "prompt[0]")?),
            Some(other) => {
                return Err(ApiError::invalid(
                    "prompt[0]",
                    format!(
                        "prompt[0] must be a string or a token id, got {}",
                        type_name(other)
                    ),
                ));
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "prompt must be a string or an array, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    let empty = match &prompt {
        Prompt::Text(s) => s.is_empty(),
        Prompt::Tokens(t) => t.is_empty(),
    };
    if empty {
        return Err(ApiError::invalid("prompt", "prompt must not be empty"));
    }
    Ok(prompt)
}

fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| token_id(v, &format!("{param}[{i}]")))
        .collect()
}

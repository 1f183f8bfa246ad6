//! `POST /v1/chat/completions` bodies.

use serde_json::Value;

use super::fields::{Result, type_name};
use super::messages::parse_messages;
use super::sampling::{
    MAX_TOP_LOGPROBS, parse_n, parse_prompt_logprobs, parse_sampling, reject_unsupported,
};
use super::structured::parse_structured_output;
use super::tools::{parse_response_format, parse_tool_choice, parse_tools};
use super::{ValidationOptions, parse_stream, root, truncate_prompt_tokens, unknown_keys};
use crate::error::ApiError;
use crate::request::ChatRequest;

pub fn parse_chat_request(body: &Value, opts: &ValidationOptions) -> Result<ChatRequest> {
    let mut f = root(body)?;
    let model = f.string("model")?.map(str::to_string);
    let messages = parse_messages(f.get("messages"), opts.max_messages)?;
    reject_unsupported(&mut f)?;
    for name in [
        "functions",
        "function_call",
        "audio",
        "prediction",
        "web_search_options",
    ] {
        if f.get(name).is_some() {
            return Err(ApiError::unsupported(name));
        }
    }
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::unsupported("echo"));
    }
    check_modalities(f.get("modalities"))?;

    let mut sampling = parse_sampling(&mut f, 1)?;
    sampling.prompt_logprobs = parse_prompt_logprobs(&mut f, opts)?;
    let n = parse_n(&mut f, opts)?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top_logprobs = f.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if top_logprobs.is_some() && !logprobs {
        return Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        ));
    }
    if logprobs {
        if !opts.logprobs_supported {
            return Err(ApiError::unsupported("logprobs"));
        }
        sampling.logprobs = Some(top_logprobs.unwrap_or(0) as u32);
    }

    let tools = parse_tools(f.get("tools"))?;
    let tool_choice = parse_tool_choice(f.get("tool_choice"), &tools, opts)?;
    let parallel_tool_calls = f.bool("parallel_tool_calls")?.unwrap_or(true);

    let chat_template_kwargs = match f.get("chat_template_kwargs") {
        None => Default::default(),
        Some(Value::Object(m)) => m.clone(),
        Some(other) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                format!(
                    "chat_template_kwargs must be an object, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    let enable_thinking = match chat_template_kwargs.get("enable_thinking") {
        None | Some(Value::Null) => f.bool("enable_thinking")?,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs.enable_thinking",
                format!(
                    "chat_template_kwargs.enable_thinking must be a boolean, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
    let continue_final_message = f.bool("continue_final_message")?.unwrap_or(false);
    if add_generation_prompt && continue_final_message {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message and add_generation_prompt cannot both be true",
        ));
    }
    if continue_final_message && messages.last().is_some_and(|m| m.role != "assistant") {
        return Err(ApiError::invalid(
            "continue_final_message",
            "continue_final_message needs the last message to be from the assistant",
        ));
    }

    let response_format = parse_response_format(f.get("response_format"), opts)?;
    let structured_output = parse_structured_output(&mut f, &response_format, opts)?;
    let (stream, include_usage) = parse_stream(&mut f)?;
    let truncate_prompt_tokens = truncate_prompt_tokens(&mut f)?;
    let user = f.string("user")?.map(str::to_string);
    let ignored_keys = unknown_keys(&mut f, opts)?;
    Ok(ChatRequest {
        model,
        messages,
        tools,
        tool_choice,
        parallel_tool_calls,
        chat_template_kwargs,
        enable_thinking,
        add_generation_prompt,
        continue_final_message,
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

/// Only text output is produced.
fn check_modalities(value: Option<&Value>) -> Result<()> {
    match value {
        None => Ok(()),
        Some(Value::Array(items)) if items.iter().all(|m| m == "text") => Ok(()),
        Some(Value::Array(_)) => {
            Err(ApiError::unsupported("modalities other than text").with_param("modalities"))
        }
        Some(other) => Err(ApiError::invalid(
            "modalities",
            format!("modalities must be an array, got {}", type_name(other)),
        )),
    }
}

//! Sampling and stopping parameters shared by chat and text completions,
//! with vLLM's ranges (`SamplingParams._verify_args`).

use serde_json::Value;

use super::ValidationOptions;
use super::fields::{Fields, Result, integer, type_name};
use crate::error::ApiError;
use crate::request::SamplingRequest;

/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 8;
/// Longest stop string, in bytes; bounds the text the stop matcher withholds.
pub const MAX_STOP_STRING_BYTES: usize = 1024;
/// Most top logprobs per token.
pub const MAX_TOP_LOGPROBS: i128 = 20;

fn out_of_range(param: &str, rule: &str, got: f32) -> ApiError {
    ApiError::invalid(param, format!("{param} must be {rule}, got {got}"))
}

/// Reads every sampling field except logprobs, which differ by endpoint.
/// `min_max_tokens`: the least `max_tokens` the endpoint takes (0 where
/// the prompt alone may be computed: completions).
pub(crate) fn parse_sampling(f: &mut Fields, min_max_tokens: i128) -> Result<SamplingRequest> {
    let mut s = SamplingRequest {
        skip_special_tokens: true,
        spaces_between_special_tokens: true,
        ..Default::default()
    };

    s.temperature = f.f32("temperature")?;
    if let Some(t) = s.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(out_of_range("temperature", "in [0, 2]", t));
    }
    s.top_p = f.f32("top_p")?;
    if let Some(p) = s.top_p
        && !(p > 0.0 && p <= 1.0)
    {
        return Err(out_of_range("top_p", "in (0, 1]", p));
    }
    s.top_k = match f.int("top_k")? {
        None => None,
        // -1 and 0 both mean "no top-k" (vLLM accepts both).
        Some(-1) | Some(0) => Some(0),
        Some(k) if k >= 1 => Some(k.min(u32::MAX as i128) as u32),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("top_k must be -1 (disable), 0 (disable) or at least 1, got {k}"),
            ));
        }
    };
    s.min_p = f.f32("min_p")?;
    if let Some(p) = s.min_p
        && !(0.0..=1.0).contains(&p)
    {
        return Err(out_of_range("min_p", "in [0, 1]", p));
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        let v = f.f32(name)?;
        if let Some(p) = v
            && !(-2.0..=2.0).contains(&p)
        {
            return Err(out_of_range(name, "in [-2, 2]", p));
        }
        if name == "presence_penalty" {
            s.presence_penalty = v;
        } else {
            s.frequency_penalty = v;
        }
    }
    s.repetition_penalty = repetition_penalty(f)?;

    let max_tokens = f.int_in("max_tokens", min_max_tokens, u32::MAX as i128)?;
    let max_completion = f.int_in("max_completion_tokens", min_max_tokens, u32::MAX as i128)?;
    s.max_tokens = max_completion.or(max_tokens).map(|v| v as u32);
    s.min_tokens = f.int_in("min_tokens", 0, u32::MAX as i128)?.unwrap_or(0) as u32;
    if let Some(max) = s.max_tokens
        && s.min_tokens > max
    {
        return Err(ApiError::invalid(
            "min_tokens",
            format!(
                "min_tokens ({}) must not exceed max_tokens ({max})",
                s.min_tokens
            ),
        ));
    }

    s.seed = f.int_in("seed", 0, u64::MAX as i128)?.map(|v| v as u64);
    s.stop = stop_strings(f)?;
    s.stop_token_ids = stop_token_ids(f)?;
    s.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    s.include_stop_str_in_output = f.bool("include_stop_str_in_output")?.unwrap_or(false);
    s.skip_special_tokens = f.bool("skip_special_tokens")?.unwrap_or(true);
    s.spaces_between_special_tokens = f.bool("spaces_between_special_tokens")?.unwrap_or(true);

    Ok(s)
}

/// `n`, the number of choices: 1 when not given, at most `opts.max_n`.
pub(crate) fn parse_n(f: &mut Fields, opts: &ValidationOptions) -> Result<u32> {
    match f.int("n")? {
        None => Ok(1),
        Some(n) if n < 1 => Err(ApiError::invalid(
            "n",
            format!("n must be at least 1, got {n}"),
        )),
        Some(n) if n > opts.max_n as i128 => Err(if opts.max_n == 1 {
            ApiError::unsupported("n > 1")
        } else {
            ApiError::invalid("n", format!("n must be at most {}, got {n}", opts.max_n))
        }
        .with_param("n")),
        Some(n) => Ok(n as u32),
    }
}

/// `repetition_penalty`, or its llama.cpp alias `repeat_penalty`.
fn repetition_penalty(f: &mut Fields) -> Result<Option<f32>> {
    let mut value = None;
    for name in ["repeat_penalty", "repetition_penalty"] {
        if let Some(p) = f.f32(name)? {
            if p <= 0.0 {
                return Err(out_of_range(name, "greater than 0", p));
            }
            value = Some(p);
        }
    }
    Ok(value)
}

fn stop_strings(f: &mut Fields) -> Result<Vec<String>> {
    let list: Vec<String> = match f.get("stop") {
        None => return Ok(Vec::new()),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => out.push(s.clone()),
                    other => {
                        return Err(ApiError::invalid(
                            format!("stop[{i}]"),
                            format!("stop[{i}] must be a string, got {}", type_name(other)),
                        ));
                    }
                }
            }
            out
        }
        Some(other) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "stop must be a string or an array of strings, got {}",
                    type_name(other)
                ),
            ));
        }
    };
    if list.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "stop may hold at most {MAX_STOP_STRINGS} strings, got {}",
                list.len()
            ),
        ));
    }
    if list.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    if list.iter().any(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(ApiError::invalid(
            "stop",
            format!("stop strings must be at most {MAX_STOP_STRING_BYTES} bytes"),
        ));
    }
    Ok(list)
}

fn stop_token_ids(f: &mut Fields) -> Result<Vec<u32>> {
    match f.get("stop_token_ids") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| token_id(v, &format!("stop_token_ids[{i}]")))
            .collect(),
        Some(other) => Err(ApiError::invalid(
            "stop_token_ids",
            format!(
                "stop_token_ids must be an array of integers, got {}",
                type_name(other)
            ),
        )),
    }
}

/// A token id: an integer in `[0, u32::MAX]`. The vocabulary bound is
/// checked where the tokenizer is known.
pub(crate) fn token_id(v: &Value, param: &str) -> Result<u32> {
    let i = integer(v, param)?;
    if !(0..=u32::MAX as i128).contains(&i) {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be a token id >= 0, got {i}"),
        ));
    }
    Ok(i as u32)
}

/// Parameters with no implementation here: present and not a no-op -> 400.
pub(crate) fn reject_unsupported(f: &mut Fields) -> Result<()> {
    if let Some(v) = f.get("logit_bias") {
        let empty = matches!(v, Value::Object(m) if m.is_empty());
        if !empty {
            return Err(ApiError::unsupported("logit_bias"));
        }
    }
    if let Some(v) = f.get("best_of") {
        let n = integer(v, "best_of")?;
        if n != 1 {
            return Err(ApiError::unsupported("best_of"));
        }
    }
    if let Some(v) = f.get("use_beam_search")
        && v != &Value::Bool(false)
    {
        return Err(ApiError::unsupported("use_beam_search"));
    }
    // Never deserialize client-supplied tensors (CVE-2025-62164).
    for name in [
        "prompt_embeds",
        "logits_processors",
        "allowed_token_ids",
        "bad_words",
        "chat_template",
        "kv_transfer_params",
    ] {
        if f.get(name).is_some() {
            return Err(ApiError::unsupported(name));
        }
    }
    Ok(())
}

/// vLLM's `prompt_logprobs` (0..=20), where logprobs are served.
pub(crate) fn parse_prompt_logprobs(
    f: &mut Fields,
    opts: &super::ValidationOptions,
) -> Result<Option<u32>> {
    let n = f.int_in("prompt_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if n.is_some() && !opts.logprobs_supported {
        return Err(ApiError::unsupported("prompt_logprobs"));
    }
    Ok(n.map(|n| n as u32))
}

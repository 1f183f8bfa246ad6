//! `POST /v1/completions`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kestrel_api::types::{CompletionChoice, CompletionLogprobs, CompletionResponse};
use kestrel_api::validate::{check_context_length, check_token_ids};
use kestrel_api::{ApiError, Prompt, parse_completion_request};

use super::prompt::{encode, truncate_left};
use super::validation_options;
use crate::body::json_body;
use crate::choices::{collect_choices, submit_choices};
use crate::echo::{PromptReport, prompt_logprobs_to_compute};
use crate::error::{ServerError, ServerResult};
use crate::generation::sampling_params;
use crate::request_id::RequestId;
use crate::sse::CompletionSse;
use crate::sse_choices::stream_choices;
use crate::state::{AppState, unix_now};
use crate::structured::{self, ConstraintRequest};

pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    let received = Instant::now();
    let body = json_body(&headers, body)?;
    let req = parse_completion_request(&body, &validation_options())?;
    let model_name = state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    if !req.ignored_keys.is_empty() {
        tracing::debug!(request_id = %request_id.0, keys = ?req.ignored_keys, "ignored unknown request keys");
    }
    let mut prompt_ids = match &req.prompt {
        Prompt::Tokens(ids) => {
            check_token_ids(ids, model.engine.vocab_size(), "prompt")?;
            ids.clone()
        }
        Prompt::Text(text) => {
            let (model, text) = (model.clone(), text.clone());
            tokio::task::spawn_blocking(move || encode(&model, &text, true))
                .await
                .map_err(|e| ServerError::internal(format!("tokenization failed: {e}")))??
        }
    };
    let encoded_len = prompt_ids.len();
    truncate_left(&mut prompt_ids, req.truncate_prompt_tokens);
    let truncated = prompt_ids.len() < encoded_len;
    if prompt_ids.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt encodes to no tokens").into());
    }

    let generation_params = req.sampling.resolve(&model.sampling_defaults);
    let max_tokens = check_context_length(
        prompt_ids.len(),
        generation_params.max_tokens,
        model.max_model_len,
    )
    .map_err(|e| {
        if e.param.as_deref() == Some("messages") {
            e.with_param("prompt")
        } else {
            e
        }
    })?;
    let mut params = sampling_params(&generation_params, max_tokens)?;
    params.prompt_logprobs = prompt_logprobs_to_compute(&req);
    let constraint = match req.structured_output.clone() {
        Some(s) => {
            Some(structured::compile(&model, ConstraintRequest::Structured(s), false).await?)
        }
        None => None,
    };
    let id = format!("cmpl-{}", request_id.0);
    let created = unix_now();
    let mut generations = submit_choices(
        &state,
        &model,
        &request_id.0,
        prompt_ids.clone(),
        params,
        &generation_params,
        received,
        constraint,
        req.n,
    )
    .await?;
    let first = generations
        .first_mut()
        .ok_or_else(|| ServerError::internal("no generation was submitted"))?;
    let report = PromptReport::build(&model, &req, &prompt_ids, truncated, first).await?;

    if req.stream {
        let ping = state.config.sse_ping_interval;
        let sse = |i| {
            CompletionSse::new(
                id.clone(),
                model_name.clone(),
                created,
                i,
                req.include_usage,
            )
            .with_prompt_report(&report)
        };
        return Ok(stream_choices(generations, sse, ping));
    }
    let want_logprobs = req.sampling.logprobs.is_some();
    let (collected, usage) = collect_choices(generations).await?;
    let choices = collected
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = want_logprobs.then(|| CompletionLogprobs::from_tokens(&c.logprobs));
            let (text, logprobs) = report.prepend(c.text, logprobs);
            CompletionChoice {
                index: i as u32,
                text,
                logprobs,
                finish_reason: Some(c.reason),
                prompt_logprobs: report.prompt_logprobs.clone(),
            }
        })
        .collect();
    let response = CompletionResponse {
        id,
        object: "text_completion".into(),
        created,
        model: model_name,
        choices,
        usage,
    };
    Ok(Json(response).into_response())
}

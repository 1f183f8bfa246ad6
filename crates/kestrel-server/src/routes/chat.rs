//! `POST /v1/chat/completions`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kestrel_api::output::{OutputOptions, parse_chat_output};
use kestrel_api::reasoning::prompt_opens_reasoning;
use kestrel_api::types::{ChatChoice, ChatCompletionResponse, ChatLogprobs};
use kestrel_api::validate::check_context_length;
use kestrel_api::{ApiError, ChatRequest, ToolChoice, parse_chat_request};
use serde_json::Value;

use super::prompt::{encode, render_chat, truncate_left};
use super::validation_options;
use crate::body::json_body;
use crate::choices::{collect_choices, submit_choices};
use crate::error::{ServerError, ServerResult};
use crate::generation::{TextGeneration, sampling_params};
use crate::prompt_logprobs::prompt_logprobs_field;
use crate::request_id::RequestId;
use crate::sse::ChatSse;
use crate::sse_choices::stream_choices;
use crate::state::{AppState, LoadedModel, unix_now};
use crate::structured::{self, ConstraintRequest};

pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    let received = Instant::now();
    let body = json_body(&headers, body)?;
    let req = parse_chat_request(&body, &validation_options())?;
    let model_name = state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    if !req.ignored_keys.is_empty() {
        tracing::debug!(request_id = %request_id.0, keys = ?req.ignored_keys, "ignored unknown request keys");
    }
    if req.continue_final_message {
        return Err(ApiError::unsupported("continue_final_message").into());
    }
    let mut prepared = prepare_chat(&model, req, &request_id.0, received).await?;
    let id = format!("chatcmpl-{}", request_id.0);
    let created = unix_now();
    let n = prepared.req.n;
    let mut generations =
        start_generations(&state, &model, &mut prepared, &request_id.0, received, n).await?;
    let req = &prepared.req;
    let prompt_logprobs = match (req.sampling.prompt_logprobs, generations.first_mut()) {
        (Some(top), Some(first)) => {
            // The engine sends them before the first token.
            first.prefilled().await;
            let entries = first.take_prompt_logprobs();
            Some(prompt_logprobs_field(
                &model.tokenizer,
                &entries,
                top as usize,
            ))
        }
        _ => None,
    };
    let opts = prepared.output_options();

    if req.stream {
        let ping = state.config.sse_ping_interval;
        let sse = |i| {
            ChatSse::new(
                id.clone(),
                model_name.clone(),
                created,
                i,
                &opts,
                req.include_usage,
            )
            // The field is the chunk's, not the choice's: the first chunk.
            .with_prompt_logprobs(if i == 0 {
                prompt_logprobs.clone()
            } else {
                None
            })
        };
        return Ok(stream_choices(generations, sse, ping));
    }

    // Non-streaming: if the client disconnects, axum drops this future and
    // with it the generations, which aborts the requests.
    let want_logprobs = req.sampling.logprobs.is_some();
    let (collected, usage) = collect_choices(generations).await?;
    let choices = collected
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let (message, reason) = parse_chat_output(&c.text, &opts, c.reason);
            ChatChoice {
                index: i as u32,
                message,
                logprobs: want_logprobs.then(|| ChatLogprobs::from_tokens(&c.logprobs)),
                finish_reason: Some(reason),
            }
        })
        .collect();
    let response = ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created,
        model: model_name,
        choices,
        usage,
        prompt_logprobs,
    };
    Ok(Json(response).into_response())
}

/// A chat request rendered and tokenised: what its generation starts from.
/// `/v1/messages` builds on it too.
pub(crate) struct PreparedChat {
    pub prompt: String,
    /// Taken by [`start_generation`].
    pub prompt_ids: Vec<u32>,
    pub req: ChatRequest,
    pub use_tools: bool,
}

impl PreparedChat {
    /// How the generated text is parsed into reasoning, content and calls.
    pub fn output_options(&self) -> OutputOptions<'_> {
        OutputOptions {
            reasoning: true,
            starts_in_reasoning: prompt_opens_reasoning(&self.prompt),
            tools: self.use_tools.then_some(self.req.tools.as_slice()),
            parallel_tool_calls: self.req.parallel_tool_calls,
        }
    }
}

/// Renders the chat template and tokenises the prompt, off the async
/// workers (a large prompt is CPU work).
pub(crate) async fn prepare_chat(
    model: &Arc<LoadedModel>,
    req: ChatRequest,
    request_id: &str,
    received: Instant,
) -> ServerResult<PreparedChat> {
    let use_tools = req.tool_choice != ToolChoice::None && !req.tools.is_empty();
    let forced_call = matches!(req.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
    let model = model.clone();
    let id = request_id.to_string();
    tokio::task::spawn_blocking(move || -> ServerResult<PreparedChat> {
        let started = Instant::now();
        let tools = if use_tools { req.tools.as_slice() } else { &[] };
        let prompt = render_chat(
            model.template.as_ref(),
            &req.messages,
            tools,
            req.add_generation_prompt,
            &template_kwargs(&req, forced_call),
        )?;
        let rendered = Instant::now();
        let mut ids = encode(&model, &prompt, false)?;
        crate::timing::prompt_prepared(&id, received, started, rendered);
        truncate_left(&mut ids, req.truncate_prompt_tokens);
        Ok(PreparedChat {
            prompt,
            prompt_ids: ids,
            req,
            use_tools,
        })
    })
    .await
    .map_err(|e| ServerError::internal(format!("prompt rendering failed: {e}")))?
}

/// [`start_generations`] of one choice.
pub(crate) async fn start_generation(
    state: &Arc<AppState>,
    model: &Arc<LoadedModel>,
    prepared: &mut PreparedChat,
    request_id: &str,
    received: Instant,
) -> ServerResult<TextGeneration> {
    let mut one = start_generations(state, model, prepared, request_id, received, 1).await?;
    one.pop()
        .ok_or_else(|| ServerError::internal("no generation was submitted"))
}

/// Checks the context length, resolves sampling, compiles the request's
/// output constraint (a structured output, or the forced tool call of
/// `tool_choice`; off the async workers) and submits the prompt as `n`
/// choices ([`submit_choices`]).
pub(crate) async fn start_generations(
    state: &Arc<AppState>,
    model: &Arc<LoadedModel>,
    prepared: &mut PreparedChat,
    request_id: &str,
    received: Instant,
    n: u32,
) -> ServerResult<Vec<TextGeneration>> {
    let req = &prepared.req;
    let constraint_request = ConstraintRequest::for_chat(
        req.structured_output.as_ref(),
        &req.tools,
        &req.tool_choice,
        req.parallel_tool_calls,
    )?;
    let generation_params = req.sampling.resolve(&model.sampling_defaults);
    let max_tokens = check_context_length(
        prepared.prompt_ids.len(),
        generation_params.max_tokens,
        model.max_model_len,
    )?;
    let params = sampling_params(&generation_params, max_tokens)?;
    let constraint = match constraint_request {
        Some(c) => {
            let starts_in_reasoning = prompt_opens_reasoning(&prepared.prompt);
            Some(structured::compile(model, c, starts_in_reasoning).await?)
        }
        None => None,
    };
    submit_choices(
        state,
        model,
        request_id,
        std::mem::take(&mut prepared.prompt_ids),
        params,
        &generation_params,
        received,
        constraint,
        n,
    )
    .await
}

/// `chat_template_kwargs`, with a top-level `enable_thinking` folded in.
fn template_kwargs(req: &ChatRequest, forced_call: bool) -> serde_json::Map<String, Value> {
    let mut kwargs = req.chat_template_kwargs.clone();
    if let Some(b) = req.enable_thinking {
        kwargs.insert("enable_thinking".into(), Value::Bool(b));
    } else if forced_call && !kwargs.contains_key("enable_thinking") {
        // A forced call comes at once unless the client asks for thinking
        // (then its grammar starts after `</think>`).
        kwargs.insert("enable_thinking".into(), Value::Bool(false));
    }
    kwargs
}

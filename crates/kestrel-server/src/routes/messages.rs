//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, the Anthropic
//! Messages API. The body is translated into a chat request
//! (`kestrel_api::anthropic`) and runs through the chat route's own
//! preparation and generation; only the answer's shape differs. Every
//! failure on these routes has Anthropic's error body.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kestrel_api::anthropic::stream::error_event;
use kestrel_api::anthropic::{
    MessageResponse, MessageStream, MessageUsage, Normalization, check_context, content_blocks,
    parse_messages_body, stop_reason,
};
use kestrel_api::output::{ChatOutputParser, OutputOptions, parse_chat_output};
use kestrel_api::types::{FinishReason, Usage};
use kestrel_api::{ChatRequest, parse_chat_request};
use serde_json::json;

use super::chat::{prepare_chat, start_generation};
use super::validation_options;
use crate::body::json_body;
use crate::error::{ServerError, ServerResult};
use crate::request_id::RequestId;
use crate::sse::{SseAssembler, sse_response};
use crate::state::AppState;

pub async fn messages(
    State(state): State<Arc<AppState>>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    create_message(state, request_id, headers, body)
        .await
        .unwrap_or_else(ServerError::into_anthropic_response)
}

pub async fn count_tokens(
    State(state): State<Arc<AppState>>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    count(state, request_id, headers, body)
        .await
        .unwrap_or_else(ServerError::into_anthropic_response)
}

/// The Messages body as a validated chat request.
fn chat_request(
    state: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    require_max_tokens: bool,
) -> ServerResult<ChatRequest> {
    let body = json_body(headers, body)?;
    let req = parse_messages_body(&body, require_max_tokens)?;
    let norm = Normalization {
        strip_billing_header: state.config.strip_billing_header,
        // Before the model is up the request fails on `ready()` anyway.
        late_system_messages: state.loaded().is_none_or(|m| m.late_system_messages),
    };
    let mut chat = parse_chat_request(&req.to_chat_body(norm)?, &validation_options())?;
    // The Messages API has no usage option: usage is always reported.
    chat.include_usage = true;
    Ok(chat)
}

async fn count(
    state: Arc<AppState>,
    request_id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    let received = Instant::now();
    let req = chat_request(&state, &headers, body, false)?;
    state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    let prepared = prepare_chat(&model, req, &request_id.0, received).await?;
    Ok(Json(json!({"input_tokens": prepared.prompt_ids.len()})).into_response())
}

async fn create_message(
    state: Arc<AppState>,
    request_id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    let received = Instant::now();
    let req = chat_request(&state, &headers, body, true)?;
    let model_name = state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    let mut prepared = prepare_chat(&model, req, &request_id.0, received).await?;
    if let Some(max_tokens) = prepared.req.sampling.max_tokens {
        check_context(prepared.prompt_ids.len(), max_tokens, model.max_model_len)?;
    }
    let prompt_tokens = prepared.prompt_ids.len() as u32;
    let generation =
        start_generation(&state, &model, &mut prepared, &request_id.0, received).await?;
    let id = format!("msg_{}", request_id.0);

    if prepared.req.stream {
        let sse = MessagesSse::new(id, model_name, prompt_tokens, &prepared.output_options());
        let mut response = sse_response(generation, sse, state.config.sse_ping_interval);
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        return Ok(response);
    }

    let (text, reason, usage, stop) = generation.collect_with_stop(String::new()).await?;
    let (message, reason) = parse_chat_output(&text, &prepared.output_options(), reason);
    let response = MessageResponse {
        id,
        kind: "message",
        role: "assistant",
        model: model_name,
        content: content_blocks(&message),
        stop_reason: Some(stop_reason(reason, stop.as_deref())),
        stop_sequence: stop,
        usage: MessageUsage::from_chat(&usage),
    };
    Ok(Json(response).into_response())
}

/// Chat output parsing -> Anthropic stream events. Public (hidden) so that
/// tests can drive it with scripted text, without a model.
pub struct MessagesSse {
    stream: MessageStream,
    parser: ChatOutputParser,
}

impl MessagesSse {
    pub fn new(id: String, model: String, prompt_tokens: u32, opts: &OutputOptions) -> Self {
        MessagesSse {
            stream: MessageStream::new(id, model, prompt_tokens),
            parser: ChatOutputParser::new(opts),
        }
    }
}

impl SseAssembler for MessagesSse {
    fn start(&mut self) -> Vec<String> {
        self.stream.start()
    }

    fn text(&mut self, text: &str) -> Vec<String> {
        let parts = self.parser.push(text);
        self.stream.delta(parts)
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<String> {
        self.finish_at_stop(reason, usage, None)
    }

    fn finish_at_stop(
        &mut self,
        reason: FinishReason,
        usage: Usage,
        stop_sequence: Option<&str>,
    ) -> Vec<String> {
        let end = self.parser.finish();
        let reason = self.parser.finish_reason(reason, &end);
        let mut events = self.stream.delta(end.parts);
        events.extend(
            self.stream
                .finish(reason, stop_sequence, MessageUsage::from_chat(&usage)),
        );
        events
    }

    fn failure(&mut self, message: &str) -> Vec<String> {
        vec![error_event(message)]
    }
}

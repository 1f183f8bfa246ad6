//! `POST /v1/responses`, the OpenAI Responses API. The body is translated
//! into a chat request (`kestrel_api::responses`) and runs through the chat
//! route's own preparation and generation; the parsed output is built into
//! output items by one `ResponseBuilder`, streamed or not. Nothing is
//! stored. Failures have the OpenAI error body of the other routes.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use kestrel_api::output::{ChatOutputParser, OutputOptions};
use kestrel_api::parse_chat_request;
use kestrel_api::responses::{
    ResponseBuilder, ResponseUsage, in_responses_terms, parse_responses_body,
};
use kestrel_api::types::{FinishReason, Usage};

use super::chat::{prepare_chat, start_generation};
use super::validation_options;
use crate::body::json_body;
use crate::error::{ServerError, ServerResult};
use crate::request_id::RequestId;
use crate::sse::{SseAssembler, sse_response};
use crate::state::{AppState, unix_now};

pub async fn responses(
    State(state): State<Arc<AppState>>,
    Extension(request_id): Extension<RequestId>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    create_response(state, request_id, headers, body)
        .await
        .map_err(|e| ServerError {
            error: in_responses_terms(e.error),
            status: e.status,
        })
}

async fn create_response(
    state: Arc<AppState>,
    request_id: RequestId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Response> {
    let received = Instant::now();
    let body = json_body(&headers, body)?;
    let req = parse_responses_body(&body)?;
    let mut chat = parse_chat_request(&req.to_chat_body()?, &validation_options())?;
    // A response always reports its usage.
    chat.include_usage = true;
    let model_name = state.resolve_model_name(chat.model.as_deref())?;
    let model = state.ready()?;
    let mut prepared = prepare_chat(&model, chat, &request_id.0, received).await?;
    let generation =
        start_generation(&state, &model, &mut prepared, &request_id.0, received).await?;
    let builder = ResponseBuilder::new(&request_id.0, &model_name, unix_now(), req.echo());
    // The reasoning re-tokenised: close to the generated count (the
    // `<think>` tags aside), without tracking tokens through the parsers.
    let count_tokens = move |text: &str| {
        let ids = model.tokenizer.encode(text, false);
        ids.map_or(0, |ids| ids.len() as u32)
    };
    let mut output = ResponseOutput::new(builder, &prepared.output_options(), count_tokens);

    if req.stream() {
        return Ok(sse_response(
            generation,
            output,
            state.config.sse_ping_interval,
        ));
    }

    // Non-streaming: the same builder over the whole text, events dropped.
    let (text, reason, usage) = generation.collect(String::new()).await?;
    output.text(&text);
    output.finish(reason, usage);
    Ok(Json(output.response()).into_response())
}

/// Chat output parsing -> output items (and their stream events). Public
/// (hidden) so that tests can drive it with scripted text, without a model.
pub struct ResponseOutput {
    builder: ResponseBuilder,
    parser: ChatOutputParser,
    /// The tokens in a text, for the reasoning's count in the usage.
    count_tokens: Box<dyn Fn(&str) -> u32 + Send>,
}

impl ResponseOutput {
    pub fn new(
        builder: ResponseBuilder,
        opts: &OutputOptions,
        count_tokens: impl Fn(&str) -> u32 + Send + 'static,
    ) -> Self {
        ResponseOutput {
            builder,
            parser: ChatOutputParser::new(opts),
            count_tokens: Box::new(count_tokens),
        }
    }

    /// The response object as it stands (final after `finish`).
    pub fn response(&self) -> serde_json::Value {
        self.builder.response()
    }
}

impl SseAssembler for ResponseOutput {
    fn start(&mut self) -> Vec<String> {
        self.builder.start()
    }

    fn text(&mut self, text: &str) -> Vec<String> {
        let parts = self.parser.push(text);
        self.builder.delta(parts)
    }

    fn finish(&mut self, reason: FinishReason, usage: Usage) -> Vec<String> {
        let end = self.parser.finish();
        let reason = self.parser.finish_reason(reason, &end);
        let mut events = self.builder.delta(end.parts);
        let reasoning = self.builder.reasoning_text();
        let reasoning_tokens = if reasoning.is_empty() {
            0
        } else {
            (self.count_tokens)(reasoning)
        };
        let usage = ResponseUsage::from_chat(&usage, reasoning_tokens);
        events.extend(self.builder.finish(reason, usage));
        events
    }

    fn failure(&mut self, message: &str) -> Vec<String> {
        self.builder.failure(message)
    }
}

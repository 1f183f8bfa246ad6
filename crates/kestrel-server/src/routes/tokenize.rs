//! `POST /tokenize` and `POST /detokenize` (vLLM's fields).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use kestrel_api::ApiError;
use kestrel_api::types::{DetokenizeResponse, TokenizeResponse};
use kestrel_api::validate::{
    TokenizeInput, check_token_ids, parse_detokenize_request, parse_tokenize_request,
};

use super::prompt::{encode, render_chat};
use super::validation_options;
use crate::body::json_body;
use crate::error::{ServerError, ServerResult};
use crate::state::AppState;

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Json<TokenizeResponse>> {
    let body = json_body(&headers, body)?;
    let req = parse_tokenize_request(&body, &validation_options())?;
    state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    let return_strs = req.return_token_strs;
    let m = model.clone();
    let tokens = tokio::task::spawn_blocking(move || -> ServerResult<Vec<u32>> {
        match &req.input {
            TokenizeInput::Text(text) => encode(&m, text, req.add_special_tokens.unwrap_or(true)),
            TokenizeInput::Chat {
                messages,
                tools,
                add_generation_prompt,
                chat_template_kwargs,
            } => {
                let prompt = render_chat(
                    m.template.as_ref(),
                    messages,
                    tools,
                    *add_generation_prompt,
                    chat_template_kwargs,
                )?;
                encode(&m, &prompt, req.add_special_tokens.unwrap_or(false))
            }
        }
    })
    .await
    .map_err(|e| ServerError::internal(format!("tokenization failed: {e}")))??;
    let token_strs = return_strs.then(|| {
        tokens
            .iter()
            .map(|&id| model.tokenizer.id_to_token(id).unwrap_or_default())
            .collect()
    });
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        tokens,
        max_model_len: u32::try_from(model.max_model_len).unwrap_or(u32::MAX),
        token_strs,
    }))
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ServerResult<Json<DetokenizeResponse>> {
    let body = json_body(&headers, body)?;
    let req = parse_detokenize_request(&body)?;
    state.resolve_model_name(req.model.as_deref())?;
    let model = state.ready()?;
    let vocab = model.tokenizer.vocab_size().min(model.engine.vocab_size());
    check_token_ids(&req.tokens, vocab, "tokens")?;
    let prompt = model
        .tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot decode: {e:#}")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

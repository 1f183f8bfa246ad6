//! The router: routes, auth, request ids, header and body limits, panic
//! safety net.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Router, middleware};
use kestrel_api::{ApiError, ErrorKind};
use tower_http::catch_panic::CatchPanicLayer;

use crate::auth::require_api_key;
use crate::error::ServerError;
use crate::header_limit::limit_headers;
use crate::request_id::assign_request_id;
use crate::routes::{chat, completions, health, messages, metrics, models, responses, tokenize};
use crate::state::AppState;

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health::health))
        .route("/api/hello", get(health::hello))
        .route("/v1/models", get(models::list_models))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/messages", post(messages::messages))
        .route("/v1/messages/count_tokens", post(messages::count_tokens))
        .route("/v1/responses", post(responses::responses))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize))
        .route("/metrics", get(metrics::metrics))
        .route("/v1/embeddings", post(not_implemented))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ))
        .layer(middleware::from_fn(limit_headers))
        .layer(middleware::from_fn(assign_request_id))
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

async fn not_found(request: Request) -> ServerError {
    ServerError::not_found_route(request.uri().path())
}

async fn method_not_allowed(request: Request) -> ServerError {
    ServerError::with_status(
        StatusCode::METHOD_NOT_ALLOWED,
        ApiError::new(
            ErrorKind::InvalidRequest,
            format!(
                "{} is not allowed on {}",
                request.method(),
                request.uri().path()
            ),
        ),
    )
}

async fn not_implemented(request: Request) -> ServerError {
    ApiError::new(
        ErrorKind::NotImplemented,
        format!("{} is not implemented by this server", request.uri().path()),
    )
    .into()
}

/// A bug must still answer with an error body, not a dropped connection.
fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    tracing::error!("a request handler panicked");
    ServerError::internal("internal error").into_response()
}

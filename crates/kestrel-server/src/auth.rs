//! API-key check on every route except `/health` and `/api/hello` (and CORS
//! preflights), against the server's [`crate::api_keys::ApiKeys`].

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kestrel_api::ApiError;

use crate::error::ServerError;
use crate::state::AppState;

/// `Authorization: Bearer KEY` (OpenAI clients) or `x-api-key: KEY`
/// (Anthropic clients).
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let v = v.trim();
        if let Some(key) = v
            .strip_prefix("Bearer ")
            .or_else(|| v.strip_prefix("bearer "))
        {
            return Some(key.trim());
        }
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// Routes anyone may call.
fn is_public(method: &Method, path: &str) -> bool {
    method == Method::OPTIONS || path == "/health" || path == "/api/hello"
}

pub async fn require_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let keys = &state.api_keys;
    if !keys.is_enabled() || is_public(request.method(), request.uri().path()) {
        return next.run(request).await;
    }
    match presented_key(request.headers()) {
        Some(key) if keys.accepts(key) => next.run(request).await,
        _ => {
            let error = ServerError::from(ApiError::unauthorized());
            if request.uri().path().starts_with("/v1/messages") {
                error.into_anthropic_response()
            } else {
                error.into_response()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_bearer_and_x_api_key() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer k1".parse().unwrap());
        assert_eq!(presented_key(&h), Some("k1"));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k2".parse().unwrap());
        assert_eq!(presented_key(&h), Some("k2"));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(presented_key(&h), None);
    }
}

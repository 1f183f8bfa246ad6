//! API-key check on every route except `/health` and `/api/hello` (and CORS
//! preflights).
//! Keys are compared as SHA-256 digests in constant time, so neither the
//! key's length nor its matching prefix leaks through timing.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kestrel_api::ApiError;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ServerError;
use crate::state::AppState;

/// The digests of the accepted keys.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

impl ApiKeys {
    pub fn new(keys: &[String]) -> Self {
        ApiKeys {
            digests: keys.iter().map(|k| digest(k.as_bytes())).collect(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        !self.digests.is_empty()
    }

    /// Whether `key` is one of the accepted keys. Every digest is compared,
    /// so the time does not depend on which one matches.
    pub fn accepts(&self, key: &str) -> bool {
        let given = digest(key.as_bytes());
        let mut ok = subtle::Choice::from(0u8);
        for d in &self.digests {
            ok |= d.ct_eq(&given);
        }
        ok.into()
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

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
                crate::routes::messages::error_response(error)
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
    fn accepts_only_listed_keys() {
        let keys = ApiKeys::new(&["alpha".into(), "beta".into()]);
        assert!(keys.is_enabled());
        assert!(keys.accepts("alpha"));
        assert!(keys.accepts("beta"));
        assert!(!keys.accepts("alph"));
        assert!(!keys.accepts(""));
        assert!(!ApiKeys::new(&[]).accepts("alpha"));
    }

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

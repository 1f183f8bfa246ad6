//! Request ids: a client's `x-request-id` is kept (when it is a sane
//! token), otherwise one is made up; it is echoed in the response, names
//! the request in the engine and in every log line, and forms the
//! completion id.

use std::time::Instant;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use rand::Rng;
use tracing::Instrument;

#[derive(Clone, Debug)]
pub struct RequestId(pub String);

const HEADER: &str = "x-request-id";

fn is_valid(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// 32 random hex digits.
pub fn new_request_id() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

pub async fn assign_request_id(mut request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| is_valid(v))
        .map(str::to_string)
        .unwrap_or_else(new_request_id);
    request.extensions_mut().insert(RequestId(id.clone()));
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let started = Instant::now();
    let span = tracing::info_span!("request", request_id = %id);
    let mut response = next.run(request).instrument(span).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, v);
    }
    tracing::info!(
        request_id = %id,
        %method,
        path,
        status = response.status().as_u16(),
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_client_ids() {
        assert!(is_valid("abc-123_x.y:z"));
        assert!(!is_valid(""));
        assert!(!is_valid("has space"));
        assert!(!is_valid(&"a".repeat(129)));
        assert!(is_valid(&new_request_id()));
    }
}

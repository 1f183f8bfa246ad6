//! The request head's size limits, answered as 431 with the route's error
//! body (hyper's own, higher limits would answer with no body at all).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use kestrel_api::{ApiError, ErrorKind};

use crate::error::ServerError;

/// Bytes of all header names and values together (each line's `: ` and CRLF
/// counted): far above any real client's head, a few KiB.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Header lines per request.
pub const MAX_HEADERS: usize = 100;

pub async fn limit_headers(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let count = headers.len();
    let bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    let problem = if count > MAX_HEADERS {
        format!("the request has {count} headers; the limit is {MAX_HEADERS}")
    } else if bytes > MAX_HEADER_BYTES {
        format!("the request's headers are {bytes} bytes; the limit is {MAX_HEADER_BYTES}")
    } else {
        return next.run(request).await;
    };
    let error = ServerError::with_status(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ApiError::new(ErrorKind::InvalidRequest, problem),
    );
    if request.uri().path().starts_with("/v1/messages") {
        error.into_anthropic_response()
    } else {
        error.into_response()
    }
}

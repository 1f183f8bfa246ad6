//! Request bodies: size limit (413), media type (415), then JSON parsing
//! and the object check (400), all as OpenAI error bodies.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, FailedToBufferBody};
use axum::http::{HeaderMap, StatusCode, header};
use kestrel_api::{ApiError, ErrorKind, parse_json_body};
use serde_json::Value;

use crate::error::{ServerError, ServerResult};

/// The JSON object of a POST body. A missing `Content-Type` is accepted (as
/// llama-server does); any other type than JSON is refused.
pub fn json_body(headers: &HeaderMap, body: Result<Bytes, BytesRejection>) -> ServerResult<Value> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("").to_ascii_lowercase();
        let mime = ct.split(';').next().unwrap_or("").trim();
        if mime != "application/json" && !mime.ends_with("+json") {
            return Err(ServerError::with_status(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ApiError::new(
                    ErrorKind::InvalidRequest,
                    format!("Content-Type must be application/json, got {mime:?}"),
                ),
            ));
        }
    }
    let bytes = body.map_err(|e| match e {
        BytesRejection::FailedToBufferBody(FailedToBufferBody::LengthLimitError(_)) => {
            ServerError::from(ApiError::new(
                ErrorKind::PayloadTooLarge,
                "The request body is larger than the server's limit (--max-body-bytes)",
            ))
        }
        other => ServerError::from(ApiError::new(
            ErrorKind::InvalidRequest,
            format!("cannot read the request body: {other}"),
        )),
    })?;
    Ok(parse_json_body(&bytes)?)
}

//! Every failure leaves the server as an OpenAI error body with the status
//! its kind calls for (plus `Retry-After` on 429).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kestrel_api::{ApiError, ErrorKind};
use kestrel_engine::SubmitError;

/// An [`ApiError`] with an optional status override (413, 415, 431 share
/// `invalid_request_error` but not 400).
#[derive(Debug, Clone)]
pub struct ServerError {
    pub error: ApiError,
    pub status: Option<StatusCode>,
}

impl ServerError {
    pub fn with_status(status: StatusCode, error: ApiError) -> Self {
        ServerError {
            error,
            status: Some(status),
        }
    }

    pub fn status(&self) -> StatusCode {
        self.status.unwrap_or_else(|| {
            StatusCode::from_u16(self.error.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
        })
    }

    pub fn not_found_route(path: &str) -> Self {
        ApiError::new(ErrorKind::NotFound, format!("no route for {path}")).into()
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Internal, message).into()
    }
}

impl From<ApiError> for ServerError {
    fn from(error: ApiError) -> Self {
        ServerError {
            error,
            status: None,
        }
    }
}

impl From<SubmitError> for ServerError {
    fn from(e: SubmitError) -> Self {
        match e {
            SubmitError::QueueFull(n) => ApiError::queue_full(n).into(),
            SubmitError::Invalid(msg) => ApiError::new(ErrorKind::InvalidRequest, msg).into(),
            SubmitError::Stopped => ApiError::unavailable("the engine has stopped").into(),
        }
    }
}

/// Seconds a client should wait after a 429.
const RETRY_AFTER_S: &str = "1";

impl ServerError {
    /// The failure as Anthropic clients read it (`/v1/messages`): the same
    /// status, Anthropic's error body.
    pub fn into_anthropic_response(self) -> Response {
        let status = self.status();
        let body = kestrel_api::anthropic::error_body(&self.error);
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        }
        response
    }
}

impl IntoResponse for ServerError {
    fn into_response(self) -> Response {
        let status = self.status();
        // llama-server's form (`code` = the status number) for 401 and 503.
        let body = match self.error.kind {
            ErrorKind::Authentication | ErrorKind::Unavailable => {
                self.error.body_with_status_code()
            }
            _ => self.error.body(),
        };
        let json = serde_json::to_string(&body).unwrap_or_else(|_| self.error.to_json());
        let mut response = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response();
        if self.error.kind == ErrorKind::RateLimit {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        }
        response
    }
}

pub type ServerResult<T> = Result<T, ServerError>;

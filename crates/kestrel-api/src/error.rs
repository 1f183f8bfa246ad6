//! OpenAI-style errors: `{"error":{"message","type","param","code"}}` plus the
//! HTTP status the server must answer with.

use serde::{Deserialize, Serialize};

/// The OpenAI `error.type` values this server produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 400: the request is malformed or asks for something unsupported.
    InvalidRequest,
    /// 401: missing or wrong API key.
    Authentication,
    /// 404: unknown model or route.
    NotFound,
    /// 413: request body too large.
    PayloadTooLarge,
    /// 429: queue full; clients retry.
    RateLimit,
    /// 500: a bug or engine failure.
    Internal,
    /// 501: a route we do not implement.
    NotImplemented,
    /// 503: loading, shutting down, or the engine died.
    Unavailable,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::NotFound => 404,
            ErrorKind::PayloadTooLarge => 413,
            ErrorKind::RateLimit => 429,
            ErrorKind::Internal => 500,
            ErrorKind::NotImplemented => 501,
            ErrorKind::Unavailable => 503,
        }
    }

    /// The `error.type` string clients see.
    pub fn type_name(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::PayloadTooLarge => "invalid_request_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Internal => "internal_server_error",
            ErrorKind::NotImplemented => "not_implemented_error",
            ErrorKind::Unavailable => "unavailable_error",
        }
    }
}

/// An error that becomes an HTTP response with an OpenAI error body.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub kind: ErrorKind,
    pub message: String,
    /// The request parameter at fault, e.g. `temperature` or `messages[2].role`.
    pub param: Option<String>,
    /// A machine-readable code such as `model_not_found`.
    pub code: Option<String>,
}

impl ApiError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400 naming the parameter at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// 400 "X is not supported" for parameters the server does not implement,
    /// so they are never silently ignored.
    pub fn unsupported(param: impl Into<String>) -> Self {
        let param = param.into();
        ApiError {
            kind: ErrorKind::InvalidRequest,
            message: format!("{param} is not supported"),
            param: Some(param),
            code: Some("unsupported_parameter".into()),
        }
    }

    /// 404 for a `model` that names no served alias.
    pub fn model_not_found(model: &str) -> Self {
        ApiError {
            kind: ErrorKind::NotFound,
            message: format!("The model `{model}` does not exist."),
            param: Some("model".into()),
            code: Some("model_not_found".into()),
        }
    }

    /// 429 when the queue is full; clients retry (send `Retry-After`).
    pub fn queue_full(max_queued: usize) -> Self {
        ApiError::new(
            ErrorKind::RateLimit,
            format!("The server is busy: {max_queued} requests are already queued. Retry later."),
        )
    }

    /// 503 while loading, shutting down, or after the engine died.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(ErrorKind::Unavailable, message)
    }

    /// 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError::new(ErrorKind::Authentication, "Invalid or missing API key")
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    pub fn with_code(mut self, code: impl Into<String>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn status(&self) -> u16 {
        self.kind.status()
    }

    /// The JSON body to send: `{"error":{...}}`.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind.type_name().to_string(),
                param: self.param.clone(),
                code: self.code.clone().map(serde_json::Value::String),
            },
        }
    }

    /// The body with `code` set to the HTTP status as a number, the form
    /// llama-server uses for `/health` (503) and 401 responses.
    pub fn body_with_status_code(&self) -> ErrorBody {
        let mut body = self.body();
        body.error.code = Some(serde_json::Value::from(self.status()));
        body
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.body()).unwrap_or_else(|_| {
            r#"{"error":{"message":"error","type":"internal_server_error","param":null,"code":null}}"#
                .to_string()
        })
    }
}

/// `{"error": {...}}`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    /// A string code, or the HTTP status as a number where llama-server
    /// compatible bodies use that (`/health`, 401).
    pub code: Option<serde_json::Value>,
}

//! `GET /metrics`: Prometheus text format.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.loaded().map(|m| m.engine.stats());
    let page = state.metrics.render(&state.model_names[0], stats.as_ref());
    let mut response = page.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

//! `GET /health`: 200 `{"status":"ok"}` once the model serves; 503 with an
//! OpenAI-style error while loading (with the load stage and progress),
//! after a failed load, when the engine died, or during shutdown.
//!
//! `GET`/`HEAD /api/hello`: 200 whenever the server is up, without a key.
//! Claude Code sends it to `ANTHROPIC_BASE_URL` to warm the connection and
//! to check that the API is reachable, as Anthropic's API answers it.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::state::{AppState, Phase};

pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.is_shutting_down() {
        return unavailable("Shutting down", None);
    }
    state.with_phase(|phase| match phase {
        Phase::Loading {
            stage,
            progress,
            started,
        } => unavailable(
            "Loading model",
            Some(json!({
                "stage": stage,
                "progress": progress,
                "elapsed_s": started.elapsed().as_secs_f64(),
            })),
        ),
        Phase::Failed(e) => unavailable(&format!("The model failed to load: {e}"), None),
        Phase::Ready(model) if !model.engine.is_alive() => {
            unavailable("The engine has stopped", None)
        }
        Phase::Ready(_) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
    })
}

pub async fn hello() -> Response {
    (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
}

fn unavailable(message: &str, extra: Option<serde_json::Value>) -> Response {
    let mut error = json!({"code": 503, "message": message, "type": "unavailable_error"});
    if let (Some(serde_json::Value::Object(extra)), Some(obj)) = (extra, error.as_object_mut()) {
        obj.extend(extra);
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": error})),
    )
        .into_response()
}

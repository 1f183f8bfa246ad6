//! `GET /v1/models`: one card per served alias.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use kestrel_api::types::ModelList;

use crate::state::AppState;

pub async fn list_models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let max_model_len = state.loaded().map_or(0, |m| m.max_model_len);
    Json(ModelList::new(
        &state.model_names,
        state.created,
        "kestrel",
        u32::try_from(max_model_len).unwrap_or(u32::MAX),
    ))
}

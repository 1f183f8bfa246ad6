//! `GET /v1/models`.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: u64,
    pub owned_by: String,
    pub max_model_len: u32,
}

impl ModelList {
    /// One card per served alias.
    pub fn new(aliases: &[String], created: u64, owned_by: &str, max_model_len: u32) -> Self {
        ModelList {
            object: "list".into(),
            data: aliases
                .iter()
                .map(|id| ModelCard {
                    id: id.clone(),
                    object: "model".into(),
                    created,
                    owned_by: owned_by.into(),
                    max_model_len,
                })
                .collect(),
        }
    }
}

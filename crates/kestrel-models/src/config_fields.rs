//! Typed reads of `config.json` objects whose errors name the failing field.
//!
//! serde_json alone says "invalid type: string, expected usize" without saying
//! where; with a config of a hundred fields, the path is what the reader needs.

use anyhow::{Result, anyhow};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Deserialises `value`, found at `at` in the file ("" for the top level,
/// else a dotted path such as "text_config"), into `T`. An error reads
/// "text_config.hidden_size: invalid type: ...".
pub(crate) fn read_fields<T: DeserializeOwned>(value: Value, at: &str) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let inner = e.path().to_string();
        let path = match (at.is_empty(), inner == ".") {
            (true, true) => "(top level)".to_string(),
            (true, false) => inner,
            (false, true) => at.to_string(),
            (false, false) => format!("{at}.{inner}"),
        };
        anyhow!("{path}: {}", e.into_inner())
    })
}

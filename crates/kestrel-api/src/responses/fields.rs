//! Request fields deserialised with the path of the field at fault.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{ApiError, ErrorKind};

/// Deserialises `value` as `T`; a failure is a 400 whose `param` is the
/// path of the field at fault under `prefix` (`input[2].call_id`).
pub(super) fn typed<T: DeserializeOwned>(value: &Value, prefix: &str) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = match (prefix, path.as_str()) {
            ("", ".") => None,
            (p, ".") => Some(p.to_string()),
            ("", rest) => Some(rest.to_string()),
            (p, rest) if rest.starts_with('[') => Some(format!("{p}{rest}")),
            (p, rest) => Some(format!("{p}.{rest}")),
        };
        let inner = e.into_inner().to_string();
        let mut err = ApiError::new(
            ErrorKind::InvalidRequest,
            match &param {
                Some(p) => format!("{p}: {inner}"),
                None => inner,
            },
        );
        err.param = param;
        err
    })
}

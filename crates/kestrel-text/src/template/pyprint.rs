//! Printing values the way Jinja2 (Python's `str()`) does, where minijinja's
//! defaults differ: `True`/`False`/`None` instead of `true`/`false`/`none`,
//! and floats as Python writes them. Applies to `{{ value }}` output and the
//! `string` filter.

use minijinja::value::{Value, ValueKind};
use minijinja::{Error, Output, State};

use super::pyjson::python_float_repr;

/// Python's `str()` of a scalar; `None` for values minijinja prints the same
/// way as Python (strings, integers) or that are not scalars.
fn python_scalar_text(value: &Value) -> Option<String> {
    match value.kind() {
        ValueKind::Bool => Some(if value.is_true() { "True" } else { "False" }.to_string()),
        ValueKind::None => Some("None".to_string()),
        ValueKind::Number if !value.is_integer() => {
            let f = f64::try_from(value.clone()).ok()?;
            Some(match python_float_repr(f).as_str() {
                "NaN" => "nan".to_string(),
                "Infinity" => "inf".to_string(),
                "-Infinity" => "-inf".to_string(),
                text => text.to_string(),
            })
        }
        _ => None,
    }
}

/// Formatter for `{{ ... }}` blocks.
pub fn format_value(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    match python_scalar_text(value) {
        Some(text) => out.write_str(&text).map_err(Error::from),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// The `string` filter.
pub fn string_filter(value: &Value) -> Value {
    match python_scalar_text(value) {
        Some(text) => Value::from(text),
        None if value.kind() == ValueKind::String => value.clone(),
        None => Value::from(value.to_string()),
    }
}

//! The minijinja environment that mirrors transformers' chat-template
//! environment: `trim_blocks`, `lstrip_blocks`, no auto-escaping, loop
//! controls, Python string methods, and the globals and filters transformers
//! adds (`raise_exception`, `strftime_now`, a Python-compatible `tojson`).

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind};

use super::pyjson::{self, DumpOptions};
use super::{pyprint, pystr};

/// Marker carried as the source of the error `raise_exception` returns, so
/// that render failures the template raised on purpose can be told apart.
#[derive(Debug)]
pub struct RaisedException(pub String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

/// An environment configured like transformers' `ImmutableSandboxedEnvironment`.
pub fn new_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(pystr::unknown_method);
    env.set_formatter(pyprint::format_value);
    minijinja_contrib::add_to_environment(&mut env);
    env.add_filter("tojson", tojson);
    env.add_filter("trim", pystr::trim_filter);
    env.add_filter("string", pyprint::string_filter);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone())
        .with_source(RaisedException(message)))
}

/// `datetime.now().strftime(format)` in local time.
fn strftime_now(format: &str) -> Result<String, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item> = StrftimeItems::new(format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: invalid format {format:?}"),
        ));
    }
    let now = chrono::Local::now();
    let mut out = String::new();
    use std::fmt::Write;
    write!(out, "{}", now.format_with_items(items.into_iter())).map_err(|_| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: cannot format {format:?}"),
        )
    })?;
    Ok(out)
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, i.e. `json.dumps` with those arguments, positional or
/// by keyword.
fn tojson(value: &Value, positional: Rest<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if positional.len() > NAMES.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let arg = |i: usize| -> Result<Option<Value>, Error> {
        let by_keyword = kwargs.get::<Option<Value>>(NAMES[i])?;
        match (positional.get(i).cloned(), by_keyword) {
            (Some(_), Some(_)) => Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson got {} twice", NAMES[i]),
            )),
            (Some(v), None) | (None, Some(v)) => Ok((!v.is_none()).then_some(v)),
            (None, None) => Ok(None),
        }
    };
    let mut options = DumpOptions {
        ensure_ascii: arg(0)?.is_some_and(|v| v.is_true()),
        sort_keys: arg(3)?.is_some_and(|v| v.is_true()),
        ..DumpOptions::default()
    };
    if let Some(indent) = arg(1)? {
        options.indent = Some(indent_text(&indent)?);
        // json.dumps drops the space after item commas when indenting.
        options.item_separator = ",".into();
    }
    if let Some(separators) = arg(2)? {
        let parts: Vec<Value> = separators.try_iter()?.collect();
        match parts.as_slice() {
            [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                options.item_separator = item.as_str().unwrap_or_default().to_string();
                options.key_separator = key.as_str().unwrap_or_default().to_string();
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be a pair of strings",
                ));
            }
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from(pyjson::dumps(value, &options)?))
}

/// `indent` as json.dumps reads it: a number of spaces (negative means none)
/// or the literal text to indent with.
fn indent_text(indent: &Value) -> Result<String, Error> {
    match indent.kind() {
        ValueKind::String => Ok(indent.as_str().unwrap_or_default().to_string()),
        ValueKind::Number if indent.is_integer() => {
            let n = indent.as_i64().unwrap_or(0).clamp(0, 1024);
            Ok(" ".repeat(n as usize))
        }
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: indent must be an integer or a string",
        )),
    }
}

//! Typed access to the keys of a JSON object, where each problem becomes a
//! 400 naming the parameter. `null` counts as "not given" everywhere, since
//! many clients send explicit nulls for unset options.

use serde_json::{Map, Number, Value};

use crate::error::ApiError;

pub(crate) type Result<T> = std::result::Result<T, ApiError>;

/// The keys of one JSON object, with the path used in error messages.
pub(crate) struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// Prefix for parameter names, e.g. `messages[3]`; empty at top level.
    path: String,
    seen: Vec<String>,
}

impl<'a> Fields<'a> {
    pub fn new(map: &'a Map<String, Value>, path: impl Into<String>) -> Self {
        Fields {
            map,
            path: path.into(),
            seen: Vec::new(),
        }
    }

    /// The object at `value`, or a 400 saying it must be one.
    pub fn of(value: &'a Value, path: &str) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Fields::new(map, path)),
            other => Err(ApiError::invalid(
                path,
                format!("{path} must be an object, got {}", type_name(other)),
            )),
        }
    }

    /// Full parameter name of `key`.
    pub fn param(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The raw value, with null mapped to `None`; marks the key as known.
    pub fn get(&mut self, key: &str) -> Option<&'a Value> {
        self.seen.push(key.to_string());
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    /// Marks keys as known although they have no effect (e.g. `store`).
    pub fn accept(&mut self, keys: &[&str]) {
        self.seen.extend(keys.iter().map(|k| k.to_string()));
    }

    /// Keys present in the object that no getter asked for, sorted.
    pub fn unknown_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .map
            .keys()
            .filter(|k| !self.seen.iter().any(|s| s == *k))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong_type(key, "a boolean", other)),
        }
    }

    pub fn string(&mut self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(other) => Err(self.wrong_type(key, "a string", other)),
        }
    }

    /// A finite number that also fits a finite f32.
    pub fn f32(&mut self, key: &str) -> Result<Option<f32>> {
        let param = self.param(key);
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => finite_f32(n, &param).map(Some),
            Some(other) => Err(self.wrong_type(key, "a number", other)),
        }
    }

    /// An integer (an integral float like `3.0` is accepted, as pydantic does).
    pub fn int(&mut self, key: &str) -> Result<Option<i128>> {
        let param = self.param(key);
        match self.get(key) {
            None => Ok(None),
            Some(v) => integer(v, &param).map(Some),
        }
    }

    /// An integer within `[min, max]`.
    pub fn int_in(&mut self, key: &str, min: i128, max: i128) -> Result<Option<i128>> {
        let param = self.param(key);
        match self.int(key)? {
            Some(i) if i < min || i > max => Err(ApiError::invalid(
                &param,
                format!("{param} must be between {min} and {max}, got {i}"),
            )),
            other => Ok(other),
        }
    }

    fn wrong_type(&self, key: &str, expected: &str, got: &Value) -> ApiError {
        let param = self.param(key);
        ApiError::invalid(
            &param,
            format!("{param} must be {expected}, got {}", type_name(got)),
        )
    }
}

/// A JSON integer as i128 (wide enough for every u64 and i64).
pub(crate) fn integer(v: &Value, param: &str) -> Result<i128> {
    let not_int = || {
        ApiError::invalid(
            param,
            format!("{param} must be an integer, got {}", type_name(v)),
        )
    };
    let Value::Number(n) = v else {
        return Err(not_int());
    };
    if let Some(i) = n.as_i64() {
        return Ok(i as i128);
    }
    if let Some(u) = n.as_u64() {
        return Ok(u as i128);
    }
    match n.as_f64() {
        Some(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e30 => Ok(f as i128),
        Some(f) if !f.is_finite() => Err(ApiError::invalid(
            param,
            format!("{param} must be a finite number"),
        )),
        _ => Err(ApiError::invalid(
            param,
            format!("{param} must be an integer, got {n}"),
        )),
    }
}

fn finite_f32(n: &Number, param: &str) -> Result<f32> {
    let f = n.as_f64().unwrap_or(f64::NAN);
    let narrowed = f as f32;
    if !f.is_finite() || !narrowed.is_finite() {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be a finite number, got {n}"),
        ));
    }
    Ok(narrowed)
}

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

//! Reading the small JSON files of a model folder (`tokenizer_config.json`,
//! `generation_config.json`, `config.json`) with errors that name the file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub const TOKENIZER_JSON: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const GENERATION_CONFIG: &str = "generation_config.json";
pub const MODEL_CONFIG: &str = "config.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// Reads a UTF-8 text file; the error names the file.
pub fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    String::from_utf8(bytes)
        .map_err(|e| anyhow::anyhow!("{} is not valid UTF-8: {e}", path.display()))
}

/// Reads and parses `dir/name` if it exists; `Ok(None)` when it does not.
pub fn read_optional_json(dir: &Path, name: &str) -> Result<Option<Value>> {
    let path = dir.join(name);
    if !path.exists() {
        return Ok(None);
    }
    let text = read_text(&path)?;
    let value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    Ok(Some(value))
}

/// A token written in a config either as a plain string or as an
/// AddedToken object `{"content": "...", ...}`.
pub fn token_text(value: &Value) -> Option<&str> {
    match value {
        Value::String(s) => Some(s),
        Value::Object(map) => map.get("content").and_then(Value::as_str),
        _ => None,
    }
}

/// Appends the ids of an `eos_token_id` field (an integer or a list of
/// integers) to `out`; the error names the file.
fn push_ids(value: &Value, file: &Path, out: &mut Vec<u32>) -> Result<()> {
    let as_id = |v: &Value| -> Result<u32> {
        v.as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .with_context(|| format!("{}: eos_token_id {v} is not a token id", file.display()))
    };
    match value {
        Value::Null => {}
        Value::Array(items) => {
            for item in items {
                out.push(as_id(item)?);
            }
        }
        other => out.push(as_id(other)?),
    }
    Ok(())
}

/// End-of-sequence token ids of a model folder, in this order of precedence
/// (all sources are merged, first occurrence kept): `generation_config.json`
/// `eos_token_id`, `config.json` `eos_token_id` (or `text_config.eos_token_id`),
/// and the `eos_token` string of `tokenizer_config.json` resolved through
/// `lookup`.
pub fn eos_token_ids(dir: &Path, lookup: impl Fn(&str) -> Option<u32>) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    if let Some(gen_cfg) = read_optional_json(dir, GENERATION_CONFIG)?
        && let Some(v) = gen_cfg.get("eos_token_id")
    {
        push_ids(v, &dir.join(GENERATION_CONFIG), &mut ids)?;
    }
    if let Some(cfg) = read_optional_json(dir, MODEL_CONFIG)? {
        let field = cfg
            .get("eos_token_id")
            .or_else(|| cfg.get("text_config").and_then(|t| t.get("eos_token_id")));
        if let Some(v) = field {
            push_ids(v, &dir.join(MODEL_CONFIG), &mut ids)?;
        }
    }
    if let Some(tok_cfg) = read_optional_json(dir, TOKENIZER_CONFIG)?
        && let Some(text) = tok_cfg.get("eos_token").and_then(token_text)
    {
        match lookup(text) {
            Some(id) => ids.push(id),
            None => bail!(
                "{}: eos_token {text:?} is not in the tokenizer's vocabulary",
                dir.join(TOKENIZER_CONFIG).display()
            ),
        }
    }
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}

/// The folder a tokenizer file sits in, for finding its sibling configs.
pub fn parent_dir(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

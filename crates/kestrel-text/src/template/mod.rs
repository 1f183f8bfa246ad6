//! Chat templates: loading a model's Jinja template(s) and rendering a
//! conversation exactly as transformers' `apply_chat_template` does.

mod environment;
mod pyjson;
mod pyprint;
mod pystr;

use std::path::Path;

use anyhow::{Result, bail};
use minijinja::Environment;
use serde_json::{Map, Value};

use crate::model_files::{self, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG};
use environment::RaisedException;

/// Name of the template used unless tools select `tool_use`.
const DEFAULT_NAME: &str = "default";
/// Name of the template transformers picks when tools are given and the
/// model ships one under this name.
const TOOL_USE_NAME: &str = "tool_use";

/// Special-token variables transformers passes to every template.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Variables the renderer sets itself; extra kwargs may not replace them
/// (transformers rejects them too, with a TypeError).
const RESERVED_KEYS: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// Why a render failed.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template called `raise_exception`: the conversation is not one the
    /// model accepts (a client error).
    #[error("chat template rejected the conversation: {0}")]
    Raised(String),
    /// Any other failure while rendering (bad input types, template bugs).
    #[error("chat template failed: {0}")]
    Render(String),
}

/// A model's chat template(s), compiled once.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Names of the compiled templates (`default`, maybe `tool_use`, ...).
    names: Vec<String>,
    /// Special tokens from `tokenizer_config.json`, passed as variables.
    special_tokens: Map<String, Value>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("names", &self.names)
            .finish()
    }
}

impl ChatTemplate {
    /// Whether the template's source mentions `needle`; tells, for one,
    /// which tool-call format a model was trained on.
    pub fn source_contains(&self, needle: &str) -> bool {
        self.names.iter().any(|name| {
            self.env
                .get_template(name)
                .is_ok_and(|t| t.source().contains(needle))
        })
    }

    /// Loads the template of a model folder: `chat_template.jinja` if present
    /// (it takes precedence, as in transformers), else the `chat_template`
    /// field of `tokenizer_config.json`, which is a string or a list of
    /// `{"name", "template"}`. `Ok(None)` when the model has no template.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Option<Self>> {
        let dir = dir.as_ref();
        let config = model_files::read_optional_json(dir, TOKENIZER_CONFIG)?;
        let config_path = dir.join(TOKENIZER_CONFIG);
        let special_tokens = config.as_ref().map(special_tokens_of).unwrap_or_default();

        let jinja_path = dir.join(CHAT_TEMPLATE_FILE);
        let templates: Vec<(String, String, String)> = if jinja_path.exists() {
            let source = model_files::read_text(&jinja_path)?;
            vec![(
                DEFAULT_NAME.to_string(),
                source,
                jinja_path.display().to_string(),
            )]
        } else {
            match config.as_ref().and_then(|c| c.get("chat_template")) {
                None | Some(Value::Null) => return Ok(None),
                Some(field) => templates_from_field(field, &config_path.display().to_string())?,
            }
        };
        Self::from_named_sources(templates, special_tokens).map(Some)
    }

    /// A single template from source text; `origin` names it in errors.
    /// `special_tokens` are variables such as `eos_token` (may be empty).
    pub fn from_source(
        source: &str,
        origin: &str,
        special_tokens: Map<String, Value>,
    ) -> Result<Self> {
        Self::from_named_sources(
            vec![(DEFAULT_NAME.into(), source.into(), origin.into())],
            special_tokens,
        )
    }

    fn from_named_sources(
        templates: Vec<(String, String, String)>,
        special_tokens: Map<String, Value>,
    ) -> Result<Self> {
        let mut env = environment::new_environment();
        let mut names = Vec::new();
        for (name, source, origin) in templates {
            env.add_template_owned(name.clone(), source).map_err(|e| {
                anyhow::anyhow!("{origin}: chat template {name:?} does not compile: {e}")
            })?;
            names.push(name);
        }
        Ok(Self {
            env,
            names,
            special_tokens,
        })
    }

    /// Renders a conversation. `messages` and `tools` are passed to the
    /// template as they are; `extra` holds further template variables
    /// (`enable_thinking`, `preserve_thinking`, ...), which override the
    /// special-token variables but may not replace `messages`, `tools`,
    /// `documents` or `add_generation_prompt`.
    pub fn render(
        &self,
        messages: &[Value],
        tools: Option<&[Value]>,
        add_generation_prompt: bool,
        extra: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        if let Some(key) = RESERVED_KEYS.iter().find(|k| extra.contains_key(**k)) {
            return Err(TemplateError::Render(format!(
                "{key} cannot be passed as an extra template variable"
            )));
        }
        let name = self.pick_template(tools.is_some())?;
        let mut context = self.special_tokens.clone();
        context.extend(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        context.insert("messages".into(), Value::Array(messages.to_vec()));
        context.insert(
            "tools".into(),
            tools.map_or(Value::Null, |t| Value::Array(t.to_vec())),
        );
        context.insert("documents".into(), Value::Null);
        context.insert(
            "add_generation_prompt".into(),
            Value::Bool(add_generation_prompt),
        );

        let template = self
            .env
            .get_template(name)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        // minijinja 2.24 panics on some expressions instead of failing: a
        // slice with a negative step of an empty sequence or string (as in
        // `messages[::-1]` with no messages: index out of bounds), or one
        // whose stop is past its start (`x[0:2:-1]`: an overflow, where
        // overflow checks are on). The render keeps nothing between calls,
        // so such a panic is a failed render like any other.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render(minijinja::Value::from_serialize(&context))
        }));
        match rendered {
            Ok(result) => result.map_err(classify_error),
            Err(panic) => Err(TemplateError::Render(format!(
                "the template engine failed: {}",
                panic_message(panic.as_ref())
            ))),
        }
    }

    /// transformers' choice among named templates: `tool_use` when tools are
    /// given and it exists, else `default`.
    fn pick_template(&self, has_tools: bool) -> Result<&str, TemplateError> {
        let has = |name: &str| self.names.iter().any(|n| n == name);
        if has_tools && has(TOOL_USE_NAME) {
            return Ok(TOOL_USE_NAME);
        }
        if has(DEFAULT_NAME) {
            return Ok(DEFAULT_NAME);
        }
        Err(TemplateError::Render(format!(
            "the model has chat templates {:?} but none named \"default\"",
            self.names
        )))
    }
}

/// The message a panic carried, when it is text.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic")
}

/// Splits a failure into a template-raised rejection or another error.
fn classify_error(err: minijinja::Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = e.source();
    }
    TemplateError::Render(err.to_string())
}

/// `bos_token`, `eos_token`, ... of a tokenizer_config, as plain strings.
fn special_tokens_of(config: &Value) -> Map<String, Value> {
    SPECIAL_TOKEN_KEYS
        .iter()
        .filter_map(|key| {
            let text = config.get(*key).and_then(model_files::token_text)?;
            Some((key.to_string(), Value::String(text.to_string())))
        })
        .collect()
}

/// The `chat_template` field: one template, or a list of named ones.
fn templates_from_field(field: &Value, origin: &str) -> Result<Vec<(String, String, String)>> {
    match field {
        Value::String(source) => Ok(vec![(DEFAULT_NAME.into(), source.clone(), origin.into())]),
        Value::Array(entries) => {
            let mut out = Vec::new();
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let source = entry.get("template").and_then(Value::as_str);
                let (Some(name), Some(source)) = (name, source) else {
                    bail!(
                        "{origin}: each chat_template entry needs string \"name\" and \"template\" fields"
                    );
                };
                out.push((name.to_string(), source.to_string(), origin.to_string()));
            }
            if out.is_empty() {
                bail!("{origin}: chat_template is an empty list");
            }
            Ok(out)
        }
        _ => bail!("{origin}: chat_template must be a string or a list of named templates"),
    }
}

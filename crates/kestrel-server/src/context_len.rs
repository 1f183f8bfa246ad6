//! The context length served: the model's own (`max_position_embeddings`),
//! or `--max-model-len` below it. A value above it is refused unless asked
//! for explicitly, as vLLM does: positions past the trained context give
//! output of no known quality, so a typo must not silently lead there.

use anyhow::{Result, bail};
use kestrel_models::ModelConfig;

use crate::config::ServerConfig;

/// The context length for a model whose own is `model_len` tokens.
pub fn resolve(config: &ServerConfig, model_len: usize) -> Result<usize> {
    match config.max_model_len {
        None => Ok(model_len),
        Some(asked) if asked > model_len && !config.allow_long_max_model_len => bail!(
            "--max-model-len {asked} is above the model's context of {model_len} tokens \
             (max_position_embeddings in config.json); pass --allow-long-max-model-len \
             to serve it anyway (output past the trained context may be poor)"
        ),
        Some(asked) => Ok(asked.max(1)),
    }
}

/// Checks `--max-model-len` against the folder's `config.json` before the
/// server starts, so a refused value ends `kestrel serve` at once instead of
/// leaving a server that answers 503. A config that cannot be read is left
/// to the loader, which reports it in full.
pub fn check_before_start(config: &ServerConfig) -> Result<()> {
    if config.max_model_len.is_none() {
        return Ok(());
    }
    match ModelConfig::from_file(&config.model_dir.join("config.json")) {
        Ok(model) => resolve(config, model.max_position_embeddings).map(|_| ()),
        Err(_) => Ok(()),
    }
}

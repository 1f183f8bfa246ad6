//! `config.json` of a DFlash drafter in the z-lab form: a Qwen3 config for
//! its layers plus the block-drafting fields (`block_size`, at the top level
//! or inside `dflash_config`; `dflash_config.mask_token_id` and
//! `dflash_config.target_layer_ids`), checked against the target it drafts
//! for, since it shares the target's embedding and lm_head.

use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::config::{Arch, ModelConfig};

#[derive(Clone, Debug, PartialEq)]
pub struct DflashConfig {
    /// The drafter's Qwen3 layers (hidden size, heads, RoPE, MLP, eps).
    pub layers: ModelConfig,
    /// Tokens per drafted block: the anchor and `block_size - 1` masks.
    pub block_size: usize,
    /// The id the block's masked positions are embedded as.
    pub mask_token_id: u32,
    /// Target layers whose output hidden states form the context feature,
    /// in concatenation order.
    pub target_layer_ids: Vec<usize>,
}

fn usize_field(v: &Value, key: &str) -> Option<Result<usize>> {
    v.get(key).filter(|x| !x.is_null()).map(|x| {
        x.as_u64()
            .map(|n| n as usize)
            .with_context(|| format!("\"{key}\" must be a non-negative integer"))
    })
}

/// The taps the reference picks when a checkpoint names none: evenly spaced
/// from layer 1 to layer `target_layers - 3`, one per drafter layer, rounded
/// half to even as Python rounds.
fn default_taps(target_layers: usize, draft_layers: usize) -> Vec<usize> {
    if draft_layers == 1 {
        return vec![target_layers / 2];
    }
    let (start, end) = (1.0, target_layers as f64 - 3.0);
    (0..draft_layers)
        .map(|i| {
            (start + i as f64 * (end - start) / (draft_layers - 1) as f64).round_ties_even()
                as usize
        })
        .collect()
}

impl DflashConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_json(&text)
            .with_context(|| format!("invalid DFlash drafter config {}", path.display()))
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let root: Value = serde_json::from_str(text)?;
        let dflash = root
            .get("dflash_config")
            .filter(|v| v.is_object())
            .context("no \"dflash_config\" object: not a DFlash drafter")?;
        let layers = ModelConfig::from_json(text)?;
        if layers.arch != Arch::Qwen3 {
            bail!(
                "a DFlash drafter's layers are Qwen3 layers (model_type \"qwen3\"), not \"{}\"",
                layers.model_type
            );
        }
        if let Some(types) = root.get("layer_types").and_then(Value::as_array) {
            let sliding = root
                .get("use_sliding_window")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if sliding && types.iter().any(|t| t.as_str() != Some("full_attention")) {
                bail!("sliding-window drafter layers are not supported");
            }
        }
        let block_size = usize_field(&root, "block_size")
            .or_else(|| usize_field(dflash, "block_size"))
            .context("missing \"block_size\"")??;
        if block_size < 2 {
            bail!("block_size {block_size} drafts nothing: it must be at least 2");
        }
        let mask_token_id = usize_field(dflash, "mask_token_id")
            .or_else(|| usize_field(&root, "mask_token_id"))
            .context("missing \"dflash_config.mask_token_id\"")??;
        let target_layer_ids = match dflash.get("target_layer_ids") {
            Some(ids) => serde_json::from_value::<Vec<usize>>(ids.clone())
                .context("\"dflash_config.target_layer_ids\" must be a list of layer indices")?,
            None => {
                let target_layers = usize_field(&root, "num_target_layers").context(
                    "missing \"dflash_config.target_layer_ids\" (and \"num_target_layers\")",
                )??;
                default_taps(target_layers, layers.num_layers)
            }
        };
        if target_layer_ids.is_empty() {
            bail!("\"dflash_config.target_layer_ids\" is empty");
        }
        Ok(DflashConfig {
            layers,
            block_size,
            mask_token_id: u32::try_from(mask_token_id).context("mask_token_id is too large")?,
            target_layer_ids,
        })
    }

    /// Whether this drafter fits `target`: same hidden size (it reads the
    /// target's embedding and hidden states), taps inside the target's
    /// layers, the mask id inside its vocabulary.
    pub fn check_target(&self, target: &ModelConfig) -> Result<()> {
        let (h, th) = (self.layers.hidden_size, target.hidden_size);
        if h != th {
            bail!("the drafter's hidden size {h} differs from the target's {th}");
        }
        let n = target.num_layers;
        if let Some(bad) = self.target_layer_ids.iter().find(|&&l| l >= n) {
            bail!("target layer {bad} does not exist (the target has {n} layers)");
        }
        if self.mask_token_id as usize >= target.vocab_size {
            bail!(
                "mask_token_id {} is outside the target's vocabulary of {}",
                self.mask_token_id,
                target.vocab_size
            );
        }
        Ok(())
    }

    /// Width of the concatenated context feature `fc` reads.
    pub fn feature_width(&self) -> usize {
        self.target_layer_ids.len() * self.layers.hidden_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAYERS: &str = r#""model_type": "qwen3", "vocab_size": 512, "hidden_size": 64,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 32, "intermediate_size": 96"#;

    fn parse(extra: &str) -> Result<DflashConfig> {
        DflashConfig::from_json(&format!("{{{LAYERS}{extra}}}"))
    }

    #[test]
    fn block_size_is_read_at_the_top_level_or_inside_dflash_config() {
        let top = parse(r#", "block_size": 16, "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1, 2]}"#).unwrap();
        assert_eq!((top.block_size, top.mask_token_id), (16, 7));
        assert_eq!(top.target_layer_ids, vec![1, 2]);
        let inner = parse(
            r#", "dflash_config": {"block_size": 8, "mask_token_id": 7, "target_layer_ids": [1]}"#,
        )
        .unwrap();
        assert_eq!(inner.block_size, 8);
        assert_eq!(inner.feature_width(), 64);
    }

    #[test]
    fn missing_taps_follow_the_reference_spacing() {
        let c = parse(
            r#", "block_size": 16, "num_target_layers": 40, "dflash_config": {"mask_token_id": 7}"#,
        )
        .unwrap();
        assert_eq!(c.target_layer_ids, vec![1, 37]);
        assert_eq!(default_taps(40, 5), vec![1, 10, 19, 28, 37]);
    }

    #[test]
    fn malformed_configs_say_what_is_wrong() {
        let err = |extra: &str| format!("{:#}", parse(extra).unwrap_err());
        assert!(err(r#", "block_size": 16"#).contains("not a DFlash drafter"));
        assert!(
            err(r#", "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1]}"#)
                .contains("block_size")
        );
        assert!(err(r#", "block_size": 1, "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1]}"#).contains("at least 2"));
        assert!(
            err(r#", "block_size": 8, "dflash_config": {"target_layer_ids": [1]}"#)
                .contains("mask_token_id")
        );
        assert!(
            err(r#", "block_size": 8, "dflash_config": {"mask_token_id": 7}"#)
                .contains("target_layer_ids")
        );
        assert!(err(r#", "block_size": 8, "dflash_config": {"mask_token_id": 7, "target_layer_ids": []}"#).contains("empty"));
        let moe = DflashConfig::from_json(
            r#"{"model_type": "qwen3_moe", "block_size": 8, "dflash_config": {"mask_token_id": 7, "target_layer_ids": [1]}}"#,
        );
        assert!(moe.is_err());
    }

    #[test]
    fn a_drafter_must_fit_its_target() {
        let c = parse(r#", "block_size": 8, "dflash_config": {"mask_token_id": 500, "target_layer_ids": [1, 7]}"#).unwrap();
        let mut target = c.layers.clone();
        target.num_layers = 8;
        c.check_target(&target).unwrap();
        target.num_layers = 7;
        assert!(format!("{:#}", c.check_target(&target).unwrap_err()).contains("layer 7"));
        target.num_layers = 8;
        target.vocab_size = 500;
        assert!(format!("{:#}", c.check_target(&target).unwrap_err()).contains("mask_token_id"));
        target.vocab_size = 512;
        target.hidden_size = 32;
        assert!(format!("{:#}", c.check_target(&target).unwrap_err()).contains("hidden size"));
    }
}

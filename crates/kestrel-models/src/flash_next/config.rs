//! The `qwen4_exp` (Qwen3.8-Flash-Next) text config: the Qwen3.5-shaped
//! fields through [`ModelConfig`], and the hyper-connection, PLE and QSA
//! fields here. Options the model does not implement are refused by name.

use std::path::Path;

use anyhow::{Context, Result, bail};
use kestrel_core::GdnGate;
use serde::Deserialize;

use crate::config::{Arch, LayerKind, ModelConfig};
use crate::config_fields::read_fields;

#[derive(Clone, Debug, PartialEq)]
pub struct FlashNextConfig {
    pub base: ModelConfig,
    /// Residual streams of the hyper-connections and rank of their gates.
    pub hc_count: usize,
    pub hc_lowrank: usize,
    pub ple: Option<PleConfig>,
    pub qsa: QsaConfig,
    /// `mtp_num_hidden_layers`; the Flash-Next MTP head is not loaded yet.
    pub mtp_layers: usize,
}

/// The hashed n-gram per-layer embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct PleConfig {
    /// Zero-based decoder layers with a PLE module (the config lists them one-based).
    pub layers: Vec<usize>,
    pub embed_dim: usize,
    pub conv_kernel: usize,
    pub ngram_size: usize,
    pub heads_per_ngram: usize,
    pub vocab_base: u64,
    pub vocab_divisible_by: u64,
    pub seed: u64,
    /// Checkpoint shards of every n-gram table.
    pub split_parts: usize,
    pub eos_token_id: u32,
}

impl PleConfig {
    pub fn num_heads(&self) -> usize {
        (self.ngram_size - 1) * self.heads_per_ngram
    }
    pub fn head_dim(&self) -> usize {
        self.embed_dim / self.num_heads()
    }
}

/// The QSA indexer of every attention layer.
#[derive(Clone, Debug, PartialEq)]
pub struct QsaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub budget: usize,
    pub compress_ratio: usize,
}

#[derive(Deserialize)]
struct RawRope {
    rope_type: Option<String>,
}

#[derive(Deserialize)]
struct RawFlashNext {
    hidden_act: Option<String>,
    output_gate_type: Option<String>,
    attention_bias: Option<bool>,
    rope_parameters: Option<RawRope>,
    hc_count: Option<usize>,
    hc_lowrank: Option<usize>,
    #[serde(default)]
    ple_layer_ids: Vec<usize>,
    ple_embed_dim: Option<usize>,
    ple_conv_kernel_size: Option<usize>,
    ngram_size: Option<usize>,
    heads_per_ngram: Option<usize>,
    ngram_vocab_size_base: Option<u64>,
    make_ngram_vocab_size_divisible_by: Option<u64>,
    seed: Option<u64>,
    split_ngram_parts: Option<usize>,
    indexer_n_heads: Option<usize>,
    indexer_kv_heads: Option<usize>,
    indexer_head_dim: Option<usize>,
    indexer_budget: Option<usize>,
    indexer_compress_ratio: Option<usize>,
    mtp_num_hidden_layers: Option<usize>,
}

impl FlashNextConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("invalid model config {}", path.display()))
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let mut base = ModelConfig::from_json(text)?;
        if base.arch != Arch::Qwen4Exp {
            bail!("model_type \"{}\" is not qwen4_exp", base.model_type);
        }
        let root: serde_json::Value = serde_json::from_str(text)?;
        let (text_value, at) = match root.get("text_config") {
            Some(text) => (text.clone(), "text_config"),
            None => (root.clone(), ""),
        };
        let raw: RawFlashNext = read_fields(text_value, at)?;

        let gate = raw
            .output_gate_type
            .as_deref()
            .or(raw.hidden_act.as_deref())
            .unwrap_or("silu");
        let output_gate = match gate {
            "sigmoid" => GdnGate::Sigmoid,
            "silu" => GdnGate::Silu,
            other => bail!("unsupported Gated DeltaNet output gate activation \"{other}\""),
        };
        if let Some(la) = base.linear_attn.as_mut() {
            la.output_gate = output_gate;
        }
        if raw.hidden_act.as_deref().is_some_and(|a| a != "silu") {
            bail!("hidden_act other than silu is not supported");
        }
        if raw.attention_bias == Some(true) {
            bail!("attention_bias is not supported");
        }
        if let Some(t) = raw.rope_parameters.and_then(|r| r.rope_type)
            && t != "default"
        {
            bail!("rope_type \"{t}\" is not supported (only \"default\")");
        }
        if base.moe.as_ref().is_some_and(|m| !m.norm_topk_prob) {
            bail!("norm_topk_prob false is not supported");
        }

        let hc_count = raw.hc_count.unwrap_or(4);
        if hc_count <= 1 {
            bail!("hc_count must be greater than 1, got {hc_count}");
        }
        let hc_lowrank = raw.hc_lowrank.unwrap_or(320);

        let qsa = match (
            raw.indexer_n_heads,
            raw.indexer_kv_heads,
            raw.indexer_head_dim,
            raw.indexer_budget,
            raw.indexer_compress_ratio,
        ) {
            (Some(num_heads), Some(kv), Some(head_dim), Some(budget), Some(compress_ratio)) => {
                if [num_heads, kv, head_dim, budget, compress_ratio].contains(&0) {
                    bail!("QSA indexer sizes must be positive");
                }
                if kv != 1 {
                    bail!("indexer_kv_heads must be 1, got {kv}");
                }
                if !budget.is_multiple_of(compress_ratio) {
                    bail!(
                        "indexer_budget {budget} is not a multiple of indexer_compress_ratio {compress_ratio}"
                    );
                }
                if base.rotary_dim > head_dim {
                    bail!(
                        "rotary dims {} do not fit the indexer head of {head_dim}",
                        base.rotary_dim
                    );
                }
                QsaConfig {
                    num_heads,
                    head_dim,
                    budget,
                    compress_ratio,
                }
            }
            (None, None, None, None, None) => {
                bail!("qwen4_exp without the QSA indexer (indexer_* fields) is not supported")
            }
            _ => bail!(
                "the QSA indexer needs all of indexer_n_heads, indexer_kv_heads, indexer_head_dim, indexer_budget and indexer_compress_ratio"
            ),
        };

        let ple = if raw.ple_layer_ids.is_empty() {
            None
        } else {
            let mut ids = raw.ple_layer_ids.clone();
            ids.sort_unstable();
            ids.dedup();
            let n = base.num_layers;
            if let Some(bad) = ids.iter().find(|&&i| i == 0 || i > n) {
                bail!("ple_layer_ids are one-based layer numbers in 1..={n}, got {bad}");
            }
            let layers: Vec<usize> = ids.iter().map(|i| i - 1).collect();
            if let Some(bad) = layers
                .iter()
                .find(|&&l| base.layer_kinds[l] != LayerKind::LinearAttention)
            {
                bail!("PLE is only supported on linear-attention layers, not on layer {bad}");
            }
            let eos_token_id = *base
                .eos_token_ids
                .first()
                .context("eos_token_id must be set when PLE layers are enabled")?;
            let ple = PleConfig {
                layers,
                embed_dim: raw.ple_embed_dim.unwrap_or(base.hidden_size),
                conv_kernel: raw.ple_conv_kernel_size.unwrap_or(4),
                ngram_size: raw.ngram_size.unwrap_or(3),
                heads_per_ngram: raw.heads_per_ngram.unwrap_or(8),
                vocab_base: raw.ngram_vocab_size_base.unwrap_or(20_000_000),
                vocab_divisible_by: raw.make_ngram_vocab_size_divisible_by.unwrap_or(128),
                seed: raw.seed.unwrap_or(1234),
                split_parts: raw.split_ngram_parts.unwrap_or(512),
                eos_token_id,
            };
            if ple.ngram_size < 2 || ple.heads_per_ngram == 0 {
                bail!("PLE needs ngram_size >= 2 and heads_per_ngram >= 1");
            }
            if ple.embed_dim == 0 || !ple.embed_dim.is_multiple_of(ple.num_heads()) {
                bail!(
                    "ple_embed_dim {} is not a multiple of the {} n-gram heads",
                    ple.embed_dim,
                    ple.num_heads()
                );
            }
            if ple.conv_kernel < 1 || ple.split_parts == 0 || ple.vocab_divisible_by == 0 {
                bail!(
                    "PLE conv kernel, split_ngram_parts and the vocabulary divisor must be positive"
                );
            }
            Some(ple)
        };
        Ok(FlashNextConfig {
            base,
            hc_count,
            hc_lowrank,
            ple,
            qsa,
            mtp_layers: raw.mtp_num_hidden_layers.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> String {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp/model");
        std::fs::read_to_string(dir.join("config.json")).unwrap()
    }

    fn edited(f: impl FnOnce(&mut serde_json::Value)) -> Result<FlashNextConfig> {
        let mut v: serde_json::Value = serde_json::from_str(&fixture()).unwrap();
        f(&mut v["text_config"]);
        FlashNextConfig::from_json(&v.to_string())
    }

    #[test]
    fn the_fixture_config_reads_as_flash_next() {
        let c = FlashNextConfig::from_json(&fixture()).unwrap();
        assert_eq!(c.base.arch, Arch::Qwen4Exp);
        assert_eq!(c.base.weight_prefix, "model.language_model.");
        assert_eq!(c.base.num_attention_layers(), 2);
        assert_eq!(
            c.base.linear_attn.as_ref().unwrap().output_gate,
            GdnGate::Sigmoid
        );
        assert_eq!((c.hc_count, c.hc_lowrank), (4, 8));
        let ple = c.ple.unwrap();
        assert_eq!(
            (ple.layers.clone(), ple.num_heads(), ple.head_dim()),
            (vec![0], 16, 4)
        );
        assert_eq!(ple.eos_token_id, 2);
        assert_eq!(
            c.qsa,
            QsaConfig {
                num_heads: 2,
                head_dim: 16,
                budget: 16,
                compress_ratio: 4
            }
        );
    }

    #[test]
    fn unsupported_options_are_refused_by_name() {
        let err = |f: fn(&mut serde_json::Value)| format!("{:#}", edited(f).unwrap_err());
        assert!(err(|t| t["indexer_kv_heads"] = 2.into()).contains("indexer_kv_heads"));
        assert!(err(|t| t["indexer_budget"] = 18.into()).contains("multiple"));
        assert!(err(|t| t["output_gate_type"] = "gelu".into()).contains("gelu"));
        assert!(err(|t| t["hc_count"] = 1.into()).contains("hc_count"));
        assert!(err(|t| t["ple_layer_ids"] = serde_json::json!([4])).contains("linear-attention"));
        assert!(err(|t| t["ple_embed_dim"] = 60.into()).contains("ple_embed_dim"));
        assert!(
            err(|t| {
                t.as_object_mut().unwrap().remove("indexer_n_heads");
            })
            .contains("indexer")
        );
        assert!(err(|t| t["rope_parameters"]["rope_type"] = "yarn".into()).contains("yarn"));
        assert!(err(|t| t["norm_topk_prob"] = false.into()).contains("norm_topk_prob"));
        assert!(
            err(|t| t["layer_types"][0] = "sliding_attention".into()).contains("sliding_attention")
        );
    }

    #[test]
    fn the_shared_model_refuses_flash_next() {
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp/model");
        let err = crate::Model::load(&dir, &kestrel_cpu::CpuBackend::new())
            .err()
            .unwrap();
        assert!(format!("{err:#}").contains("flash_next"), "{err:#}");
    }
}

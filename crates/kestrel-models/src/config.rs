//! `config.json` of the four Qwen architectures, mapped onto one description.
//!
//! Qwen3.5/3.6 nest the language model's fields under `text_config`; the others
//! are flat. Older and newer transformers spell RoPE settings differently
//! (`rope_theta` at the top level or inside `rope_parameters`), and the expert
//! count as `num_experts` or `num_local_experts`; both are read.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use crate::config_fields::read_fields;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Qwen3,
    Qwen3Moe,
    Qwen35Moe,
    Qwen3Next,
    /// Qwen3.8-Flash-Next: read here for its Qwen3.5-shaped fields; the rest
    /// of its config and the model itself are in [`crate::flash_next`].
    Qwen4Exp,
}

impl Arch {
    /// Hybrid models (Gated DeltaNet + gated attention) use zero-centred norms.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Qwen4Exp)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    FullAttention,
    LinearAttention,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub top_k: usize,
    pub intermediate: usize,
    pub norm_topk_prob: bool,
    pub shared_intermediate: Option<usize>,
}

impl MoeConfig {
    /// The backend's view of this MoE block.
    pub fn spec(&self) -> kestrel_core::MoeSpec {
        kestrel_core::MoeSpec {
            num_experts: self.num_experts,
            top_k: self.top_k,
            intermediate: self.intermediate,
            norm_topk_prob: self.norm_topk_prob,
            shared_intermediate: self.shared_intermediate,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LinearAttnConfig {
    pub num_k_heads: usize,
    pub num_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    pub conv_kernel: usize,
    /// SiLU everywhere but Qwen3.8-Flash-Next (sigmoid).
    pub output_gate: kestrel_core::GdnGate,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rotary_dim: usize,
    pub attn_output_gate: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub layer_kinds: Vec<LayerKind>,
    /// Per layer: true when the feed-forward block is the sparse MoE.
    pub sparse_layers: Vec<bool>,
    pub dense_intermediate: Option<usize>,
    pub moe: Option<MoeConfig>,
    pub linear_attn: Option<LinearAttnConfig>,
    pub mtp_layers: usize,
    pub eos_token_ids: Vec<u32>,
    /// Tensor-name prefix of the language model (`model.` or `model.language_model.`).
    pub weight_prefix: String,
}

#[derive(Deserialize, Default)]
struct RawRope {
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize)]
struct RawText {
    vocab_size: usize,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    #[serde(default = "default_eps")]
    rms_norm_eps: f64,
    rope_theta: Option<f64>,
    partial_rotary_factor: Option<f64>,
    rope_parameters: Option<RawRope>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    intermediate_size: Option<usize>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    attn_output_gate: Option<bool>,
    // MoE
    num_experts: Option<usize>,
    /// transformers 5 writes this name where Qwen's own configs say
    /// `num_experts`; `num_experts` wins when both are present.
    num_local_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    norm_topk_prob: Option<bool>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    // Gated DeltaNet
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    mtp_num_hidden_layers: Option<usize>,
    eos_token_id: Option<OneOrMany>,
}

fn default_eps() -> f64 {
    1e-6
}

/// The `config.json` a command names: the file itself, or the one in the
/// folder it names.
pub fn config_file(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("config.json")
    } else {
        path.to_path_buf()
    }
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::from_json(&text).with_context(|| format!("invalid model config {}", path.display()))
    }

    pub fn from_json(text: &str) -> Result<Self> {
        let root: serde_json::Value = serde_json::from_str(text)?;
        let model_type = root
            .get("model_type")
            .and_then(|v| v.as_str())
            .context("missing \"model_type\"")?
            .to_string();
        let (arch, text_value, prefix, at) = match model_type.as_str() {
            "qwen3" => (Arch::Qwen3, root.clone(), "model.", ""),
            "qwen3_moe" => (Arch::Qwen3Moe, root.clone(), "model.", ""),
            "qwen3_next" => (Arch::Qwen3Next, root.clone(), "model.", ""),
            "qwen3_5_moe" => {
                let text = root
                    .get("text_config")
                    .cloned()
                    .context("qwen3_5_moe config has no \"text_config\"")?;
                (
                    Arch::Qwen35Moe,
                    text,
                    "model.language_model.",
                    "text_config",
                )
            }
            "qwen3_5_moe_text" => (Arch::Qwen35Moe, root.clone(), "model.", ""),
            "qwen4_exp" => {
                let text = root
                    .get("text_config")
                    .cloned()
                    .context("qwen4_exp config has no \"text_config\"")?;
                (Arch::Qwen4Exp, text, "model.language_model.", "text_config")
            }
            "qwen4_exp_text" => (Arch::Qwen4Exp, root.clone(), "model.", ""),
            other => bail!(
                "unsupported model_type \"{other}\" (supported: qwen3, qwen3_moe, qwen3_5_moe, qwen3_next, qwen4_exp)"
            ),
        };
        let mut raw: RawText = read_fields(text_value, at)?;
        // Top-level eos wins over text_config's (Qwen3.5 keeps it at both levels).
        let eos = root
            .get("eos_token_id")
            .and_then(|v| serde_json::from_value::<OneOrMany>(v.clone()).ok())
            .or(raw.eos_token_id.take());
        Self::build(arch, model_type, raw, eos, prefix)
    }

    fn build(
        arch: Arch,
        model_type: String,
        raw: RawText,
        eos: Option<OneOrMany>,
        prefix: &str,
    ) -> Result<Self> {
        let n = raw.num_hidden_layers;
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        let head_dim = raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads.max(1));
        if raw.num_attention_heads == 0 || num_kv_heads == 0 || head_dim == 0 {
            bail!("attention heads and head_dim must be positive");
        }
        if !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            bail!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({num_kv_heads})",
                raw.num_attention_heads
            );
        }
        let rope = raw.rope_parameters.unwrap_or_default();
        let rope_theta = rope.rope_theta.or(raw.rope_theta).unwrap_or(10_000.0);
        let default_partial = if arch.is_hybrid() { 0.25 } else { 1.0 };
        let partial = rope
            .partial_rotary_factor
            .or(raw.partial_rotary_factor)
            .unwrap_or(default_partial);
        let rotary_dim = (head_dim as f64 * partial) as usize;
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            bail!(
                "rotary dimension {rotary_dim} (head_dim {head_dim} x {partial}) must be even and positive"
            );
        }

        let layer_kinds = if arch.is_hybrid() {
            match &raw.layer_types {
                Some(types) => {
                    if types.len() != n {
                        bail!("layer_types has {} entries for {n} layers", types.len());
                    }
                    types
                        .iter()
                        .map(|t| match t.as_str() {
                            "full_attention" | "attention" => Ok(LayerKind::FullAttention),
                            // Qwen3.8-Flash-Next's name for its (sparse) attention layers.
                            "qwen_sparse_attention" if arch == Arch::Qwen4Exp => {
                                Ok(LayerKind::FullAttention)
                            }
                            "linear_attention" | "mamba" => Ok(LayerKind::LinearAttention),
                            other => bail!("unknown layer type \"{other}\""),
                        })
                        .collect::<Result<Vec<_>>>()?
                }
                None => {
                    let interval = raw.full_attention_interval.unwrap_or(4).max(1);
                    (0..n)
                        .map(|i| {
                            if (i + 1) % interval == 0 {
                                LayerKind::FullAttention
                            } else {
                                LayerKind::LinearAttention
                            }
                        })
                        .collect()
                }
            }
        } else {
            vec![LayerKind::FullAttention; n]
        };

        let moe = match (raw.num_experts.or(raw.num_local_experts), arch) {
            (Some(e), Arch::Qwen3Moe | Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Qwen4Exp)
                if e > 0 =>
            {
                let top_k = raw
                    .num_experts_per_tok
                    .context("missing num_experts_per_tok")?;
                if top_k == 0 || top_k > e {
                    bail!("num_experts_per_tok {top_k} must be in 1..={e}");
                }
                Some(MoeConfig {
                    num_experts: e,
                    top_k,
                    intermediate: raw
                        .moe_intermediate_size
                        .context("missing moe_intermediate_size")?,
                    // Qwen3.5's router always renormalises.
                    // Qwen3.8-Flash-Next's defaults to true.
                    norm_topk_prob: arch == Arch::Qwen35Moe
                        || raw.norm_topk_prob.unwrap_or(arch == Arch::Qwen4Exp),
                    shared_intermediate: match arch {
                        Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Qwen4Exp => {
                            raw.shared_expert_intermediate_size
                        }
                        _ => None,
                    }
                    .filter(|&s| s > 0),
                })
            }
            (None, Arch::Qwen3Moe | Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Qwen4Exp) => {
                bail!("missing num_experts")
            }
            _ => None,
        };
        let step = raw.decoder_sparse_step.unwrap_or(1).max(1);
        let mlp_only = raw.mlp_only_layers.unwrap_or_default();
        let sparse_layers: Vec<bool> = (0..n)
            .map(|i| {
                moe.is_some()
                    && (matches!(arch, Arch::Qwen35Moe | Arch::Qwen4Exp)
                        || (!mlp_only.contains(&i) && (i + 1) % step == 0))
            })
            .collect();
        let dense_intermediate = raw.intermediate_size;
        if sparse_layers.iter().any(|s| !s) && dense_intermediate.is_none() {
            bail!("missing intermediate_size for dense layers");
        }

        let linear_attn = if arch.is_hybrid() {
            Some(LinearAttnConfig {
                num_k_heads: raw
                    .linear_num_key_heads
                    .context("missing linear_num_key_heads")?,
                num_v_heads: raw
                    .linear_num_value_heads
                    .context("missing linear_num_value_heads")?,
                head_k_dim: raw
                    .linear_key_head_dim
                    .context("missing linear_key_head_dim")?,
                head_v_dim: raw
                    .linear_value_head_dim
                    .context("missing linear_value_head_dim")?,
                conv_kernel: raw.linear_conv_kernel_dim.unwrap_or(4),
                output_gate: kestrel_core::GdnGate::Silu,
            })
        } else {
            None
        };
        if let Some(la) = &linear_attn
            && (la.num_k_heads == 0 || la.num_v_heads % la.num_k_heads != 0 || la.conv_kernel < 2)
        {
            bail!(
                "linear attention heads ({} k, {} v) or conv kernel invalid",
                la.num_k_heads,
                la.num_v_heads
            );
        }

        Ok(ModelConfig {
            arch,
            model_type,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            num_layers: n,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: raw.rms_norm_eps as f32,
            rope_theta: rope_theta as f32,
            rotary_dim,
            attn_output_gate: raw.attn_output_gate.unwrap_or(arch.is_hybrid()),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(32768),
            layer_kinds,
            sparse_layers,
            dense_intermediate,
            moe,
            linear_attn,
            mtp_layers: raw.mtp_num_hidden_layers.unwrap_or(0),
            eos_token_ids: match eos {
                Some(OneOrMany::One(id)) => vec![id],
                Some(OneOrMany::Many(ids)) => ids,
                None => vec![],
            },
            weight_prefix: prefix.to_string(),
        })
    }

    pub fn num_attention_layers(&self) -> usize {
        self.layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::FullAttention)
            .count()
    }

    pub fn num_linear_layers(&self) -> usize {
        self.num_layers - self.num_attention_layers()
    }
}

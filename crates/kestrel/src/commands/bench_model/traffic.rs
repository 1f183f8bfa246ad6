//! Bytes a forward step must read from memory at least: every weight it
//! uses once (for MoE layers the experts its tokens route to), the KV cache
//! of its sequences and their recurrent state. Divided by the memory
//! bandwidth this is the step's floor; decode at small batch sits on it.

use kestrel_models::blocks::{attention::attention_spec, gdn::gdn_spec};
use kestrel_models::{LayerKind, ModelConfig};
use serde_json::{Value, json};

/// How a backend stores things, in bytes per element.
#[derive(Clone, Copy, Debug)]
pub struct Storage {
    /// Matrix weights (bf16 on CUDA, f32 on the CPU reference backend).
    pub matrix: usize,
    /// The matrices block-FP8 checkpoints quantise (attention and DeltaNet
    /// projections but their `a`/`b` rows, dense and expert MLPs): 1 where
    /// the backend reads them as FP8 (their scales, 4 bytes per 16,384
    /// weights, are left out), else `matrix`.
    pub quantized: usize,
    /// The whole lm_head: 1 with `--lm-head-dtype fp8` on CUDA, else
    /// `matrix` (a reduced draft vocabulary's head is always `matrix`).
    pub lm_head: usize,
    /// KV-cache entries.
    pub kv: usize,
}

impl Storage {
    /// The CPU reference backend: everything f32.
    pub fn cpu() -> Self {
        Storage {
            matrix: 4,
            quantized: 4,
            lm_head: 4,
            kv: 4,
        }
    }

    /// CUDA: bf16 weights and KV cache; the quantisable matrices FP8 with
    /// `fp8`, the lm_head with `lm_head_fp8`.
    pub fn cuda(fp8: bool, lm_head_fp8: bool) -> Self {
        let bytes = |fp8| if fp8 { 1 } else { 2 };
        Storage {
            matrix: 2,
            quantized: bytes(fp8),
            lm_head: bytes(lm_head_fp8),
            kv: 2,
        }
    }
}

/// Vectors (norms, decays) and recurrent state are f32 on every backend.
const VECTOR: usize = 4;

#[derive(Clone, Debug, Default)]
pub struct StepBytes {
    /// Weights every step reads whatever the routing: attention/DeltaNet
    /// projections, norms, routers, shared experts, the embedding rows used.
    pub dense_weights: f64,
    /// Routed experts: the expected number of distinct experts the step's
    /// tokens select, `E * (1 - (1 - k/E)^tokens)` per MoE layer.
    pub expert_weights: f64,
    pub expected_experts_per_layer: f64,
    pub lm_head: f64,
    pub kv_cache: f64,
    pub recurrent_state: f64,
    /// Verify steps on hybrid models: the recurrent and conv state written
    /// after each draft token (k per sequence and DeltaNet layer).
    pub state_checkpoints: f64,
    pub total: f64,
}

impl StepBytes {
    pub fn to_json(&self) -> Value {
        json!({
            "dense_weights": self.dense_weights,
            "expert_weights": self.expert_weights,
            "expected_experts_per_layer": self.expected_experts_per_layer,
            "lm_head": self.lm_head,
            "kv_cache": self.kv_cache,
            "recurrent_state": self.recurrent_state,
            "state_checkpoints": self.state_checkpoints,
            "total": self.total,
        })
    }
}

/// Bytes of one step over `seqs` sequences of `context` cached tokens each,
/// every one adding `new_tokens` tokens (1 for decode) and producing logits
/// for its last token.
pub fn step_bytes(
    cfg: &ModelConfig,
    st: Storage,
    seqs: usize,
    context: f64,
    new_tokens: usize,
) -> StepBytes {
    let h = cfg.hidden_size;
    let tokens = seqs * new_tokens;
    let mat = |rows: usize, cols: usize| (rows * cols * st.matrix) as f64;
    let qmat = |rows: usize, cols: usize| (rows * cols * st.quantized) as f64;
    let vec = |n: usize| (n * VECTOR) as f64;
    let mut b = StepBytes::default();
    // Embedding rows of the new tokens, final norm.
    b.dense_weights += mat(tokens, h) + vec(h);
    let attn = attention_spec(cfg);
    for (i, kind) in cfg.layer_kinds.iter().enumerate() {
        b.dense_weights += 2.0 * vec(h);
        match kind {
            LayerKind::FullAttention => {
                b.dense_weights +=
                    qmat(attn.proj_width(), h) + qmat(h, attn.q_width()) + 2.0 * vec(attn.head_dim);
                // Keys and values of every cached and new position.
                b.kv_cache += seqs as f64
                    * (context + new_tokens as f64)
                    * (2 * attn.kv_width() * st.kv) as f64;
            }
            LayerKind::LinearAttention => {
                let g = gdn_spec(cfg).expect("hybrid configs have linear attention");
                let ba = 2 * g.num_v_heads;
                b.dense_weights += qmat(g.proj_width() - ba, h)
                    + mat(ba, h)
                    + qmat(h, g.value_width())
                    + mat(g.conv_dim(), g.conv_kernel)
                    + vec(2 * g.num_v_heads + g.head_v_dim);
                let state = g.num_v_heads * g.head_k_dim * g.head_v_dim
                    + (g.conv_kernel - 1) * g.conv_dim();
                b.recurrent_state += (seqs * state * VECTOR) as f64;
            }
        }
        match (&cfg.moe, cfg.sparse_layers[i]) {
            (Some(moe), true) => {
                let (e, k) = (moe.num_experts as f64, moe.top_k as f64);
                let distinct = e * (1.0 - (1.0 - k / e).powi(tokens as i32));
                b.expected_experts_per_layer = distinct;
                b.dense_weights += mat(moe.num_experts, h);
                if let Some(si) = moe.shared_intermediate {
                    b.dense_weights += qmat(3 * si, h) + mat(1, h);
                }
                b.expert_weights += distinct * qmat(3 * moe.intermediate, h);
            }
            _ => b.dense_weights += qmat(3 * cfg.dense_intermediate.unwrap_or_default(), h),
        }
    }
    b.lm_head = (cfg.vocab_size * h * st.lm_head) as f64;
    b.total = b.dense_weights + b.expert_weights + b.lm_head + b.kv_cache + b.recurrent_state;
    b
}

/// Bytes of a verify step: `seqs` sequences of `context` cached tokens each
/// bringing `k + 1` new tokens (its next token and `k` drafts), so the
/// routed experts are the expected union over `seqs * (k + 1)` tokens
/// (uniform routing); on hybrid models each sequence also writes `k` state
/// checkpoints per DeltaNet layer.
pub fn verify_bytes(
    cfg: &ModelConfig,
    st: Storage,
    seqs: usize,
    context: f64,
    k: usize,
) -> StepBytes {
    let mut b = step_bytes(cfg, st, seqs, context, k + 1);
    if cfg.arch.is_hybrid() {
        // `recurrent_state` is one state per sequence and layer.
        b.state_checkpoints = b.recurrent_state * k as f64;
        b.total += b.state_checkpoints;
    }
    b
}

/// Matrix FLOPs of a prefill of `tokens` tokens (one sequence): two per
/// multiply-add over the weights each token uses (top-k experts only), plus
/// causal attention scores and values.
pub fn prefill_flops(cfg: &ModelConfig, tokens: usize) -> f64 {
    let one_byte = Storage {
        matrix: 1,
        quantized: 1,
        lm_head: 1,
        kv: 0,
    };
    let per_token = step_bytes(cfg, one_byte, 1, 0.0, 1);
    // With one token, the "distinct experts" are exactly top-k; bytes at one
    // byte per element are parameters. The embedding row is a lookup, not math.
    let params = per_token.dense_weights + per_token.expert_weights + per_token.lm_head
        - cfg.hidden_size as f64;
    let attn = attention_spec(cfg);
    let t = tokens as f64;
    let attn_flops = cfg.num_attention_layers() as f64
        * 2.0
        * 2.0
        * (t * t / 2.0)
        * (attn.num_q_heads * attn.head_dim) as f64;
    2.0 * params * t + attn_flops
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(name: &str) -> ModelConfig {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs")
            .join(name)
            .join("config.json");
        ModelConfig::from_file(&path).unwrap()
    }

    const BF16: Storage = Storage {
        matrix: 2,
        quantized: 2,
        lm_head: 2,
        kv: 2,
    };

    #[test]
    fn qwen3_6_batch_one_reads_about_six_gigabytes() {
        // The published figure: about 2.95 B parameters read per decoded token
        // (5.9 GB in bf16), of which the lm_head is 1 GB.
        let b = step_bytes(&config("qwen3.6-35b-a3b"), BF16, 1, 0.0, 1);
        assert!((b.lm_head - 248_320.0 * 2048.0 * 2.0).abs() < 1.0);
        assert!((5.7e9..6.2e9).contains(&b.total), "{b:?}");
        assert!((b.expected_experts_per_layer - 8.0).abs() < 1e-9);
        // 30 DeltaNet layers of 32 x 128 x 128 f32 state: 60 MiB.
        assert!(b.recurrent_state > 60.0 * 1024.0 * 1024.0);
    }

    #[test]
    fn qwen3_30b_batch_one_reads_about_six_gigabytes_and_experts_grow_with_batch() {
        let cfg = config("qwen3-30b-a3b");
        let one = step_bytes(&cfg, BF16, 1, 0.0, 1);
        assert!((5.8e9..6.4e9).contains(&one.total), "{one:?}");
        let eight = step_bytes(&cfg, BF16, 8, 1024.0, 1);
        // 8 tokens x top-8 of 128: about 51 distinct experts, not 64.
        assert!((50.0..53.0).contains(&eight.expected_experts_per_layer));
        // KV: 48 layers x 2 x 4 heads x 128 x 2 B = 96 KiB per token.
        assert!((eight.kv_cache - 8.0 * 1025.0 * 98_304.0).abs() < 1.0);
    }

    #[test]
    fn verify_steps_count_the_expert_union_of_all_tokens_and_the_checkpoints() {
        let cfg = config("qwen3.6-35b-a3b");
        let decode = step_bytes(&cfg, BF16, 2, 1024.0, 1);
        let verify = verify_bytes(&cfg, BF16, 2, 1024.0, 3);
        // 8 tokens x top-8 of 256 experts: 256 * (1 - (1 - 8/256)^8) = 57.4.
        assert!((57.3..57.5).contains(&verify.expected_experts_per_layer));
        assert!((decode.expected_experts_per_layer - 15.75).abs() < 0.01);
        assert!((verify.state_checkpoints - 3.0 * decode.recurrent_state).abs() < 1.0);
        let parts = verify.dense_weights
            + verify.expert_weights
            + verify.lm_head
            + verify.kv_cache
            + verify.recurrent_state
            + verify.state_checkpoints;
        assert!((verify.total - parts).abs() < 1.0);
        let dense = verify_bytes(&config("qwen3-30b-a3b"), BF16, 2, 1024.0, 3);
        assert_eq!(dense.state_checkpoints, 0.0, "no DeltaNet layers");
    }

    #[test]
    fn prefill_flops_count_active_parameters() {
        let cfg = config("qwen3-30b-a3b");
        let f = prefill_flops(&cfg, 1);
        // About 3.3 B active parameters (with the lm_head) per token.
        assert!((6.0e9..7.0e9).contains(&f), "{f}");
    }

    #[test]
    fn fp8_halves_the_quantised_weights_and_keeps_the_lm_head() {
        let cfg = config("qwen3.6-35b-a3b");
        let fp8 = Storage {
            quantized: 1,
            ..BF16
        };
        let (b, q) = (
            step_bytes(&cfg, BF16, 1, 0.0, 1),
            step_bytes(&cfg, fp8, 1, 0.0, 1),
        );
        assert_eq!(q.lm_head, b.lm_head);
        assert!((q.expert_weights * 2.0 - b.expert_weights).abs() < 1.0);
        // The figure: about 1.7x fewer bytes with the lm_head in bf16.
        let gain = b.total / q.total;
        assert!((1.6..1.8).contains(&gain), "{gain}");
    }
}

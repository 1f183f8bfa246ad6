//! Full attention: fused q/k/v(/gate) projection, the backend's paged
//! attention (q/k norm, RoPE, KV write, softmax, output gate), `o_proj`.

use anyhow::Result;
use kestrel_core::{AttentionSpec, AttentionWeights, Backend, ForwardBatch, PreNorm, RopeSpec};

use crate::config::ModelConfig;
use crate::loader::Loader;
use crate::transform;

pub struct Attention<B: Backend> {
    pub(crate) proj: B::Weight,
    pub(crate) o_proj: B::Weight,
    pub(crate) weights: AttentionWeights<B::Weight>,
    pub spec: AttentionSpec,
    /// Index of this layer among the cache's attention layers.
    pub(crate) cache_layer: usize,
}

pub fn attention_spec(cfg: &ModelConfig) -> AttentionSpec {
    AttentionSpec {
        num_q_heads: cfg.num_heads,
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
        rope: RopeSpec {
            theta: cfg.rope_theta,
            rotary_dim: cfg.rotary_dim,
        },
        norm_eps: cfg.rms_norm_eps,
        output_gate: cfg.attn_output_gate,
        scale: (cfg.head_dim as f32).powf(-0.5),
    }
}

impl<B: Backend> Attention<B> {
    /// `p` is the module prefix, e.g. `model.layers.3.self_attn.`.
    pub fn load(l: &Loader<B>, p: &str, cfg: &ModelConfig, cache_layer: usize) -> Result<Self> {
        let spec = attention_spec(cfg);
        let (h, d) = (cfg.hidden_size, spec.head_dim);
        let q_rows = spec.q_width() * if spec.output_gate { 2 } else { 1 };
        let q_name = format!("{p}q_proj.weight");
        let proj = l.materialize(&q_name, &[spec.proj_width(), h], || {
            let q = l.tensor(&q_name, &[q_rows, h])?;
            // Gated checkpoints interleave per head [query (D) | gate (D)]; the
            // fused operation wants all queries first, then all gates.
            let q = if spec.output_gate {
                let order: Vec<usize> = (0..2)
                    .flat_map(|half| {
                        (0..spec.num_q_heads).flat_map(move |head| {
                            let start = head * 2 * d + half * d;
                            start..start + d
                        })
                    })
                    .collect();
                transform::gather_rows(&q, &order)
            } else {
                q
            };
            let k = l.tensor(&format!("{p}k_proj.weight"), &[spec.kv_width(), h])?;
            let v = l.tensor(&format!("{p}v_proj.weight"), &[spec.kv_width(), h])?;
            transform::concat_rows(&[q, k, v])
        })?;
        Ok(Attention {
            proj,
            o_proj: l.weight(&format!("{p}o_proj.weight"), &[h, spec.q_width()])?,
            weights: AttentionWeights {
                q_norm: l.norm(&format!("{p}q_norm.weight"), d)?,
                k_norm: l.norm(&format!("{p}k_norm.weight"), d)?,
            },
            spec,
            cache_layer,
        })
    }

    pub fn forward(
        &self,
        b: &B,
        x: PreNorm<'_, B::Tensor, B::Weight>,
        cache: &mut B::Cache,
        batch: &ForwardBatch,
    ) -> B::Tensor {
        let proj = b.norm_matmul(x, &self.proj);
        let out = b.attention(
            &proj,
            &self.weights,
            &self.spec,
            cache,
            self.cache_layer,
            batch,
        );
        b.matmul(&out, &self.o_proj)
    }
}

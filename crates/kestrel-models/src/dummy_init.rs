//! How `--load-format dummy` draws each parameter, by its role: values of
//! the scale trained weights have, so that a full-size model with random
//! weights runs like one with real ones.

use kestrel_core::DType;

/// How a dummy parameter is drawn: uniform in `[offset - scale, offset + scale)`.
/// Chosen so that activations of a full-size model stay finite and MoE routing
/// spreads over the experts, as with trained weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Init {
    pub offset: f32,
    pub scale: f32,
    pub dtype: DType,
}

impl Init {
    /// Picked from the tensor's role, which its name and rank tell.
    pub fn for_tensor(name: &str, shape: &[usize]) -> Init {
        let base = name.split('#').next().unwrap_or(name);
        let f32 = |offset, scale| Init {
            offset,
            scale,
            dtype: DType::F32,
        };
        if base.ends_with("A_log") {
            // A = exp(A_log) in [1, 16], as Qwen3.5's initialiser draws it.
            f32(0.5 * 16f32.ln(), 0.5 * 16f32.ln())
        } else if base.ends_with("dt_bias") {
            // Inverse softplus of dt in about [1e-3, 1e-1].
            f32(-4.6, 2.3)
        } else if shape.len() == 1 {
            // Norm weights in the plain form the backends use (`1 + w` of a
            // zero-centred checkpoint is near 1 too).
            f32(1.0, 0.1)
        } else if base.contains("conv1d") {
            Init {
                offset: 0.0,
                scale: 0.3,
                dtype: DType::BF16,
            }
        } else {
            // Matrices: standard deviation 0.02 (the configs' initializer_range).
            Init {
                offset: 0.0,
                scale: 0.02 * 3f32.sqrt(),
                dtype: DType::BF16,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dummy_inits_follow_the_tensor_role() {
        let a = Init::for_tensor("model.layers.0.linear_attn.A_log", &[32]);
        assert!(a.offset - a.scale >= 0.0 && a.offset + a.scale <= 16f32.ln() + 1e-6);
        let dt = Init::for_tensor("model.layers.0.linear_attn.dt_bias", &[32]);
        assert!(
            dt.offset + dt.scale < 0.0,
            "softplus(dt_bias) must be small"
        );
        let n = Init::for_tensor("model.norm.weight", &[2048]);
        assert_eq!((n.offset, n.dtype), (1.0, DType::F32));
        let m = Init::for_tensor("model.layers.0.mlp.experts.gate_up_proj", &[8, 64, 32]);
        assert_eq!((m.offset, m.dtype), (0.0, DType::BF16));
        assert!((m.scale / 3f32.sqrt() - 0.02).abs() < 1e-6);
    }
}

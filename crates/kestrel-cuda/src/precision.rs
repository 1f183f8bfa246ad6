//! How much the CUDA backend rounds between and inside operations.

use kestrel_core::{BackendError, Result};

/// The arithmetic of one backend instance. Weights are bf16 either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// The serving default: a bf16 KV cache, and activations rounded to bf16
    /// on the way into the tensor-core products of prefill (cuBLAS, grouped
    /// MoE GEMMs, flash attention). Decode products keep f32 activations.
    #[default]
    Bf16,
    /// The CPU reference's arithmetic: an f32 KV cache and f32 activations in
    /// every product (prefill runs through the decode kernels 8 rows at a
    /// time and the generic attention kernel). Much slower prefill; for
    /// checking model definitions against references whose routing or greedy
    /// margins are below bf16 rounding.
    F32,
}

impl Precision {
    /// Bytes per KV cache element.
    pub fn kv_bytes(self) -> usize {
        match self {
            Precision::Bf16 => 2,
            Precision::F32 => 4,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "bf16" => Ok(Precision::Bf16),
            "f32" => Ok(Precision::F32),
            other => Err(BackendError::Invalid(format!(
                "KESTREL_CUDA_PRECISION={other}: expected bf16 or f32"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_two_names_and_refuses_others() {
        assert_eq!("bf16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert_eq!("f32".parse::<Precision>().unwrap(), Precision::F32);
        assert!("fp16".parse::<Precision>().is_err());
        assert_eq!(Precision::F32.kv_bytes(), 4);
    }
}

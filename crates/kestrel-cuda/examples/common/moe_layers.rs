//! What the MoE micro-benchmarks share: the target models' MoE shapes, read
//! from the repository's `configs/`, and one layer of dummy bf16 weights.

use std::path::Path;

use kestrel_core::dummy::dummy_value;
use kestrel_core::{Backend, DType, MoeSpec, MoeWeights};
use kestrel_cuda::{CudaBackend, CudaWeight};
use kestrel_models::config::ModelConfig;

/// (name, MoE spec, hidden size) of Qwen3.6-35B-A3B and Qwen3-30B-A3B.
pub fn target_models() -> Vec<(&'static str, MoeSpec, usize)> {
    ["qwen3.6-35b-a3b", "qwen3-30b-a3b"]
        .into_iter()
        .map(|name| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../configs")
                .join(name)
                .join("config.json");
            let cfg = ModelConfig::from_file(&path)
                .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
            let moe = cfg.moe.as_ref().expect("an MoE model");
            (name, moe.spec(), cfg.hidden_size)
        })
        .collect()
}

/// Scale of the router weights: logits spread enough that routing varies.
pub const ROUTER_SCALE: f32 = 0.05;

/// One MoE layer of dummy weights filled on the GPU.
pub fn moe_layer(gpu: &CudaBackend, spec: &MoeSpec, h: usize, seed: u64) -> MoeWeights<CudaWeight> {
    let (e, i) = (spec.num_experts, spec.intermediate);
    let w = |shape: &[usize], s: u64, scale: f32| {
        gpu.dummy_weight(shape, DType::BF16, seed * 16 + s, 0.0, scale)
            .expect("weight")
    };
    MoeWeights {
        router: w(&[e, h], 0, ROUTER_SCALE),
        gate_up: w(&[e, 2 * i, h], 1, 0.03),
        down: w(&[e, h, i], 2, 0.03),
        shared_gate_up: spec.shared_intermediate.map(|si| w(&[2 * si, h], 3, 0.03)),
        shared_down: spec.shared_intermediate.map(|si| w(&[h, si], 4, 0.03)),
        shared_gate: spec.shared_intermediate.map(|_| w(&[1, h], 5, 0.05)),
    }
}

/// Deterministic activations in [-1, 1).
pub fn inputs(rows: usize, cols: usize, seed: u64) -> Vec<f32> {
    (0..(rows * cols) as u64)
        .map(|i| dummy_value(seed, i, 0.0, 1.0))
        .collect()
}

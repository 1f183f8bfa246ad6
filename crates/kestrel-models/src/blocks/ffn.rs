//! Feed-forward blocks: a dense SwiGLU MLP, or the sparse MoE with an
//! optional gated shared expert.

use anyhow::{Result, bail};
use kestrel_core::{Backend, HostWeight, MoeSpec, MoeWeights, PreNorm};

use crate::config::MoeConfig;
use crate::loader::Loader;
use crate::transform;

pub enum FeedForward<B: Backend> {
    Dense {
        gate_up: B::Weight,
        down: B::Weight,
    },
    Moe {
        weights: MoeWeights<B::Weight>,
        spec: MoeSpec,
    },
}

impl<B: Backend> FeedForward<B> {
    /// `p` is the module prefix, e.g. `model.layers.0.mlp.`.
    pub fn load_dense(l: &Loader<B>, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(FeedForward::Dense {
            gate_up: l.fused(&[
                (&format!("{p}gate_proj.weight"), &[inter, hidden]),
                (&format!("{p}up_proj.weight"), &[inter, hidden]),
            ])?,
            down: l.weight(&format!("{p}down_proj.weight"), &[hidden, inter])?,
        })
    }

    pub fn load_moe(l: &Loader<B>, p: &str, hidden: usize, moe: &MoeConfig) -> Result<Self> {
        let (e, i) = (moe.num_experts, moe.intermediate);
        let experts = format!("{p}experts.");
        let gate_up = l.materialize(
            &format!("{experts}gate_up_proj"),
            &[e, 2 * i, hidden],
            || load_experts(l, &experts, hidden, e, i, false),
        )?;
        let down = l.materialize(&format!("{experts}down_proj"), &[e, hidden, i], || {
            load_experts(l, &experts, hidden, e, i, true)
        })?;
        let (shared_gate_up, shared_down, shared_gate) = match moe.shared_intermediate {
            Some(si) => {
                let s = format!("{p}shared_expert.");
                let gate_name = format!("{p}shared_expert_gate.weight");
                let gate = if l.has(&gate_name) {
                    Some(l.weight(&gate_name, &[1, hidden])?)
                } else {
                    None
                };
                (
                    Some(l.fused(&[
                        (&format!("{s}gate_proj.weight"), &[si, hidden]),
                        (&format!("{s}up_proj.weight"), &[si, hidden]),
                    ])?),
                    Some(l.weight(&format!("{s}down_proj.weight"), &[hidden, si])?),
                    gate,
                )
            }
            None => (None, None, None),
        };
        Ok(FeedForward::Moe {
            weights: MoeWeights {
                router: l.weight(&format!("{p}gate.weight"), &[e, hidden])?,
                gate_up,
                down,
                shared_gate_up,
                shared_down,
                shared_gate,
            },
            spec: moe.spec(),
        })
    }

    pub fn forward(&self, b: &B, x: PreNorm<'_, B::Tensor, B::Weight>) -> B::Tensor {
        match self {
            FeedForward::Dense { gate_up, down } => {
                let h = b.norm_matmul(x, gate_up);
                b.matmul(&b.swiglu(&h), down)
            }
            FeedForward::Moe { weights, spec } => b.norm_moe(x, weights, spec),
        }
    }
}

/// Experts as the stacked `[E, 2I, H]` / `[E, H, I]` tensors the backends use.
/// Checkpoints store them either stacked (Qwen3.5/3.6: `experts.gate_up_proj`,
/// `experts.down_proj`) or one by one (`experts.{e}.{gate,up,down}_proj.weight`,
/// Qwen3-MoE and Qwen3-Next). `down` picks which of the two to build.
fn load_experts<B: Backend>(
    l: &Loader<'_, B>,
    p: &str,
    hidden: usize,
    e: usize,
    i: usize,
    down: bool,
) -> Result<HostWeight<'static>> {
    let stacked = format!("{p}gate_up_proj");
    if l.has(&stacked) {
        return if down {
            l.tensor(&format!("{p}down_proj"), &[e, hidden, i])
        } else {
            l.tensor(&stacked, &[e, 2 * i, hidden])
        };
    }
    if !l.has(&format!("{p}0.gate_proj.weight")) {
        bail!("missing tensor {stacked} (or per-expert {p}0.gate_proj.weight)");
    }
    let mut names: Vec<(String, [usize; 2])> = Vec::with_capacity(2 * e);
    for x in 0..e {
        if down {
            names.push((format!("{p}{x}.down_proj.weight"), [hidden, i]));
        } else {
            names.push((format!("{p}{x}.gate_proj.weight"), [i, hidden]));
            names.push((format!("{p}{x}.up_proj.weight"), [i, hidden]));
        }
    }
    let parts: Vec<(&str, &[usize])> = names.iter().map(|(n, s)| (n.as_str(), &s[..])).collect();
    let shape = if down {
        [e, hidden, i]
    } else {
        [e, 2 * i, hidden]
    };
    transform::reshape(l.stack(&parts)?, &shape)
}

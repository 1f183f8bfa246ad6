//! Sparse mixture of experts: softmax router, top-k, experts grouped so that each
//! selected expert's weights are read once per call, plus the gated shared expert.

use kestrel_core::{MoeSpec, MoeWeights};
use rayon::prelude::*;

use crate::linear::linear;
use crate::math::{dot, sigmoid, softmax_in_place};
use crate::norm::swiglu;
use crate::tensor::CpuWeight;

/// The experts one token is routed to, best first, and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    pub experts: Vec<usize>,
    pub weights: Vec<f32>,
}

/// Softmax over the router logits (f32), top-k, optional renormalisation.
///
/// Ties go to the lower expert index, which is what `torch.topk` does in practice
/// on CPU (it does not promise an order for equal values).
pub fn route(logits: &[f32], top_k: usize, renormalise: bool) -> Route {
    let mut probs = logits.to_vec();
    softmax_in_place(&mut probs);
    let mut experts = Vec::with_capacity(top_k);
    let mut taken = vec![false; probs.len()];
    for _ in 0..top_k {
        let mut best: Option<usize> = None;
        for (e, &p) in probs.iter().enumerate() {
            // Strict `>` keeps the lowest index among equal values.
            if !taken[e] && best.is_none_or(|b| p > probs[b]) {
                best = Some(e);
            }
        }
        let b = best.expect("top_k <= num_experts is validated");
        taken[b] = true;
        experts.push(b);
    }
    let mut weights: Vec<f32> = experts.iter().map(|&e| probs[e]).collect();
    if renormalise {
        let total: f32 = weights.iter().sum();
        for w in &mut weights {
            *w /= total;
        }
    }
    Route { experts, weights }
}

/// `down(silu(gate) * up)` for `n` rows of `x` with one expert's (or the shared
/// expert's) weights: `gate_up [2I, H]`, `down [H, I]`.
fn expert_mlp(
    x: &[f32],
    n: usize,
    h: usize,
    gate_up: &[f32],
    down: &[f32],
    inter: usize,
    parallel: bool,
) -> Vec<f32> {
    let mut gu = vec![0.0f32; n * 2 * inter];
    linear(x, n, h, gate_up, 2 * inter, &mut gu, parallel);
    let act = swiglu(&gu, 2 * inter);
    let mut y = vec![0.0f32; n * h];
    linear(&act, n, inter, down, h, &mut y, parallel);
    y
}

/// The MoE block for `x [T, H]`; returns `[T, H]`.
pub fn moe(x: &[f32], h: usize, w: &MoeWeights<CpuWeight>, spec: &MoeSpec) -> Vec<f32> {
    w.check_shapes(h, spec, |x| x.numel());
    let t_total = x.len().checked_div(h).unwrap_or(0);
    let (ne, inter) = (spec.num_experts, spec.intermediate);

    let mut logits = vec![0.0f32; t_total * ne];
    linear(x, t_total, h, &w.router.data, ne, &mut logits, true);
    let routes: Vec<Route> = logits
        .par_chunks(ne)
        .map(|l| route(l, spec.top_k, spec.norm_topk_prob))
        .collect();

    // Tokens (and their weights) per expert, tokens in ascending order.
    let mut assigned: Vec<Vec<(usize, f32)>> = vec![Vec::new(); ne];
    for (t, r) in routes.iter().enumerate() {
        for (&e, &wt) in r.experts.iter().zip(&r.weights) {
            assigned[e].push((t, wt));
        }
    }
    let active: Vec<usize> = (0..ne).filter(|&e| !assigned[e].is_empty()).collect();
    // Parallel over experts; an expert's own matmuls go parallel only when there
    // are too few experts to keep every thread busy.
    let inner_parallel = active.len() < rayon::current_num_threads();
    let expert_out: Vec<Vec<f32>> = active
        .par_iter()
        .map(|&e| {
            let toks = &assigned[e];
            let mut xe = Vec::with_capacity(toks.len() * h);
            for &(t, _) in toks {
                xe.extend_from_slice(&x[t * h..(t + 1) * h]);
            }
            let gu = &w.gate_up.data[e * 2 * inter * h..(e + 1) * 2 * inter * h];
            let dn = &w.down.data[e * h * inter..(e + 1) * h * inter];
            let mut y = expert_mlp(&xe, toks.len(), h, gu, dn, inter, inner_parallel);
            for (row, &(_, wt)) in y.chunks_exact_mut(h).zip(toks) {
                for v in row {
                    *v *= wt;
                }
            }
            y
        })
        .collect();

    // Per token, the (active-expert index, row) of its contributions in ascending
    // expert order: transformers adds experts into a zero buffer in that order.
    let mut contributions: Vec<Vec<(usize, usize)>> = vec![Vec::new(); t_total];
    for (a, &e) in active.iter().enumerate() {
        for (row, &(t, _)) in assigned[e].iter().enumerate() {
            contributions[t].push((a, row));
        }
    }

    let shared = match (&w.shared_gate_up, &w.shared_down, spec.shared_intermediate) {
        (Some(gu), Some(dn), Some(si)) => {
            Some(expert_mlp(x, t_total, h, &gu.data, &dn.data, si, true))
        }
        _ => None,
    };

    let mut out = vec![0.0f32; t_total * h];
    out.par_chunks_mut(h.max(1)).enumerate().for_each(|(t, o)| {
        for &(a, row) in &contributions[t] {
            for (oi, &yi) in o.iter_mut().zip(&expert_out[a][row * h..(row + 1) * h]) {
                *oi += yi;
            }
        }
        if let Some(sy) = &shared {
            let xr = &x[t * h..(t + 1) * h];
            let gate = w
                .shared_gate
                .as_ref()
                .map_or(1.0, |g| sigmoid(dot(xr, &g.data)));
            for (oi, &yi) in o.iter_mut().zip(&sy[t * h..(t + 1) * h]) {
                *oi += gate * yi;
            }
        }
    });
    out
}

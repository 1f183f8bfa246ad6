//! MoE: routing ties, and the grouped computation against a dense loop.

use kestrel_core::{Backend, MoeSpec, MoeWeights};

use super::ops::weight;
use super::{assert_close, naive, rng::Rng};
use crate::CpuBackend;
use crate::moe::route;

#[test]
fn route_breaks_ties_towards_lower_index_and_renormalises() {
    let r = route(&[0.5, 2.0, 1.0, 2.0, 1.0], 3, false);
    assert_eq!(r.experts, [1, 3, 2]);
    let r = route(&[0.5, 2.0, 1.0, 2.0, 1.0], 3, true);
    let total: f32 = r.weights.iter().sum();
    assert!((total - 1.0).abs() < 1e-6);
    assert_eq!(r.weights[0], r.weights[1]);
}

#[test]
fn moe_matches_dense_loop() {
    let be = CpuBackend::new();
    let (h, e, i, si) = (24, 6, 10, 14);
    // (tokens, top_k, renormalise, shared expert, shared gate)
    for (case, &(t, k, renorm, shared, gated)) in [
        (1, 2, true, true, true),
        (9, 3, true, true, true),
        (7, 2, false, false, false),
        (12, 4, true, true, false),
    ]
    .iter()
    .enumerate()
    {
        let mut rng = Rng::new(40 + case as u64);
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: i,
            norm_topk_prob: renorm,
            shared_intermediate: shared.then_some(si),
        };
        let w = MoeWeights {
            router: weight(&[e, h], rng.vec(e * h)),
            gate_up: weight(&[e, 2 * i, h], rng.vec(e * 2 * i * h)),
            down: weight(&[e, h, i], rng.vec(e * h * i)),
            shared_gate_up: shared.then(|| weight(&[2 * si, h], rng.vec(2 * si * h))),
            shared_down: shared.then(|| weight(&[h, si], rng.vec(h * si))),
            shared_gate: gated.then(|| weight(&[1, h], rng.vec(h))),
        };
        let x = rng.vec(t * h);
        let got = be.to_host(&be.moe(&be.from_host(t, h, &x), &w, &spec));
        let sh = w
            .shared_gate_up
            .as_ref()
            .zip(w.shared_down.as_ref())
            .map(|(a, b)| (&a.data[..], &b.data[..], si));
        let want = naive::moe(
            &x,
            h,
            &spec,
            &w.router.data,
            &w.gate_up.data,
            &w.down.data,
            sh,
            w.shared_gate.as_ref().map(|g| &g.data[..]),
        );
        assert_close(&got, &want, 1e-4, &format!("moe case {case}"));
    }
}

//! The gated delta rule one token at a time (transformers' `torch_recurrent_gated_delta_rule`).

use super::HeadInputs;
use crate::math::axpy;

/// Runs the recurrence for one value head over `inputs.len()` tokens, continuing from
/// `state [Dk, Dv]` (updated in place), writing `out [T, Dv]`.
///
/// Per token: `S *= exp(g)`, `kv = S^T k`, `d = (v - kv) * beta`, `S += k d^T`,
/// `o = S^T q`. `q` must already be L2-normalised and scaled by `Dk^-0.5`, `k`
/// L2-normalised.
pub fn recurrent(inputs: &HeadInputs, state: &mut [f32], out: &mut [f32]) {
    let (dk, dv, n) = (inputs.dk, inputs.dv, inputs.len());
    inputs.check(state, out);
    let mut kv = vec![0.0f32; dv];
    let mut delta = vec![0.0f32; dv];
    for t in 0..n {
        let q = &inputs.q[t * dk..(t + 1) * dk];
        let k = &inputs.k[t * dk..(t + 1) * dk];
        let v = &inputs.v[t * dv..(t + 1) * dv];
        let decay = inputs.g[t].exp();
        let beta = inputs.beta[t];
        // Decay the state and read it with k in one pass over the rows.
        kv.fill(0.0);
        for (row, &ki) in state.chunks_exact_mut(dv).zip(k) {
            for s in row.iter_mut() {
                *s *= decay;
            }
            axpy(&mut kv, ki, row);
        }
        for ((d, &vj), &kvj) in delta.iter_mut().zip(v).zip(&kv) {
            *d = (vj - kvj) * beta;
        }
        // Write the correction and read the output with q in one pass.
        let o = &mut out[t * dv..(t + 1) * dv];
        o.fill(0.0);
        for ((row, &ki), &qi) in state.chunks_exact_mut(dv).zip(k).zip(q) {
            axpy(row, ki, &delta);
            axpy(o, qi, row);
        }
    }
}

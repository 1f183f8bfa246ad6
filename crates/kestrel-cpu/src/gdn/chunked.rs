//! The gated delta rule in chunks (transformers' `torch_chunk_gated_delta_rule`):
//! within a chunk the delta-rule updates are condensed by a unit lower-triangular
//! (UT) solve, and the state is read and written once per chunk.

use super::HeadInputs;
use crate::math::{axpy, dot};

/// Chunk length, as in transformers and the FLA kernels.
pub const CHUNK_SIZE: usize = 64;

/// Scratch buffers reused across chunks.
struct Scratch {
    cum: Vec<f32>,
    /// `exp(cum_last - cum)`: decay from each token to the end of the chunk.
    decay_to_end: Vec<f32>,
    /// `k * beta`, and `k * beta * exp(cum)`.
    k_beta: Vec<f32>,
    k_beta_decayed: Vec<f32>,
    v_beta: Vec<f32>,
    /// Strictly lower part of the UT system, `[L, L]`.
    ut: Vec<f32>,
    /// Decayed causal `q k^T` within the chunk, `[L, L]`.
    intra: Vec<f32>,
    /// UT-solved values (then corrected by the old state) and decayed keys.
    v_new: Vec<f32>,
    k_cumdecay: Vec<f32>,
}

impl Scratch {
    fn new(dk: usize, dv: usize) -> Self {
        let c = CHUNK_SIZE;
        Scratch {
            cum: vec![0.0; c],
            decay_to_end: vec![0.0; c],
            k_beta: vec![0.0; c * dk],
            k_beta_decayed: vec![0.0; c * dk],
            v_beta: vec![0.0; c * dv],
            ut: vec![0.0; c * c],
            intra: vec![0.0; c * c],
            v_new: vec![0.0; c * dv],
            k_cumdecay: vec![0.0; c * dk],
        }
    }
}

/// Same contract as [`super::recurrent`]; mathematically equal, different rounding.
/// A last partial chunk is processed at its true length, which equals the
/// reference's zero padding (padded tokens have k = v = beta = g = 0).
pub fn chunked(inputs: &HeadInputs, state: &mut [f32], out: &mut [f32]) {
    inputs.check(state, out);
    let mut s = Scratch::new(inputs.dk, inputs.dv);
    let mut start = 0;
    while start < inputs.len() {
        let len = CHUNK_SIZE.min(inputs.len() - start);
        chunk(inputs, start, len, &mut s, state, out);
        start += len;
    }
}

/// Forward substitution `X = M^-1 B` for `M = I + strictly_lower(ut)`, rows of width `w`.
fn unit_lower_solve(ut: &[f32], l: usize, b: &[f32], x: &mut [f32], w: usize) {
    for i in 0..l {
        let (done, rest) = x.split_at_mut(i * w);
        let xi = &mut rest[..w];
        xi.copy_from_slice(&b[i * w..(i + 1) * w]);
        for j in 0..i {
            axpy(xi, -ut[i * l + j], &done[j * w..(j + 1) * w]);
        }
    }
}

fn chunk(
    inp: &HeadInputs,
    t0: usize,
    l: usize,
    s: &mut Scratch,
    state: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv) = (inp.dk, inp.dv);
    let q = &inp.q[t0 * dk..(t0 + l) * dk];
    let k = &inp.k[t0 * dk..(t0 + l) * dk];
    let v = &inp.v[t0 * dv..(t0 + l) * dv];
    let row_k = |i: usize| &k[i * dk..(i + 1) * dk];

    // Cumulative log-decay inside the chunk (sequential, like torch's cumsum on CPU).
    let mut acc = 0.0f32;
    for i in 0..l {
        acc += inp.g[t0 + i];
        s.cum[i] = acc;
    }
    let cum = &s.cum[..l];
    let cum_last = cum[l - 1];

    for i in 0..l {
        let beta = inp.beta[t0 + i];
        let e = cum[i].exp();
        for a in 0..dk {
            let kb = row_k(i)[a] * beta;
            s.k_beta[i * dk + a] = kb;
            s.k_beta_decayed[i * dk + a] = kb * e;
        }
        for (vb, &x) in s.v_beta[i * dv..(i + 1) * dv]
            .iter_mut()
            .zip(&v[i * dv..(i + 1) * dv])
        {
            *vb = x * beta;
        }
    }
    // UT system (strictly lower) and intra-chunk attention (lower incl. diagonal),
    // both scaled by the pairwise decay exp(cum_i - cum_j).
    for i in 0..l {
        let kb = &s.k_beta[i * dk..(i + 1) * dk];
        let qi = &q[i * dk..(i + 1) * dk];
        for j in 0..=i {
            let decay = (cum[i] - cum[j]).exp();
            s.ut[i * l + j] = dot(kb, row_k(j)) * decay;
            s.intra[i * l + j] = dot(qi, row_k(j)) * decay;
        }
    }
    unit_lower_solve(&s.ut, l, &s.v_beta, &mut s.v_new[..l * dv], dv);
    unit_lower_solve(&s.ut, l, &s.k_beta_decayed, &mut s.k_cumdecay[..l * dk], dk);

    // v_new = u - k_cumdecay @ S; out = (q * exp(cum)) @ S + intra @ v_new.
    for i in 0..l {
        let vn = &mut s.v_new[i * dv..(i + 1) * dv];
        let o = &mut out[(t0 + i) * dv..(t0 + i + 1) * dv];
        o.fill(0.0);
        let eq = cum[i].exp();
        for (a, srow) in state.chunks_exact(dv).enumerate() {
            axpy(vn, -s.k_cumdecay[i * dk + a], srow);
            axpy(o, q[i * dk + a] * eq, srow);
        }
    }
    for i in 0..l {
        let (o, vn) = (&mut out[(t0 + i) * dv..(t0 + i + 1) * dv], &s.v_new);
        for j in 0..=i {
            axpy(o, s.intra[i * l + j], &vn[j * dv..(j + 1) * dv]);
        }
    }
    // S = S * exp(cum_last) + (k * exp(cum_last - cum))^T @ v_new.
    let chunk_decay = cum_last.exp();
    for (d, &c) in s.decay_to_end.iter_mut().zip(cum) {
        *d = (cum_last - c).exp();
    }
    for (a, srow) in state.chunks_exact_mut(dv).enumerate() {
        for x in srow.iter_mut() {
            *x *= chunk_decay;
        }
        for j in 0..l {
            let kd = row_k(j)[a] * s.decay_to_end[j];
            axpy(srow, kd, &s.v_new[j * dv..(j + 1) * dv]);
        }
    }
}

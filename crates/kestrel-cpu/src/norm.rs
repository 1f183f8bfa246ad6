//! Row-wise elementwise operations: RMSNorm and the SwiGLU activation.

use rayon::prelude::*;

use crate::math::{rms_inv, silu};

/// Rows per rayon task for cheap row-wise work, so tiny tensors stay on one thread.
const ROWS_PER_TASK: usize = 8;

/// `x * 1/sqrt(mean(x^2) + eps) * w`, in that order (as transformers' Qwen3RMSNorm).
#[inline]
pub fn rms_norm_row(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = rms_inv(x, eps);
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = wi * (xi * inv);
    }
}

/// RMSNorm of every row of `x` (`cols` wide) with weight `w`.
pub fn rms_norm(x: &[f32], cols: usize, w: &[f32], eps: f32) -> Vec<f32> {
    assert_eq!(
        w.len(),
        cols,
        "RMSNorm weight has {} values for rows of {cols}",
        w.len()
    );
    let mut out = vec![0.0f32; x.len()];
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols * ROWS_PER_TASK)
        .zip(x.par_chunks(cols * ROWS_PER_TASK))
        .for_each(|(o, xs)| {
            for (or, xr) in o.chunks_exact_mut(cols).zip(xs.chunks_exact(cols)) {
                rms_norm_row(xr, w, eps, or);
            }
        });
    out
}

/// `residual += x`, then the RMSNorm of the updated residual.
pub fn add_rms_norm(residual: &mut [f32], x: &[f32], cols: usize, w: &[f32], eps: f32) -> Vec<f32> {
    assert_eq!(
        residual.len(),
        x.len(),
        "add_rms_norm: residual and input differ in size"
    );
    assert_eq!(
        w.len(),
        cols,
        "RMSNorm weight has {} values for rows of {cols}",
        w.len()
    );
    let mut out = vec![0.0f32; x.len()];
    if cols == 0 {
        return out;
    }
    out.par_chunks_mut(cols * ROWS_PER_TASK)
        .zip(residual.par_chunks_mut(cols * ROWS_PER_TASK))
        .zip(x.par_chunks(cols * ROWS_PER_TASK))
        .for_each(|((o, rs), xs)| {
            for ((or, rr), xr) in o
                .chunks_exact_mut(cols)
                .zip(rs.chunks_exact_mut(cols))
                .zip(xs.chunks_exact(cols))
            {
                for (r, &xi) in rr.iter_mut().zip(xr) {
                    *r += xi;
                }
                rms_norm_row(rr, w, eps, or);
            }
        });
    out
}

/// `silu(gate) * up` for one row `[gate | up]`, written to `out` (half as wide).
#[inline]
pub fn swiglu_row(gate_up: &[f32], out: &mut [f32]) {
    let (gate, up) = gate_up.split_at(out.len());
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// SwiGLU over rows `[gate | up]` of width `2 * inter`; returns `[rows, inter]`.
pub fn swiglu(gate_up: &[f32], cols: usize) -> Vec<f32> {
    assert!(cols.is_multiple_of(2), "swiglu input width {cols} is odd");
    let inter = cols / 2;
    let mut out = vec![0.0f32; gate_up.len() / 2];
    if inter == 0 {
        return out;
    }
    out.par_chunks_mut(inter * ROWS_PER_TASK)
        .zip(gate_up.par_chunks(cols * ROWS_PER_TASK))
        .for_each(|(o, g)| {
            for (or, gr) in o.chunks_exact_mut(inter).zip(g.chunks_exact(cols)) {
                swiglu_row(gr, or);
            }
        });
    out
}

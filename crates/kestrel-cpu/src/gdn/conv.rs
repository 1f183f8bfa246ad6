//! Causal depthwise conv1d with a carried state, followed by SiLU.

use rayon::prelude::*;

use crate::math::silu;

/// Transpose the checkpoint's `[channels, kernel]` conv weight to `[kernel, channels]`,
/// so the inner loop runs over contiguous channels.
pub fn transpose_weight(w: &[f32], channels: usize, kernel: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for c in 0..channels {
        for j in 0..kernel {
            t[j * channels + c] = w[c * kernel + j];
        }
    }
    t
}

/// New input rows of one sequence: row `i` is `data[i * stride..][..channels]`
/// (the qkv columns at the start of each projection row).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub data: &'a [f32],
    pub stride: usize,
    pub count: usize,
}

impl<'a> Rows<'a> {
    fn row(&self, i: usize, channels: usize) -> &'a [f32] {
        &self.data[i * self.stride..i * self.stride + channels]
    }
}

/// One sequence's conv. `state` holds the previous `kernel - 1` inputs
/// `[kernel-1, channels]` (zeros for a fresh sequence, which equals transformers'
/// left zero padding). Writes `silu(conv)` of every new row into
/// `out [count, channels]` and leaves the last `kernel - 1` inputs in `state`.
pub fn causal_conv_silu(
    input: Rows,
    weight_t: &[f32],
    kernel: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    let n = input.count;
    let hist = kernel - 1;
    let channels = weight_t.len() / kernel;
    assert_eq!(state.len(), hist * channels, "conv state size mismatch");
    assert_eq!(out.len(), n * channels, "conv output size mismatch");
    if n == 0 || channels == 0 {
        return;
    }
    // Row r of the virtual sequence [state ; new inputs].
    fn ext<'b>(
        r: usize,
        hist: usize,
        channels: usize,
        state: &'b [f32],
        input: &Rows<'b>,
    ) -> &'b [f32] {
        if r < hist {
            &state[r * channels..(r + 1) * channels]
        } else {
            input.row(r - hist, channels)
        }
    }
    let st: &[f32] = state;
    out.par_chunks_mut(channels).enumerate().for_each(|(i, o)| {
        o.fill(0.0);
        for j in 0..kernel {
            let row = ext(i + j, hist, channels, st, &input);
            let wj = &weight_t[j * channels..(j + 1) * channels];
            for ((oc, &x), &w) in o.iter_mut().zip(row).zip(wj) {
                *oc += w * x;
            }
        }
        for oc in o.iter_mut() {
            *oc = silu(*oc);
        }
    });
    // New state: the last `hist` rows of [state ; inputs].
    let mut new_state = Vec::with_capacity(state.len());
    for r in n..n + hist {
        new_state.extend_from_slice(ext(r, hist, channels, state, &input));
    }
    state.copy_from_slice(&new_state);
}

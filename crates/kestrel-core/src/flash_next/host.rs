//! Host (f32) reference implementations of the Flash-Next operations, in the
//! order of operations of transformers' `qwen4_exp` modules where it affects
//! rounding. The CPU backend runs these directly; the trait defaults run them
//! on copies of a device's tensors.

use super::selection::ScoreLayout;
use super::{
    HostPleParams, HostQsaNorms, HyperSpec, IndexerKeys, PleSpec, QsaSpec, RowEdit, TokenSelection,
};
use crate::{ForwardBatch, RopeSpec, StateSnapshot};

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `x * rsqrt(mean(x^2) + eps) * w` of one slice, written to `out`.
fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let inv = 1.0 / (dot(x, x) / x.len() as f32 + eps).sqrt();
    for ((o, &xi), &wi) in out.iter_mut().zip(x).zip(w) {
        *o = (xi * inv) * wi;
    }
}

/// RMSNorm of every `group`-wide slice of rows `cols` wide; `w` spans a row.
pub fn grouped_rms_norm(x: &[f32], cols: usize, w: &[f32], group: usize, eps: f32) -> Vec<f32> {
    assert_eq!(
        w.len(),
        cols,
        "grouped norm weight must be as wide as the row"
    );
    assert!(
        group > 0 && cols.is_multiple_of(group),
        "row of {cols} is not groups of {group}"
    );
    let mut out = vec![0.0f32; x.len()];
    let groups = cols / group;
    for (i, (o, xr)) in out
        .chunks_exact_mut(group)
        .zip(x.chunks_exact(group))
        .enumerate()
    {
        let g = i % groups;
        rms_norm_into(xr, &w[g * group..(g + 1) * group], eps, o);
    }
    out
}

/// Each `cols`-wide row repeated `streams` times side by side.
pub fn repeat_streams(x: &[f32], cols: usize, streams: usize) -> Vec<f32> {
    x.chunks_exact(cols.max(1))
        .flat_map(|row| std::iter::repeat_n(row, streams).flatten().copied())
        .collect()
}

/// `silu(x / divisor)`.
pub fn scaled_silu(x: &[f32], divisor: f32) -> Vec<f32> {
    x.iter().map(|&v| silu(v / divisor)).collect()
}

/// Mean over streams of `sigmoid(gate) * normed`; both `[T, streams * hidden]`.
pub fn hyper_mix(normed: &[f32], gate: &[f32], spec: &HyperSpec) -> Vec<f32> {
    let (n, h) = (spec.streams, spec.hidden);
    assert_eq!(normed.len(), gate.len(), "hyper_mix: inputs differ in size");
    let rows = normed.len() / spec.width();
    let mut out = vec![0.0f32; rows * h];
    for t in 0..rows {
        for j in 0..h {
            let mut acc = 0.0f32;
            for s in 0..n {
                let i = t * n * h + s * h + j;
                acc += sigmoid(gate[i]) * normed[i];
            }
            out[t * h + j] = acc / n as f32;
        }
    }
    out
}

/// `x[s] += out * (2 * sigmoid(inject[s] / streams))`.
pub fn hyper_inject(x: &mut [f32], out: &[f32], inject: &[f32], spec: &HyperSpec) {
    let (n, h) = (spec.streams, spec.hidden);
    let rows = out.len() / h;
    assert_eq!(x.len(), rows * n * h, "hyper_inject: stream width");
    assert_eq!(
        inject.len(),
        rows * n,
        "hyper_inject: one weight per stream"
    );
    for t in 0..rows {
        for s in 0..n {
            let w = 2.0 * sigmoid(inject[t * n + s] / n as f32);
            let dst = &mut x[(t * n + s) * h..(t * n + s + 1) * h];
            for (d, &o) in dst.iter_mut().zip(&out[t * h..(t + 1) * h]) {
                *d += o * w;
            }
        }
    }
}

/// The PLE layer after its projections (see `FlashNextOps::ple_mix`).
pub fn ple_mix(
    streams: &[f32],
    key: &[f32],
    value: &[f32],
    p: &HostPleParams<'_>,
    spec: &PleSpec,
    state: &mut [f32],
    batch: &ForwardBatch,
) -> Vec<f32> {
    let hs = &spec.hyper;
    let (n, h, width) = (hs.streams, hs.hidden, hs.width());
    let rows = value.len() / h;
    assert_eq!(streams.len(), rows * width, "ple_mix: stream width");
    assert_eq!(key.len(), rows * width, "ple_mix: one key per stream");
    assert_eq!(
        rows,
        batch.num_tokens(),
        "ple_mix: rows do not match the batch"
    );
    let key_n = grouped_rms_norm(key, width, p.norm_key, h, hs.eps);
    let query_n = grouped_rms_norm(streams, width, p.norm_query, h, hs.eps);
    let scale = (h as f32).sqrt();
    let mut gated = vec![0.0f32; rows * width];
    for t in 0..rows {
        for s in 0..n {
            let i = (t * n + s) * h;
            let g = dot(&key_n[i..i + h], &query_n[i..i + h]) / scale;
            let g = g.abs().max(1e-6).sqrt() * sign(g);
            let w = sigmoid(g);
            for (d, &v) in gated[i..i + h].iter_mut().zip(&value[t * h..(t + 1) * h]) {
                *d = w * v;
            }
        }
    }
    let normed = grouped_rms_norm(&gated, width, p.norm_conv, h, hs.eps);
    let conv = dilated_conv_silu(&normed, width, p.conv, spec, state, batch);
    gated.iter_mut().zip(&conv).for_each(|(g, c)| *g += c);
    gated
}

/// torch's `sign`: -1, 0 or 1.
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

/// Depthwise causal conv with dilation and SiLU over each sequence's new
/// rows, continuing from (and updating) its slot's `state_len` past inputs.
/// Like the Gated DeltaNet state, the window is also written to each of the
/// chunk's `state_checkpoints` (after the `i`-th new token) and to its
/// `state_snapshot` slot; the conv reads the same inputs however a sequence
/// is cut, so a snapshot needs no boundary in the computation.
pub fn dilated_conv_silu(
    x: &[f32],
    width: usize,
    taps: &[f32],
    spec: &PleSpec,
    state: &mut [f32],
    batch: &ForwardBatch,
) -> Vec<f32> {
    let (k, dil, len) = (spec.conv_kernel, spec.conv_dilation, spec.state_len());
    assert_eq!(taps.len(), width * k, "conv taps must be [width, kernel]");
    let mut out = vec![0.0f32; x.len()];
    let mut start = 0;
    for s in &batch.seqs {
        let slot = s.state_slot as usize;
        // Past inputs then the new ones, oldest first.
        let mut seq: Vec<f32> = state[slot * len * width..(slot + 1) * len * width].to_vec();
        seq.extend_from_slice(&x[start * width..(start + s.num_tokens) * width]);
        // The window after `n` new tokens, into `dst`.
        let mut store = |dst: u32, n: usize| {
            let d = dst as usize;
            state[d * len * width..(d + 1) * len * width]
                .copy_from_slice(&seq[n * width..(n + len) * width]);
        };
        for (i, &dst) in s.state_checkpoints.iter().enumerate() {
            store(dst, i + 1);
        }
        if let Some(StateSnapshot {
            after,
            slot: Some(dst),
        }) = s.state_snapshot
        {
            store(dst, after);
        }
        store(s.state_slot, s.num_tokens);
        for i in 0..s.num_tokens {
            let o = &mut out[(start + i) * width..(start + i + 1) * width];
            for (c, oc) in o.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for j in 0..k {
                    let row = len + i - (k - 1 - j) * dil;
                    acc += taps[c * k + j] * seq[row * width + c];
                }
                *oc = silu(acc);
            }
        }
        start += s.num_tokens;
    }
    out
}

/// [`super::FlashNextOps::edit_rows`] on rows `cols` wide.
pub fn edit_rows(data: &mut [f32], cols: usize, edit: RowEdit) {
    match edit {
        RowEdit::Zero(rows) => data[rows.start * cols..rows.end * cols].fill(0.0),
        RowEdit::Copy { src, dst } => {
            data.copy_within(src.start * cols..src.end * cols, dst * cols)
        }
    }
}

/// cos and sin of RoPE at `pos` (f32 angles, as transformers computes them).
fn rope_at(rope: &RopeSpec, pos: usize) -> (Vec<f32>, Vec<f32>) {
    let dim = rope.rotary_dim as f32;
    (0..rope.rotary_dim / 2)
        .map(|j| {
            let angle = pos as f32 * (1.0 / rope.theta.powf((2 * j) as f32 / dim));
            (angle.cos(), angle.sin())
        })
        .unzip()
}

/// Rotate-half RoPE on the first `rotary_dim` values of `x`.
fn apply_rope(x: &mut [f32], cs: &(Vec<f32>, Vec<f32>)) {
    let half = cs.0.len();
    for j in 0..half {
        let (x1, x2) = (x[j], x[j + half]);
        x[j] = x1 * cs.0[j] + (-x2) * cs.1[j];
        x[j + half] = x2 * cs.0[j] + x1 * cs.1[j];
    }
}

/// Row of the paged key pool holding position `pos` of a sequence.
fn page_row(block_table: &[u32], block_size: usize, pos: usize) -> usize {
    block_table[pos / block_size] as usize * block_size + pos % block_size
}

/// The QSA indexer (see `FlashNextOps::qsa_select`).
pub fn qsa_select(
    proj: &[f32],
    norms: &HostQsaNorms<'_>,
    spec: &QsaSpec,
    keys: &mut IndexerKeys<Vec<f32>>,
    block_size: usize,
    batch: &ForwardBatch,
) -> TokenSelection {
    let (nh, d, r) = (spec.num_heads, spec.head_dim, spec.compress_ratio);
    let cols = spec.proj_width();
    assert_eq!(
        proj.len(),
        batch.num_tokens() * cols,
        "qsa_select: projection width"
    );
    assert!(
        block_size.is_multiple_of(r),
        "pages of {block_size} positions are not whole blocks of {r}"
    );
    let mut start = 0;
    for s in &batch.seqs {
        for i in 0..s.num_tokens {
            let row = &proj[(start + i) * cols..(start + i + 1) * cols];
            let dst = page_row(&s.block_table, block_size, s.cached_len + i);
            keys.raw[dst * d..(dst + 1) * d].copy_from_slice(&row[nh * d..]);
        }
        start += s.num_tokens;
    }
    let layout = ScoreLayout::new(spec, batch);
    // The pooled, normalised and rotated key of every block completed now.
    for &(seq, b) in &layout.completed {
        let s = &batch.seqs[seq];
        let mut pooled = vec![0.0f32; d];
        for p in b * r..(b + 1) * r {
            let src = page_row(&s.block_table, block_size, p);
            pooled
                .iter_mut()
                .zip(&keys.raw[src * d..(src + 1) * d])
                .for_each(|(a, k)| *a += k);
        }
        pooled.iter_mut().for_each(|a| *a /= r as f32);
        let dst = spec.pooled_row(&s.block_table, block_size, b);
        let bk = &mut keys.pooled[dst * d..(dst + 1) * d];
        rms_norm_into(&pooled, norms.k, spec.eps, bk);
        apply_rope(&mut bk[..spec.rope.rotary_dim], &rope_at(&spec.rope, b * r));
    }
    let mut scores = vec![0.0f32; layout.score_len];
    let scale = (d as f32).sqrt();
    let positions = batch.positions();
    for u in &layout.scored {
        let row = &proj[u.row * cols..(u.row + 1) * cols];
        let cs = rope_at(&spec.rope, positions[u.row] as usize);
        let mut q = vec![0.0f32; nh * d];
        for (qh, src) in q.chunks_exact_mut(d).zip(row.chunks_exact(d)) {
            rms_norm_into(src, norms.q, spec.eps, qh);
            apply_rope(&mut qh[..spec.rope.rotary_dim], &cs);
        }
        let table = &batch.seqs[u.seq].block_table;
        for b in 0..u.blocks {
            let k = spec.pooled_row(table, block_size, b);
            let k = &keys.pooled[k * d..(k + 1) * d];
            let relu_sum: f32 = q.chunks_exact(d).map(|qh| dot(qh, k).max(0.0)).sum();
            scores[u.at + b] = relu_sum / scale;
        }
    }
    layout.selection(spec, batch, &scores)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqChunk;

    #[test]
    fn grouped_norm_normalises_each_group_with_its_weights() {
        let x = [1.0, 1.0, 2.0, 2.0];
        let out = grouped_rms_norm(&x, 4, &[1.0, 1.0, 2.0, 3.0], 2, 0.0);
        assert_eq!(out, vec![1.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn dilated_conv_carries_its_state_across_chunks() {
        let spec = PleSpec {
            hyper: HyperSpec {
                streams: 1,
                hidden: 1,
                eps: 1e-6,
            },
            conv_kernel: 2,
            conv_dilation: 2,
        };
        // out[t] = silu(x[t-2] + 10 x[t]).
        let taps = [1.0, 10.0];
        let x: Vec<f32> = (1..=5).map(|v| v as f32 * 0.1).collect();
        let whole = {
            let mut st = vec![0.0; 2];
            dilated_conv_silu(
                &x,
                1,
                &taps,
                &spec,
                &mut st,
                &ForwardBatch {
                    seqs: vec![SeqChunk::new(5, 0, vec![0], 0)],
                },
            )
        };
        let mut st = vec![0.0; 2];
        let mut parts = dilated_conv_silu(
            &x[..3],
            1,
            &taps,
            &spec,
            &mut st,
            &ForwardBatch {
                seqs: vec![SeqChunk::new(3, 0, vec![0], 0)],
            },
        );
        parts.extend(dilated_conv_silu(
            &x[3..],
            1,
            &taps,
            &spec,
            &mut st,
            &ForwardBatch {
                seqs: vec![SeqChunk::new(2, 3, vec![0], 0)],
            },
        ));
        assert_eq!(whole, parts);
        assert!((whole[2] - silu(0.1 + 3.0)).abs() < 1e-6);
    }
}

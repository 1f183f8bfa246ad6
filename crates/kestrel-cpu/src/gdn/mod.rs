//! Gated DeltaNet (linear attention) layer: causal conv, q/k L2 norm, decay and
//! beta, the gated delta rule with carried state, and the gated output RMSNorm.
//!
//! The two forms of the recurrence are public so that other backends' tests can
//! use them as references: [`recurrent`] (token by token) and [`chunked`].

mod chunked;
mod conv;
mod recurrent;

pub use chunked::{CHUNK_SIZE, chunked};
pub use conv::{Rows, causal_conv_silu, transpose_weight};
pub use recurrent::recurrent;

use kestrel_core::{ForwardBatch, GdnGate, GdnSpec, GdnWeights};
use rayon::prelude::*;

use crate::cache::GdnState;
use crate::math::{rms_inv, sigmoid, silu, softplus, sum_sq};
use crate::tensor::CpuWeight;

/// A sequence with at least this many new tokens uses the chunked form; shorter
/// runs (decode steps, short chunks) use the token-by-token form, which is
/// cheaper for them.
pub const CHUNKED_MIN_TOKENS: usize = CHUNK_SIZE;

/// transformers' `l2norm` epsilon for q and k (fixed, independent of the config).
pub const L2NORM_EPS: f32 = 1e-6;

/// One value head's inputs over `T` consecutive tokens of one sequence.
///
/// `q` and `k` are `[T, Dk]`: `k` L2-normalised, `q` L2-normalised and then scaled
/// by `Dk^-0.5` (see [`prepare_qk`]). `v` is `[T, Dv]`; `g` (log decay, <= 0) and
/// `beta` are `[T]`. (transformers' recurrent form divides q by `sqrt(Dk)` where its
/// chunked form multiplies by `Dk^-0.5`; both forms here take the multiplied q, a
/// difference of at most one rounding step.)
#[derive(Clone, Copy, Debug)]
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub dk: usize,
    pub dv: usize,
}

impl HeadInputs<'_> {
    pub fn len(&self) -> usize {
        self.g.len()
    }

    pub fn is_empty(&self) -> bool {
        self.g.is_empty()
    }

    /// The inputs of token `t` alone.
    pub fn token(&self, t: usize) -> HeadInputs<'_> {
        self.tokens(t, t + 1)
    }

    /// The inputs of tokens `a..b`.
    pub fn tokens(&self, a: usize, b: usize) -> HeadInputs<'_> {
        let (dk, dv) = (self.dk, self.dv);
        HeadInputs {
            q: &self.q[a * dk..b * dk],
            k: &self.k[a * dk..b * dk],
            v: &self.v[a * dv..b * dv],
            g: &self.g[a..b],
            beta: &self.beta[a..b],
            dk,
            dv,
        }
    }

    fn check(&self, state: &[f32], out: &[f32]) {
        let n = self.len();
        assert_eq!(self.beta.len(), n, "beta length");
        assert_eq!(self.q.len(), n * self.dk, "q must be [T, Dk]");
        assert_eq!(self.k.len(), n * self.dk, "k must be [T, Dk]");
        assert_eq!(self.v.len(), n * self.dv, "v must be [T, Dv]");
        assert_eq!(state.len(), self.dk * self.dv, "state must be [Dk, Dv]");
        assert_eq!(out.len(), n * self.dv, "output must be [T, Dv]");
    }
}

/// `x * rsqrt(sum(x^2) + 1e-6)` in place, then times `scale`.
/// (Scaling after normalising, as transformers does for q.)
#[inline]
pub fn prepare_qk(x: &mut [f32], scale: f32) {
    let inv = 1.0 / (sum_sq(x) + L2NORM_EPS).sqrt();
    for v in x.iter_mut() {
        *v *= inv;
    }
    if scale != 1.0 {
        for v in x.iter_mut() {
            *v *= scale;
        }
    }
}

/// `Dk^-0.5` as transformers computes it (in double, then used as an f32 scalar).
pub fn query_scale(dk: usize) -> f32 {
    (dk as f64).powf(-0.5) as f32
}

fn validate(
    proj_cols: usize,
    t_total: usize,
    w: &GdnWeights<CpuWeight>,
    spec: &GdnSpec,
    state: &GdnState,
    slots: usize,
    batch: &ForwardBatch,
) {
    assert_eq!(
        proj_cols,
        spec.proj_width(),
        "GDN input width does not match the spec"
    );
    assert_eq!(
        t_total,
        batch.num_tokens(),
        "GDN input rows do not match the batch"
    );
    assert!(
        spec.num_k_heads > 0 && spec.num_v_heads.is_multiple_of(spec.num_k_heads),
        "num_v_heads must be a multiple of num_k_heads"
    );
    assert!(spec.conv_kernel >= 1, "conv_kernel must be at least 1");
    assert_eq!(
        w.conv.numel(),
        spec.conv_dim() * spec.conv_kernel,
        "conv weight must be [conv_dim, kernel]"
    );
    assert_eq!(w.a_log.numel(), spec.num_v_heads, "A_log must be [Hv]");
    assert_eq!(w.dt_bias.numel(), spec.num_v_heads, "dt_bias must be [Hv]");
    assert_eq!(
        w.norm.numel(),
        spec.head_v_dim,
        "gated norm weight must be [Dv]"
    );
    let rec = spec.num_v_heads * spec.head_k_dim * spec.head_v_dim;
    assert_eq!(
        state.recurrent.len(),
        slots * rec,
        "cache GDN dims do not match the layer spec"
    );
    assert_eq!(
        state.conv.len(),
        slots * (spec.conv_kernel - 1) * spec.conv_dim(),
        "cache conv dims do not match the layer spec"
    );
    let mut seen = vec![false; slots];
    for (i, s) in batch.seqs.iter().enumerate() {
        let snapshot_slot = s.state_snapshot.and_then(|snap| snap.slot);
        for &slot in std::iter::once(&s.state_slot)
            .chain(&s.state_checkpoints)
            .chain(snapshot_slot.as_ref())
        {
            let slot = slot as usize;
            assert!(
                slot < slots,
                "sequence {i}: state slot {slot} out of range ({slots} slots)"
            );
            assert!(
                !seen[slot],
                "state slot {slot} is used twice in one batch (live slots and checkpoints must be distinct)"
            );
            seen[slot] = true;
        }
        assert!(
            s.state_checkpoints.len() <= s.num_tokens,
            "sequence {i}: {} state checkpoints for {} new tokens",
            s.state_checkpoints.len(),
            s.num_tokens
        );
        if let Some(snap) = s.state_snapshot {
            assert!(
                0 < snap.after && snap.after < s.num_tokens && s.state_checkpoints.is_empty(),
                "sequence {i}: a snapshot after {} of {} new tokens (with {} checkpoints)",
                snap.after,
                s.num_tokens,
                s.state_checkpoints.len()
            );
        }
        assert!(
            s.state_checkpoints.is_empty() || s.num_tokens < CHUNKED_MIN_TOKENS,
            "sequence {i}: state checkpoints need the token-by-token form (fewer than {CHUNKED_MIN_TOKENS} new tokens)"
        );
    }
}

/// The conv window after each of the first `count` new tokens: the last
/// `hist` rows of `[state ; inputs[..=i]]` (plain copies, so a checkpoint is
/// exactly what running the tokens one step at a time leaves behind).
fn conv_windows(
    state: &[f32],
    rows: &Rows,
    channels: usize,
    hist: usize,
    count: usize,
) -> Vec<Vec<f32>> {
    (0..count)
        .map(|i| conv_window(state, rows, channels, hist, i))
        .collect()
}

/// The conv window after new token `i` (see [`conv_windows`]).
fn conv_window(state: &[f32], rows: &Rows, channels: usize, hist: usize, i: usize) -> Vec<f32> {
    let row = |r: usize| -> &[f32] {
        if r < hist {
            &state[r * channels..(r + 1) * channels]
        } else {
            let t = r - hist;
            &rows.data[t * rows.stride..t * rows.stride + channels]
        }
    };
    (i + 1..i + 1 + hist)
        .flat_map(|r| row(r).iter().copied())
        .collect()
}

/// The delta rule over a run of tokens that a pass computes together: the
/// chunked form for long runs, token by token for short ones.
fn delta_rule_run(inputs: &HeadInputs, state: &mut [f32], out: &mut [f32]) {
    if inputs.len() >= CHUNKED_MIN_TOKENS {
        chunked(inputs, state, out)
    } else {
        recurrent(inputs, state, out)
    }
}

/// Runs one GDN layer over `proj [T, spec.proj_width()]`; returns `[T, Hv*Dv]`.
pub fn gated_delta_net(
    proj: &[f32],
    proj_cols: usize,
    w: &GdnWeights<CpuWeight>,
    spec: &GdnSpec,
    state: &mut GdnState,
    slots: usize,
    batch: &ForwardBatch,
) -> Vec<f32> {
    let t_total = proj.len().checked_div(proj_cols).unwrap_or(0);
    validate(proj_cols, t_total, w, spec, state, slots, batch);
    let (hk, hv, dk, dv) = (
        spec.num_k_heads,
        spec.num_v_heads,
        spec.head_k_dim,
        spec.head_v_dim,
    );
    let conv_dim = spec.conv_dim();
    let key_dim = hk * dk;
    let kernel = spec.conv_kernel;

    // 1. Causal conv + SiLU per sequence, carrying the conv state.
    let weight_t = transpose_weight(&w.conv.data, conv_dim, kernel);
    let mut mixed = vec![0.0f32; t_total * conv_dim];
    let conv_slot = (kernel - 1) * conv_dim;
    let mut t0 = 0;
    for s in &batch.seqs {
        let n = s.num_tokens;
        let slot = s.state_slot as usize;
        let rows = Rows {
            data: &proj[t0 * proj_cols..(t0 + n) * proj_cols],
            stride: proj_cols,
            count: n,
        };
        let windows = conv_windows(
            &state.conv[slot * conv_slot..(slot + 1) * conv_slot],
            &rows,
            conv_dim,
            kernel - 1,
            s.state_checkpoints.len(),
        );
        for (&ckpt, window) in s.state_checkpoints.iter().zip(windows) {
            let c = ckpt as usize;
            state.conv[c * conv_slot..(c + 1) * conv_slot].copy_from_slice(&window);
        }
        if let Some(snap) = s.state_snapshot
            && let Some(c) = snap.slot
        {
            let window = conv_window(
                &state.conv[slot * conv_slot..(slot + 1) * conv_slot],
                &rows,
                conv_dim,
                kernel - 1,
                snap.after - 1,
            );
            let c = c as usize;
            state.conv[c * conv_slot..(c + 1) * conv_slot].copy_from_slice(&window);
        }
        causal_conv_silu(
            rows,
            &weight_t,
            kernel,
            &mut state.conv[slot * conv_slot..(slot + 1) * conv_slot],
            &mut mixed[t0 * conv_dim..(t0 + n) * conv_dim],
        );
        t0 += n;
    }

    // 2. Head-major q, k (normalised), v, g, beta.
    let scale = query_scale(dk);
    let mut q = vec![0.0f32; hk * t_total * dk];
    let mut k = vec![0.0f32; hk * t_total * dk];
    let head_k = t_total * dk;
    q.par_chunks_mut(head_k.max(1))
        .zip(k.par_chunks_mut(head_k.max(1)))
        .enumerate()
        .for_each(|(h, (qh, kh))| {
            for t in 0..t_total {
                let row = &mixed[t * conv_dim..(t + 1) * conv_dim];
                let qt = &mut qh[t * dk..(t + 1) * dk];
                qt.copy_from_slice(&row[h * dk..(h + 1) * dk]);
                prepare_qk(qt, scale);
                let kt = &mut kh[t * dk..(t + 1) * dk];
                kt.copy_from_slice(&row[key_dim + h * dk..key_dim + (h + 1) * dk]);
                prepare_qk(kt, 1.0);
            }
        });
    let mut v = vec![0.0f32; hv * t_total * dv];
    let mut g = vec![0.0f32; hv * t_total];
    let mut beta = vec![0.0f32; hv * t_total];
    let (z_col, b_col) = (conv_dim, conv_dim + hv * dv);
    let a_col = b_col + hv;
    for t in 0..t_total {
        let row = &proj[t * proj_cols..(t + 1) * proj_cols];
        let mrow = &mixed[t * conv_dim..(t + 1) * conv_dim];
        for h in 0..hv {
            v[(h * t_total + t) * dv..(h * t_total + t + 1) * dv]
                .copy_from_slice(&mrow[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv]);
            beta[h * t_total + t] = sigmoid(row[b_col + h]);
            g[h * t_total + t] =
                -w.a_log.data[h].exp() * softplus(row[a_col + h] + w.dt_bias.data[h]);
        }
    }

    // 3. The delta rule per (sequence, value head), each with its own state.
    let mut core = vec![0.0f32; hv * t_total * dv];
    let rec_len = dk * dv;
    let mut heads_state: Vec<Option<&mut [f32]>> = state
        .recurrent
        .chunks_mut(rec_len.max(1))
        .map(Some)
        .collect();
    let mut work = Vec::with_capacity(batch.seqs.len() * hv);
    let mut core_heads: Vec<&mut [f32]> = core.chunks_mut((t_total * dv).max(1)).collect();
    let mut seq_start = 0;
    for s in &batch.seqs {
        let (n, slot) = (s.num_tokens, s.state_slot as usize);
        for (h, head_out) in core_heads.iter_mut().enumerate() {
            let (seg, rest) = std::mem::take(head_out).split_at_mut(n * dv);
            *head_out = rest;
            let st = heads_state[slot * hv + h]
                .take()
                .expect("slots are validated distinct");
            let checkpoints: Vec<&mut [f32]> = s
                .state_checkpoints
                .iter()
                .map(|&c| {
                    heads_state[c as usize * hv + h]
                        .take()
                        .expect("slots are validated distinct")
                })
                .collect();
            let snapshot = s.state_snapshot.map(|snap| {
                let dst = snap.slot.map(|slot| {
                    heads_state[slot as usize * hv + h]
                        .take()
                        .expect("slots are validated distinct")
                });
                (snap.after, dst)
            });
            work.push((seq_start, n, h, st, seg, checkpoints, snapshot));
        }
        seq_start += n;
    }
    let group = hv / hk;
    work.into_par_iter()
        .for_each(|(t0, n, h, st, seg, mut checkpoints, snapshot)| {
            let kh = h / group;
            let inputs = HeadInputs {
                q: &q[(kh * t_total + t0) * dk..(kh * t_total + t0 + n) * dk],
                k: &k[(kh * t_total + t0) * dk..(kh * t_total + t0 + n) * dk],
                v: &v[(h * t_total + t0) * dv..(h * t_total + t0 + n) * dv],
                g: &g[h * t_total + t0..h * t_total + t0 + n],
                beta: &beta[h * t_total + t0..h * t_total + t0 + n],
                dk,
                dv,
            };
            if !checkpoints.is_empty() {
                // One token at a time (the same arithmetic as `recurrent` over
                // the run), keeping the state after each checkpointed token.
                for (i, out) in seg.chunks_exact_mut(dv).enumerate() {
                    recurrent(&inputs.token(i), st, out);
                    if let Some(ckpt) = checkpoints.get_mut(i) {
                        ckpt.copy_from_slice(st);
                    }
                }
            } else if let Some((after, dst)) = snapshot {
                // Two runs, as two passes split at the snapshot would compute
                // them, with the state in between kept.
                let (first, rest) = seg.split_at_mut(after * dv);
                delta_rule_run(&inputs.tokens(0, after), st, first);
                if let Some(dst) = dst {
                    dst.copy_from_slice(st);
                }
                delta_rule_run(&inputs.tokens(after, n), st, rest);
            } else {
                delta_rule_run(&inputs, st, seg)
            }
        });

    // 4. Gated RMSNorm per (token, head): w * (o * rsqrt(mean(o^2) + eps)) * act(z),
    // act = silu, or sigmoid for Qwen3.8-Flash-Next.
    let act: fn(f32) -> f32 = match spec.output_gate {
        GdnGate::Silu => silu,
        GdnGate::Sigmoid => sigmoid,
    };
    let width = hv * dv;
    let mut out = vec![0.0f32; t_total * width];
    out.par_chunks_mut(width.max(1))
        .enumerate()
        .for_each(|(t, orow)| {
            let z = &proj[t * proj_cols + z_col..t * proj_cols + z_col + width];
            for h in 0..hv {
                let o = &core[(h * t_total + t) * dv..(h * t_total + t + 1) * dv];
                let inv = rms_inv(o, spec.norm_eps);
                let dst = &mut orow[h * dv..(h + 1) * dv];
                for (((d, &oi), &wi), &zi) in dst
                    .iter_mut()
                    .zip(o)
                    .zip(&w.norm.data)
                    .zip(&z[h * dv..(h + 1) * dv])
                {
                    *d = (wi * (oi * inv)) * act(zi);
                }
            }
        });
    out
}

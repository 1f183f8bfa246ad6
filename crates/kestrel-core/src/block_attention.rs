//! Attention over keys and values held outside the paged cache, with no
//! causal mask: what a block drafter (DFlash) runs. Its queries are a block
//! of new rows that see every key at once, the context's and the block's
//! own, so the causal paged [`Backend::attention`] cannot express it.
//!
//! These are host forms of [`Backend::append_block_keys`] and
//! [`Backend::block_attention`] over a [`HostBlockKeys`] store, for a
//! backend without kernels for them (the CPU backend uses them as they are):
//! they copy activations to the host, compute in f32 and copy back. The
//! per-head RMSNorm goes through the backend's own [`Backend::rms_norm`]
//! (on a `[rows * heads, head_dim]` view), so no weight is ever read back.

use crate::{AttentionSpec, Backend, RopeSpec};

/// Rotate one head in place at `position` (rotate-half pairing over the
/// first `rotary_dim` dims; `inv_freq[j] = theta^(-2j / rotary_dim)` and the
/// angle computed in f32, as transformers computes them).
fn rotate_head(head: &mut [f32], rope: &RopeSpec, position: usize) {
    let half = rope.rotary_dim / 2;
    let dim = rope.rotary_dim as f32;
    for j in 0..half {
        let inv_freq = 1.0 / rope.theta.powf((2 * j) as f32 / dim);
        let angle = position as f32 * inv_freq;
        let (cos, sin) = (angle.cos(), angle.sin());
        let (x1, x2) = (head[j], head[j + half]);
        head[j] = x1 * cos - x2 * sin;
        head[j + half] = x2 * cos + x1 * sin;
    }
}

/// The first `heads * d` columns of every row of `values`, each head
/// RMS-normed with `weight` through the backend and rotated at its row's
/// position (`first_position + row`), written back into `values`.
fn norm_rotate_heads<B: Backend>(
    b: &B,
    values: &mut [f32],
    row_len: usize,
    heads: usize,
    weight: &B::Weight,
    spec: &AttentionSpec,
    first_position: usize,
) {
    let d = spec.head_dim;
    let rows = values.len() / row_len.max(1);
    let mut gathered = Vec::with_capacity(rows * heads * d);
    for row in values.chunks_exact(row_len) {
        gathered.extend_from_slice(&row[..heads * d]);
    }
    let normed = b.to_host(&b.rms_norm(
        &b.from_host(rows * heads, d, &gathered),
        weight,
        spec.norm_eps,
    ));
    for (r, row) in values.chunks_exact_mut(row_len).enumerate() {
        let part = &mut row[..heads * d];
        part.copy_from_slice(&normed[r * heads * d..(r + 1) * heads * d]);
        for head in part.chunks_exact_mut(d) {
            rotate_head(head, &spec.rope, first_position + r);
        }
    }
}

/// Key/value rows on the host: `[len, 2 * Hkv * D]` f32, keys normed and
/// rotated.
#[derive(Clone, Debug, Default)]
pub struct HostBlockKeys {
    values: Vec<f32>,
    cols: usize,
}

impl HostBlockKeys {
    pub fn new(spec: &AttentionSpec) -> Self {
        HostBlockKeys {
            values: Vec::new(),
            cols: 2 * spec.kv_width(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len() / self.cols.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// See [`Backend::keep_block_keys`].
    pub fn keep(&mut self, range: std::ops::Range<usize>) {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "keeping rows {range:?} of {}",
            self.len()
        );
        self.values.truncate(range.end * self.cols);
        self.values.drain(..range.start * self.cols);
    }

    /// See [`Backend::append_block_keys`].
    pub fn append<B: Backend>(
        &mut self,
        b: &B,
        kv: &B::Tensor,
        k_norm: &B::Weight,
        spec: &AttentionSpec,
        first_position: usize,
    ) {
        let (rows, cols) = b.dims(kv);
        assert_eq!(
            cols, self.cols,
            "key/value rows must be [k (Hkv*D) | v (Hkv*D)]"
        );
        if rows == 0 {
            return;
        }
        let mut values = b.to_host(kv);
        norm_rotate_heads(
            b,
            &mut values,
            cols,
            spec.num_kv_heads,
            k_norm,
            spec,
            first_position,
        );
        self.values.extend(values);
    }

    /// See [`Backend::block_attention`].
    pub fn attend<B: Backend>(
        &self,
        b: &B,
        qkv: &B::Tensor,
        q_norm: &B::Weight,
        k_norm: &B::Weight,
        spec: &AttentionSpec,
        first_position: usize,
    ) -> B::Tensor {
        let (rows, cols) = b.dims(qkv);
        let (q_cols, kv_cols) = (spec.q_width(), 2 * spec.kv_width());
        assert_eq!(
            cols,
            q_cols + kv_cols,
            "block rows must be [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]"
        );
        let mut values = b.to_host(qkv);
        let mut queries = Vec::with_capacity(rows * q_cols);
        let mut own = Vec::with_capacity(rows * kv_cols);
        for row in values.chunks_exact(cols) {
            queries.extend_from_slice(&row[..q_cols]);
            own.extend_from_slice(&row[q_cols..]);
        }
        values.clear();
        if rows > 0 {
            norm_rotate_heads(
                b,
                &mut queries,
                q_cols,
                spec.num_q_heads,
                q_norm,
                spec,
                first_position,
            );
            norm_rotate_heads(
                b,
                &mut own,
                kv_cols,
                spec.num_kv_heads,
                k_norm,
                spec,
                first_position,
            );
        }
        let out = attend_rows(&queries, &[&self.values, &own], spec);
        b.from_host(rows, q_cols, &out)
    }
}

/// Every query row (`[T, Hq*D]`, normed and rotated) over every key row of
/// `parts` (each `[n, 2 * Hkv*D]`), no mask, in f32.
fn attend_rows(queries: &[f32], parts: &[&[f32]], spec: &AttentionSpec) -> Vec<f32> {
    let d = spec.head_dim;
    let q_cols = spec.q_width();
    let kv_cols = 2 * spec.kv_width();
    let rows = queries.len() / q_cols.max(1);
    let keys: usize = parts.iter().map(|p| p.len() / kv_cols).sum();
    assert!(
        keys > 0 || rows == 0,
        "block attention needs at least one key"
    );
    let group = spec.num_q_heads / spec.num_kv_heads;
    let v_offset = spec.kv_width();
    let key_rows = || parts.iter().flat_map(|p| p.chunks_exact(kv_cols));
    let mut out = vec![0.0f32; rows * q_cols];
    let mut scores = vec![0.0f32; keys];
    for r in 0..rows {
        for head in 0..spec.num_q_heads {
            let kv_head = head / group;
            let query = &queries[r * q_cols + head * d..][..d];
            for (score, row) in scores.iter_mut().zip(key_rows()) {
                let key = &row[kv_head * d..][..d];
                *score = query.iter().zip(key).map(|(a, b)| a * b).sum::<f32>() * spec.scale;
            }
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut total = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                total += *s;
            }
            let o = &mut out[r * q_cols + head * d..][..d];
            for (&s, row) in scores.iter().zip(key_rows()) {
                let value = &row[v_offset + kv_head * d..][..d];
                let weight = s / total;
                for (oi, vi) in o.iter_mut().zip(value) {
                    *oi += weight * vi;
                }
            }
        }
    }
    out
}

/// See [`Backend::concat_rows`].
pub fn concat_rows_on_host<B: Backend>(b: &B, a: &B::Tensor, c: &B::Tensor) -> B::Tensor {
    let ((ra, ca), (rc, cc)) = (b.dims(a), b.dims(c));
    assert!(
        ca == cc || ra == 0 || rc == 0,
        "concatenated rows must have the same width ({ca} and {cc})"
    );
    let mut values = b.to_host(a);
    values.extend(b.to_host(c));
    b.from_host(ra + rc, if ra == 0 { cc } else { ca }, &values)
}

/// [`Backend::block_attention_batch`] one sequence at a time: each block's
/// rows gathered, attended over its own keys, and the outputs joined in
/// order (the trait's default, and a device backend's fallback for stores
/// its kernels do not take).
#[allow(clippy::too_many_arguments)]
pub fn attend_each<B: Backend>(
    b: &B,
    qkv: &B::Tensor,
    q_norm: &B::Weight,
    k_norm: &B::Weight,
    keys: &mut [&mut B::BlockKeys],
    spec: &AttentionSpec,
    first_positions: &[usize],
    block: usize,
) -> B::Tensor {
    check_batch(b.dims(qkv).0, keys.len(), first_positions.len(), block);
    if keys.len() == 1 {
        return b.block_attention(qkv, q_norm, k_norm, keys[0], spec, first_positions[0]);
    }
    let mut joined: Option<B::Tensor> = None;
    for (s, (keys, &first)) in keys.iter_mut().zip(first_positions).enumerate() {
        let rows: Vec<usize> = (s * block..(s + 1) * block).collect();
        let own = b.gather_rows(qkv, &rows);
        let out = b.block_attention(&own, q_norm, k_norm, keys, spec, first);
        joined = Some(match joined {
            None => out,
            Some(j) => b.concat_rows(&j, &out),
        });
    }
    joined.expect("at least one sequence")
}

/// [`Backend::append_block_keys_batch`] one store at a time: each store's
/// rows gathered from `kv` (all of them when there is one store).
#[allow(clippy::too_many_arguments)]
pub fn append_each<B: Backend>(
    b: &B,
    keys: &mut [&mut B::BlockKeys],
    kv: &B::Tensor,
    k_norm: &B::Weight,
    spec: &AttentionSpec,
    first_positions: &[usize],
    counts: &[usize],
) {
    check_append_batch(b.dims(kv).0, keys.len(), first_positions.len(), counts);
    if keys.len() == 1 {
        return b.append_block_keys(keys[0], kv, k_norm, spec, first_positions[0]);
    }
    let mut start = 0;
    for ((keys, &first), &n) in keys.iter_mut().zip(first_positions).zip(counts) {
        if n > 0 {
            let own = b.gather_rows(kv, &(start..start + n).collect::<Vec<_>>());
            b.append_block_keys(keys, &own, k_norm, spec, first);
        }
        start += n;
    }
}

/// The shape rules of [`Backend::append_block_keys_batch`].
pub fn check_append_batch(rows: usize, stores: usize, positions: usize, counts: &[usize]) {
    assert_eq!(stores, positions, "one first position per store");
    assert_eq!(stores, counts.len(), "one row count per store");
    let total: usize = counts.iter().sum();
    assert_eq!(rows, total, "{total} rows to append, {rows} given");
}

/// The shape rules of [`Backend::block_attention_batch`].
pub fn check_batch(rows: usize, sequences: usize, positions: usize, block: usize) {
    assert!(sequences > 0, "a batch of no blocks");
    assert_eq!(sequences, positions, "one first position per sequence");
    assert_eq!(
        rows,
        sequences * block,
        "{sequences} blocks of {block} rows are not {rows} rows"
    );
}

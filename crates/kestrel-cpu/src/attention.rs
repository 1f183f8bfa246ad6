//! Full attention over a paged KV cache: q/k RMSNorm, RoPE, KV write, causal GQA
//! softmax attention, optional sigmoid output gate.

use kestrel_core::{AttentionSpec, ForwardBatch};
use rayon::prelude::*;

use crate::cache::KvPool;
use crate::math::{axpy, dot, rms_inv, sigmoid, softmax_in_place};
use crate::rope::RopeTable;

/// Where a KV pool's pages live and how they are shaped.
#[derive(Clone, Copy, Debug)]
pub struct PageLayout {
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl PageLayout {
    /// Offset of `(position, kv_head)` in the pool for a sequence's block table.
    #[inline]
    fn offset(&self, block_table: &[u32], pos: usize, kv_head: usize) -> usize {
        let page = block_table[pos / self.block_size] as usize;
        ((page * self.block_size + pos % self.block_size) * self.num_kv_heads + kv_head)
            * self.head_dim
    }
}

/// The fixed column offsets inside a projection row.
struct ProjColumns {
    q: usize,
    gate: Option<usize>,
    k: usize,
    v: usize,
}

impl ProjColumns {
    fn new(spec: &AttentionSpec) -> Self {
        let qw = spec.q_width();
        let gate = spec.output_gate.then_some(qw);
        let k = if spec.output_gate { 2 * qw } else { qw };
        ProjColumns {
            q: 0,
            gate,
            k,
            v: k + spec.kv_width(),
        }
    }
}

/// RMSNorm of one head in place, `x * rsqrt(mean(x^2) + eps) * w`.
#[inline]
fn norm_head(x: &mut [f32], w: &[f32], eps: f32) {
    let inv = rms_inv(x, eps);
    for (xi, &wi) in x.iter_mut().zip(w) {
        *xi = wi * (*xi * inv);
    }
}

fn validate(
    proj_rows: usize,
    proj_cols: usize,
    q_norm: &[f32],
    k_norm: &[f32],
    spec: &AttentionSpec,
    pages: &PageLayout,
    batch: &ForwardBatch,
) {
    let d = spec.head_dim;
    assert_eq!(
        proj_cols,
        spec.proj_width(),
        "attention input width does not match the spec"
    );
    assert_eq!(
        proj_rows,
        batch.num_tokens(),
        "attention input rows do not match the batch"
    );
    assert!(
        spec.num_kv_heads > 0 && spec.num_q_heads.is_multiple_of(spec.num_kv_heads),
        "query heads must be a multiple of KV heads"
    );
    assert!(
        spec.rope.rotary_dim <= d && spec.rope.rotary_dim.is_multiple_of(2),
        "rotary_dim must be even and at most head_dim"
    );
    assert_eq!(
        (pages.num_kv_heads, pages.head_dim),
        (spec.num_kv_heads, d),
        "KV cache heads/head_dim do not match the attention spec"
    );
    assert_eq!(q_norm.len(), d, "q_norm must have head_dim values");
    assert_eq!(k_norm.len(), d, "k_norm must have head_dim values");
    for (i, s) in batch.seqs.iter().enumerate() {
        let needed = s.total_len().div_ceil(pages.block_size);
        assert!(
            s.block_table.len() >= needed,
            "sequence {i}: {} pages for {} positions",
            s.block_table.len(),
            s.total_len()
        );
        assert!(
            s.block_table[..needed]
                .iter()
                .all(|&b| (b as usize) < pages.num_blocks),
            "sequence {i}: page index out of range ({} pages in the pool)",
            pages.num_blocks
        );
    }
}

/// Runs one attention layer. `proj` is `[T, spec.proj_width()]`; returns `[T, Hq*D]`.
/// With `selected`, token `t` attends to the positions `selected[t]` only
/// (ascending; QSA sparse attention), otherwise to all of `0 ..= its position`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    proj: &[f32],
    proj_cols: usize,
    q_norm: &[f32],
    k_norm: &[f32],
    spec: &AttentionSpec,
    pool: &mut KvPool,
    pages: &PageLayout,
    batch: &ForwardBatch,
    selected: Option<&[Vec<u32>]>,
) -> Vec<f32> {
    let t_total = proj.len().checked_div(proj_cols).unwrap_or(0);
    validate(t_total, proj_cols, q_norm, k_norm, spec, pages, batch);
    let (hq, hkv, d) = (spec.num_q_heads, spec.num_kv_heads, spec.head_dim);
    let qw = spec.q_width();
    let cols = ProjColumns::new(spec);
    let positions = batch.positions();
    let rope = RopeTable::new(&spec.rope, &positions);
    let rot = spec.rope.rotary_dim;

    // Queries: normalised and rotated, [T, Hq*D].
    let mut q = vec![0.0f32; t_total * qw];
    q.par_chunks_mut(qw).enumerate().for_each(|(t, qrow)| {
        qrow.copy_from_slice(&proj[t * proj_cols + cols.q..t * proj_cols + cols.q + qw]);
        for head in qrow.chunks_exact_mut(d) {
            norm_head(head, q_norm, spec.norm_eps);
            rope.apply(t, &mut head[..rot]);
        }
    });

    // Keys and values of the new tokens go into their pages.
    let mut t = 0;
    for s in &batch.seqs {
        for i in 0..s.num_tokens {
            let row = &proj[t * proj_cols..(t + 1) * proj_cols];
            let pos = s.cached_len + i;
            for h in 0..hkv {
                let off = pages.offset(&s.block_table, pos, h);
                let kdst = &mut pool.k[off..off + d];
                kdst.copy_from_slice(&row[cols.k + h * d..cols.k + (h + 1) * d]);
                norm_head(kdst, k_norm, spec.norm_eps);
                rope.apply(t, &mut kdst[..rot]);
                pool.v[off..off + d].copy_from_slice(&row[cols.v + h * d..cols.v + (h + 1) * d]);
            }
            t += 1;
        }
    }

    // Which sequence and position each token row is.
    let token_seq: Vec<usize> = batch
        .seqs
        .iter()
        .enumerate()
        .flat_map(|(i, s)| std::iter::repeat_n(i, s.num_tokens))
        .collect();

    let group = hq / hkv;
    let pool = &*pool;
    let mut out = vec![0.0f32; t_total * qw];
    out.par_chunks_mut(d)
        .enumerate()
        .for_each_init(Vec::new, |scores: &mut Vec<f32>, (idx, o)| {
            let (t, h) = (idx / hq, idx % hq);
            let seq = &batch.seqs[token_seq[t]];
            let pos = positions[t] as usize;
            let kvh = h / group;
            let qh = &q[t * qw + h * d..t * qw + (h + 1) * d];
            scores.clear();
            o.fill(0.0);
            let score = |j: usize| {
                let off = pages.offset(&seq.block_table, j, kvh);
                dot(qh, &pool.k[off..off + d]) * spec.scale
            };
            match selected {
                None => {
                    scores.extend((0..=pos).map(score));
                    softmax_in_place(scores);
                    for (j, &p) in scores.iter().enumerate() {
                        let off = pages.offset(&seq.block_table, j, kvh);
                        axpy(o, p, &pool.v[off..off + d]);
                    }
                }
                Some(sel) => {
                    let sel = &sel[t];
                    assert!(
                        sel.iter().all(|&j| j as usize <= pos),
                        "a selected position is past its token"
                    );
                    scores.extend(sel.iter().map(|&j| score(j as usize)));
                    softmax_in_place(scores);
                    for (&j, &p) in sel.iter().zip(scores.iter()) {
                        let off = pages.offset(&seq.block_table, j as usize, kvh);
                        axpy(o, p, &pool.v[off..off + d]);
                    }
                }
            }
            if let Some(g) = cols.gate {
                let gate = &proj[t * proj_cols + g + h * d..t * proj_cols + g + (h + 1) * d];
                for (oi, &gi) in o.iter_mut().zip(gate) {
                    *oi *= sigmoid(gi);
                }
            }
        });
    out
}

//! Attention over pages: against a contiguous naive reference, and invariance to
//! page placement, chunking and batching.

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, ForwardBatch, RopeSpec, SeqChunk,
};

use super::ops::weight;
use super::{assert_close, naive, rng::Rng};
use crate::{CpuBackend, CpuCache, CpuWeight};

const BLOCK: usize = 4;
const BLOCKS: usize = 64;

fn spec(output_gate: bool, rotary_dim: usize) -> AttentionSpec {
    AttentionSpec {
        num_q_heads: 4,
        num_kv_heads: 2,
        head_dim: 16,
        rope: RopeSpec {
            theta: 10_000.0,
            rotary_dim,
        },
        norm_eps: 1e-6,
        output_gate,
        scale: 0.25,
    }
}

fn cache(s: &AttentionSpec) -> CpuCache {
    CpuBackend::new()
        .new_cache(&CacheSpec {
            attn_layers: 1,
            num_blocks: BLOCKS,
            block_size: BLOCK,
            num_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            gdn_layers: 0,
            num_state_slots: 0,
            gdn: None,
        })
        .unwrap()
}

fn weights(rng: &mut Rng, d: usize) -> AttentionWeights<CpuWeight> {
    AttentionWeights {
        q_norm: weight(&[d], rng.vec(d)),
        k_norm: weight(&[d], rng.vec(d)),
    }
}

/// Runs `proj` rows of one sequence through attention in calls of the given sizes.
fn run_in_chunks(
    proj: &[f32],
    s: &AttentionSpec,
    w: &AttentionWeights<CpuWeight>,
    table: &[u32],
    chunks: &[usize],
) -> Vec<f32> {
    let be = CpuBackend::new();
    let width = s.proj_width();
    let mut c = cache(s);
    let mut out = Vec::new();
    let mut done = 0;
    for &n in chunks {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                prompt: false,
                num_tokens: n,
                cached_len: done,
                block_table: table.to_vec(),
                state_slot: 0,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            }],
        };
        let x = be.from_host(n, width, &proj[done * width..(done + n) * width]);
        out.extend(be.to_host(&be.attention(&x, w, s, &mut c, 0, &batch)));
        done += n;
    }
    out
}

fn shuffled_table(rng: &mut Rng, pages: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..BLOCKS as u32).collect();
    rng.shuffle(&mut all);
    all.truncate(pages);
    all
}

#[test]
fn attention_over_shuffled_pages_matches_contiguous_naive() {
    for (gate, rot) in [(true, 8), (false, 16)] {
        let mut rng = Rng::new(20 + rot as u64);
        let s = spec(gate, rot);
        let w = weights(&mut rng, s.head_dim);
        let t = 19;
        let proj = rng.vec(t * s.proj_width());
        let want = naive::attention(&proj, &w.q_norm.data, &w.k_norm.data, &s);
        let shuffled = run_in_chunks(
            &proj,
            &s,
            &w,
            &shuffled_table(&mut rng, t.div_ceil(BLOCK)),
            &[t],
        );
        assert_close(
            &shuffled,
            &want,
            1e-4,
            &format!("attention gate={gate} rot={rot}"),
        );
        let identity: Vec<u32> = (0..t.div_ceil(BLOCK) as u32).collect();
        let contiguous = run_in_chunks(&proj, &s, &w, &identity, &[t]);
        assert_close(
            &shuffled,
            &contiguous,
            1e-6,
            "shuffled vs identity page table",
        );
    }
}

#[test]
fn attention_is_independent_of_chunking() {
    let mut rng = Rng::new(21);
    let s = spec(true, 8);
    let w = weights(&mut rng, s.head_dim);
    let t = 17;
    let proj = rng.vec(t * s.proj_width());
    let table = shuffled_table(&mut rng, t.div_ceil(BLOCK));
    let whole = run_in_chunks(&proj, &s, &w, &table, &[t]);
    let one_by_one = run_in_chunks(&proj, &s, &w, &table, &[1; 17]);
    let uneven = run_in_chunks(&proj, &s, &w, &table, &[3, 1, 6, 2, 5]);
    assert_close(&one_by_one, &whole, 1e-5, "token by token vs one call");
    assert_close(&uneven, &whole, 1e-5, "uneven chunks vs one call");
}

#[test]
fn batch_of_two_sequences_equals_each_alone() {
    let be = CpuBackend::new();
    let mut rng = Rng::new(22);
    let s = spec(true, 8);
    let w = weights(&mut rng, s.head_dim);
    let width = s.proj_width();
    // Sequence A: 6 cached + 5 new; sequence B: 9 new. Disjoint pages.
    let (a_pre, a_new, b_new) = (6, 5, 9);
    let a_proj = rng.vec((a_pre + a_new) * width);
    let b_proj = rng.vec(b_new * width);
    let mut pages = shuffled_table(&mut rng, 6);
    let a_table: Vec<u32> = pages.drain(..3).collect();
    let b_table = pages;

    let alone_a = run_in_chunks(&a_proj, &s, &w, &a_table, &[a_pre, a_new]);
    let alone_b = run_in_chunks(&b_proj, &s, &w, &b_table, &[b_new]);

    let mut c = cache(&s);
    let pre = ForwardBatch {
        seqs: vec![SeqChunk {
            prompt: false,
            num_tokens: a_pre,
            cached_len: 0,
            block_table: a_table.clone(),
            state_slot: 0,
            state_checkpoints: Vec::new(),
            state_snapshot: None,
        }],
    };
    be.attention(
        &be.from_host(a_pre, width, &a_proj[..a_pre * width]),
        &w,
        &s,
        &mut c,
        0,
        &pre,
    );
    let batch = ForwardBatch {
        seqs: vec![
            SeqChunk {
                prompt: false,
                num_tokens: a_new,
                cached_len: a_pre,
                block_table: a_table,
                state_slot: 0,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            },
            SeqChunk {
                prompt: false,
                num_tokens: b_new,
                cached_len: 0,
                block_table: b_table,
                state_slot: 1,
                state_checkpoints: Vec::new(),
                state_snapshot: None,
            },
        ],
    };
    let mut x = a_proj[a_pre * width..].to_vec();
    x.extend_from_slice(&b_proj);
    let both = be.to_host(&be.attention(
        &be.from_host(a_new + b_new, width, &x),
        &w,
        &s,
        &mut c,
        0,
        &batch,
    ));
    let qw = s.q_width();
    assert_close(
        &both[..a_new * qw],
        &alone_a[a_pre * qw..],
        1e-6,
        "sequence A in a batch",
    );
    assert_close(&both[a_new * qw..], &alone_b, 1e-6, "sequence B in a batch");
}

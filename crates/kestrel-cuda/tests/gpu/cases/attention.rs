//! Paged attention: mixed steps, decode and prefill over scattered pages.

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, ForwardBatch, HostTensor, Result,
    RopeSpec, SeqChunk,
};

use super::{Ctx, Outputs, TOL_ATTENTION, out, repeatable};

/// Two steps over two sequences with scattered pages: a prefill of both, then
/// a decode of one and a further chunk of the other.
pub(super) fn attention_steps(block_size: usize, pages: &[u32]) -> Vec<ForwardBatch> {
    let table_a: Vec<u32> = pages[..3].to_vec();
    let table_b: Vec<u32> = pages[3..5].to_vec();
    let seq = |n, cached, table: &Vec<u32>, slot| SeqChunk {
        prompt: false,
        num_tokens: n,
        cached_len: cached,
        block_table: table[..(cached + n).div_ceil(block_size)].to_vec(),
        state_slot: slot,
        state_checkpoints: Vec::new(),
        state_snapshot: None,
    };
    vec![
        ForwardBatch {
            seqs: vec![seq(37, 0, &table_a, 0), seq(5, 0, &table_b, 1)],
        },
        ForwardBatch {
            seqs: vec![seq(1, 37, &table_a, 0), seq(20, 5, &table_b, 1)],
        },
    ]
}

pub fn attention(c: &mut Ctx) {
    let configs: [AttnShape; 2] = [
        ("qwen3-like Hq8 Hkv2 D128", 8, 2, 128, 128, 1e6f32, false),
        (
            "next-like Hq4 Hkv1 D256 rot64 gate",
            4,
            1,
            256,
            64,
            1e7f32,
            true,
        ),
    ];
    for shape in configs {
        let steps = attention_steps(16, &[7, 2, 9, 4, 11]);
        let label = format!("attention {}", shape.0);
        check_attention_steps(c, &label, &shape, 12, &steps, TOL_ATTENTION);
    }
    for shape in [QWEN3_SHAPE, QWEN36_SHAPE] {
        attention_decode(c, &shape);
        attention_prefill(c, &shape);
    }
    for shape in LONG_SHAPES {
        attention_prefill_long(c, &shape);
    }
    // The fused decode kernel's other cases: head dim 64 with a partial
    // rotary (the bundled model's attention layers), and 16 q heads per kv
    // head (two blocks per kv head, of which one writes the cache).
    for shape in DECODE_EXTRA_SHAPES {
        attention_decode(c, &shape);
    }
}

const DECODE_EXTRA_SHAPES: [AttnShape; 2] = [
    ("Hq4 Hkv2 D64 rot16", 4, 2, 64, 16, 1e4, false),
    ("Hq16 Hkv1 D128", 16, 1, 128, 128, 1e6, false),
];

/// One shape per tensor-core head dim, few heads (the CPU reference is the
/// cost of the long cases), each with GQA.
const LONG_SHAPES: [AttnShape; 3] = [
    ("Hq4 Hkv2 D64", 4, 2, 64, 64, 1e4, false),
    ("Hq8 Hkv2 D128", 8, 2, 128, 128, 1e6, false),
    ("Hq4 Hkv1 D256 rot64 gate", 4, 1, 256, 64, 1e7, true),
];

/// A long causal prefill split over two steps, next to short sequences in the
/// same batches: 1,500 then 1,333 tokens (a chunk on top of 1,500 cached ones,
/// so query tiles, key tiles and pages are all misaligned with each other),
/// 77 then 1 (a decode row in a prefill step), 300 then 259, and a 5-token
/// sequence in the first step only. Lengths end mid-tile and mid-page.
fn attention_prefill_long(c: &mut Ctx, shape: &AttnShape) {
    const BS: usize = 16;
    let totals = [2833, 78, 559, 5];
    let tables = scattered_tables(c, &totals, BS, 256);
    let seq = |i: usize, n: usize, cached: usize| SeqChunk {
        prompt: false,
        num_tokens: n,
        cached_len: cached,
        block_table: tables[i][..(cached + n).div_ceil(BS)].to_vec(),
        state_slot: 0,
        state_checkpoints: Vec::new(),
        state_snapshot: None,
    };
    let steps = vec![
        ForwardBatch {
            seqs: vec![seq(0, 1500, 0), seq(1, 77, 0), seq(2, 300, 0), seq(3, 5, 0)],
        },
        ForwardBatch {
            seqs: vec![seq(2, 259, 300), seq(0, 1333, 1500), seq(1, 1, 77)],
        },
    ];
    let label = format!("attention prefill long {}", shape.0);
    check_attention_steps(c, &label, shape, 256, &steps, TOL_ATTENTION);
}

/// (label, hq, hkv, head_dim, rotary_dim, theta, output gate).
pub(super) type AttnShape = (&'static str, usize, usize, usize, usize, f32, bool);
const QWEN3_SHAPE: AttnShape = ("Hq32 Hkv4 D128", 32, 4, 128, 128, 1e6, false);
const QWEN36_SHAPE: AttnShape = ("Hq16 Hkv2 D256 rot64 gate", 16, 2, 256, 64, 1e7, true);

/// Decode steps of 8, 3, 1 and 5 sequences (lengths 1 to 2003) after a
/// prefill that fills their caches; pages scattered over the pool.
fn attention_decode(c: &mut Ctx, shape: &AttnShape) {
    const BS: usize = 16;
    let lens = [1, 17, 300, 2000, 45, 129, 700, 3];
    let tables = scattered_tables(c, &lens.map(|l| l + 3), BS, 256);
    let seq = |i: usize, n: usize, cached: usize| SeqChunk {
        prompt: false,
        num_tokens: n,
        cached_len: cached,
        block_table: tables[i][..(cached + n).div_ceil(BS)].to_vec(),
        state_slot: 0,
        state_checkpoints: Vec::new(),
        state_snapshot: None,
    };
    let prefill = (0..8)
        .filter(|&i| lens[i] > 1)
        .map(|i| seq(i, lens[i] - 1, 0));
    let mut steps = vec![ForwardBatch {
        seqs: prefill.collect(),
    }];
    let mut cached = lens.map(|l| l - 1);
    for group in [
        &[0, 1, 2, 3, 4, 5, 6, 7][..],
        &[3, 1, 6],
        &[3],
        &[7, 0, 2, 5, 3],
    ] {
        let seqs = group.iter().map(|&i| seq(i, 1, cached[i])).collect();
        steps.push(ForwardBatch { seqs });
        for &i in group {
            cached[i] += 1;
        }
    }
    let label = format!("attention decode {}", shape.0);
    check_attention_steps(c, &label, shape, 256, &steps, TOL_ATTENTION);
}

/// Prefill chunks of about 300 tokens on top of about 100 cached ones.
fn attention_prefill(c: &mut Ctx, shape: &AttnShape) {
    const BS: usize = 16;
    let tables = scattered_tables(c, &[400, 370], BS, 64);
    let seq = |i: usize, n: usize, cached: usize| SeqChunk {
        prompt: false,
        num_tokens: n,
        cached_len: cached,
        block_table: tables[i][..(cached + n).div_ceil(BS)].to_vec(),
        state_slot: 0,
        state_checkpoints: Vec::new(),
        state_snapshot: None,
    };
    let steps = vec![
        ForwardBatch {
            seqs: vec![seq(0, 100, 0), seq(1, 90, 0)],
        },
        ForwardBatch {
            seqs: vec![seq(0, 300, 100), seq(1, 280, 90)],
        },
    ];
    let label = format!("attention prefill {}", shape.0);
    check_attention_steps(c, &label, shape, 64, &steps, TOL_ATTENTION);
}

/// Block tables for sequences of `lens` tokens, drawn from a shuffled pool.
fn scattered_tables(c: &mut Ctx, lens: &[usize], bs: usize, num_blocks: usize) -> Vec<Vec<u32>> {
    let mut pool: Vec<u32> = (0..num_blocks as u32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, c.data.index(i + 1));
    }
    let mut next = pool.into_iter();
    lens.iter()
        .map(|l| next.by_ref().take(l.div_ceil(bs)).collect())
        .collect()
}

/// Runs `steps` through layer 1 of a fresh two-layer cache on both backends
/// and records each step's output; CUDA runs everything twice (from a fresh
/// cache) and must repeat bit for bit.
pub(super) fn check_attention_steps(
    c: &mut Ctx,
    label: &str,
    shape: &AttnShape,
    num_blocks: usize,
    steps: &[ForwardBatch],
    tol: f64,
) {
    let &(_, hq, hkv, d, rot, theta, gate) = shape;
    let spec = AttentionSpec {
        num_q_heads: hq,
        num_kv_heads: hkv,
        head_dim: d,
        rope: RopeSpec {
            theta,
            rotary_dim: rot,
        },
        norm_eps: 1e-6,
        output_gate: gate,
        scale: (d as f32).powf(-0.5),
    };
    let cache = CacheSpec {
        attn_layers: 2,
        num_blocks,
        block_size: 16,
        num_kv_heads: hkv,
        head_dim: d,
        gdn_layers: 0,
        num_state_slots: 0,
        gdn: None,
    };
    let inputs: Vec<Vec<f32>> = steps
        .iter()
        .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
        .collect();
    let q_norm = c.data.vector(d, 1.0, 0.2);
    let k_norm = c.data.vector(d, 1.0, 0.2);
    #[allow(clippy::too_many_arguments)]
    fn run<B: Backend>(
        b: &B,
        spec: &AttentionSpec,
        cache: &CacheSpec,
        steps: &[ForwardBatch],
        inputs: &[Vec<f32>],
        q_norm: &HostTensor,
        k_norm: &HostTensor,
    ) -> Result<Outputs> {
        let w = AttentionWeights {
            q_norm: b.upload(q_norm)?,
            k_norm: b.upload(k_norm)?,
        };
        let mut cache = b.new_cache(cache)?;
        let mut outs = Vec::new();
        for (i, (batch, x)) in steps.iter().zip(inputs).enumerate() {
            let proj = b.from_host(batch.num_tokens(), spec.proj_width(), x);
            // Layer 1: the other pool must stay untouched by layer 0's writes.
            let o = b.attention(&proj, &w, spec, &mut cache, 1, batch);
            outs.push(out(b, &format!("step{i}"), &o));
        }
        Ok(outs)
    }
    let cpu = run(&c.cpu, &spec, &cache, steps, &inputs, &q_norm, &k_norm);
    let gpu = run(&c.gpu, &spec, &cache, steps, &inputs, &q_norm, &k_norm).and_then(|first| {
        let again = run(&c.gpu, &spec, &cache, steps, &inputs, &q_norm, &k_norm)?;
        first
            .into_iter()
            .zip(again)
            .map(|((name, a), (_, b))| repeatable(&name, a, b))
            .collect()
    });
    c.record(label, tol, cpu, gpu);
}

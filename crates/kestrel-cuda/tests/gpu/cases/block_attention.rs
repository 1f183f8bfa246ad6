//! Keys kept outside the paged cache and non-causal block attention over
//! them (a DFlash drafter's context and block pass).

use kestrel_core::{AttentionSpec, Backend, HostTensor, Result, RopeSpec};

use super::{Ctx, Outputs, TOL_ATTENTION, out};

/// `(label, Hq, Hkv, D, rotary_dim, theta)`: the z-lab drafter's heads, and
/// the other tensor-core head dims with partial rotaries.
const SHAPES: [(&str, usize, usize, usize, usize, f32); 3] = [
    ("Hq32 Hkv4 D128 (z-lab drafter)", 32, 4, 128, 128, 1e6),
    ("Hq4 Hkv2 D64 rot16", 4, 2, 64, 16, 1e7),
    ("Hq8 Hkv1 D256 rot64", 8, 1, 256, 64, 1e7),
];

/// The attention of one of [`SHAPES`] (no output gate, scale `D^-0.5`).
fn spec_of(hq: usize, hkv: usize, d: usize, rotary_dim: usize, theta: f32) -> AttentionSpec {
    AttentionSpec {
        num_q_heads: hq,
        num_kv_heads: hkv,
        head_dim: d,
        rope: RopeSpec { theta, rotary_dim },
        norm_eps: 1e-6,
        output_gate: false,
        scale: (d as f32).powf(-0.5),
    }
}

/// What happens to a store between block passes.
#[derive(Clone, Copy)]
enum Op {
    /// Append this many rows (their positions continue the context's).
    Append(usize),
    /// Drop this many of the oldest rows (a window).
    DropOldest(usize),
    /// Drop this many of the newest rows (a roll-back).
    DropNewest(usize),
    /// A block pass of this many rows right after the context.
    Attend(usize),
}

/// Appends that outgrow the first store (64 rows) and its successor, a
/// window that moves the live rows off slot 0, a roll-back, and block
/// passes of 16, 8 and 1 rows whose keys the next append overwrites.
const OPS: [Op; 10] = [
    Op::Append(37),
    Op::Attend(16),
    Op::Append(1),
    Op::Append(150),
    Op::DropOldest(60),
    Op::Attend(8),
    Op::DropNewest(5),
    Op::Append(9),
    Op::Attend(16),
    Op::Attend(1),
];

pub fn block_attention(c: &mut Ctx) {
    for (label, hq, hkv, d, rotary_dim, theta) in SHAPES {
        let spec = spec_of(hq, hkv, d, rotary_dim, theta);
        let (q_norm, k_norm) = (c.data.vector(d, 1.0, 0.2), c.data.vector(d, 1.0, 0.2));
        let kv_cols = 2 * spec.kv_width();
        let inputs: Vec<Vec<f32>> = OPS
            .iter()
            .map(|op| match *op {
                Op::Append(n) => c.data.randn(n * kv_cols, 1.0),
                Op::Attend(n) => c.data.randn(n * (spec.q_width() + kv_cols), 1.0),
                _ => Vec::new(),
            })
            .collect();
        fn run<B: Backend>(
            b: &B,
            spec: &AttentionSpec,
            norms: (&HostTensor, &HostTensor),
            inputs: &[Vec<f32>],
        ) -> Result<Outputs> {
            let (q_norm, k_norm) = (b.upload(norms.0)?, b.upload(norms.1)?);
            let mut keys = b.new_block_keys(spec);
            // Position of the oldest row kept; rows are consecutive.
            let mut first = 3usize;
            let mut outputs = Vec::new();
            let kv_cols = 2 * spec.kv_width();
            for (i, (op, x)) in OPS.iter().zip(inputs).enumerate() {
                let len = b.block_keys_len(&keys);
                match *op {
                    Op::Append(n) => {
                        let kv = b.from_host(n, kv_cols, x);
                        b.append_block_keys(&mut keys, &kv, &k_norm, spec, first + len);
                    }
                    Op::DropOldest(n) => {
                        b.keep_block_keys(&mut keys, n..len);
                        first += n;
                    }
                    Op::DropNewest(n) => b.keep_block_keys(&mut keys, 0..len - n),
                    Op::Attend(n) => {
                        let qkv = b.from_host(n, spec.q_width() + kv_cols, x);
                        let o =
                            b.block_attention(&qkv, &q_norm, &k_norm, &mut keys, spec, first + len);
                        outputs.push(out(b, &format!("pass {i} ({n} rows over {len})"), &o));
                    }
                }
            }
            Ok(outputs)
        }
        let norms = (&q_norm, &k_norm);
        let (cpu, gpu) = (
            run(&c.cpu, &spec, norms, &inputs),
            run(&c.gpu, &spec, norms, &inputs),
        );
        c.record(&format!("block_attention {label}"), TOL_ATTENTION, cpu, gpu);
    }
}

/// Context rows of the stores of a batched pass: one that outgrew its first
/// store, a short one and one of a single row.
const BATCH_CONTEXTS: [usize; 3] = [150, 37, 1];

/// Rows then appended to those stores in one batched call (none to one).
const BATCH_APPENDS: [usize; 3] = [3, 0, 5];

/// [`Backend::block_attention_batch`]: the blocks of several sequences, each
/// over its own store at its own positions, in one call; twice, so that the
/// second pass finds the stores after the first staged its keys. Before the
/// passes, [`Backend::append_block_keys_batch`] adds rows to every store
/// but one in one call.
pub fn block_attention_batch(c: &mut Ctx) {
    for (label, hq, hkv, d, rotary_dim, theta) in SHAPES {
        let spec = spec_of(hq, hkv, d, rotary_dim, theta);
        let (q_norm, k_norm) = (c.data.vector(d, 1.0, 0.2), c.data.vector(d, 1.0, 0.2));
        let kv_cols = 2 * spec.kv_width();
        let contexts: Vec<Vec<f32>> = BATCH_CONTEXTS
            .iter()
            .map(|&n| c.data.randn(n * kv_cols, 1.0))
            .collect();
        let blocks: Vec<(usize, Vec<f32>)> = [16usize, 8]
            .iter()
            .map(|&block| {
                let rows = block * BATCH_CONTEXTS.len();
                (block, c.data.randn(rows * (spec.q_width() + kv_cols), 1.0))
            })
            .collect();
        let appended = c
            .data
            .randn(BATCH_APPENDS.iter().sum::<usize>() * kv_cols, 1.0);
        fn run<B: Backend>(
            b: &B,
            spec: &AttentionSpec,
            norms: (&HostTensor, &HostTensor),
            (contexts, appended): (&[Vec<f32>], &[f32]),
            blocks: &[(usize, Vec<f32>)],
        ) -> Result<Outputs> {
            let (q_norm, k_norm) = (b.upload(norms.0)?, b.upload(norms.1)?);
            let kv_cols = 2 * spec.kv_width();
            let mut stores: Vec<B::BlockKeys> = Vec::new();
            let mut firsts = Vec::new();
            for (i, (x, &n)) in contexts.iter().zip(&BATCH_CONTEXTS).enumerate() {
                let mut keys = b.new_block_keys(spec);
                let first = 5 + 100 * i;
                b.append_block_keys(&mut keys, &b.from_host(n, kv_cols, x), &k_norm, spec, first);
                stores.push(keys);
                firsts.push(first + n);
            }
            let total = BATCH_APPENDS.iter().sum();
            let kv = b.from_host(total, kv_cols, appended);
            let mut keys: Vec<&mut B::BlockKeys> = stores.iter_mut().collect();
            b.append_block_keys_batch(&mut keys, &kv, &k_norm, spec, &firsts, &BATCH_APPENDS);
            for (first, n) in firsts.iter_mut().zip(BATCH_APPENDS) {
                *first += n;
            }
            let mut outputs = Vec::new();
            for (block, x) in blocks {
                let rows = block * stores.len();
                let qkv = b.from_host(rows, spec.q_width() + kv_cols, x);
                let mut keys: Vec<&mut B::BlockKeys> = stores.iter_mut().collect();
                let o = b.block_attention_batch(
                    &qkv, &q_norm, &k_norm, &mut keys, spec, &firsts, *block,
                );
                outputs.push(out(b, &format!("{} blocks of {block}", stores.len()), &o));
            }
            Ok(outputs)
        }
        let norms = (&q_norm, &k_norm);
        let (cpu, gpu) = (
            run(&c.cpu, &spec, norms, (&contexts, &appended), &blocks),
            run(&c.gpu, &spec, norms, (&contexts, &appended), &blocks),
        );
        c.record(
            &format!("block_attention_batch {label}"),
            TOL_ATTENTION,
            cpu,
            gpu,
        );
    }
}

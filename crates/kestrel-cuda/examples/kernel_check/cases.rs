//! The checks: each draws fresh inputs, runs the same function on the CPU
//! reference and on CUDA, and records every output's error.

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, BackendError, CacheSpec, DType, ForwardBatch,
    GdnSpec, GdnWeights, HostTensor, MoeSpec, MoeWeights, Result, RopeSpec, SeqChunk,
};
use kestrel_cpu::CpuBackend;
use kestrel_cuda::CudaBackend;

use crate::compare::{Outcome, compare};
use crate::data::Data;

type Outputs = Vec<(String, Vec<f32>)>;

/// f32 arithmetic only (summation order differs).
const TOL_F32: f64 = 1e-5;
/// Activations rounded to bf16 before a matrix product, f32 accumulation.
const TOL_BF16_MATMUL: f64 = 1e-2;
/// bf16 KV cache.
const TOL_ATTENTION: f64 = 1e-2;
/// bf16 activations into two chained expert products.
const TOL_MOE: f64 = 2e-2;
/// f32 state; long recurrences amplify rounding slightly.
const TOL_GDN: f64 = 1e-4;

pub struct Ctx {
    pub cpu: CpuBackend,
    pub gpu: CudaBackend,
    pub data: Data,
    pub outcomes: Vec<Outcome>,
}

impl Ctx {
    fn record(&mut self, case: &str, tol: f64, cpu: Result<Outputs>, gpu: Result<Outputs>) {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            let mut o = compare(case, what, &[], &[0.0], tol);
            o.note = Some(format!("{what} failed: {e}"));
            o
        };
        let sync = self.gpu.synchronize();
        let first = self.outcomes.len();
        match (cpu, gpu, sync) {
            (Err(e), _, _) => self.outcomes.push(failed("cpu", &e)),
            (_, Err(e), _) | (_, _, Err(e)) => self.outcomes.push(failed("cuda", &e)),
            (Ok(cpu), Ok(gpu), Ok(())) => {
                if cpu.len() != gpu.len() {
                    self.outcomes.push(failed(
                        "outputs",
                        &format!("{} vs {} outputs", gpu.len(), cpu.len()),
                    ));
                }
                for ((name, c), (_, g)) in cpu.iter().zip(&gpu) {
                    self.outcomes.push(compare(case, name, g, c, tol));
                }
            }
        }
        for o in &self.outcomes[first..] {
            println!("{}", o.line());
        }
    }

    /// A case that panicked (a failed assertion or a CUDA fault) is a failure.
    pub fn panicked(&mut self, case: &str, msg: String) {
        let mut o = compare(case, "panic", &[], &[0.0], 0.0);
        o.note = Some(msg);
        println!("{}", o.line());
        self.outcomes.push(o);
    }
}

fn out<B: Backend>(b: &B, name: &str, t: &B::Tensor) -> (String, Vec<f32>) {
    (name.to_string(), b.to_host(t))
}

pub fn embedding(c: &mut Ctx) {
    let table = c.data.mat_bf16(&[1000, 512], 1.0);
    let ids: Vec<u32> = (0..37).map(|_| c.data.index(1000) as u32).collect();
    fn run<B: Backend>(b: &B, table: &HostTensor, ids: &[u32]) -> Result<Outputs> {
        let t = b.upload(table)?;
        Ok(vec![out(b, "out", &b.embedding(&t, ids))])
    }
    let (cpu, gpu) = (run(&c.cpu, &table, &ids), run(&c.gpu, &table, &ids));
    c.record("embedding [1000x512] 37 ids", TOL_F32, cpu, gpu);
}

pub fn elementwise(c: &mut Ctx) {
    let (rows, cols) = (17, 1000);
    let a = c.data.randn(rows * cols, 1.0);
    let bv = c.data.randn(rows * cols, 1.0);
    fn run_add<B: Backend>(
        b: &B,
        rows: usize,
        cols: usize,
        a: &[f32],
        bv: &[f32],
    ) -> Result<Outputs> {
        let mut x = b.from_host(rows, cols, a);
        b.add_assign(&mut x, &b.from_host(rows, cols, bv));
        Ok(vec![out(b, "a", &x)])
    }
    let (cpu, gpu) = (
        run_add(&c.cpu, rows, cols, &a, &bv),
        run_add(&c.gpu, rows, cols, &a, &bv),
    );
    c.record("add_assign [17x1000]", TOL_F32, cpu, gpu);

    let gu = c.data.randn(19 * 2 * 768, 2.0);
    fn run_swiglu<B: Backend>(b: &B, gu: &[f32]) -> Result<Outputs> {
        Ok(vec![out(
            b,
            "out",
            &b.swiglu(&b.from_host(19, 2 * 768, gu)),
        )])
    }
    let (cpu, gpu) = (run_swiglu(&c.cpu, &gu), run_swiglu(&c.gpu, &gu));
    c.record("swiglu [19x1536]", TOL_F32, cpu, gpu);

    let x = c.data.randn(40 * 300, 1.0);
    let rows_idx = vec![3, 0, 39, 3, 17];
    fn run_gather<B: Backend>(b: &B, x: &[f32], rows: &[usize]) -> Result<Outputs> {
        Ok(vec![out(
            b,
            "out",
            &b.gather_rows(&b.from_host(40, 300, x), rows),
        )])
    }
    let (cpu, gpu) = (
        run_gather(&c.cpu, &x, &rows_idx),
        run_gather(&c.gpu, &x, &rows_idx),
    );
    c.record("gather_rows [40x300] 5 rows", TOL_F32, cpu, gpu);
}

pub fn norms(c: &mut Ctx) {
    let (rows, cols, eps) = (33, 2048, 1e-6);
    let x = c.data.randn(rows * cols, 3.0);
    let r = c.data.randn(rows * cols, 3.0);
    let w = c.data.vector(cols, 1.0, 0.2);
    fn run<B: Backend>(
        b: &B,
        rows: usize,
        cols: usize,
        x: &[f32],
        r: &[f32],
        w: &HostTensor,
        eps: f32,
    ) -> Result<Outputs> {
        let w = b.upload(w)?;
        let xt = b.from_host(rows, cols, x);
        let normed = b.rms_norm(&xt, &w, eps);
        let mut res = b.from_host(rows, cols, r);
        let fused = b.add_rms_norm(&mut res, &xt, &w, eps);
        Ok(vec![
            out(b, "rms_norm", &normed),
            out(b, "residual", &res),
            out(b, "add_rms_norm", &fused),
        ])
    }
    let cpu = run(&c.cpu, rows, cols, &x, &r, &w, eps);
    let gpu = run(&c.gpu, rows, cols, &x, &r, &w, eps);
    c.record("rms_norm/add_rms_norm [33x2048]", TOL_F32, cpu, gpu);
}

pub fn matmul(c: &mut Ctx) {
    for (rows, k, n, dtype) in [
        (13, 1024, 768, DType::BF16),
        (1, 2048, 4096, DType::F16),
        (64, 512, 1000, DType::F32),
    ] {
        let x = c.data.randn(rows * k, 1.0);
        let w = c.data.mat_other(&[n, k], 0.05, dtype);
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            k: usize,
            x: &[f32],
            w: &HostTensor,
        ) -> Result<Outputs> {
            let w = b.upload(w)?;
            Ok(vec![out(b, "out", &b.matmul(&b.from_host(rows, k, x), &w))])
        }
        let (cpu, gpu) = (run(&c.cpu, rows, k, &x, &w), run(&c.gpu, rows, k, &x, &w));
        // Non-bf16 checkpoints are rounded to bf16 on the GPU: same tolerance,
        // the rounding of x already dominates.
        c.record(
            &format!("matmul [{rows}x{k}]x[{n}x{k}]^T {dtype:?}"),
            TOL_BF16_MATMUL,
            cpu,
            gpu,
        );
    }
    matmul_decode(c);
}

/// The same output twice from one backend, bit for bit: decode kernels must
/// not depend on timing (no atomics), or graph replays would drift from eager runs.
fn repeatable(name: &str, first: Vec<f32>, again: Vec<f32>) -> Result<(String, Vec<f32>)> {
    if first
        .iter()
        .map(|v| v.to_bits())
        .ne(again.iter().map(|v| v.to_bits()))
    {
        return Err(BackendError::Invalid(format!(
            "{name}: two runs on the same input differ"
        )));
    }
    Ok((name.to_string(), first))
}

/// Decode-sized products (1..8 rows), which take the `gemv` kernels: shapes of
/// Qwen3.6 projections, a short K, an N that no row-group size divides, and a
/// K that is not a multiple of 8 (cuBLAS fallback).
fn matmul_decode(c: &mut Ctx) {
    for (k, n, row_counts) in [
        (2048, 12352, &[1usize, 2, 3, 5, 8][..]),
        (4096, 2048, &[1, 2, 3, 5, 8]),
        (512, 2048, &[1, 2, 3, 5, 8]),
        (1024, 1001, &[1, 2, 3, 5, 8]),
        (8, 37, &[1, 8]),
        (1004, 300, &[2]),
    ] {
        let w = c.data.mat_bf16(&[n, k], 0.05);
        for &rows in row_counts {
            let x = c.data.randn(rows * k, 1.0);
            fn run<B: Backend>(
                b: &B,
                rows: usize,
                k: usize,
                x: &[f32],
                w: &HostTensor,
            ) -> Result<Outputs> {
                let w = b.upload(w)?;
                let xt = b.from_host(rows, k, x);
                let first = b.to_host(&b.matmul(&xt, &w));
                let again = b.to_host(&b.matmul(&xt, &w));
                Ok(vec![repeatable("out", first, again)?])
            }
            let (cpu, gpu) = (run(&c.cpu, rows, k, &x, &w), run(&c.gpu, rows, k, &x, &w));
            c.record(
                &format!("matmul decode [{rows}x{k}]x[{n}x{k}]^T"),
                TOL_BF16_MATMUL,
                cpu,
                gpu,
            );
        }
    }
}

/// Two steps over two sequences with scattered pages: a prefill of both, then
/// a decode of one and a further chunk of the other.
fn attention_steps(block_size: usize, pages: &[u32]) -> Vec<ForwardBatch> {
    let table_a: Vec<u32> = pages[..3].to_vec();
    let table_b: Vec<u32> = pages[3..5].to_vec();
    let seq = |n, cached, table: &Vec<u32>, slot| SeqChunk {
        num_tokens: n,
        cached_len: cached,
        block_table: table[..(cached + n).div_ceil(block_size)].to_vec(),
        state_slot: slot,
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
        check_attention_steps(c, &format!("attention {}", shape.0), &shape, 12, &steps);
    }
    for shape in [QWEN3_SHAPE, QWEN36_SHAPE] {
        attention_decode(c, &shape);
        attention_prefill(c, &shape);
    }
}

/// (label, hq, hkv, head_dim, rotary_dim, theta, output gate).
type AttnShape = (&'static str, usize, usize, usize, usize, f32, bool);
const QWEN3_SHAPE: AttnShape = ("Hq32 Hkv4 D128", 32, 4, 128, 128, 1e6, false);
const QWEN36_SHAPE: AttnShape = ("Hq16 Hkv2 D256 rot64 gate", 16, 2, 256, 64, 1e7, true);

/// Decode steps of 8, 3, 1 and 5 sequences (lengths 1 to 2003) after a
/// prefill that fills their caches; pages scattered over the pool.
fn attention_decode(c: &mut Ctx, shape: &AttnShape) {
    const BS: usize = 16;
    let lens = [1, 17, 300, 2000, 45, 129, 700, 3];
    let tables = scattered_tables(c, &lens.map(|l| l + 3), BS, 256);
    let seq = |i: usize, n: usize, cached: usize| SeqChunk {
        num_tokens: n,
        cached_len: cached,
        block_table: tables[i][..(cached + n).div_ceil(BS)].to_vec(),
        state_slot: 0,
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
    check_attention_steps(c, &label, shape, 256, &steps);
}

/// Prefill chunks of about 300 tokens on top of about 100 cached ones.
fn attention_prefill(c: &mut Ctx, shape: &AttnShape) {
    const BS: usize = 16;
    let tables = scattered_tables(c, &[400, 370], BS, 64);
    let seq = |i: usize, n: usize, cached: usize| SeqChunk {
        num_tokens: n,
        cached_len: cached,
        block_table: tables[i][..(cached + n).div_ceil(BS)].to_vec(),
        state_slot: 0,
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
    check_attention_steps(c, &label, shape, 64, &steps);
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
/// and records each step's output.
fn check_attention_steps(
    c: &mut Ctx,
    label: &str,
    shape: &AttnShape,
    num_blocks: usize,
    steps: &[ForwardBatch],
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
    let gpu = run(&c.gpu, &spec, &cache, steps, &inputs, &q_norm, &k_norm);
    c.record(label, TOL_ATTENTION, cpu, gpu);
}

pub fn moe(c: &mut Ctx) {
    let configs = [
        (
            "E16 k4 renorm shared+gate T23",
            16,
            4,
            96,
            256,
            23,
            true,
            Some(128),
            true,
        ),
        ("E8 k2 no-shared T1", 8, 2, 64, 256, 1, false, None, false),
        (
            "E32 k8 renorm shared T70",
            32,
            8,
            64,
            512,
            70,
            true,
            Some(96),
            false,
        ),
    ];
    for (label, e, k, inter, h, t, renorm, shared, shared_gate) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        let x = c.data.randn(t * h, 1.0);
        let w = MoeWeights {
            router: c.data.mat_bf16(&[e, h], 0.1),
            gate_up: c.data.mat_bf16(&[e, 2 * inter, h], 0.06),
            down: c.data.mat_bf16(&[e, h, inter], 0.1),
            shared_gate_up: shared.map(|si| c.data.mat_bf16(&[2 * si, h], 0.06)),
            shared_down: shared.map(|si| c.data.mat_bf16(&[h, si], 0.1)),
            shared_gate: shared_gate.then(|| c.data.mat_bf16(&[1, h], 0.1)),
        };
        fn run<B: Backend>(
            b: &B,
            spec: &MoeSpec,
            t: usize,
            h: usize,
            x: &[f32],
            w: &MoeWeights<HostTensor>,
        ) -> Result<Outputs> {
            let up = |o: &Option<HostTensor>| o.as_ref().map(|t| b.upload(t)).transpose();
            let w = MoeWeights {
                router: b.upload(&w.router)?,
                gate_up: b.upload(&w.gate_up)?,
                down: b.upload(&w.down)?,
                shared_gate_up: up(&w.shared_gate_up)?,
                shared_down: up(&w.shared_down)?,
                shared_gate: up(&w.shared_gate)?,
            };
            Ok(vec![out(b, "out", &b.moe(&b.from_host(t, h, x), &w, spec))])
        }
        let (cpu, gpu) = (
            run(&c.cpu, &spec, t, h, &x, &w),
            run(&c.gpu, &spec, t, h, &x, &w),
        );
        c.record(&format!("moe {label}"), TOL_MOE, cpu, gpu);
    }
    moe_decode(c);
    moe_prefill(c);
}

/// Prefill-sized MoE blocks (more than 8 tokens), which route on the device
/// and run the experts as grouped tensor-core GEMMs: Qwen3.6- and Qwen3-30B-
/// like layouts scaled down at 9..2000 tokens (partial tiles, experts with
/// one token and with many), a shape whose dimensions are multiples of 8 but
/// not of 64 (K and N tails), and a routing skewed onto one expert that also
/// leaves experts unpicked. Each block runs twice and the two results must
/// be bit-identical.
///
/// Two experts whose logits differ by about the f32 rounding (~1e-6) at the
/// k-th place would be picked differently by the reference and the kernels
/// without any bug, and over thousands of tokens that becomes likely. So the
/// router weights are multiples of 2^-10 below 1/2 and, from 700 tokens on,
/// the inputs multiples of 1/4 below 8: every logit is then a multiple of
/// 2^-12 below 2^11 (H <= 512), exact in f32 whatever the summation order,
/// and ties go to the lower index in both.
fn moe_prefill(c: &mut Ctx) {
    // (label, E, k, I, H, renormalise, shared I, shared gate, skewed)
    type Config = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
        bool,
        bool,
    );
    let configs: [(Config, &[usize]); 4] = [
        (
            (
                "3.6-like E64 k8 renorm shared+gate",
                64,
                8,
                128,
                512,
                true,
                Some(128),
                true,
                false,
            ),
            &[9, 100, 700, 2000],
        ),
        (
            (
                "30B-like E32 k4 I192 renorm",
                32,
                4,
                192,
                256,
                true,
                None,
                false,
                false,
            ),
            &[9, 100, 700, 2000],
        ),
        (
            (
                "tails E20 k3 I40 H200 shared Is24+gate",
                20,
                3,
                40,
                200,
                false,
                Some(24),
                true,
                false,
            ),
            &[130],
        ),
        (
            (
                "skewed E64 k4 shared+gate",
                64,
                4,
                128,
                256,
                false,
                Some(64),
                true,
                true,
            ),
            &[700, 2000],
        ),
    ];
    for ((label, e, k, inter, h, renorm, shared, shared_gate, skewed), tokens) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        // Skewed: inputs get a positive offset and the router a constant
        // component along it, large for expert 3 (picked by nearly every
        // token) and negative for the last 3/8 of the experts (never picked).
        let mut router = c.data.randn(e * h, 0.1);
        if skewed {
            for (row, r) in router.chunks_exact_mut(h).enumerate() {
                let bias = match row {
                    3 => 0.05,
                    _ if row >= e * 5 / 8 => -0.05,
                    _ => 0.0,
                };
                r.iter_mut().for_each(|v| *v += bias);
            }
        }
        for v in &mut router {
            *v = ((*v * 1024.0).round() / 1024.0).clamp(-511.0 / 1024.0, 511.0 / 1024.0);
        }
        let w = MoeWeights {
            router: crate::data::bf16_tensor(&[e, h], &router),
            gate_up: c.data.mat_bf16(&[e, 2 * inter, h], 0.06),
            down: c.data.mat_bf16(&[e, h, inter], 0.1),
            shared_gate_up: shared.map(|si| c.data.mat_bf16(&[2 * si, h], 0.06)),
            shared_down: shared.map(|si| c.data.mat_bf16(&[h, si], 0.1)),
            shared_gate: shared_gate.then(|| c.data.mat_bf16(&[1, h], 0.1)),
        };
        for &t in tokens {
            let offset = if skewed { 0.5 } else { 0.0 };
            let exact = t >= 700;
            let x: Vec<f32> = c
                .data
                .randn(t * h, 1.0)
                .into_iter()
                .map(|v| v + offset)
                .map(|v| {
                    if exact {
                        ((v * 4.0).round() / 4.0).clamp(-7.75, 7.75)
                    } else {
                        v
                    }
                })
                .collect();
            fn run<B: Backend>(
                b: &B,
                spec: &MoeSpec,
                t: usize,
                h: usize,
                x: &[f32],
                w: &MoeWeights<HostTensor>,
            ) -> Result<Outputs> {
                let up = |o: &Option<HostTensor>| o.as_ref().map(|t| b.upload(t)).transpose();
                let w = MoeWeights {
                    router: b.upload(&w.router)?,
                    gate_up: b.upload(&w.gate_up)?,
                    down: b.upload(&w.down)?,
                    shared_gate_up: up(&w.shared_gate_up)?,
                    shared_down: up(&w.shared_down)?,
                    shared_gate: up(&w.shared_gate)?,
                };
                let xt = b.from_host(t, h, x);
                let first = b.to_host(&b.moe(&xt, &w, spec));
                let again = b.to_host(&b.moe(&xt, &w, spec));
                Ok(vec![repeatable("out", first, again)?])
            }
            let (cpu, gpu) = (
                run(&c.cpu, &spec, t, h, &x, &w),
                run(&c.gpu, &spec, t, h, &x, &w),
            );
            c.record(&format!("moe prefill {label} H{h} T{t}"), TOL_MOE, cpu, gpu);
        }
    }
}

/// Decode-sized MoE blocks (1..8 tokens), which route on the device: Qwen3.6-
/// and Qwen3-30B-like layouts scaled down, with and without the shared expert,
/// its gate and renormalisation, a shared expert wider or narrower than the
/// routed ones, and a Qwen3-Next-like 512 experts with 10 picks.
fn moe_decode(c: &mut Ctx) {
    type Config = (
        &'static str,
        usize,
        usize,
        usize,
        usize,
        bool,
        Option<usize>,
        bool,
    );
    let configs: [(Config, &[usize]); 5] = [
        (
            (
                "3.6-like E64 k8 renorm shared+gate",
                64,
                8,
                128,
                512,
                true,
                Some(128),
                true,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "3.6-like E64 k8 shared Is192",
                64,
                8,
                128,
                512,
                false,
                Some(192),
                false,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "30B-like E32 k8 I192 renorm",
                32,
                8,
                192,
                512,
                true,
                None,
                false,
            ),
            &[1, 2, 5, 8],
        ),
        (
            (
                "E48 k4 shared Is64+gate",
                48,
                4,
                160,
                256,
                false,
                Some(64),
                true,
            ),
            &[1, 8],
        ),
        (
            (
                "next-like E512 k10 shared+gate",
                512,
                10,
                64,
                256,
                true,
                Some(64),
                true,
            ),
            &[3],
        ),
    ];
    for ((label, e, k, inter, h, renorm, shared, shared_gate), tokens) in configs {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: renorm,
            shared_intermediate: shared,
        };
        let w = MoeWeights {
            router: c.data.mat_bf16(&[e, h], 0.1),
            gate_up: c.data.mat_bf16(&[e, 2 * inter, h], 0.06),
            down: c.data.mat_bf16(&[e, h, inter], 0.1),
            shared_gate_up: shared.map(|si| c.data.mat_bf16(&[2 * si, h], 0.06)),
            shared_down: shared.map(|si| c.data.mat_bf16(&[h, si], 0.1)),
            shared_gate: shared_gate.then(|| c.data.mat_bf16(&[1, h], 0.1)),
        };
        for &t in tokens {
            let x = c.data.randn(t * h, 1.0);
            fn run<B: Backend>(
                b: &B,
                spec: &MoeSpec,
                t: usize,
                h: usize,
                x: &[f32],
                w: &MoeWeights<HostTensor>,
            ) -> Result<Outputs> {
                let up = |o: &Option<HostTensor>| o.as_ref().map(|t| b.upload(t)).transpose();
                let w = MoeWeights {
                    router: b.upload(&w.router)?,
                    gate_up: b.upload(&w.gate_up)?,
                    down: b.upload(&w.down)?,
                    shared_gate_up: up(&w.shared_gate_up)?,
                    shared_down: up(&w.shared_down)?,
                    shared_gate: up(&w.shared_gate)?,
                };
                let xt = b.from_host(t, h, x);
                let first = b.to_host(&b.moe(&xt, &w, spec));
                let again = b.to_host(&b.moe(&xt, &w, spec));
                Ok(vec![repeatable("out", first, again)?])
            }
            let (cpu, gpu) = (
                run(&c.cpu, &spec, t, h, &x, &w),
                run(&c.gpu, &spec, t, h, &x, &w),
            );
            c.record(&format!("moe decode {label} H{h} T{t}"), TOL_MOE, cpu, gpu);
        }
    }
}

/// Prefill, a mixed step, a state snapshot, and a reset, over two GDN layers.
pub fn gated_delta_net(c: &mut Ctx) {
    let spec = GdnSpec {
        num_k_heads: 2,
        num_v_heads: 4,
        head_k_dim: 128,
        head_v_dim: 128,
        conv_kernel: 4,
        norm_eps: 1e-6,
    };
    let cache = CacheSpec {
        attn_layers: 0,
        num_blocks: 0,
        block_size: 16,
        num_kv_heads: 0,
        head_dim: 0,
        gdn_layers: 2,
        num_state_slots: 4,
        gdn: Some(spec),
    };
    let chunk = |n, slot| SeqChunk {
        num_tokens: n,
        cached_len: 0,
        block_table: vec![],
        state_slot: slot,
    };
    // (batch, action before it): slots 1 and 3 run, 1 is snapshotted into 0, 3 is reset.
    let steps = vec![
        ForwardBatch {
            seqs: vec![chunk(70, 1), chunk(2, 3)],
        },
        ForwardBatch {
            seqs: vec![chunk(1, 1), chunk(5, 3)],
        },
        ForwardBatch {
            seqs: vec![chunk(3, 0), chunk(1, 1), chunk(4, 3)],
        },
    ];
    let inputs: Vec<Vec<f32>> = steps
        .iter()
        .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
        .collect();
    let c_dim = spec.conv_dim();
    let w = GdnWeights {
        conv: c.data.mat_bf16(&[c_dim, spec.conv_kernel], 0.5),
        // A = exp(A_log) in (0.37, 15): decays from mild to strong.
        a_log: HostTensor::from_f32(vec![4], &c.data.uniform(4, -1.0, 2.7)),
        dt_bias: c.data.vector(4, 0.0, 1.0),
        norm: c.data.vector(spec.head_v_dim, 1.0, 0.2),
    };
    fn run<B: Backend>(
        b: &B,
        spec: &GdnSpec,
        cache: &CacheSpec,
        steps: &[ForwardBatch],
        inputs: &[Vec<f32>],
        w: &GdnWeights<HostTensor>,
    ) -> Result<Outputs> {
        let w = GdnWeights {
            conv: b.upload(&w.conv)?,
            a_log: b.upload(&w.a_log)?,
            dt_bias: b.upload(&w.dt_bias)?,
            norm: b.upload(&w.norm)?,
        };
        let mut cache = b.new_cache(cache)?;
        for slot in 0..4 {
            b.zero_state(&mut cache, slot);
        }
        let mut outs = Vec::new();
        for (i, (batch, x)) in steps.iter().zip(inputs).enumerate() {
            if i == 2 {
                b.copy_state(&mut cache, 1, 0);
                b.zero_state(&mut cache, 3);
            }
            let proj = b.from_host(batch.num_tokens(), spec.proj_width(), x);
            for layer in 0..2 {
                let o = b.gated_delta_net(&proj, &w, spec, &mut cache, layer, batch);
                outs.push(out(b, &format!("step{i}.l{layer}"), &o));
            }
        }
        Ok(outs)
    }
    let cpu = run(&c.cpu, &spec, &cache, &steps, &inputs, &w);
    let gpu = run(&c.gpu, &spec, &cache, &steps, &inputs, &w);
    c.record("gated_delta_net Hk2 Hv4 D128 K4", TOL_GDN, cpu, gpu);
    gated_delta_net_paths(c);
}

/// The CUDA GDN paths on carried state: decode steps of 1..=8 sequences (the
/// fused decode kernel), single prefills of 1, 63, 64, 65 and 300 tokens (the
/// chunked kernels), a mixed batch, and decode after all of them; for each
/// Hv/Hk group the decode kernel has, and a head size that takes the general
/// kernels. The GPU side runs twice: the outputs must agree bit for bit.
fn gated_delta_net_paths(c: &mut Ctx) {
    for (hk, hv, d) in [(2, 4, 128), (4, 4, 128), (1, 4, 128), (2, 4, 64)] {
        let spec = GdnSpec {
            num_k_heads: hk,
            num_v_heads: hv,
            head_k_dim: d,
            head_v_dim: d,
            conv_kernel: 4,
            norm_eps: 1e-6,
        };
        let slots = 8;
        let cache = CacheSpec {
            attn_layers: 0,
            num_blocks: 0,
            block_size: 16,
            num_kv_heads: 0,
            head_dim: 0,
            gdn_layers: 2,
            num_state_slots: slots,
            gdn: Some(spec),
        };
        let batch = |seqs: &[(usize, u32)]| ForwardBatch {
            seqs: seqs
                .iter()
                .map(|&(n, slot)| SeqChunk {
                    num_tokens: n,
                    cached_len: 0,
                    block_table: vec![],
                    state_slot: slot,
                })
                .collect(),
        };
        let mut steps = vec![batch(&[
            (5, 0),
            (17, 1),
            (64, 2),
            (1, 3),
            (40, 4),
            (3, 5),
            (70, 6),
            (9, 7),
        ])];
        // Decode: n sequences on slots in a shuffled order.
        for n in 1..=8u32 {
            let seqs: Vec<(usize, u32)> = (0..n).map(|i| (1, (i * 5 + n) % slots as u32)).collect();
            steps.push(batch(&seqs));
        }
        for (n, slot) in [(1, 3), (63, 1), (64, 0), (65, 5), (300, 6)] {
            steps.push(batch(&[(n, slot)]));
        }
        steps.push(batch(&[(1, 2), (130, 4), (1, 7), (64, 0), (2, 6)]));
        steps.push(batch(&(0..8).map(|i| (1, 7 - i)).collect::<Vec<_>>()));
        let inputs: Vec<Vec<f32>> = steps
            .iter()
            .map(|s| c.data.randn(s.num_tokens() * spec.proj_width(), 1.0))
            .collect();
        let w = GdnWeights {
            conv: c.data.mat_bf16(&[spec.conv_dim(), spec.conv_kernel], 0.5),
            a_log: HostTensor::from_f32(vec![hv], &c.data.uniform(hv, -1.0, 2.7)),
            dt_bias: c.data.vector(hv, 0.0, 1.0),
            norm: c.data.vector(d, 1.0, 0.2),
        };
        fn run<B: Backend>(
            b: &B,
            spec: &GdnSpec,
            cache: &CacheSpec,
            steps: &[ForwardBatch],
            inputs: &[Vec<f32>],
            w: &GdnWeights<HostTensor>,
        ) -> Result<Outputs> {
            let w = GdnWeights {
                conv: b.upload(&w.conv)?,
                a_log: b.upload(&w.a_log)?,
                dt_bias: b.upload(&w.dt_bias)?,
                norm: b.upload(&w.norm)?,
            };
            let slots = cache.num_state_slots as u32;
            let mut cache = b.new_cache(cache)?;
            for slot in 0..slots {
                b.zero_state(&mut cache, slot);
            }
            let mut outs = Vec::new();
            for (i, (batch, x)) in steps.iter().zip(inputs).enumerate() {
                let proj = b.from_host(batch.num_tokens(), spec.proj_width(), x);
                // Layer 1 only: layer 0's state must stay untouched.
                let o = b.gated_delta_net(&proj, &w, spec, &mut cache, 1, batch);
                let sizes: Vec<String> = batch
                    .seqs
                    .iter()
                    .map(|q| q.num_tokens.to_string())
                    .collect();
                outs.push(out(b, &format!("step{i} [{}]", sizes.join(",")), &o));
            }
            Ok(outs)
        }
        let cpu = run(&c.cpu, &spec, &cache, &steps, &inputs, &w);
        let gpu = run(&c.gpu, &spec, &cache, &steps, &inputs, &w).and_then(|first| {
            let again = run(&c.gpu, &spec, &cache, &steps, &inputs, &w)?;
            let same = first.iter().zip(&again).all(|((_, a), (_, b))| {
                a.iter()
                    .map(|v| v.to_bits())
                    .eq(b.iter().map(|v| v.to_bits()))
            });
            if same {
                Ok(first)
            } else {
                Err(kestrel_core::BackendError::Invalid(
                    "two runs on the same input differ".into(),
                ))
            }
        });
        c.record(&format!("gdn paths Hk{hk} Hv{hv} D{d}"), TOL_GDN, cpu, gpu);
    }
}

//! The checks: each draws fresh inputs, runs the same function on the CPU
//! reference and on CUDA, and records every output's error.

use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, DType, ForwardBatch, GdnSpec, GdnWeights,
    HostTensor, MoeSpec, MoeWeights, Result, RopeSpec, SeqChunk,
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
    let configs = [
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
    for (label, hq, hkv, d, rot, theta, gate) in configs {
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
        let block_size = 16;
        let cache = CacheSpec {
            attn_layers: 2,
            num_blocks: 12,
            block_size,
            num_kv_heads: hkv,
            head_dim: d,
            gdn_layers: 0,
            num_state_slots: 0,
            gdn: None,
        };
        let steps = attention_steps(block_size, &[7, 2, 9, 4, 11]);
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
        let cpu = run(&c.cpu, &spec, &cache, &steps, &inputs, &q_norm, &k_norm);
        let gpu = run(&c.gpu, &spec, &cache, &steps, &inputs, &q_norm, &k_norm);
        c.record(&format!("attention {label}"), TOL_ATTENTION, cpu, gpu);
    }
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
}

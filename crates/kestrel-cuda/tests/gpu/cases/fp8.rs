//! Block-FP8 weights: the FP8 `gemv` and MoE decode kernels, which read the
//! codes and block scales directly, and the bf16 copies the prefill products
//! read, against the CPU reference, which dequantises exactly at upload.
//! The decode kernels read the exact weights with f32 activations, so they
//! are held to the f32 tolerance; the prefill copies round the weights and
//! activations to bf16.

use kestrel_core::{Backend, BlockFp8, HostWeight, MoeSpec, MoeWeights, PreNorm, Result, fp8};

use super::{Ctx, Outputs, TOL_BF16_MATMUL, TOL_F32, TOL_MOE, out, repeatable};
use crate::data::bf16_tensor;

pub fn fp8(c: &mut Ctx) {
    fp8_matmul(c);
    fp8_norm_matmul(c);
    fp8_stacked(c);
    fp8_moe(c);
    fp8_dummy(c);
}

/// A random `[.., rows, cols]` weight quantised with the checkpoints' rule.
fn quantized(c: &mut Ctx, shape: &[usize], scale: f32) -> HostWeight<'static> {
    let n: usize = shape.iter().product();
    // Uneven magnitudes across blocks, so that every scale matters.
    let mut v = c.data.randn(n, scale);
    let cols = shape[shape.len() - 1];
    for (i, x) in v.iter_mut().enumerate() {
        let block = (i / cols / 128) * 7 + (i % cols) / 128;
        *x *= 1.0 + (block % 5) as f32;
    }
    HostWeight::BlockFp8(BlockFp8::quantize(&bf16_tensor(shape, &v), fp8::BLOCK))
}

/// Products of 1..8 rows take the FP8 `gemv`, 16 and 40 rows (outside a
/// decode-shaped step) the cuBLAS product on a bf16 copy. Shapes of Qwen3.6
/// projections, and an N that ends inside a scale block.
fn fp8_matmul(c: &mut Ctx) {
    for (k, n, row_counts) in [
        (2048, 12352, &[1usize, 2, 5, 8, 16][..]),
        (4096, 2048, &[1, 3, 8]),
        (512, 2048, &[1, 4, 40]),
        (2048, 1000, &[1, 7, 40]),
    ] {
        let w = quantized(c, &[n, k], 0.05);
        for &rows in row_counts {
            let x = c.data.randn(rows * k, 1.0);
            fn run<B: Backend>(
                b: &B,
                rows: usize,
                k: usize,
                x: &[f32],
                w: &HostWeight,
            ) -> Result<Outputs> {
                let w = b.upload_weight(w)?;
                let xt = b.from_host(rows, k, x);
                let first = b.to_host(&b.matmul(&xt, &w));
                let again = b.to_host(&b.matmul(&xt, &w));
                Ok(vec![repeatable("out", first, again)?])
            }
            let (cpu, gpu) = (run(&c.cpu, rows, k, &x, &w), run(&c.gpu, rows, k, &x, &w));
            let tol = if rows > 8 { TOL_BF16_MATMUL } else { TOL_F32 };
            c.record(
                &format!("fp8 matmul [{rows}x{k}]x[{n}x{k}]^T"),
                tol,
                cpu,
                gpu,
            );
        }
    }
}

/// `gemv_norm` on FP8 weights (1 and 2 rows), and the unfused form (3 rows).
fn fp8_norm_matmul(c: &mut Ctx) {
    for (rows, k, n) in [(1, 2048, 12352), (2, 2048, 1024), (3, 4096, 2048)] {
        let r = c.data.randn(rows * k, 3.0);
        let d = c.data.randn(rows * k, 3.0);
        let norm = c.data.vector(k, 1.0, 0.2);
        let w = quantized(c, &[n, k], 0.05);
        fn run<B: Backend>(
            b: &B,
            (rows, k): (usize, usize),
            (r, d): (&[f32], &[f32]),
            norm: &kestrel_core::HostTensor,
            w: &HostWeight,
        ) -> Result<Outputs> {
            let (norm, w) = (b.upload(norm)?, b.upload_weight(w)?);
            let mut residual = b.from_host(rows, k, r);
            let delta = b.from_host(rows, k, d);
            let y = b.norm_matmul(
                PreNorm {
                    residual: &mut residual,
                    delta: Some(&delta),
                    weight: &norm,
                    eps: 1e-6,
                },
                &w,
            );
            Ok(vec![out(b, "product", &y), out(b, "residual", &residual)])
        }
        let cpu = run(&c.cpu, (rows, k), (&r, &d), &norm, &w);
        let gpu = run(&c.gpu, (rows, k), (&r, &d), &norm, &w);
        c.record(
            &format!("fp8 norm_matmul [{rows}x{k}]x[{n}x{k}]^T"),
            TOL_F32,
            cpu,
            gpu,
        );
    }
}

/// A weight stacked from an FP8 part and a bf16 one (`Backend::stack_rows`,
/// Qwen3.6's GDN in_proj: q/k/v and z FP8, b and a bf16): each part's
/// launch fills its columns, through `gemv` (1..8 rows, a 16-row pass),
/// `gemv_norm` (1 and 2 rows; 3 rows take the norm, then `gemv`) and the
/// prefill product on the stacked bf16 copy (40 rows).
fn fp8_stacked(c: &mut Ctx) {
    let (k, head, tail) = (2048, 12288, 64);
    let w = quantized(c, &[head, k], 0.05);
    let b_a = HostWeight::Dense(bf16_tensor(&[tail, k], &c.data.randn(tail * k, 0.05)));
    fn stacked<B: Backend>(b: &B, w: &HostWeight, b_a: &HostWeight) -> Result<B::Weight> {
        b.stack_rows(vec![b.upload_weight(w)?, b.upload_weight(b_a)?])
    }
    for rows in [1usize, 2, 5, 8, 16, 40] {
        let x = c.data.randn(rows * k, 1.0);
        fn run<B: Backend>(
            b: &B,
            rows: usize,
            k: usize,
            x: &[f32],
            w: &HostWeight,
            b_a: &HostWeight,
        ) -> Result<Outputs> {
            let w = stacked(b, w, b_a)?;
            let xt = b.from_host(rows, k, x);
            let first = b.to_host(&b.matmul(&xt, &w));
            let again = b.to_host(&b.matmul(&xt, &w));
            Ok(vec![repeatable("out", first, again)?])
        }
        let cpu = run(&c.cpu, rows, k, &x, &w, &b_a);
        let gpu = run(&c.gpu, rows, k, &x, &w, &b_a);
        let tol = if rows > 8 { TOL_BF16_MATMUL } else { TOL_F32 };
        c.record(
            &format!("fp8 + bf16 stacked matmul [{rows}x{k}]x[{head}+{tail}x{k}]^T"),
            tol,
            cpu,
            gpu,
        );
    }
    for rows in [1usize, 2, 3] {
        let r = c.data.randn(rows * k, 3.0);
        let d = c.data.randn(rows * k, 3.0);
        let norm = c.data.vector(k, 1.0, 0.2);
        fn run<B: Backend>(
            b: &B,
            (rows, k): (usize, usize),
            (r, d): (&[f32], &[f32]),
            norm: &kestrel_core::HostTensor,
            (w, b_a): (&HostWeight, &HostWeight),
        ) -> Result<Outputs> {
            let (norm, w) = (b.upload(norm)?, stacked(b, w, b_a)?);
            let mut residual = b.from_host(rows, k, r);
            let delta = b.from_host(rows, k, d);
            let y = b.norm_matmul(
                PreNorm {
                    residual: &mut residual,
                    delta: Some(&delta),
                    weight: &norm,
                    eps: 1e-6,
                },
                &w,
            );
            Ok(vec![out(b, "product", &y), out(b, "residual", &residual)])
        }
        let cpu = run(&c.cpu, (rows, k), (&r, &d), &norm, (&w, &b_a));
        let gpu = run(&c.gpu, (rows, k), (&r, &d), &norm, (&w, &b_a));
        c.record(
            &format!("fp8 + bf16 stacked norm_matmul [{rows}x{k}]x[{head}+{tail}x{k}]^T"),
            TOL_F32,
            cpu,
            gpu,
        );
    }
}

/// The MoE block on FP8 experts (bf16 router and shared-expert gate, as
/// the checkpoints keep them): decode at 1, 2 and 5 tokens (routing in
/// `moe_gate_up`, then in `moe_topk`), and a prefill of 40 tokens on bf16
/// copies. Qwen3.6's expert shape, fewer experts.
fn fp8_moe(c: &mut Ctx) {
    let (h, inter, shared) = (2048, 512, 512);
    let spec = MoeSpec {
        num_experts: 32,
        top_k: 8,
        intermediate: inter,
        norm_topk_prob: true,
        shared_intermediate: Some(shared),
    };
    let e = spec.num_experts;
    let w = MoeWeights {
        router: HostWeight::Dense(c.data.mat_bf16(&[e, h], 0.1)),
        gate_up: quantized(c, &[e, 2 * inter, h], 0.06),
        down: quantized(c, &[e, h, inter], 0.1),
        shared_gate_up: Some(quantized(c, &[2 * shared, h], 0.06)),
        shared_down: Some(quantized(c, &[h, shared], 0.1)),
        shared_gate: Some(HostWeight::Dense(c.data.mat_bf16(&[1, h], 0.1))),
    };
    fn run<B: Backend>(
        b: &B,
        spec: &MoeSpec,
        (t, h): (usize, usize),
        x: &[f32],
        w: &MoeWeights<HostWeight>,
    ) -> Result<Outputs> {
        let up = |o: &Option<HostWeight>| o.as_ref().map(|t| b.upload_weight(t)).transpose();
        let w = MoeWeights {
            router: b.upload_weight(&w.router)?,
            gate_up: b.upload_weight(&w.gate_up)?,
            down: b.upload_weight(&w.down)?,
            shared_gate_up: up(&w.shared_gate_up)?,
            shared_down: up(&w.shared_down)?,
            shared_gate: up(&w.shared_gate)?,
        };
        Ok(vec![out(b, "out", &b.moe(&b.from_host(t, h, x), &w, spec))])
    }
    for t in [1, 2, 5, 40] {
        let x = c.data.randn(t * h, 1.0);
        let (cpu, gpu) = (
            run(&c.cpu, &spec, (t, h), &x, &w),
            run(&c.gpu, &spec, (t, h), &x, &w),
        );
        let tol = if t > 8 { TOL_MOE } else { TOL_F32 };
        c.record(&format!("fp8 moe E{e} k8 shared+gate T{t}"), tol, cpu, gpu);
    }
    // Prefill on the GPU, FP8 experts against the same weights uploaded as
    // bf16 (their dequantised values): the wgmma GEMMs convert the codes in
    // shared memory to exactly those values, so the outputs are equal bit
    // for bit. 40 tokens take 64-row tiles, 600 128-row tiles and 2,048 the
    // wide ones (gate_up and down); the shared expert one dense group.
    fn dense(o: &HostWeight) -> HostWeight<'static> {
        match o {
            HostWeight::BlockFp8(q) => {
                HostWeight::Dense(bf16_tensor(&q.shape, &q.dequantize().to_f32()))
            }
            HostWeight::Dense(t) => HostWeight::Dense(t.clone()).into_owned(),
        }
    }
    let w_dense = MoeWeights {
        router: dense(&w.router),
        gate_up: dense(&w.gate_up),
        down: dense(&w.down),
        shared_gate_up: w.shared_gate_up.as_ref().map(dense),
        shared_down: w.shared_down.as_ref().map(dense),
        shared_gate: w.shared_gate.as_ref().map(dense),
    };
    for t in [40, 600, 2048] {
        let x = c.data.randn(t * h, 1.0);
        let (bf16, fp8) = (
            run(&c.gpu, &spec, (t, h), &x, &w_dense),
            run(&c.gpu, &spec, (t, h), &x, &w),
        );
        c.record(
            &format!("fp8 moe prefill E{e} T{t} (fp8 = its bf16 values)"),
            0.0,
            bf16,
            fp8,
        );
    }
}

/// Dummy FP8 weights with codes drawn on the device equal the host's draw:
/// the same product of both, bit for bit (a single differing code changes it).
fn fp8_dummy(c: &mut Ctx) {
    let (n, k, seed, scale) = (300, 256, 0x5eed, 0.05);
    let scales = kestrel_models::fp8::dummy_scales(&[n, k], seed, scale);
    let x = c.data.randn(k, 1.0);
    let host = HostWeight::BlockFp8(kestrel_models::fp8::dummy_weight(&[n, k], seed, scale));
    let on_device = match c.gpu.dummy_fp8_weight(&[n, k], seed, &scales) {
        Some(w) => w,
        None => {
            c.record(
                "fp8 dummy codes",
                0.0,
                Ok(vec![]),
                Err(kestrel_core::BackendError::Invalid(
                    "the CUDA backend drew no FP8 codes".into(),
                )),
            );
            return;
        }
    };
    let gpu = on_device.map(|w| {
        let xt = c.gpu.from_host(1, k, &x);
        vec![out(&c.gpu, "out", &c.gpu.matmul(&xt, &w))]
    });
    let cpu = c.gpu.upload_weight(&host).map(|w| {
        let xt = c.gpu.from_host(1, k, &x);
        vec![out(&c.gpu, "out", &c.gpu.matmul(&xt, &w))]
    });
    // Both on the GPU through the same kernel: any difference is a code.
    c.record("fp8 dummy codes (device = host)", 0.0, cpu, gpu);
}

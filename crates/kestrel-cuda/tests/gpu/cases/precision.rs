//! The reference arithmetic (`Precision::F32`): prefill-sized products, MoE
//! blocks and attention over an f32 KV cache must match the CPU backend to
//! f32 rounding, not just bf16 tolerance.

use kestrel_core::{Backend, DType, HostTensor, MoeSpec, Result};
use kestrel_cuda::Precision;

use super::attention::{AttnShape, attention_steps, check_attention_steps};
use super::matmul::run_matmul;
use super::moe::{random_weights, run_block};
use super::{Ctx, Outputs, out};

/// f32 arithmetic in a different order, through chained products, softmax
/// and RoPE.
const TOL_REFERENCE: f64 = 1e-4;

pub fn precision_f32(c: &mut Ctx) {
    c.gpu.set_precision(Precision::F32);
    matmul_rows(c);
    moe_tokens(c);
    let shapes: [AttnShape; 2] = [
        ("Hq8 Hkv2 D128", 8, 2, 128, 128, 1e6, false),
        ("Hq4 Hkv1 D256 rot64 gate", 4, 1, 256, 64, 1e7, true),
    ];
    for shape in shapes {
        let steps = attention_steps(16, &[7, 2, 9, 4, 11]);
        let label = format!("f32 attention {}", shape.0);
        check_attention_steps(c, &label, &shape, 12, &steps, TOL_REFERENCE);
    }
    c.gpu.set_precision(Precision::Bf16);
}

/// More rows than one `gemv` launch takes, including a partial last group,
/// with bf16 weights and with f16 ones (kept exact under this precision).
fn matmul_rows(c: &mut Ctx) {
    for (rows, k, n, dtype) in [
        (37, 512, 1000, DType::BF16),
        (37, 512, 1000, DType::F16),
        (3, 1024, 300, DType::F16),
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
            let mut outs = run_matmul(b, rows, k, x, w)?;
            // The rows of w through the embedding kernel: exact.
            let ids: Vec<u32> = (0..rows as u32).collect();
            outs.push(out(b, "embedding", &b.embedding(&b.upload(w)?, &ids)));
            Ok(outs)
        }
        let (cpu, gpu) = (run(&c.cpu, rows, k, &x, &w), run(&c.gpu, rows, k, &x, &w));
        c.record(
            &format!("f32 matmul [{rows}x{k}]x[{n}x{k}]^T {dtype:?}"),
            TOL_REFERENCE,
            cpu,
            gpu,
        );
    }
}

/// Prefill-sized MoE blocks, with and without a gated shared expert.
fn moe_tokens(c: &mut Ctx) {
    for (label, e, k, inter, h, t, shared, gated) in [
        (
            "E16 k4 shared+gate T23",
            16,
            4,
            96,
            256,
            23,
            Some(128),
            true,
        ),
        ("E32 k8 T70", 32, 8, 64, 512, 70, None, false),
    ] {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: true,
            shared_intermediate: shared,
        };
        let x = c.data.randn(t * h, 1.0);
        let w = random_weights(c, &spec, h, gated);
        let (cpu, gpu) = (
            run_block(&c.cpu, &spec, t, h, &x, &w),
            run_block(&c.gpu, &spec, t, h, &x, &w),
        );
        c.record(&format!("f32 moe {label}"), TOL_REFERENCE, cpu, gpu);
    }
}

//! Norms computed inside the operation that reads them (`norm_matmul`,
//! `norm_moe`): on CUDA, decode-sized rows take `gemv_norm`, where every
//! block normalises the rows itself and the first also writes the updated
//! residual (and, for the MoE block, the rows its experts read).

use kestrel_core::{Backend, HostTensor, MoeSpec, PreNorm, Result};

use super::moe::{random_weights, upload};
use super::{Ctx, Outputs, TOL_BF16_MATMUL, TOL_F32, TOL_MOE, out};

/// Each case chains two fused products on one residual stream, so the second
/// reads the residual the first one's kernel wrote: Qwen3.6's GDN input
/// projection at 1 row (more row groups than resident blocks: each block
/// takes several), 2 rows with K split over warps, a K whose rows the norm
/// pass covers only partly (1,000), a K too long for the norm weights to
/// stay in registers (4,096), the first layer's norm without a delta, and
/// row counts the fused kernels do not take (3 and 8: the norm kernels run
/// first).
pub fn norm_matmul(c: &mut Ctx) {
    for (rows, k, n, with_delta) in [
        (1, 2048, 12352, true),
        (2, 2048, 1001, true),
        (1, 1000, 300, true),
        (1, 2048, 9216, false),
        (2, 4096, 2048, true),
        (3, 1000, 300, true),
        (8, 2048, 1001, true),
    ] {
        let r = c.data.randn(rows * k, 3.0);
        let d = c.data.randn(rows * k, 3.0);
        let d2 = c.data.randn(rows * k, 3.0);
        let norm = c.data.vector(k, 1.0, 0.2);
        let w = c.data.mat_bf16(&[n, k], 0.05);
        let w2 = c.data.mat_bf16(&[n, k], 0.05);
        #[allow(clippy::too_many_arguments)]
        fn run<B: Backend>(
            b: &B,
            (rows, k): (usize, usize),
            r: &[f32],
            d: Option<&[f32]>,
            d2: &[f32],
            norm: &HostTensor,
            w: &HostTensor,
            w2: &HostTensor,
        ) -> Result<Outputs> {
            let (norm, w, w2) = (b.upload(norm)?, b.upload(w)?, b.upload(w2)?);
            let mut residual = b.from_host(rows, k, r);
            let delta = d.map(|d| b.from_host(rows, k, d));
            let y = b.norm_matmul(
                PreNorm {
                    residual: &mut residual,
                    delta: delta.as_ref(),
                    weight: &norm,
                    eps: 1e-6,
                },
                &w,
            );
            let after_first = b.to_host(&residual);
            let delta2 = b.from_host(rows, k, d2);
            let y2 = b.norm_matmul(
                PreNorm {
                    residual: &mut residual,
                    delta: Some(&delta2),
                    weight: &norm,
                    eps: 1e-6,
                },
                &w2,
            );
            Ok(vec![
                out(b, "product", &y),
                ("residual".into(), after_first),
                out(b, "second product", &y2),
                out(b, "second residual", &residual),
            ])
        }
        let d = with_delta.then_some(&d[..]);
        let cpu = run(&c.cpu, (rows, k), &r, d, &d2, &norm, &w, &w2);
        let gpu = run(&c.gpu, (rows, k), &r, d, &d2, &norm, &w, &w2);
        let tol = TOL_BF16_MATMUL.max(TOL_F32);
        let delta = if with_delta { "" } else { " (no delta)" };
        c.record(
            &format!("norm_matmul [{rows}x{k}]x[{n}x{k}]^T{delta}"),
            tol,
            cpu,
            gpu,
        );
    }
}

/// A decode-sized MoE block after a residual add + norm (the router's
/// product normalises; the experts read its rows), Qwen3.6-like with a gated
/// shared expert and Qwen3-30B-like without one, at 1 and 2 tokens, then 8
/// and 12 (40) tokens (the norm kernels first, then the decode or prefill
/// path; from 9 tokens `moe_norm_split`), with and without a delta.
pub fn norm_moe(c: &mut Ctx) {
    for (label, e, k, inter, h, shared, gated, tokens) in [
        (
            "3.6-like E64 k8 shared+gate",
            64,
            8,
            128,
            512,
            Some(128),
            true,
            &[1usize, 2, 8, 12][..],
        ),
        ("30B-like E32 k8", 32, 8, 192, 512, None, false, &[1, 8, 40]),
    ] {
        let spec = MoeSpec {
            num_experts: e,
            top_k: k,
            intermediate: inter,
            norm_topk_prob: true,
            shared_intermediate: shared,
        };
        let w = random_weights(c, &spec, h, gated);
        let norm = c.data.vector(h, 1.0, 0.2);
        // The prefill sizes also without a delta (the first block's norm).
        let runs = tokens
            .iter()
            .map(|&t| (t, true))
            .chain(tokens.iter().filter(|&&t| t > 8).map(|&t| (t, false)));
        for (t, with_delta) in runs {
            let r = c.data.randn(t * h, 1.0);
            let d = c.data.randn(t * h, 1.0);
            let d = with_delta.then_some(&d[..]);
            fn run<B: Backend>(
                b: &B,
                spec: &MoeSpec,
                (t, h): (usize, usize),
                (r, d): (&[f32], Option<&[f32]>),
                norm: &HostTensor,
                w: &kestrel_core::MoeWeights<HostTensor>,
            ) -> Result<Outputs> {
                let (norm, w) = (b.upload(norm)?, upload(b, w)?);
                let mut residual = b.from_host(t, h, r);
                let delta = d.map(|d| b.from_host(t, h, d));
                let y = b.norm_moe(
                    PreNorm {
                        residual: &mut residual,
                        delta: delta.as_ref(),
                        weight: &norm,
                        eps: 1e-6,
                    },
                    &w,
                    spec,
                );
                Ok(vec![out(b, "out", &y), out(b, "residual", &residual)])
            }
            let cpu = run(&c.cpu, &spec, (t, h), (&r, d), &norm, &w);
            let gpu = run(&c.gpu, &spec, (t, h), (&r, d), &norm, &w);
            let delta = if with_delta { "" } else { " no delta" };
            c.record(
                &format!("norm_moe {label} H{h} T{t}{delta}"),
                TOL_MOE,
                cpu,
                gpu,
            );
        }
    }
}

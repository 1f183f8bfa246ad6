//! Matrix products of several shapes and dtypes, and decode-sized ones (the
//! `gemv` kernels).

use kestrel_core::{Backend, DType, HostTensor, Result};

use super::{Ctx, Outputs, TOL_BF16_MATMUL, out, repeatable};

pub fn matmul(c: &mut Ctx) {
    for (rows, k, n, dtype) in [
        (13, 1024, 768, DType::BF16),
        (1, 2048, 4096, DType::F16),
        (64, 512, 1000, DType::F32),
    ] {
        let x = c.data.randn(rows * k, 1.0);
        let w = c.data.mat_other(&[n, k], 0.05, dtype);
        let (cpu, gpu) = (
            run_matmul(&c.cpu, rows, k, &x, &w),
            run_matmul(&c.gpu, rows, k, &x, &w),
        );
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

/// `x [rows, k] @ w^T` on backend `b`.
pub(super) fn run_matmul<B: Backend>(
    b: &B,
    rows: usize,
    k: usize,
    x: &[f32],
    w: &HostTensor,
) -> Result<Outputs> {
    let w = b.upload(w)?;
    Ok(vec![out(b, "out", &b.matmul(&b.from_host(rows, k, x), &w))])
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

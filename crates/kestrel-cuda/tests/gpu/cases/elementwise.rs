//! Embedding lookup, elementwise operations and norms.

use kestrel_core::{Backend, HostTensor, Result};

use super::{Ctx, Outputs, TOL_BF16_MATMUL, TOL_F32, out};

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

/// Rows held in registers by the fused kernel (2,048; 1,000 with a partial
/// last slice) and rows too long for that (5,000), one row and many.
pub fn norms(c: &mut Ctx) {
    for (rows, cols) in [(33, 2048), (1, 2048), (5, 1000), (3, 5000)] {
        let eps = 1e-6;
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
        c.record(
            &format!("rms_norm/add_rms_norm [{rows}x{cols}]"),
            TOL_F32,
            cpu,
            gpu,
        );
    }
    norm_into_product(c);
}

/// A prefill-sized residual-add + RMSNorm feeding a matrix product: on CUDA
/// the norm also writes the bf16 copy that the cuBLAS product reads instead
/// of converting. The product must equal, bit for bit, the same product of
/// the norm's f32 output uploaded afresh (converted as before).
fn norm_into_product(c: &mut Ctx) {
    let (rows, cols, n) = (33, 2048, 300);
    let x = c.data.randn(rows * cols, 3.0);
    let r = c.data.randn(rows * cols, 3.0);
    let w = c.data.vector(cols, 1.0, 0.2);
    let m = c.data.mat_bf16(&[n, cols], 0.05);
    fn run<B: Backend>(
        b: &B,
        (rows, cols): (usize, usize),
        x: &[f32],
        r: &[f32],
        w: &HostTensor,
        m: &HostTensor,
    ) -> Result<Outputs> {
        let (w, m) = (b.upload(w)?, b.upload(m)?);
        let mut res = b.from_host(rows, cols, r);
        let normed = b.add_rms_norm(&mut res, &b.from_host(rows, cols, x), &w, 1e-6);
        let y = b.matmul(&normed, &m);
        let again = b.matmul(&b.from_host(rows, cols, &b.to_host(&normed)), &m);
        if !b
            .to_host(&y)
            .iter()
            .map(|v| v.to_bits())
            .eq(b.to_host(&again).iter().map(|v| v.to_bits()))
        {
            return Err(kestrel_core::BackendError::Invalid(
                "the product of the norm's own bf16 copy differs from converting its output".into(),
            ));
        }
        Ok(vec![out(b, "product", &y)])
    }
    let cpu = run(&c.cpu, (rows, cols), &x, &r, &w, &m);
    let gpu = run(&c.gpu, (rows, cols), &x, &r, &w, &m);
    c.record(
        &format!("add_rms_norm -> matmul [{rows}x{cols}]x[{n}x{cols}]^T"),
        TOL_BF16_MATMUL,
        cpu,
        gpu,
    );
}

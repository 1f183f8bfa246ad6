//! Matrix products: bf16 (or block-FP8) weights, f32 accumulation and output.
//!
//! Up to [`GEMV_MAX_ROWS`](kernels::GEMV_MAX_ROWS) rows (decode steps) go through the `gemv` kernels
//! (`gemv.rs`): the product is bound by reading the weights once, the
//! activations stay f32, and the launch depends only on the shapes, so it can
//! be recorded in a CUDA graph. Larger batches go through cuBLAS with
//! activations rounded to bf16 (`gemm.rs`), except under `Precision::F32`,
//! where they run through `gemv` 8 rows at a time (the weights are read once
//! per 8 rows: slow, but no rounding); rows whose length is not a multiple
//! of 8 still go through cuBLAS in bf16. Block-FP8 weights go to the FP8
//! `gemv` kernels, and to cuBLAS through a bf16 copy (`ops::fp8`). The rows of a decode-shaped step
//! ([`Cx::decode_shaped`](crate::context::Cx::decode_shaped): a verify step
//! of up to 8 sequences) take `gemv` too, in passes, so that each computes
//! what its sequence's plain decode row would. The bf16 activations come from the
//! producing kernel when it wrote them ([`CudaTensor::bf16`]: the norms do in
//! prefill), else from a conversion pass.

pub mod gemm;
pub mod gemv;
pub mod kernels;

use kestrel_core::PreNorm;

use crate::context::Cx;
use crate::device::ptr;
use crate::ops::fp8::bf16_matrix;
use crate::ops::norm::pre_norm;
use crate::tensor::{CudaTensor, CudaWeight};
use gemm::{gemm_bf16, takes_bf16, to_bf16};
use gemv::{NORM_MAX_N, NormPart, Out, gemv_norm_parts, gemv_passes, norm_fits};

/// `pre`'s normalised rows times `w^T`: in one `gemv_norm` launch (one per
/// part of a stacked weight) where [`norm_fits`], else the norm and then
/// [`matmul`].
pub fn norm_matmul(
    cx: &Cx,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    w: &CudaWeight,
) -> CudaTensor {
    let (rows, k) = (pre.residual.rows, pre.residual.cols);
    let n = w.dim0();
    let s = &cx.gpu.stream;
    let parts: Vec<NormPart> = w
        .parts()
        .iter()
        .map(|p| NormPart {
            w: p.matrix("norm_matmul", s),
            n: p.dim0(),
            w_last: 0,
        })
        .collect();
    let fused = w.numel() == n * k
        && n <= NORM_MAX_N
        && parts.iter().all(|p| norm_fits(cx, rows, k, p.w.format));
    if !fused {
        return matmul(cx, &pre_norm(cx, pre), w);
    }
    let (y, _) = gemv_norm_parts(cx, pre, &parts, false);
    CudaTensor {
        bf16: None,
        rows,
        cols: n,
        buf: y,
    }
}

pub fn matmul(cx: &Cx, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
    let gpu = cx.gpu;
    let n = w.dim0();
    let k = w.numel() / n.max(1);
    assert_eq!(
        k, x.cols,
        "matmul: weight {:?} does not take rows of {}",
        w.shape, x.cols
    );
    if !takes_bf16(cx, x.rows, k) {
        let out = gpu.alloc::<f32>(x.rows * n);
        let s = &gpu.stream;
        // A stacked weight's parts fill their columns of each row in turn.
        let mut column = 0;
        for part in w.parts() {
            let rows = part.dim0();
            let y = Out {
                ptr: ptr(&out, s) + (column * 4) as u64,
                ld: n,
            };
            let m = part.matrix("matmul", s);
            gemv_passes(cx, y, ptr(&x.buf, s), x.rows, k, m, rows, 0);
            column += rows;
        }
        return CudaTensor {
            bf16: None,
            rows: x.rows,
            cols: n,
            buf: out,
        };
    }
    // The producer's bf16 copy when it wrote one, else a conversion pass.
    let converted;
    let xb = match &x.bf16 {
        Some(b) => b,
        None => {
            converted = to_bf16(cx, x);
            &converted
        }
    };
    let out = gpu.alloc::<f32>(x.rows * n);
    let s = &gpu.stream;
    let wb = bf16_matrix(cx, w, "matmul");
    gemm_bf16(cx, ptr(xb, s), x.rows, k, wb.ptr, n, ptr(&out, s));
    CudaTensor {
        bf16: None,
        rows: x.rows,
        cols: n,
        buf: out,
    }
}

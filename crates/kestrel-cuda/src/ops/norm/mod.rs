//! RMSNorm and residual-add + RMSNorm, one block per row.

use kestrel_core::PreNorm;

use crate::context::Cx;
use crate::device::ptr;
use crate::launch::Arg;
use crate::ops::linear::gemm::bf16_copy_for;
use crate::ops::linear::kernels::GEMV_MAX_ROWS;
use crate::tensor::{CudaTensor, CudaWeight};

pub mod kernels;

const THREADS: u32 = 256;

fn check_weight(x: &CudaTensor, w: &CudaWeight) {
    assert_eq!(
        w.numel(),
        x.cols,
        "norm weight has {} values for rows of {}",
        w.numel(),
        x.cols
    );
}

pub fn rms_norm(cx: &Cx, x: &CudaTensor, w: &CudaWeight, eps: f32) -> CudaTensor {
    check_weight(x, w);
    let gpu = cx.gpu;
    let out = gpu.alloc::<f32>(x.rows * x.cols);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.norm.rms_norm,
        (x.rows as u32, 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(w.f32("rms_norm"), s)),
            Arg::I32(x.cols as i32),
            Arg::F32(eps),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: x.rows,
        cols: x.cols,
        buf: out,
    }
}

/// Threads per row when there are more rows than a decode step has.
const PREFILL_THREADS: u32 = 128;

pub fn add_rms_norm(
    cx: &Cx,
    residual: &mut CudaTensor,
    x: &CudaTensor,
    w: &CudaWeight,
    eps: f32,
) -> CudaTensor {
    assert_eq!(
        (residual.rows, residual.cols),
        (x.rows, x.cols),
        "add_rms_norm shape mismatch"
    );
    check_weight(x, w);
    let gpu = cx.gpu;
    let out = gpu.alloc::<f32>(x.rows * x.cols);
    // Prefill: also the bf16 copy the next product (cuBLAS) reads.
    let out_bf16 = bf16_copy_for(cx, x.rows, x.cols);
    // The residual changes in place: a bf16 copy of it would be stale.
    residual.bf16 = None;
    let s = &gpu.stream;
    // Prefill rows (many per launch) in blocks of 128 threads, which still
    // keep rows of up to 2,048 values in registers (`ADD_NORM_REGS`, norm.cu):
    // more, smaller blocks per SM overlap one row's reduction with other
    // rows' loads. Decode's few rows keep 256 threads, for the shortest chain.
    // A decode-shaped step's rows keep decode's 256 (the same sums).
    let threads = if x.rows > GEMV_MAX_ROWS
        && x.cols <= 16 * PREFILL_THREADS as usize
        && !cx.plan.batch_invariant
        && !cx.decode_shaped()
    {
        PREFILL_THREADS
    } else {
        THREADS
    };
    gpu.launch(
        &cx.k.norm.add_rms_norm,
        (x.rows as u32, 1, 1),
        threads,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(out_bf16.as_ref().map_or(0, |b| ptr(b, s))),
            Arg::Ptr(ptr(&residual.buf, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(w.f32("add_rms_norm"), s)),
            Arg::I32(x.cols as i32),
            Arg::F32(eps),
        ],
    );
    CudaTensor {
        bf16: out_bf16,
        rows: x.rows,
        cols: x.cols,
        buf: out,
    }
}

/// The normalised rows `pre` stands for, by the norm kernels alone.
pub fn pre_norm(cx: &Cx, pre: PreNorm<'_, CudaTensor, CudaWeight>) -> CudaTensor {
    match pre.delta {
        Some(d) => add_rms_norm(cx, pre.residual, d, pre.weight, pre.eps),
        None => rms_norm(cx, pre.residual, pre.weight, pre.eps),
    }
}

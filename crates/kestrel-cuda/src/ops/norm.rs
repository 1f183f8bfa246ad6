//! RMSNorm and residual-add + RMSNorm, one block per row.

use crate::device::{Arg, Gpu, ptr};
use crate::tensor::{CudaTensor, CudaWeight};

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

pub fn rms_norm(gpu: &Gpu, x: &CudaTensor, w: &CudaWeight, eps: f32) -> CudaTensor {
    check_weight(x, w);
    let out = gpu.alloc::<f32>(x.rows * x.cols);
    let s = &gpu.stream;
    gpu.launch(
        &gpu.k.rms_norm,
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
        rows: x.rows,
        cols: x.cols,
        buf: out,
    }
}

pub fn add_rms_norm(
    gpu: &Gpu,
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
    let out = gpu.alloc::<f32>(x.rows * x.cols);
    let s = &gpu.stream;
    gpu.launch(
        &gpu.k.add_rms_norm,
        (x.rows as u32, 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&residual.buf, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::Ptr(ptr(w.f32("add_rms_norm"), s)),
            Arg::I32(x.cols as i32),
            Arg::F32(eps),
        ],
    );
    CudaTensor {
        rows: x.rows,
        cols: x.cols,
        buf: out,
    }
}

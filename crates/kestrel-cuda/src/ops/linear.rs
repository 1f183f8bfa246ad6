//! Matrix products: bf16 weights, f32 accumulation and output.
//!
//! Up to [`GEMV_MAX_ROWS`] rows (decode steps) go through the `gemv` kernels:
//! the product is bound by reading the weights once, the activations stay f32,
//! and the launch depends only on the shapes, so it can be recorded in a CUDA
//! graph. Larger batches go through cuBLAS with activations rounded to bf16,
//! except under `Precision::F32`, where they run through `gemv` 8 rows at a
//! time (the weights are read once per 8 rows: slow, but no rounding); rows
//! whose length is not a multiple of 8 still go through cuBLAS in bf16.
//! The bf16 activations come from the producing kernel when it wrote them
//! ([`CudaTensor::bf16`]: the norms do in prefill), else from a conversion pass.
//! `KESTREL_DENSE_GEMM=lt` sends the cuBLAS products through cuBLASLt instead
//! (`blas_lt.rs`; measured level with `cublasGemmEx` on an H200).

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::sys::CUfunction_attribute;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule, CudaSlice};
use kestrel_core::{BackendError, PreNorm, Result};

use crate::device::{Arg, Gpu, blocks, check, ptr};
use crate::precision::Precision;
use crate::tensor::{CudaTensor, CudaWeight, Half};

/// f32 activations rounded to bf16 (the cuBLAS input type).
pub fn to_bf16(gpu: &Gpu, x: &CudaTensor) -> CudaSlice<u16> {
    let n = x.rows * x.cols;
    let out = gpu.alloc::<u16>(n);
    let s = &gpu.stream;
    gpu.launch(
        &gpu.k.f32_to_bf16,
        (blocks(n.div_ceil(8), 256), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&x.buf, s)),
            Arg::U64(n as u64),
        ],
    );
    out
}

/// `out[rows, n] = x[rows, k] @ w[n, k]^T` with bf16 `x` and `w` at raw device
/// addresses, f32 `out`. Row-major `out^T = w x^T` is column-major `out`.
pub fn gemm_bf16(gpu: &Gpu, x: u64, rows: usize, k: usize, w: u64, n: usize, out: u64) {
    if rows == 0 || n == 0 {
        return;
    }
    check(gpu.ctx.bind_to_thread(), "bind context");
    if let Some(blas_lt) = &gpu.blas_lt {
        if let Err(e) = blas_lt.gemm(&gpu.stream, x, rows, k, w, n, out) {
            panic!("{e}");
        }
        return;
    }
    let (alpha, beta) = (1.0f32, 0.0f32);
    check(
        unsafe {
            gemm_ex(
                *gpu.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                rows as i32,
                k as i32,
                &alpha as *const f32 as *const _,
                w as *const _,
                cudaDataType::CUDA_R_16BF,
                k as i32,
                x as *const _,
                cudaDataType::CUDA_R_16BF,
                k as i32,
                &beta as *const f32 as *const _,
                out as *mut _,
                cudaDataType::CUDA_R_32F,
                n as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        },
        "cublasGemmEx",
    );
}

/// Most activation rows the `gemv` kernels take (one kernel per count).
pub const GEMV_MAX_ROWS: usize = 8;

/// Weight rows a `gemv` launch aims to have in flight, in warps x rows per
/// warp: about 16 warps of 4 rows per SM on a 132-SM H200 cover HBM latency.
/// Below it, K is split over more warps.
const GEMV_TARGET_ROWS: usize = 8192;

/// Whether `gemv` takes `rows` rows of length `k`: its loads are 16 bytes
/// (8 bf16) wide, so K must be a multiple of 8.
pub fn gemv_fits(rows: usize, k: usize) -> bool {
    (1..=GEMV_MAX_ROWS).contains(&rows) && k > 0 && k.is_multiple_of(8)
}

/// Weight rows per warp in `gemv_m{rows}` (must match `KESTREL_GEMV` in gemv.cu).
fn gemv_rows_per_warp(rows: usize) -> usize {
    match rows {
        1 => 2,
        2..=4 => 4,
        _ => 8,
    }
}

/// Warps that share one row group's K (1, 2, 4 or 8): split while the launch
/// has too few rows in flight (at most 2048 warps) and every lane still gets
/// a 16-byte chunk of each row. Measured on an H200 over K 512..4096 and
/// N 512..248320, this picks the best split or one within a few percent.
fn gemv_split(rows: usize, k: usize, n: usize) -> usize {
    let per_warp = gemv_rows_per_warp(rows);
    let target = (GEMV_TARGET_ROWS / per_warp).min(2048);
    let groups = n.div_ceil(per_warp);
    let mut split = 1;
    while split < 8 && groups * split < target && k / (8 * 32 * 2 * split) >= 1 {
        split *= 2;
    }
    split
}

/// `y[rows, n] = x[rows, k] . w[n, k]^T` with f32 `x` and `y`, 16-bit `w` of
/// format `half`, all raw device addresses (16-byte aligned). `w_last` (0 for
/// none, else of the same format) replaces row `n - 1` of `w`, which lets the
/// MoE router append the shared-expert gate.
/// Only kernel launches: safe to record in a CUDA graph.
#[allow(clippy::too_many_arguments)]
pub fn gemv(
    gpu: &Gpu,
    y: u64,
    x: u64,
    rows: usize,
    k: usize,
    (w, half): (u64, Half),
    n: usize,
    w_last: u64,
) {
    assert!(gemv_fits(rows, k), "gemv: {rows} rows of {k} not supported");
    assert!(
        (x | w | w_last).is_multiple_of(16),
        "gemv: operands must be 16-byte aligned"
    );
    if n == 0 {
        return;
    }
    let split = gemv_split(rows, k, n);
    let rows_per_block = (8 / split) * gemv_rows_per_warp(rows);
    let kernels = match half {
        Half::Bf16 => &gpu.k.gemv,
        Half::F16 => &gpu.k.gemv_f16,
    };
    gpu.launch(
        &kernels[rows - 1],
        (blocks(n, rows_per_block), 1, 1),
        256,
        0,
        &[
            Arg::Ptr(y),
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::Ptr(w_last),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(split as i32),
        ],
    );
}

/// Most shared memory a `gemv_norm` block holds its normalised rows in
/// (rows x k f32 values: 2 rows of 8,192); the kernels are configured for it
/// at load time. Within the opt-in limit of every target GPU (99 KB on a GB10).
pub const NORM_SMEM_MAX: usize = 64 << 10;

/// `gemv_norm_m1` .. `gemv_norm_m{NORM_MAX_ROWS}` from the gemv module,
/// allowed [`NORM_SMEM_MAX`] of dynamic shared memory.
pub(crate) fn norm_kernels(m: &Arc<CudaModule>) -> Result<[CudaFunction; NORM_MAX_ROWS]> {
    let load = |rows: usize| -> Result<CudaFunction> {
        let name = format!("gemv_norm_m{rows}");
        let f = m
            .load_function(&name)
            .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))?;
        f.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            NORM_SMEM_MAX as i32,
        )
        .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
        Ok(f)
    };
    Ok([load(1)?, load(2)?])
}

/// Whether `gemv_norm` forms `rows` normalised rows of length `k` itself for
/// a product with weights of format `half` (its kernels read bf16), unless
/// the fusion is switched off ([`Gpu::norm_fusion`]).
pub fn norm_fits(gpu: &Gpu, rows: usize, k: usize, half: Half) -> bool {
    gpu.norm_fusion
        && half == Half::Bf16
        && gemv_fits(rows, k)
        && rows <= NORM_MAX_ROWS
        && rows * k * 4 <= NORM_SMEM_MAX
}

/// Most rows `gemv_norm` takes. Every block normalises all rows before its
/// first product, and from 4 rows on that cost more than the norm kernel's
/// launch it saves (H200, replayed decode steps of Qwen3.6 and Qwen3-30B:
/// batch 1 -3 %, batch 2 about even, batch 4 +2 %, batch 8 +6 %).
pub const NORM_MAX_ROWS: usize = 2;

/// Most weight rows `norm_matmul` runs through `gemv_norm`. Its resident
/// blocks loop over row groups, which streamed a 248,320-row lm_head slower
/// than `gemv`'s block per group (H200: 241 us against 220 us plus 5 us for
/// the norm kernel). Only that size was measured; the cap sits well above
/// every other product fused this way (the largest, a GDN in_proj, has
/// 12,352 rows).
const NORM_MAX_N: usize = 65_536;

/// `y[rows, n] = x . w^T` where `x = pre`'s normalised rows, which every
/// block of the kernel computes itself (`gemv_norm`, gemv.cu); the kernel's
/// first block writes the updated residual, which replaces `pre.residual`,
/// and, when `keep_x`, `x` itself, returned for later kernels. The shapes
/// must pass [`norm_fits`]. Only kernel launches: safe to record in a graph.
pub fn gemv_norm(
    gpu: &Gpu,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    (w, half): (u64, Half),
    n: usize,
    w_last: u64,
    keep_x: bool,
) -> (CudaSlice<f32>, Option<CudaTensor>) {
    let (rows, k) = (pre.residual.rows, pre.residual.cols);
    assert!(
        norm_fits(gpu, rows, k, half),
        "gemv_norm: {rows} rows of {k} not supported"
    );
    if let Some(d) = pre.delta {
        assert_eq!(
            (d.rows, d.cols),
            (rows, k),
            "gemv_norm: residual and delta differ"
        );
    }
    assert_eq!(pre.weight.numel(), k, "gemv_norm: norm weight length");
    assert!(
        (w | w_last).is_multiple_of(16),
        "gemv_norm: weights must be 16-byte aligned"
    );
    let s = &gpu.stream;
    let y = gpu.alloc::<f32>(rows * n);
    let x = keep_x.then(|| CudaTensor {
        bf16: None,
        rows,
        cols: k,
        buf: gpu.alloc::<f32>(rows * k),
    });
    // The other blocks still read the old residual while the first writes
    // the new one, so it goes to a fresh buffer. The old one is freed after
    // the launch (stream-ordered), never before.
    let residual_out = pre.delta.map(|_| gpu.alloc::<f32>(rows * k));
    let split = gemv_split(rows, k, n);
    let rows_per_block = (8 / split) * gemv_rows_per_warp(rows);
    // Each block normalises the rows once and then takes row groups in turn:
    // as many blocks as fit on the device at once.
    let f = &gpu.k.gemv_norm[rows - 1];
    let smem = rows * k * 4;
    let resident = f
        .occupancy_max_active_blocks_per_multiprocessor(256, smem, None)
        .unwrap_or(1)
        .max(1) as usize
        * gpu.sm_count();
    gpu.launch(
        f,
        (blocks(n, rows_per_block).min(resident as u32), 1, 1),
        256,
        smem as u32,
        &[
            Arg::Ptr(ptr(&y, s)),
            Arg::Ptr(x.as_ref().map_or(0, |x| ptr(&x.buf, s))),
            Arg::Ptr(residual_out.as_ref().map_or(0, |r| ptr(r, s))),
            Arg::Ptr(ptr(&pre.residual.buf, s)),
            Arg::Ptr(pre.delta.map_or(0, |d| ptr(&d.buf, s))),
            Arg::Ptr(ptr(pre.weight.f32("gemv_norm"), s)),
            Arg::F32(pre.eps),
            Arg::Ptr(w),
            Arg::Ptr(w_last),
            Arg::I32(n as i32),
            Arg::I32(k as i32),
            Arg::I32(split as i32),
        ],
    );
    if let Some(r) = residual_out {
        pre.residual.buf = r;
        pre.residual.bf16 = None;
    }
    (y, x)
}

/// `pre`'s normalised rows times `w^T`: in one `gemv_norm` launch where
/// [`norm_fits`], else the norm and then [`matmul`].
pub fn norm_matmul(
    gpu: &Gpu,
    pre: PreNorm<'_, CudaTensor, CudaWeight>,
    w: &CudaWeight,
) -> CudaTensor {
    let (rows, k) = (pre.residual.rows, pre.residual.cols);
    let n = w.dim0();
    let (wb, half) = w.matrix("norm_matmul");
    if w.numel() != n * k || !norm_fits(gpu, rows, k, half) || n > NORM_MAX_N {
        return matmul(gpu, &crate::ops::norm::pre_norm(gpu, pre), w);
    }
    let (y, _) = gemv_norm(gpu, pre, (ptr(wb, &gpu.stream), half), n, 0, false);
    CudaTensor {
        bf16: None,
        rows,
        cols: n,
        buf: y,
    }
}

/// `gemv` over any number of rows, [`GEMV_MAX_ROWS`] at a time.
#[allow(clippy::too_many_arguments)]
pub fn gemv_chunked(gpu: &Gpu, y: u64, x: u64, rows: usize, k: usize, w: (u64, Half), n: usize) {
    for first in (0..rows).step_by(GEMV_MAX_ROWS) {
        let r = GEMV_MAX_ROWS.min(rows - first);
        let (xo, yo) = ((first * k * 4) as u64, (first * n * 4) as u64);
        gemv(gpu, y + yo, x + xo, r, k, w, n, 0);
    }
}

/// Whether [`matmul`] sends `rows` rows of length `k` through cuBLAS, in
/// bf16: then a kernel producing such rows should also write their bf16
/// copy ([`CudaTensor::bf16`]).
pub fn takes_bf16(gpu: &Gpu, rows: usize, k: usize) -> bool {
    let f32_rows = gpu.precision == Precision::F32 && gemv_fits(1, k);
    !(gemv_fits(rows, k) || (f32_rows && rows > 0))
}

/// A bf16 buffer for the copy of `rows` x `k` values a producing kernel
/// writes when [`takes_bf16`], else `None`.
pub fn bf16_copy_for(gpu: &Gpu, rows: usize, k: usize) -> Option<CudaSlice<u16>> {
    takes_bf16(gpu, rows, k).then(|| gpu.alloc::<u16>(rows * k))
}

pub fn matmul(gpu: &Gpu, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
    let n = w.dim0();
    let k = w.numel() / n.max(1);
    assert_eq!(
        k, x.cols,
        "matmul: weight {:?} does not take rows of {}",
        w.shape, x.cols
    );
    if !takes_bf16(gpu, x.rows, k) {
        let out = gpu.alloc::<f32>(x.rows * n);
        let s = &gpu.stream;
        let (wb, half) = w.matrix("matmul");
        gemv_chunked(
            gpu,
            ptr(&out, s),
            ptr(&x.buf, s),
            x.rows,
            k,
            (ptr(wb, s), half),
            n,
        );
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
            converted = to_bf16(gpu, x);
            &converted
        }
    };
    let out = gpu.alloc::<f32>(x.rows * n);
    let s = &gpu.stream;
    gemm_bf16(
        gpu,
        ptr(xb, s),
        x.rows,
        k,
        ptr(w.bf16("matmul"), s),
        n,
        ptr(&out, s),
    );
    CudaTensor {
        bf16: None,
        rows: x.rows,
        cols: n,
        buf: out,
    }
}

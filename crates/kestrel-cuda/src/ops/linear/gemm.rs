//! Products of more than 8 rows: activations rounded to bf16, cuBLAS
//! (`cublasGemmEx`, or cuBLASLt with one algorithm per weight shape, as the
//! plan's `dense_gemm` says), f32 accumulation and output.

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::CudaSlice;

use crate::context::Cx;
use crate::device::{blocks, check, ptr};
use crate::launch::Arg;
use crate::ops::linear::gemv::gemv_fits;
use crate::plan::DenseGemm;
use crate::precision::Precision;
use crate::tensor::CudaTensor;

/// f32 activations rounded to bf16 (the cuBLAS input type).
pub fn to_bf16(cx: &Cx, x: &CudaTensor) -> CudaSlice<u16> {
    let gpu = cx.gpu;
    let n = x.rows * x.cols;
    let out = gpu.alloc::<u16>(n);
    let s = &gpu.stream;
    gpu.launch(
        &cx.k.elementwise.f32_to_bf16,
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
pub fn gemm_bf16(cx: &Cx, x: u64, rows: usize, k: usize, w: u64, n: usize, out: u64) {
    if rows == 0 || n == 0 {
        return;
    }
    let gpu = cx.gpu;
    check(gpu.ctx.bind_to_thread(), "bind context");
    if cx.plan.dense_gemm != DenseGemm::CublasGemmEx {
        let lt = cx
            .blas_lt
            .expect("cuBLASLt is set up when the plan names it");
        if let Err(e) = lt.gemm(&gpu.stream, x, rows, k, w, n, out) {
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

/// Whether [`matmul`](super::matmul) sends `rows` rows of length `k` through cuBLAS, in
/// bf16: then a kernel producing such rows should also write their bf16
/// copy ([`CudaTensor::bf16`]).
pub fn takes_bf16(cx: &Cx, rows: usize, k: usize) -> bool {
    let f32_rows =
        (cx.plan.precision == Precision::F32 || cx.plan.batch_invariant) && gemv_fits(1, k);
    let decode_rows = cx.decode_shaped() && gemv_fits(1, k);
    let few_rows = gemv_fits(rows, k) && !cx.prompt_step();
    !(few_rows || (f32_rows && rows > 0) || decode_rows)
}

/// A bf16 buffer for the copy of `rows` x `k` values a producing kernel
/// writes when [`takes_bf16`], else `None`.
pub fn bf16_copy_for(cx: &Cx, rows: usize, k: usize) -> Option<CudaSlice<u16>> {
    takes_bf16(cx, rows, k).then(|| cx.gpu.alloc::<u16>(rows * k))
}

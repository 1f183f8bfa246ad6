//! Matrix products through cuBLAS: bf16 operands, f32 accumulation and output.

use cudarc::cublas::result::gemm_ex;
use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::CudaSlice;

use crate::device::{Arg, Gpu, blocks, check, ptr};
use crate::tensor::{CudaTensor, CudaWeight};

/// f32 activations rounded to bf16 (the cuBLAS input type).
pub fn to_bf16(gpu: &Gpu, x: &CudaTensor) -> CudaSlice<u16> {
    let n = x.rows * x.cols;
    let out = gpu.alloc::<u16>(n);
    let s = &gpu.stream;
    gpu.launch(
        &gpu.k.f32_to_bf16,
        (blocks(n, 256), 1, 1),
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
    let (alpha, beta) = (1.0f32, 0.0f32);
    check(gpu.ctx.bind_to_thread(), "bind context");
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

pub fn matmul(gpu: &Gpu, x: &CudaTensor, w: &CudaWeight) -> CudaTensor {
    let n = w.dim0();
    let k = w.numel() / n.max(1);
    assert_eq!(
        k, x.cols,
        "matmul: weight {:?} does not take rows of {}",
        w.shape, x.cols
    );
    let xb = to_bf16(gpu, x);
    let out = gpu.alloc::<f32>(x.rows * n);
    let s = &gpu.stream;
    gemm_bf16(
        gpu,
        ptr(&xb, s),
        x.rows,
        k,
        ptr(w.bf16("matmul"), s),
        n,
        ptr(&out, s),
    );
    CudaTensor {
        rows: x.rows,
        cols: n,
        buf: out,
    }
}

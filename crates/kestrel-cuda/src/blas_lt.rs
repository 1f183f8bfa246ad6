//! Dense bf16 products through cuBLASLt, the alternative to `cublasGemmEx`
//! for the prefill's dense products (`KESTREL_DENSE_GEMM=lt`; built with the
//! `experiments` feature only: measured level with `cublasGemmEx`).
//!
//! The product is the one `ops::linear::gemm_bf16` computes: `out[rows, n] =
//! x[rows, k] . w[n, k]^T`, bf16 operands, f32 accumulation and output. A
//! plan (descriptors and the chosen algorithm) is made on a shape's first
//! call and kept, so later calls only launch. The algorithm is the
//! heuristic's first choice, or its `KESTREL_LT_ALGO`-th (to time the
//! others), with a 32 MiB workspace.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::ptr;

/// Workspace handed to every product (split-K and stream-K algorithms use it).
const WORKSPACE_BYTES: usize = 32 << 20;
/// Heuristic results asked for per shape.
const CANDIDATES: usize = 8;
/// Shapes kept at most; prefill lengths vary, so the cache is dropped when full.
const MAX_PLANS: usize = 256;

pub struct BlasLt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    /// Index into the heuristic's results (`KESTREL_LT_ALGO`, default 0).
    algo_index: usize,
    plans: Mutex<HashMap<(usize, usize, usize), Plan>>,
}

// The handle and plans are host objects; every use goes through the one
// stream of the `Gpu` that owns this, and the plans sit behind a mutex.
unsafe impl Send for BlasLt {}
unsafe impl Sync for BlasLt {}

struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    w_layout: sys::cublasLtMatrixLayout_t,
    x_layout: sys::cublasLtMatrixLayout_t,
    out_layout: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_matrix_layout(self.out_layout);
            let _ = lt::destroy_matrix_layout(self.x_layout);
            let _ = lt::destroy_matrix_layout(self.w_layout);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

impl BlasLt {
    /// A handle and its workspace on `stream`; `None` when cuBLASLt cannot be
    /// loaded or set up (the caller then keeps `cublasGemmEx`).
    pub fn new(stream: &std::sync::Arc<CudaStream>, algo_index: usize) -> Option<Self> {
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        let handle = lt::create_handle().ok()?;
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.ok()?;
        Some(BlasLt {
            handle,
            workspace,
            algo_index,
            plans: Mutex::new(HashMap::new()),
        })
    }

    /// `out[rows, n] = x[rows, k] . w[n, k]^T` (raw device addresses; bf16
    /// `x` and `w`, f32 `out`) on `stream`. Column-major, as cuBLAS sees the
    /// row-major tensors: `out^T [n, rows] = op_T(w^T [k, n]) . x^T [k, rows]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm(
        &self,
        stream: &CudaStream,
        x: u64,
        rows: usize,
        k: usize,
        w: u64,
        n: usize,
        out: u64,
    ) -> Result<(), String> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if plans.len() >= MAX_PLANS && !plans.contains_key(&(rows, n, k)) {
            plans.clear();
        }
        let plan = match plans.entry((rows, n, k)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(self.plan(rows, n, k)?),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                w as *const c_void,
                plan.w_layout,
                x as *const c_void,
                plan.x_layout,
                out as *const c_void,
                plan.out_layout,
                out as *mut c_void,
                plan.out_layout,
                &plan.algo,
                ptr(&self.workspace, stream) as *mut c_void,
                WORKSPACE_BYTES,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cublasLtMatmul {rows}x{k} by {n}x{k}: {e:?}"))
    }

    fn plan(&self, rows: usize, n: usize, k: usize) -> Result<Plan, String> {
        let err = |what: &str, e: lt::CublasError| format!("cuBLASLt {what}: {e:?}");
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| err("matmul descriptor", e))?;
        let mut plan = Plan {
            desc,
            w_layout: std::ptr::null_mut(),
            x_layout: std::ptr::null_mut(),
            out_layout: std::ptr::null_mut(),
            algo: unsafe { std::mem::zeroed() },
        };
        let trans_w = cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T;
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans_w as *const _ as *const c_void,
                size_of::<cudarc::cublas::sys::cublasOperation_t>(),
            )
        }
        .map_err(|e| err("transpose attribute", e))?;
        let bf16 = sys::cudaDataType::CUDA_R_16BF;
        plan.w_layout = lt::create_matrix_layout(bf16, k as u64, n as u64, k as i64)
            .map_err(|e| err("weight layout", e))?;
        plan.x_layout = lt::create_matrix_layout(bf16, k as u64, rows as u64, k as i64)
            .map_err(|e| err("activation layout", e))?;
        plan.out_layout = lt::create_matrix_layout(
            sys::cudaDataType::CUDA_R_32F,
            n as u64,
            rows as u64,
            n as i64,
        )
        .map_err(|e| err("output layout", e))?;

        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        let workspace = WORKSPACE_BYTES as u64;
        let mut results: [sys::cublasLtMatmulHeuristicResult_t; CANDIDATES] =
            unsafe { std::mem::zeroed() };
        let mut found = 0i32;
        let status = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const u64 as *const c_void,
                size_of::<u64>(),
            )
            .and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    desc,
                    plan.w_layout,
                    plan.x_layout,
                    plan.out_layout,
                    plan.out_layout,
                    pref,
                    CANDIDATES as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
                .result()
            })
        };
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        status.map_err(|e| err("heuristic", e))?;
        if found <= 0 {
            return Err(format!(
                "cuBLASLt has no algorithm for {rows}x{k} by {n}x{k}"
            ));
        }
        plan.algo = results[self.algo_index.min(found as usize - 1)].algo;
        Ok(plan)
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        self.plans
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

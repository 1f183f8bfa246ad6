//! Dense bf16 products through cuBLASLt.
//!
//! The product is the one `ops::linear::gemm_bf16` computes: `out[rows, n] =
//! x[rows, k] . w[n, k]^T`, bf16 operands, f32 accumulation and output. A
//! plan (descriptors and the algorithm) is made on a shape's first call and
//! kept, so later calls only launch.
//!
//! Two ways to pick the algorithm:
//! - [`AlgoChoice::PerShape`] (the `experiments` feature, `KESTREL_DENSE_GEMM=lt`,
//!   measured level with `cublasGemmEx`): the heuristic's first choice for
//!   every row count, or its `KESTREL_LT_ALGO`-th, with a workspace.
//! - [`AlgoChoice::RowInvariant`]: one algorithm per weight shape, the
//!   heuristic's first for [`ROW_INVARIANT_ROWS`] rows that splits no sum
//!   over K (no split-K reduction), taken for every row count.
//!   An output element is then one tile's K loop whatever `rows` is, so a row
//!   of a 13-row product has the bits it has in a 7,000-row one. `cublasGemmEx`
//!   picks its kernel (and split) by the row count.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream};

use crate::device::ptr;

/// Workspace handed to every product (split-K and stream-K algorithms use
/// it; the row-invariant ones ask for a few bytes at most).
const WORKSPACE_BYTES: usize = 32 << 20;
/// Row count the row-invariant algorithm is chosen for: the shortest
/// prefill whose time matters, which kept every prefill length measured
/// level with `cublasGemmEx`, where choosing for the longest chunk slowed the
/// short ones (docs/benchmarks/2026-12-06-h100-invariant-prompt-rows).
pub const ROW_INVARIANT_ROWS: usize = 1024;
/// Heuristic results asked for per shape.
const CANDIDATES: usize = 8;
/// Shapes kept at most; prefill lengths vary, so the cache is dropped when full.
const MAX_PLANS: usize = 256;

/// How [`BlasLt`] picks a shape's algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlgoChoice {
    /// The heuristic's result of this index for each `(rows, n, k)`.
    PerShape(usize),
    /// One algorithm per `(n, k)`, whatever the row count.
    RowInvariant,
}

pub struct BlasLt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    choice: AlgoChoice,
    plans: Mutex<HashMap<(usize, usize, usize), Plan>>,
    /// The row-invariant algorithm of each weight shape `(n, k)`.
    fixed: Mutex<HashMap<(usize, usize), sys::cublasLtMatmulAlgo_t>>,
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
    rows: usize,
    n: usize,
    k: usize,
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
    /// A handle and its workspace on `stream`, picking algorithms as
    /// `choice` says; `None` when cuBLASLt cannot be loaded or set up.
    pub fn new(stream: &std::sync::Arc<CudaStream>, choice: AlgoChoice) -> Option<Self> {
        if !unsafe { sys::is_culib_present() } {
            return None;
        }
        let handle = lt::create_handle().ok()?;
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.ok()?;
        Some(BlasLt {
            handle,
            workspace,
            choice,
            plans: Mutex::new(HashMap::new()),
            fixed: Mutex::new(HashMap::new()),
        })
    }

    /// How this handle picks algorithms.
    pub fn choice(&self) -> AlgoChoice {
        self.choice
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
        let mut plan = Plan::new(rows, n, k)?;
        plan.algo = match self.choice {
            AlgoChoice::PerShape(index) => {
                let found = self.heuristic(&plan, WORKSPACE_BYTES, false)?;
                found[index.min(found.len() - 1)].algo
            }
            AlgoChoice::RowInvariant => {
                let mut fixed = self.fixed.lock().unwrap_or_else(|e| e.into_inner());
                let algo = match fixed.get(&(n, k)) {
                    Some(a) => *a,
                    None => {
                        let reference = Plan::new(ROW_INVARIANT_ROWS, n, k)?;
                        let found = self.heuristic(&reference, WORKSPACE_BYTES, true)?;
                        let algo = found
                            .iter()
                            .map(|r| r.algo)
                            .find(|a| splits_k(a) == Some(false))
                            .ok_or_else(|| {
                                format!("cuBLASLt has no unsplit algorithm for {n}x{k} weights")
                            })?;
                        fixed.insert((n, k), algo);
                        algo
                    }
                };
                self.check(&plan, &algo)?;
                algo
            }
        };
        Ok(plan)
    }

    /// The heuristic's results for `plan`'s shapes (at least one), within
    /// `workspace` bytes, and with `unsplit` only algorithms that reduce no
    /// split of K.
    fn heuristic(
        &self,
        plan: &Plan,
        workspace: usize,
        unsplit: bool,
    ) -> Result<Vec<sys::cublasLtMatmulHeuristicResult_t>, String> {
        let err = |what: &str, e: lt::CublasError| format!("cuBLASLt {what}: {e:?}");
        let pref = lt::create_matmul_pref().map_err(|e| err("preference", e))?;
        let workspace = workspace as u64;
        let reductions = sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_NONE as u32;
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
                if unsplit {
                    lt::set_matmul_pref_attribute(
                        pref,
                        sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                        &reductions as *const u32 as *const c_void,
                        size_of::<u32>(),
                    )
                } else {
                    Ok(())
                }
            })
            .and_then(|()| {
                sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
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
                "cuBLASLt has no algorithm for {}x{} by {}x{}",
                plan.rows, plan.k, plan.n, plan.k
            ));
        }
        Ok(results[..found as usize].to_vec())
    }

    /// Whether `algo` runs `plan`'s shapes within the workspace.
    fn check(&self, plan: &Plan, algo: &sys::cublasLtMatmulAlgo_t) -> Result<(), String> {
        let mut result: sys::cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        unsafe {
            sys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                plan.w_layout,
                plan.x_layout,
                plan.out_layout,
                plan.out_layout,
                algo,
                &mut result,
            )
        }
        .result()
        .map_err(|e| {
            format!(
                "the row-invariant cuBLASLt algorithm of {}x{} weights does not take {} rows: {e:?}",
                plan.n, plan.k, plan.rows
            )
        })?;
        if result.workspaceSize > WORKSPACE_BYTES {
            return Err(format!(
                "the row-invariant cuBLASLt algorithm of {}x{} weights wants {} bytes of workspace at {} rows",
                plan.n, plan.k, result.workspaceSize, plan.rows
            ));
        }
        Ok(())
    }
}

/// Whether `algo` splits K over blocks (`None`: cuBLASLt would not say).
fn splits_k(algo: &sys::cublasLtMatmulAlgo_t) -> Option<bool> {
    let mut splits = 0u32;
    let mut written = 0usize;
    unsafe {
        sys::cublasLtMatmulAlgoConfigGetAttribute(
            algo,
            sys::cublasLtMatmulAlgoConfigAttributes_t::CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
            &mut splits as *mut u32 as *mut c_void,
            size_of::<u32>(),
            &mut written,
        )
    }
    .result()
    .ok()?;
    Some(splits > 1)
}

impl Plan {
    /// Descriptors of `out[rows, n] = x[rows, k] . w[n, k]^T`, without an algorithm.
    fn new(rows: usize, n: usize, k: usize) -> Result<Plan, String> {
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
            rows,
            n,
            k,
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

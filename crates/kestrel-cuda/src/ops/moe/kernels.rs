//! The MoE family's kernels: the decode path (`moe.cu`), the device-routed
//! prefill (`moe_prefill.cu`, and its wgmma GEMMs in `moe_gemm_sm90.cu`) and
//! the host-routed fallback (`moe.cu`), with the GEMMs' tile constants.

use cudarc::driver::CudaFunction;
use kestrel_core::Result;

use crate::device::{Gpu, function, function_with_smem};

/// Mirror `kernels/moe_prefill.cu`: rows per GEMM tile (`MG_BM`), weight
/// rows per tile (`MG_BN`; a gate_up tile is 64 act columns, their gate and
/// up rows), threads, and dynamic shared memory (`MG_SMEM_BYTES`).
pub const GEMM_ROWS: usize = 64;
pub const GEMM_COLS: usize = 128;
pub const GEMM_THREADS: u32 = 256;
pub const GEMM_SMEM_BYTES: u32 = 96 * 1024;
// Two blocks per SM on Hopper (228 KiB), one within sm_121's 99 KiB.
const _: () = assert!(2 * GEMM_SMEM_BYTES <= 224 * 1024 && GEMM_SMEM_BYTES <= 97 * 1024);
/// Rows per tile of the large wgmma kernels, taken when the experts average
/// at least that many rows.
pub const GEMM_ROWS_LARGE: usize = 128;
/// Weight rows per tile of the wide wgmma kernels (128-row tiles only).
pub const GEMM_COLS_WIDE: usize = 256;
const _: () = assert!(
    GEMM_ROWS == 64 && GEMM_ROWS_LARGE == 128 && GEMM_COLS == 128 && GEMM_COLS_WIDE == 256,
    "mirror Mgw<64>, Mgw<128> and Mgw<128, 256>"
);

/// The wgmma GEMM kernels (`kernels/moe_gemm_sm90.cu`) at `rows` rows (64
/// or 128) and `cols` weight rows (128, or 256 for the wide tiles) per tile:
/// two threads per row (one or two warpgroups), and their dynamic shared
/// memory, `Mgw::STAGES` stages (3 at 128 columns, 4 at 256) of `rows` A
/// rows and `cols` weight rows of 64 bf16, plus 1 KiB to start the stages on
/// a 1,024-byte boundary.
pub fn sm90_threads(rows: usize) -> u32 {
    2 * rows as u32
}
pub fn sm90_smem_bytes(rows: usize, cols: usize) -> u32 {
    let stages = if cols == GEMM_COLS { 3 } else { 4 };
    (stages * (rows + cols) * 64 * 2 + 1024) as u32
}

/// The kernels of one expert GEMM (gate_up or down): mma.sync, and wgmma
/// with 64- and 128-row tiles, the latter 128 or 256 weight rows wide.
pub struct ExpertGemmKernels {
    pub mma: CudaFunction,
    pub wgmma: CudaFunction,
    pub wgmma_large: CudaFunction,
    pub wgmma_wide: CudaFunction,
}

pub struct MoeKernels {
    // The decode path.
    pub moe_topk: CudaFunction,
    /// The same picks with a warp per token, for many tokens.
    pub moe_topk_warps: CudaFunction,
    pub gate_up: CudaFunction,
    pub down: CudaFunction,
    pub gate_up_f16: CudaFunction,
    pub down_f16: CudaFunction,
    pub gate_up_fp8: CudaFunction,
    pub down_fp8: CudaFunction,
    // The device-routed prefill.
    pub split_x: CudaFunction,
    pub norm_split: CudaFunction,
    pub router_gemm: CudaFunction,
    /// The router GEMM on wgmma (64-row tiles, 128 logits wide).
    pub router_gemm_sm90: CudaFunction,
    pub gate_up_gemm: ExpertGemmKernels,
    pub down_gemm: ExpertGemmKernels,
    pub route_plan: CudaFunction,
    pub route_fill: CudaFunction,
    pub combine: CudaFunction,
    pub gate_logit: CudaFunction,
    // The host-routed path.
    pub router_logits: CudaFunction,
    pub router_topk: CudaFunction,
    pub gather_rows_to_bf16: CudaFunction,
    pub swiglu_to_bf16: CudaFunction,
    pub scatter_add_weighted: CudaFunction,
    pub add_gated_rows: CudaFunction,
}

impl MoeKernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let moe = gpu.module(kestrel_kernels::MOE, "moe")?;
        let prefill = gpu.module(kestrel_kernels::MOE_PREFILL, "moe_prefill")?;
        let sm90 = gpu.module(kestrel_kernels::MOE_GEMM_SM90, "moe_gemm_sm90")?;
        let mma = |name: &str| function_with_smem(&prefill, name, GEMM_SMEM_BYTES);
        let wg =
            |name: &str, rows, cols| function_with_smem(&sm90, name, sm90_smem_bytes(rows, cols));
        let expert = |name: &str| -> Result<ExpertGemmKernels> {
            Ok(ExpertGemmKernels {
                mma: mma(&format!("moe_{name}_gemm"))?,
                wgmma: wg(&format!("moe_{name}_gemm_sm90"), 64, 128)?,
                wgmma_large: wg(&format!("moe_{name}_gemm_sm90_m128"), 128, 128)?,
                wgmma_wide: wg(&format!("moe_{name}_gemm_sm90_m128_n256"), 128, 256)?,
            })
        };
        Ok(MoeKernels {
            moe_topk: function(&moe, "moe_topk")?,
            moe_topk_warps: function(&moe, "moe_topk_warps")?,
            gate_up: function(&moe, "moe_gate_up")?,
            down: function(&moe, "moe_down")?,
            gate_up_f16: function(&moe, "moe_gate_up_f16")?,
            down_f16: function(&moe, "moe_down_f16")?,
            gate_up_fp8: function(&moe, "moe_gate_up_fp8")?,
            down_fp8: function(&moe, "moe_down_fp8")?,
            split_x: function(&prefill, "moe_split_x")?,
            norm_split: function(&prefill, "moe_norm_split")?,
            router_gemm: mma("moe_router_gemm")?,
            router_gemm_sm90: wg("moe_router_gemm_sm90", 64, 128)?,
            gate_up_gemm: expert("gate_up")?,
            down_gemm: expert("down")?,
            route_plan: function(&prefill, "moe_route_plan")?,
            route_fill: function(&prefill, "moe_route_fill")?,
            combine: function(&prefill, "moe_combine")?,
            gate_logit: function(&prefill, "moe_gate_logit")?,
            router_logits: function(&moe, "router_logits")?,
            router_topk: function(&moe, "router_topk")?,
            gather_rows_to_bf16: function(&moe, "gather_rows_to_bf16")?,
            swiglu_to_bf16: function(&moe, "swiglu_to_bf16")?,
            scatter_add_weighted: function(&moe, "scatter_add_weighted")?,
            add_gated_rows: function(&moe, "add_gated_rows")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shared-memory sizes mirror `Mgw<64>` and `Mgw<128>` of moe_gemm_sm90.cu.
    #[test]
    fn sm90_shared_memory_matches_the_kernels() {
        assert_eq!(sm90_smem_bytes(GEMM_ROWS, GEMM_COLS), 73 * 1024);
        assert_eq!(sm90_smem_bytes(GEMM_ROWS_LARGE, GEMM_COLS), 97 * 1024);
        assert_eq!(sm90_smem_bytes(GEMM_ROWS_LARGE, GEMM_COLS_WIDE), 193 * 1024);
    }
}

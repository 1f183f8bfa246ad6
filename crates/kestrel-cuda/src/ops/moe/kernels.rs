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
/// rows and `cols` weight rows of 64 bf16 (FP8: 64 codes, 3 stages at 64
/// rows and 4 at 128, and three bf16 weight tiles after the stages), plus
/// 1 KiB to start the stages on a 1,024-byte boundary.
pub fn sm90_threads(rows: usize) -> u32 {
    2 * rows as u32
}
pub fn sm90_smem_bytes(rows: usize, cols: usize, fp8: bool) -> u32 {
    let stages = match (fp8, rows, cols) {
        (true, GEMM_ROWS, _) | (false, _, GEMM_COLS) => 3,
        _ => 4,
    };
    let stage_weights = if fp8 { cols * 64 } else { cols * 64 * 2 };
    let converted = if fp8 { 3 * cols * 64 * 2 } else { 0 };
    (stages * (rows * 64 * 2 + stage_weights) + converted + 1024) as u32
}

/// The wgmma kernels of one expert GEMM at one weight format: 64- and
/// 128-row tiles, the latter 128 or 256 weight rows wide.
pub struct WgmmaKernels {
    pub rows64: CudaFunction,
    pub rows128: CudaFunction,
    pub wide: CudaFunction,
}

/// The kernels of one expert GEMM (gate_up or down): mma.sync, and wgmma on
/// bf16 weights and on block-FP8 ones (codes converted in shared memory).
pub struct ExpertGemmKernels {
    pub mma: CudaFunction,
    pub wgmma: WgmmaKernels,
    pub wgmma_fp8: WgmmaKernels,
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
        let wg = |name: &str, rows, cols, fp8| {
            function_with_smem(&sm90, name, sm90_smem_bytes(rows, cols, fp8))
        };
        let wgmma = |name: &str, fp8: bool| -> Result<WgmmaKernels> {
            let tail = if fp8 { "_fp8" } else { "" };
            Ok(WgmmaKernels {
                rows64: wg(&format!("moe_{name}_gemm_sm90{tail}"), 64, 128, fp8)?,
                rows128: wg(&format!("moe_{name}_gemm_sm90_m128{tail}"), 128, 128, fp8)?,
                wide: wg(
                    &format!("moe_{name}_gemm_sm90_m128_n256{tail}"),
                    128,
                    256,
                    fp8,
                )?,
            })
        };
        let expert = |name: &str| -> Result<ExpertGemmKernels> {
            Ok(ExpertGemmKernels {
                mma: mma(&format!("moe_{name}_gemm"))?,
                wgmma: wgmma(name, false)?,
                wgmma_fp8: wgmma(name, true)?,
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
            router_gemm_sm90: wg("moe_router_gemm_sm90", 64, 128, false)?,
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

    /// The shared-memory sizes mirror `Mgw` of moe_gemm_sm90.cu (its
    /// static_assert), bf16 and FP8.
    #[test]
    fn sm90_shared_memory_matches_the_kernels() {
        for (rows, cols, fp8, kib) in [
            (GEMM_ROWS, GEMM_COLS, false, 73),
            (GEMM_ROWS_LARGE, GEMM_COLS, false, 97),
            (GEMM_ROWS_LARGE, GEMM_COLS_WIDE, false, 193),
            (GEMM_ROWS, GEMM_COLS, true, 97),
            (GEMM_ROWS_LARGE, GEMM_COLS, true, 145),
            (GEMM_ROWS_LARGE, GEMM_COLS_WIDE, true, 225),
        ] {
            let bytes = sm90_smem_bytes(rows, cols, fp8);
            assert_eq!(bytes, kib * 1024, "{rows} x {cols}, fp8 {fp8}");
        }
        // Two blocks an SM at 64 rows, as the kernels' launch bounds ask; at
        // most a block's 227 KiB for the wide tiles.
        assert!(2 * sm90_smem_bytes(GEMM_ROWS, GEMM_COLS, true) <= 227 * 1024);
        assert!(sm90_smem_bytes(GEMM_ROWS_LARGE, GEMM_COLS_WIDE, true) <= 227 * 1024);
    }
}

//! One launch of a prefill MoE GEMM (router, gate_up or down): its
//! arguments, grid and tile choice, on mma.sync or wgmma as the plan says.

use cudarc::driver::CudaFunction;

use super::kernels::*;
use crate::context::Cx;
use crate::device::Gpu;
use crate::launch::Arg;
use crate::plan::Mma;

/// Whether a GEMM of 128-row tiles takes the tiles 256 weight rows wide: when
/// the plan allows them and they still make at least two blocks per SM
/// (fewer wide blocks were slower; docs/benchmarks/2026-11-30-h200-moe-wide-tiles).
fn wide_tiles(cx: &Cx, wide_blocks: usize) -> bool {
    cx.plan.moe.wide_tiles && wide_blocks >= 2 * cx.gpu.sm_count()
}

/// One launch of a prefill GEMM kernel (`moe_gemm` in moe_prefill.cu, whose
/// comment describes the fields).
pub struct Gemm {
    pub out: u64,
    pub ldo: usize,
    pub a: u64,
    pub lda: usize,
    /// Grouped row -> A row (0: the identity).
    pub a_rows: u64,
    pub w: u64,
    /// Elements between two groups' weight matrices.
    pub w_stride: usize,
    /// Block-FP8 weights (`w` holds the codes): their scales, and the
    /// scales between two groups' grids. Only the wgmma kernels take them.
    pub w_scales: Option<(u64, usize)>,
    /// The router's last row (the shared-expert gate), or 0.
    pub w_extra: u64,
    /// `(offsets, tile_off, groups)` from `moe_route_plan`; `None`: one group
    /// of all `rows` rows.
    pub groups: Option<(u64, u64, usize)>,
    pub rows: usize,
    /// Row tiles launched: exact for one group, an upper bound when grouped.
    pub row_tiles: usize,
    pub n: usize,
    pub k: usize,
    pub k_period: usize,
}

impl Gemm {
    /// Column tiles of `cols_per_tile` (64 act columns for gate_up, 128
    /// otherwise) and the 1-D grid: every column tile of every row tile.
    pub fn grid(&self, cols_per_tile: usize) -> (usize, u32) {
        let n_tiles = self.n.div_ceil(cols_per_tile);
        let grid = n_tiles * self.row_tiles;
        assert!(
            grid <= i32::MAX as usize,
            "moe prefill: grid of {grid} blocks"
        );
        (n_tiles, grid as u32)
    }

    /// The kernels' arguments (`moe_gemm` in moe_prefill.cu). `plain`: the
    /// wgmma kernels' list, without `w_extra` and `k_period`, which they do
    /// not take.
    pub fn args(&self, n_tiles: usize, plain: bool) -> Vec<Arg> {
        let (offsets, tile_off, groups) = self.groups.unwrap_or((0, 0, 1));
        let mut args = vec![
            Arg::Ptr(self.out),
            Arg::I32(self.ldo as i32),
            Arg::Ptr(self.a),
            Arg::I32(self.lda as i32),
            Arg::Ptr(self.a_rows),
            Arg::Ptr(self.w),
            Arg::U64(self.w_stride as u64),
        ];
        if let Some((scales, stride)) = self.w_scales {
            assert!(plain, "only the wgmma GEMMs read FP8 weights");
            args.extend([Arg::Ptr(scales), Arg::U64(stride as u64)]);
        }
        if !plain {
            args.push(Arg::Ptr(self.w_extra));
        }
        args.extend([
            Arg::Ptr(offsets),
            Arg::Ptr(tile_off),
            Arg::I32(groups as i32),
            Arg::I32(self.rows as i32),
            Arg::I32(self.n as i32),
            Arg::I32(self.k as i32),
        ]);
        if !plain {
            args.push(Arg::I32(self.k_period as i32));
        }
        args.push(Arg::I32(n_tiles as i32));
        args
    }
}

/// Launch the mma.sync kernel `f` (router, gate_up or down).
pub fn launch_gemm(gpu: &Gpu, f: &CudaFunction, cols_per_tile: usize, g: &Gemm) {
    let (n_tiles, grid) = g.grid(cols_per_tile);
    gpu.launch(
        f,
        (grid, 1, 1),
        GEMM_THREADS,
        GEMM_SMEM_BYTES,
        &g.args(n_tiles, false),
    );
}

/// Rows per tile of the expert GEMMs for `rows` rows over `groups` groups:
/// 128 on wgmma when the groups average at least that many, else 64 (the
/// mma.sync kernels always take 64).
pub fn tile_rows(cx: &Cx, rows: usize, groups: usize) -> usize {
    if cx.plan.moe.expert_gemm == Mma::Wgmma && rows >= GEMM_ROWS_LARGE * groups {
        GEMM_ROWS_LARGE
    } else {
        GEMM_ROWS
    }
}

/// An expert GEMM on the plan's instructions (`moe.expert_gemm`);
/// `g.row_tiles` counts tiles of `tile_rows` rows.
pub fn launch_expert_gemm(
    cx: &Cx,
    kernels: &ExpertGemmKernels,
    tile_rows: usize,
    cols_per_tile: usize,
    g: &Gemm,
) {
    let gpu = cx.gpu;
    let fp8 = g.w_scales.is_some();
    if cx.plan.moe.expert_gemm == Mma::MmaSync {
        assert_eq!(tile_rows, GEMM_ROWS, "mma.sync tiles are {GEMM_ROWS} rows");
        assert!(!fp8, "the mma.sync expert GEMMs read bf16 weights");
        return launch_gemm(gpu, &kernels.mma, cols_per_tile, g);
    }
    assert!(
        g.w_extra == 0 && g.k_period == g.k,
        "the wgmma expert GEMMs take plain weight rows"
    );
    let family = if fp8 {
        &kernels.wgmma_fp8
    } else {
        &kernels.wgmma
    };
    let wide_blocks = g.grid(cols_per_tile * GEMM_COLS_WIDE / GEMM_COLS).1 as usize;
    let (f, cols) = match tile_rows {
        GEMM_ROWS => (&family.rows64, GEMM_COLS),
        GEMM_ROWS_LARGE if wide_tiles(cx, wide_blocks) => (&family.wide, GEMM_COLS_WIDE),
        GEMM_ROWS_LARGE => (&family.rows128, GEMM_COLS),
        _ => panic!("no wgmma kernel for {tile_rows}-row tiles"),
    };
    // Wide tiles cover twice the columns.
    let (n_tiles, grid) = g.grid(cols_per_tile * cols / GEMM_COLS);
    gpu.launch(
        f,
        (grid, 1, 1),
        sm90_threads(tile_rows),
        sm90_smem_bytes(tile_rows, cols, fp8),
        &g.args(n_tiles, true),
    );
}

/// Upper bound on the tiles of `tile_rows` rows over `pairs` rows split over
/// `groups` groups: each non-empty group rounds up once.
pub fn grouped_row_tiles(pairs: usize, groups: usize, tile_rows: usize) -> usize {
    (pairs + (tile_rows - 1) * groups.min(pairs)) / tile_rows
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The launched tile count covers every routing of the pairs, for both
    /// tile sizes.
    #[test]
    fn grouped_row_tiles_bound_every_routing() {
        for rows in [GEMM_ROWS, GEMM_ROWS_LARGE] {
            for (pairs, groups) in [(72, 64), (800, 32), (65536, 256), (5, 300), (0, 8)] {
                let bound = grouped_row_tiles(pairs, groups, rows);
                // Worst cases: one row in each of min(E, P) - 1 groups, the rest
                // in one; and spread as evenly as possible.
                let used = groups.min(pairs);
                let one_each = if used == 0 {
                    0
                } else {
                    (used - 1) + (pairs - (used - 1)).div_ceil(rows)
                };
                let even: usize = (0..used)
                    .map(|g| (pairs / used + usize::from(g < pairs % used)).div_ceil(rows))
                    .sum();
                assert!(
                    bound >= one_each && bound >= even,
                    "{pairs} {groups} {rows}"
                );
            }
        }
    }

    /// The wgmma kernels take the mma.sync kernels' 16 parameters without
    /// `w_extra` (the 8th) and `k_period` (the 15th), in the same order.
    #[test]
    fn wgmma_arguments_are_the_mma_ones_without_w_extra_and_k_period() {
        let g = Gemm {
            out: 1,
            ldo: 2,
            a: 3,
            lda: 4,
            a_rows: 5,
            w: 6,
            w_stride: 7,
            w_scales: None,
            w_extra: 8,
            groups: Some((9, 10, 11)),
            rows: 12,
            row_tiles: 13,
            n: 14,
            k: 15,
            k_period: 16,
        };
        let show = |args: Vec<Arg>| args.iter().map(|a| format!("{a:?}")).collect::<Vec<_>>();
        let mut full = show(g.args(17, false));
        assert_eq!(full.len(), 16);
        full.remove(14);
        full.remove(7);
        assert_eq!(show(g.args(17, true)), full.clone());
        // The FP8 forms: the scales and their group stride after w_stride.
        let fp8 = Gemm {
            w_scales: Some((18, 19)),
            ..g
        };
        full.splice(7..7, ["Ptr(18)".to_string(), "U64(19)".to_string()]);
        assert_eq!(show(fp8.args(17, true)), full);
    }
}

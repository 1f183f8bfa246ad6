//! The device-routed prefill path (more than 8 tokens): split x, router GEMM,
//! top-k, grouping by expert, grouped tensor-core GEMMs and a combine
//! (`kernels/moe_prefill.cu`).

use std::sync::Arc;

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaFunction, CudaModule};
use kestrel_core::{BackendError, MoeSpec, MoeWeights, Result};

use super::{MoeInput, SharedExpert, THREADS, top_k};
use crate::device::{Arg, Gpu, blocks, ptr};
use crate::tensor::{CudaTensor, CudaWeight};

/// Mirror `kernels/moe_prefill.cu`: rows per GEMM tile (`MG_BM`), weight
/// rows per tile (`MG_BN`; a gate_up tile is 64 act columns, their gate and
/// up rows), threads, and dynamic shared memory (`MG_SMEM_BYTES`).
const GEMM_ROWS: usize = 64;
const GEMM_COLS: usize = 128;
const GEMM_THREADS: u32 = 256;
pub const GEMM_SMEM_BYTES: u32 = 96 * 1024;
// Two blocks per SM on Hopper (228 KiB), one within sm_121's 99 KiB.
const _: () = assert!(2 * GEMM_SMEM_BYTES <= 224 * 1024 && GEMM_SMEM_BYTES <= 97 * 1024);
/// Threads of `moe_route_plan` and `moe_route_fill`.
const PLAN_THREADS: u32 = 1024;
const FILL_THREADS: u32 = 512;

/// A prefill GEMM kernel, allowed the dynamic shared memory it needs (above
/// the default 48 KiB).
pub fn prefill_gemm(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    let f = m
        .load_function(name)
        .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        GEMM_SMEM_BYTES as i32,
    )
    .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
    Ok(f)
}

/// The wgmma GEMM kernels (`kernels/moe_gemm_sm90.cu`) at `rows` rows (64
/// or 128) and `cols` weight rows (128, or 256 for the wide tiles) per tile:
/// two threads per row (one or two warpgroups), and their dynamic shared
/// memory, `Mgw::STAGES` stages (3 at 128 columns, 4 at 256) of `rows` A
/// rows and `cols` weight rows of 64 bf16, plus 1 KiB to start the stages on
/// a 1,024-byte boundary.
fn sm90_threads(rows: usize) -> u32 {
    2 * rows as u32
}
fn sm90_smem_bytes(rows: usize, cols: usize) -> u32 {
    let stages = if cols == GEMM_COLS { 3 } else { 4 };
    (stages * (rows + cols) * 64 * 2 + 1024) as u32
}
const _: () = assert!(
    GEMM_ROWS == 64 && GEMM_ROWS_LARGE == 128 && GEMM_COLS == 128 && GEMM_COLS_WIDE == 256,
    "mirror Mgw<64>, Mgw<128> and Mgw<128, 256>"
);
/// Rows per tile of the large wgmma kernels, taken when the experts average
/// at least that many rows (an 8K-token Qwen3.6 prefill: 256).
const GEMM_ROWS_LARGE: usize = 128;
/// Weight rows per tile of the wide wgmma kernels (128-row tiles only).
const GEMM_COLS_WIDE: usize = 256;

/// Whether a GEMM of 128-row tiles takes the tiles 256 weight rows wide: when
/// that still makes at least two blocks per SM, unless
/// `KESTREL_MOE_TILES=narrow` (read once) keeps them 128 wide. H200, MoE block
/// of an 8K-token prefill (`moe_prefill_bench`): Qwen3.6 1.569 -> 1.547 ms,
/// Qwen3-30B 1.660 -> 1.613 ms with the wide tiles; a 1K-token Qwen3.6
/// prefill's shared expert, 32 wide blocks, went 0.587 -> 0.599 ms before the
/// block count was asked.
fn wide_tiles(gpu: &Gpu, wide_blocks: usize) -> bool {
    gpu.overrides.moe_wide_tiles && wide_blocks >= 2 * gpu.sm_count()
}

/// A wgmma GEMM kernel for tiles of `rows` x `cols`, allowed its dynamic shared memory.
pub fn prefill_gemm_sm90(
    m: &Arc<CudaModule>,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<CudaFunction> {
    let f = m
        .load_function(name)
        .map_err(|e| BackendError::Unavailable(format!("CUDA kernel {name} missing: {e:?}")))?;
    f.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        sm90_smem_bytes(rows, cols) as i32,
    )
    .map_err(|e| BackendError::Unavailable(format!("configuring {name}: {e:?}")))?;
    Ok(f)
}

/// The kernels of one expert GEMM (gate_up or down): mma.sync, and wgmma
/// with 64- and 128-row tiles, the latter 128 or 256 weight rows wide.
struct ExpertGemm<'a> {
    mma: &'a CudaFunction,
    wgmma: &'a CudaFunction,
    wgmma_large: &'a CudaFunction,
    wgmma_wide: &'a CudaFunction,
}

impl<'a> ExpertGemm<'a> {
    fn gate_up(gpu: &'a Gpu) -> Self {
        ExpertGemm {
            mma: &gpu.k.moe_gate_up_gemm,
            wgmma: &gpu.k.moe_gate_up_gemm_sm90,
            wgmma_large: &gpu.k.moe_gate_up_gemm_sm90_m128,
            wgmma_wide: &gpu.k.moe_gate_up_gemm_sm90_m128_n256,
        }
    }
    fn down(gpu: &'a Gpu) -> Self {
        ExpertGemm {
            mma: &gpu.k.moe_down_gemm,
            wgmma: &gpu.k.moe_down_gemm_sm90,
            wgmma_large: &gpu.k.moe_down_gemm_sm90_m128,
            wgmma_wide: &gpu.k.moe_down_gemm_sm90_m128_n256,
        }
    }
}

/// One launch of a prefill GEMM kernel (`moe_gemm` in moe_prefill.cu, whose
/// comment describes the fields).
struct Gemm {
    out: u64,
    ldo: usize,
    a: u64,
    lda: usize,
    /// Grouped row -> A row (0: the identity).
    a_rows: u64,
    w: u64,
    /// Elements between two groups' weight matrices.
    w_stride: usize,
    /// The router's last row (the shared-expert gate), or 0.
    w_extra: u64,
    /// `(offsets, tile_off, groups)` from `moe_route_plan`; `None`: one group
    /// of all `rows` rows.
    groups: Option<(u64, u64, usize)>,
    rows: usize,
    /// Row tiles launched: exact for one group, an upper bound when grouped.
    row_tiles: usize,
    n: usize,
    k: usize,
    k_period: usize,
}

impl Gemm {
    /// Column tiles of `cols_per_tile` (64 act columns for gate_up, 128
    /// otherwise) and the 1-D grid: every column tile of every row tile.
    fn grid(&self, cols_per_tile: usize) -> (usize, u32) {
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
    fn args(&self, n_tiles: usize, plain: bool) -> Vec<Arg> {
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
fn launch_gemm(gpu: &Gpu, f: &CudaFunction, cols_per_tile: usize, g: &Gemm) {
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
fn tile_rows(gpu: &Gpu, rows: usize, groups: usize) -> usize {
    if gpu.moe_gemm_wgmma && rows >= GEMM_ROWS_LARGE * groups {
        GEMM_ROWS_LARGE
    } else {
        GEMM_ROWS
    }
}

/// An expert GEMM on wgmma where the GPU has it ([`Gpu::moe_gemm_wgmma`]),
/// else on mma.sync; `g.row_tiles` counts tiles of `tile_rows` rows.
fn launch_expert_gemm(
    gpu: &Gpu,
    kernels: &ExpertGemm,
    tile_rows: usize,
    cols_per_tile: usize,
    g: &Gemm,
) {
    if !gpu.moe_gemm_wgmma {
        assert_eq!(tile_rows, GEMM_ROWS, "mma.sync tiles are {GEMM_ROWS} rows");
        return launch_gemm(gpu, kernels.mma, cols_per_tile, g);
    }
    assert!(
        g.w_extra == 0 && g.k_period == g.k,
        "the wgmma expert GEMMs take plain weight rows"
    );
    let wide_blocks = g.grid(cols_per_tile * GEMM_COLS_WIDE / GEMM_COLS).1 as usize;
    let (f, cols) = match tile_rows {
        GEMM_ROWS => (kernels.wgmma, GEMM_COLS),
        GEMM_ROWS_LARGE if wide_tiles(gpu, wide_blocks) => (kernels.wgmma_wide, GEMM_COLS_WIDE),
        GEMM_ROWS_LARGE => (kernels.wgmma_large, GEMM_COLS),
        _ => panic!("no wgmma kernel for {tile_rows}-row tiles"),
    };
    // Wide tiles cover twice the columns.
    let (n_tiles, grid) = g.grid(cols_per_tile * cols / GEMM_COLS);
    gpu.launch(
        f,
        (grid, 1, 1),
        sm90_threads(tile_rows),
        sm90_smem_bytes(tile_rows, cols),
        &g.args(n_tiles, true),
    );
}

/// Upper bound on the tiles of `tile_rows` rows over `pairs` rows split over
/// `groups` groups: each non-empty group rounds up once.
fn grouped_row_tiles(pairs: usize, groups: usize, tile_rows: usize) -> usize {
    (pairs + (tile_rows - 1) * groups.min(pairs)) / tile_rows
}

/// Chunks of 8 values per thread of `moe_norm_split` (`NORM_SPLIT_CHUNKS`
/// in moe_prefill.cu), at 256 threads a row.
const NORM_SPLIT_CHUNKS: usize = 2;

/// Whether `moe_norm_split` takes rows of `h` values.
pub(super) fn norm_split_fits(h: usize) -> bool {
    h.is_multiple_of(8) && h <= 8 * NORM_SPLIT_CHUNKS * THREADS as usize
}

/// The device-routed prefill path (see the [module docs](super)). Shapes are
/// checked by the caller ([`prefill_fits`](super::prefill_fits)).
pub(super) fn moe_prefill(
    gpu: &Gpu,
    input: MoeInput<'_>,
    w: &MoeWeights<CudaWeight>,
    spec: &MoeSpec,
) -> CudaTensor {
    let (t, h) = input.shape();
    let (ne, k, inter) = (spec.num_experts, spec.top_k, spec.intermediate);
    let s = &gpu.stream;
    let shared = SharedExpert::of(gpu, w, spec);
    let gate = shared.and_then(|e| e.gate);
    let ld = ne + usize::from(gate.is_some());
    let pairs = t * k;

    // x as [hi | mid | lo] bf16 per row (hi feeds the experts), and router
    // logits [T, E] plus the gate logit as column E when there is one (its
    // own kernel, or the norm's: as a 257th GEMM column it cost a whole tile).
    let xs = gpu.alloc::<u16>(t * 3 * h);
    let xs_ptr = ptr(&xs, s);
    let logits = gpu.alloc::<f32>(t * ld);
    match input {
        MoeInput::Rows(x) => {
            gpu.launch(
                &gpu.k.moe_split_x,
                (blocks(t * h / 8, THREADS as usize), 1, 1),
                THREADS,
                0,
                &[
                    Arg::Ptr(xs_ptr),
                    Arg::Ptr(ptr(&x.buf, s)),
                    Arg::I32(t as i32),
                    Arg::I32(h as i32),
                ],
            );
            if let Some(gate_w) = gate {
                gpu.launch(
                    &gpu.k.moe_gate_logit,
                    (blocks(t, 8), 1, 1),
                    256,
                    0,
                    &[
                        Arg::Ptr(ptr(&logits, s)),
                        Arg::I32(ld as i32),
                        Arg::I32(ne as i32),
                        Arg::Ptr(ptr(&x.buf, s)),
                        Arg::Ptr(gate_w),
                        Arg::I32(t as i32),
                        Arg::I32(h as i32),
                    ],
                );
            }
        }
        MoeInput::Norm(pre) => {
            assert!(norm_split_fits(h), "moe_norm_split: rows of {h}");
            // The residual changes in place: a bf16 copy of it would be stale.
            pre.residual.bf16 = None;
            gpu.launch(
                &gpu.k.moe_norm_split,
                (t as u32, 1, 1),
                THREADS,
                0,
                &[
                    Arg::Ptr(xs_ptr),
                    Arg::Ptr(ptr(&pre.residual.buf, s)),
                    Arg::Ptr(pre.delta.map_or(0, |d| ptr(&d.buf, s))),
                    Arg::Ptr(ptr(pre.weight.f32("moe_norm_split"), s)),
                    Arg::F32(pre.eps),
                    Arg::Ptr(gate.unwrap_or(0)),
                    Arg::Ptr(ptr(&logits, s)),
                    Arg::I32(ld as i32),
                    Arg::I32(ne as i32),
                    Arg::I32(h as i32),
                ],
            );
        }
    }

    let router = Gemm {
        out: ptr(&logits, s),
        ldo: ld,
        a: xs_ptr,
        lda: 3 * h,
        a_rows: 0,
        w: ptr(w.router.bf16("router"), s),
        w_stride: 0,
        w_extra: 0,
        groups: None,
        rows: t,
        row_tiles: t.div_ceil(GEMM_ROWS),
        n: ne,
        k: 3 * h,
        k_period: h,
    };
    if gpu.moe_gemm_wgmma {
        // wgmma, one warpgroup per 64-row tile. H200, 8K-token Qwen3.6
        // prefill (ncu): 105 -> 90 us a layer. It reads ~0.6 GB of tiles
        // from L2 a layer (the weights once per row tile and part), a likely
        // bound that was not profiled.
        let (n_tiles, grid) = router.grid(GEMM_COLS);
        gpu.launch(
            &gpu.k.moe_router_gemm_sm90,
            (grid, 1, 1),
            sm90_threads(GEMM_ROWS),
            sm90_smem_bytes(GEMM_ROWS, GEMM_COLS),
            &router.args(n_tiles, false),
        );
    } else {
        launch_gemm(gpu, &gpu.k.moe_router_gemm, GEMM_COLS, &router);
    }

    let (ids, weights) = top_k(gpu, &logits, ld, t, spec);

    // Grouping: rows per expert and their tiles, then each expert's pairs in
    // ascending token order and every pair's grouped row.
    let routed_rows = tile_rows(gpu, pairs, ne);
    let offsets = gpu.alloc::<i32>(ne + 1);
    let tile_off = gpu.alloc::<i32>(ne + 1);
    gpu.launch(
        &gpu.k.moe_route_plan,
        (1, 1, 1),
        PLAN_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&offsets, s)),
            Arg::Ptr(ptr(&tile_off, s)),
            Arg::Ptr(ptr(&ids, s)),
            Arg::I32(pairs as i32),
            Arg::I32(ne as i32),
            Arg::I32(routed_rows as i32),
        ],
    );
    let pair_token = gpu.alloc::<i32>(pairs);
    let pos = gpu.alloc::<i32>(pairs);
    gpu.launch(
        &gpu.k.moe_route_fill,
        (ne as u32, 1, 1),
        FILL_THREADS,
        0,
        &[
            Arg::Ptr(ptr(&pair_token, s)),
            Arg::Ptr(ptr(&pos, s)),
            Arg::Ptr(ptr(&ids, s)),
            Arg::Ptr(ptr(&offsets, s)),
            Arg::I32(t as i32),
            Arg::I32(k as i32),
        ],
    );

    // The routed experts, in grouped row order.
    let grouped = Some((ptr(&offsets, s), ptr(&tile_off, s), ne));
    let row_tiles = grouped_row_tiles(pairs, ne, routed_rows);
    let act = gpu.alloc::<u16>(pairs * inter);
    launch_expert_gemm(
        gpu,
        &ExpertGemm::gate_up(gpu),
        routed_rows,
        GEMM_COLS / 2,
        &Gemm {
            out: ptr(&act, s),
            ldo: inter,
            a: xs_ptr,
            lda: 3 * h,
            a_rows: ptr(&pair_token, s),
            w: ptr(w.gate_up.bf16("experts' gate_up"), s),
            w_stride: 2 * inter * h,
            w_extra: 0,
            groups: grouped,
            rows: pairs,
            row_tiles,
            n: inter,
            k: h,
            k_period: h,
        },
    );
    // bf16 expert outputs (see MG_DOWN in moe_prefill.cu).
    let y = gpu.alloc::<u16>(pairs * h);
    launch_expert_gemm(
        gpu,
        &ExpertGemm::down(gpu),
        routed_rows,
        GEMM_COLS,
        &Gemm {
            out: ptr(&y, s),
            ldo: h,
            a: ptr(&act, s),
            lda: inter,
            a_rows: 0,
            w: ptr(w.down.bf16("experts' down"), s),
            w_stride: h * inter,
            w_extra: 0,
            groups: grouped,
            rows: pairs,
            row_tiles,
            n: h,
            k: inter,
            k_period: inter,
        },
    );
    drop(act);

    // The shared expert: the same kernels, one dense group of all tokens.
    let ys = shared.map(|e| {
        let (sgu, sdn, si) = (e.gate_up, e.down, e.inter);
        let shared_rows = tile_rows(gpu, t, 1);
        let act_s = gpu.alloc::<u16>(t * si);
        launch_expert_gemm(
            gpu,
            &ExpertGemm::gate_up(gpu),
            shared_rows,
            GEMM_COLS / 2,
            &Gemm {
                out: ptr(&act_s, s),
                ldo: si,
                a: xs_ptr,
                lda: 3 * h,
                a_rows: 0,
                w: sgu,
                w_stride: 0,
                w_extra: 0,
                groups: None,
                rows: t,
                row_tiles: t.div_ceil(shared_rows),
                n: si,
                k: h,
                k_period: h,
            },
        );
        let ys = gpu.alloc::<u16>(t * h);
        launch_expert_gemm(
            gpu,
            &ExpertGemm::down(gpu),
            shared_rows,
            GEMM_COLS,
            &Gemm {
                out: ptr(&ys, s),
                ldo: h,
                a: ptr(&act_s, s),
                lda: si,
                a_rows: 0,
                w: sdn,
                w_stride: 0,
                w_extra: 0,
                groups: None,
                rows: t,
                row_tiles: t.div_ceil(shared_rows),
                n: h,
                k: si,
                k_period: si,
            },
        );
        ys
    });

    let out = gpu.alloc::<f32>(t * h);
    gpu.launch(
        &gpu.k.moe_combine,
        (blocks(t * h / 4, THREADS as usize), 1, 1),
        THREADS,
        0,
        &[
            Arg::Ptr(ptr(&out, s)),
            Arg::Ptr(ptr(&y, s)),
            Arg::Ptr(ys.as_ref().map_or(0, |b| ptr(b, s))),
            Arg::Ptr(ptr(&pos, s)),
            Arg::Ptr(ptr(&weights, s)),
            Arg::Ptr(ptr(&logits, s)),
            Arg::I32(ld as i32),
            Arg::I32(if gate.is_some() { ne as i32 } else { -1 }),
            Arg::I32(t as i32),
            Arg::I32(h as i32),
            Arg::I32(k as i32),
        ],
    );
    CudaTensor {
        bf16: None,
        rows: t,
        cols: h,
        buf: out,
    }
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
        assert_eq!(show(g.args(17, true)), full);
    }

    /// The shared-memory sizes mirror `Mgw<64>` and `Mgw<128>` of moe_gemm_sm90.cu.
    #[test]
    fn sm90_shared_memory_matches_the_kernels() {
        assert_eq!(sm90_smem_bytes(GEMM_ROWS, GEMM_COLS), 73 * 1024);
        assert_eq!(sm90_smem_bytes(GEMM_ROWS_LARGE, GEMM_COLS), 97 * 1024);
        assert_eq!(sm90_smem_bytes(GEMM_ROWS_LARGE, GEMM_COLS_WIDE), 193 * 1024);
    }
}

//! The attention kernels' launches: decode (split-KV partials and their
//! combine), prefill (the plan's kernel for the head dim) and the generic
//! kernel for anything else.

use kestrel_core::AttentionSpec;

use super::kernels::*;
use crate::context::Cx;
use crate::device::{Gpu, ptr};
use crate::launch::Arg;
use crate::plan::{AttnPrefill, DecodeSplits};
use crate::step::StepLayout;

/// Splits of the decode kernel: a function of the launch shape and the
/// device only, never of sequence lengths (recorded steps replay with other
/// lengths). At most one wave of blocks (a second, partial wave would leave
/// most of the device idle): enough to stream the cache of a single long
/// sequence at full bandwidth, while a batch that fills the device on its own
/// is not split (fewer partials to merge).
fn decode_splits(target_blocks: usize, rows: usize, blocks_per_row: usize) -> usize {
    (target_blocks / (rows * blocks_per_row)).clamp(1, DECODE_MAX_SPLITS)
}

/// Decode blocks that fit on the device at once (two per SM at 96 KiB of
/// shared memory each).
fn decode_target_blocks(gpu: &Gpu) -> usize {
    2 * gpu.sm_count()
}

/// What `attention_decode_fused` reads to form the new token's q, k and v.
pub struct NewTokenArgs {
    pub q_norm: u64,
    pub k_norm: u64,
    pub k_offset: usize,
    pub v_offset: usize,
}

/// Everything the attention kernels read, by device address.
pub struct Attend<'a> {
    pub cx: &'a Cx<'a>,
    pub spec: &'a AttentionSpec,
    pub l: &'a StepLayout,
    pub out: u64,
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub block_size: usize,
    pub proj: u64,
    pub proj_stride: usize,
    pub gate_offset: i32,
    pub f32_cache: bool,
    /// Set: decode runs the fused kernel (no q was computed beforehand).
    pub new_token: Option<NewTokenArgs>,
}

impl Attend<'_> {
    fn scale_log2(&self) -> f32 {
        self.spec.scale * std::f32::consts::LOG2_E
    }

    /// Every new token as a one-token sequence (the layout's row sections):
    /// split-KV partials, then the combine kernel.
    ///
    /// In the batch-invariant mode the split count is a constant (a row's
    /// result then depends on its own length only), and the rows run in
    /// launches of at most [`BATCH_INVARIANT_ROWS`] (prefill chunks bring
    /// thousands; their partials are bounded so).
    pub fn decode(&self, dim_index: usize) {
        let rows = self.l.tokens;
        if self.cx.plan.batch_invariant {
            for first in (0..rows).step_by(BATCH_INVARIANT_ROWS) {
                let n = BATCH_INVARIANT_ROWS.min(rows - first);
                self.decode_rows(dim_index, first, n, BATCH_INVARIANT_SPLITS);
            }
        } else {
            // Splits for one row per sequence, whatever the rows per
            // sequence: a verify step's rows then combine their keys in the
            // splits of the decode step at the same position (the same sums).
            let target = decode_target_blocks(self.cx.gpu);
            let seqs = self.split_seqs(self.l.seqs.clamp(1, rows));
            let splits = decode_splits(target, seqs, self.decode_blocks_per_row());
            self.decode_rows(dim_index, 0, rows, splits);
        }
    }

    /// Every row of a layout whose rows are sequences of their own (each
    /// with its own block table: sparse attention's selected slots), with
    /// the splits a decode step of `seqs` sequences takes, so that a row's
    /// sums do not depend on how many rows come with it; one split in a
    /// [`Cx::prompt_step`], as a long prefill's rows take, whatever the
    /// rows. Rows run in launches of at most `ROWS_PER_LAUNCH` (a prefill
    /// chunk brings thousands, and each launch holds its partials).
    pub fn decode_rows_of(&self, dim_index: usize, seqs: usize) {
        const ROWS_PER_LAUNCH: usize = 1024;
        let rows = self.l.tokens;
        let splits = if self.cx.plan.batch_invariant {
            BATCH_INVARIANT_SPLITS
        } else if self.cx.prompt_step() {
            1
        } else {
            let target = decode_target_blocks(self.cx.gpu);
            decode_splits(
                target,
                self.split_seqs(seqs.clamp(1, rows.max(1))),
                self.decode_blocks_per_row(),
            )
        };
        for first in (0..rows).step_by(ROWS_PER_LAUNCH) {
            self.decode_rows(dim_index, first, ROWS_PER_LAUNCH.min(rows - first), splits);
        }
    }

    /// The sequence count a decode step of `seqs` sequences takes its
    /// splits for: its own, or one ([`DecodeSplits::OneSequence`]).
    fn split_seqs(&self, seqs: usize) -> usize {
        match self.cx.plan.decode_splits {
            DecodeSplits::Step => seqs,
            DecodeSplits::OneSequence => 1,
        }
    }

    /// Decode blocks of one query row and split: a block per (kv head,
    /// group of up to `DECODE_HEADS` q heads).
    fn decode_blocks_per_row(&self) -> usize {
        let (hq, hkv) = (self.spec.num_q_heads, self.spec.num_kv_heads);
        hkv * (hq / hkv).div_ceil(DECODE_HEADS)
    }

    /// Rows `first .. first + rows` of the step in `splits` splits each.
    fn decode_rows(&self, dim_index: usize, first: usize, rows: usize, splits: usize) {
        let (cx, gpu, l) = (self.cx, self.cx.gpu, self.l);
        let (hq, hkv, d) = (
            self.spec.num_q_heads,
            self.spec.num_kv_heads,
            self.spec.head_dim,
        );
        let blocks_per_row = self.decode_blocks_per_row();
        // The kernels index q, the output and the new token's sections by
        // the row's absolute index (`row_start`); only the per-row sections
        // start at `first`.
        let at = |section: u64| section + (first * 4) as u64;
        // Stream-ordered allocations: part of a recorded graph when captured.
        let part_o = gpu.alloc::<f32>(rows * hq * splits * d);
        let part_ml = gpu.alloc::<f32>(rows * hq * splits * 2);
        let s = &gpu.stream;
        let grid = (blocks_per_row as u32, rows as u32, splits as u32);
        let (threads, smem) = (32 * decode_warps(d) as u32, decode_smem_bytes(d));
        let common = [
            Arg::Ptr(at(l.row_start())),
            Arg::Ptr(at(l.row_len())),
            Arg::Ptr(at(l.row_table_offset())),
            Arg::Ptr(l.block_tables()),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            Arg::I32(self.block_size as i32),
            Arg::F32(self.scale_log2()),
            Arg::I32(splits as i32),
        ];
        let (parts, caches) = (
            [Arg::Ptr(ptr(&part_o, s)), Arg::Ptr(ptr(&part_ml, s))],
            [Arg::Ptr(self.k_cache), Arg::Ptr(self.v_cache)],
        );
        match &self.new_token {
            None => {
                let mut args = parts.to_vec();
                args.push(Arg::Ptr(self.q));
                args.extend(caches);
                args.extend(common);
                gpu.launch(
                    &cx.k.attention.decode[dim_index],
                    grid,
                    threads,
                    smem,
                    &args,
                );
            }
            Some(nt) => {
                let rope = self.spec.rope;
                let mut args = parts.to_vec();
                args.extend(caches);
                args.extend(common);
                args.extend([
                    Arg::Ptr(self.proj),
                    Arg::I32(self.proj_stride as i32),
                    Arg::I32(nt.k_offset as i32),
                    Arg::I32(nt.v_offset as i32),
                    Arg::Ptr(nt.q_norm),
                    Arg::Ptr(nt.k_norm),
                    Arg::Ptr(l.positions()),
                    Arg::Ptr(l.slot_mapping()),
                    Arg::I32(rope.rotary_dim as i32),
                    Arg::F32(rope.theta),
                    Arg::F32(self.spec.norm_eps),
                ]);
                let f = cx.k.attention.decode_fused[dim_index]
                    .as_ref()
                    .expect("a fused decode kernel for this head dim");
                gpu.launch(f, grid, threads, smem, &args);
            }
        }
        gpu.launch(
            &cx.k.attention.decode_combine,
            (hq as u32, rows as u32, 1),
            COMBINE_THREADS,
            0,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(ptr(&part_o, s)),
                Arg::Ptr(ptr(&part_ml, s)),
                Arg::Ptr(at(l.row_start())),
                Arg::I32(hq as i32),
                Arg::I32(d as i32),
                Arg::I32(splits as i32),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }

    /// Causal query tiles per (sequence, q head); eager only: the grid
    /// follows this step's longest chunk.
    pub fn prefill(&self, dim_index: usize) {
        let (cx, gpu, l) = (self.cx, self.cx.gpu, self.l);
        let (hq, d) = (self.spec.num_q_heads, self.spec.head_dim);
        // Versions 2 and wgmma put the query tile last (heaviest tiles of
        // every head first); version 1 has it first.
        let query_tiles_last =
            |rows: usize| (hq as u32, l.seqs as u32, l.max_new.div_ceil(rows) as u32);
        let k = &cx.k.attention;
        let loaded = "the plan picks loaded kernels";
        let (f, grid, threads, smem) = match cx.plan.attention.prefill.get(dim_index) {
            AttnPrefill::Wgmma => {
                let warpgroups = WG_WARPGROUPS[dim_index];
                (
                    k.prefill_wg[dim_index].as_ref().expect(loaded),
                    query_tiles_last(64 * warpgroups),
                    128 * warpgroups as u32,
                    prefill_wg_smem_bytes(warpgroups, d),
                )
            }
            AttnPrefill::V2 => (
                k.prefill_v2[dim_index].as_ref().expect(loaded),
                query_tiles_last(PREFILL_V2_ROWS),
                PREFILL_V2_THREADS,
                prefill_v2_smem_bytes(d),
            ),
            AttnPrefill::V1 => (
                &k.prefill[dim_index],
                (
                    l.max_new.div_ceil(PREFILL_ROWS) as u32,
                    hq as u32,
                    l.seqs as u32,
                ),
                THREADS,
                prefill_smem_bytes(d),
            ),
        };
        gpu.launch(
            f,
            grid,
            threads,
            smem,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(self.q),
                Arg::Ptr(self.k_cache),
                Arg::Ptr(self.v_cache),
                Arg::Ptr(l.seq_start()),
                Arg::Ptr(l.seq_len()),
                Arg::Ptr(l.table_offset()),
                Arg::Ptr(l.block_tables()),
                Arg::I32(hq as i32),
                Arg::I32(self.spec.num_kv_heads as i32),
                Arg::I32(self.block_size as i32),
                Arg::F32(self.scale_log2()),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }

    /// Any head dim up to `MAX_HEAD_DIM`, one block per (q head, token).
    pub fn generic(&self) {
        let (cx, gpu, l) = (self.cx, self.cx.gpu, self.l);
        let (hq, d) = (self.spec.num_q_heads, self.spec.head_dim);
        gpu.launch(
            if self.f32_cache {
                &cx.k.attention.paged_attention_f32
            } else {
                &cx.k.attention.paged_attention
            },
            (hq as u32, l.tokens as u32, 1),
            THREADS,
            ((d + THREADS as usize) * 4) as u32,
            &[
                Arg::Ptr(self.out),
                Arg::Ptr(self.q),
                Arg::Ptr(self.k_cache),
                Arg::Ptr(self.v_cache),
                Arg::Ptr(l.positions()),
                Arg::Ptr(l.token_seq()),
                Arg::Ptr(l.table_offset()),
                Arg::Ptr(l.block_tables()),
                Arg::I32(hq as i32),
                Arg::I32(self.spec.num_kv_heads as i32),
                Arg::I32(d as i32),
                Arg::I32(self.block_size as i32),
                Arg::F32(self.spec.scale),
                Arg::Ptr(self.proj),
                Arg::I32(self.proj_stride as i32),
                Arg::I32(self.gate_offset),
            ],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_splits_depend_on_shape_only() {
        // One long sequence on a 2-kv-head model gets the most splits.
        assert_eq!(decode_splits(264, 1, 2), DECODE_MAX_SPLITS);
        assert_eq!(decode_splits(264, 1, 4), 66);
        // A batch that fills the device is not split.
        assert_eq!(decode_splits(264, 64, 8), 1);
        assert_eq!(decode_splits(264, 8, 4), 8);
        assert_eq!(decode_splits(264, 64, 2), 2);
    }
}

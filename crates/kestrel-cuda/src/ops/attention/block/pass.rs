//! The block pass: every sequence's block rows attend, non-causally, to its
//! store and to the block's own keys staged after it.

use super::*;

/// See `Backend::block_attention`.
pub fn attend(
    cx: &Cx,
    keys: &mut DeviceBlockKeys,
    qkv: &CudaTensor,
    q_norm: &CudaWeight,
    k_norm: &CudaWeight,
    spec: &AttentionSpec,
    first_position: usize,
) -> CudaTensor {
    attend_batch(
        cx,
        &mut [keys],
        qkv,
        q_norm,
        k_norm,
        spec,
        &[first_position],
        qkv.rows,
    )
}

/// See `Backend::block_attention_batch`: each sequence's block read in
/// place from `qkv` and its output written in place into one tensor (no
/// gathers, no concatenation). Head dims with an `attention_block` kernel
/// take one launch for every sequence; the others run each sequence's rows
/// through the decode kernels.
#[allow(clippy::too_many_arguments)]
pub fn attend_batch(
    cx: &Cx,
    keys: &mut [&mut DeviceBlockKeys],
    qkv: &CudaTensor,
    q_norm: &CudaWeight,
    k_norm: &CudaWeight,
    spec: &AttentionSpec,
    first_positions: &[usize],
    block: usize,
) -> CudaTensor {
    kestrel_core::block_attention::check_batch(qkv.rows, keys.len(), first_positions.len(), block);
    let q_width = spec.q_width();
    let out = cx.gpu.alloc::<f32>(qkv.rows * q_width);
    let s = &cx.gpu.stream;
    let rows = RowsAt::all(qkv, s);
    check_rows(rows, q_norm, k_norm, spec);
    let norms = (q_norm, k_norm);
    if qkv.rows == 0 {
        // Nothing to attend.
    } else if let Some(f) = block_kernel(cx, spec.head_dim) {
        attend_blocks(
            cx,
            f,
            keys,
            rows,
            norms,
            spec,
            first_positions,
            block,
            ptr(&out, s),
        );
    } else {
        for (i, (keys, &first)) in keys.iter_mut().zip(first_positions).enumerate() {
            let out_at = ptr(&out, s) + (i * block * q_width * 4) as u64;
            attend_rows(
                cx,
                keys,
                rows.range(i * block, block),
                norms,
                spec,
                first,
                out_at,
            );
        }
    }
    CudaTensor {
        bf16: None,
        rows: qkv.rows,
        cols: q_width,
        buf: out,
    }
}

/// The `attention_block` kernel of head dim `d`, where there is one.
fn block_kernel<'a>(cx: &'a Cx, d: usize) -> Option<&'a CudaFunction> {
    let i = FAST_HEAD_DIMS.iter().position(|&x| x == d)?;
    cx.k.attention.block[i].as_ref()
}

/// Shapes every block attention checks: rows of `[q | k | v]`, q heads a
/// multiple of the kv heads, norms of one head.
fn check_rows(qkv: RowsAt, q_norm: &CudaWeight, k_norm: &CudaWeight, spec: &AttentionSpec) {
    let (hq, d) = (spec.num_q_heads, spec.head_dim);
    assert_eq!(
        qkv.cols,
        spec.q_width() + 2 * spec.kv_width(),
        "block rows must be [q (Hq*D) | k (Hkv*D) | v (Hkv*D)]"
    );
    assert!(
        spec.num_kv_heads > 0 && hq % spec.num_kv_heads == 0,
        "{hq} q heads are not a multiple of {} kv heads",
        spec.num_kv_heads
    );
    assert_eq!(q_norm.numel(), d, "q_norm must have head_dim values");
    assert_eq!(k_norm.numel(), d, "k_norm must have head_dim values");
}

/// Every sequence's `block` rows in three launches: `block_norm_rope_write`
/// forms the q rows and stages each sequence's keys after its store's live
/// rows (as the decode path's `norm_rope_write` does, one sequence at a
/// time), `attention_block` serves every query row of a (sequence, kv head)
/// from the same blocks, which read each K/V tile once for all of them,
/// and the decode path's combine merges the splits.
#[allow(clippy::too_many_arguments)]
fn attend_blocks(
    cx: &Cx,
    f: &CudaFunction,
    keys: &mut [&mut DeviceBlockKeys],
    qkv: RowsAt,
    (q_norm, k_norm): (&CudaWeight, &CudaWeight),
    spec: &AttentionSpec,
    first_positions: &[usize],
    block: usize,
    out: u64,
) {
    let gpu = cx.gpu;
    let s = &gpu.stream;
    let (hq, hkv, d) = (spec.num_q_heads, spec.num_kv_heads, spec.head_dim);
    let (q_width, t) = (spec.q_width(), qkv.rows);
    let seqs = keys.len();
    // Everything the three launches read about the sequences and rows, in
    // one upload (a pass is short enough at batch 1 for the host's calls
    // to set its pace): words of the stores' addresses, then i32 arrays.
    let mut pack = BlockPack::new(seqs, t);
    for (i, (keys, &first)) in keys.iter_mut().zip(first_positions).enumerate() {
        keys.reserve(cx, block);
        let (k, v) = keys.caches(cx);
        let len = keys.hi - keys.lo + block;
        // The block's keys go to the spare slots after the live rows.
        let rows = i * block..(i + 1) * block;
        pack.set_sequence(i, (k, v), keys.lo..keys.lo + len, rows, first, keys.hi);
    }
    let max_len = pack.max_len();
    let packed = gpu.upload(&pack.words);
    let at = |offset: usize| ptr(&packed, s) + (offset * 4) as u64;
    let (k_base, v_base) = (at(pack.k_base), at(pack.v_base));
    let (key_lo, key_len, row_ids) = (at(pack.key_lo), at(pack.key_len), at(pack.row_ids));
    let q = gpu.alloc::<f32>(t * q_width);
    stage_rows(
        cx,
        &pack,
        &packed,
        qkv,
        (ptr(&q, s), hq),
        (q_norm, k_norm),
        spec,
        q_width,
    );
    let row_groups = (block * (hq / hkv)).div_ceil(BLOCK_ATTN_ROWS);
    let splits = block_splits(2 * gpu.sm_count(), hkv * row_groups * seqs, max_len);
    let part_o = gpu.alloc::<f32>(t * hq * splits * d);
    let part_ml = gpu.alloc::<f32>(t * hq * splits * 2);
    gpu.launch(
        f,
        ((hkv * row_groups) as u32, seqs as u32, splits as u32),
        32 * (BLOCK_ATTN_ROWS / 16) as u32,
        block_smem_bytes(d),
        &[Arg::record(&BlockAttentionArgs {
            part_o: ptr(&part_o, s),
            part_ml: ptr(&part_ml, s),
            q: ptr(&q, s),
            k_base,
            v_base,
            key_lo,
            key_len,
            rows: block as i32,
            hq: hq as i32,
            hkv: hkv as i32,
            splits: splits as i32,
            scale_log2: spec.scale * std::f32::consts::LOG2_E,
        })],
    );
    gpu.launch(
        &cx.k.attention.decode_combine,
        (hq as u32, t as u32, 1),
        COMBINE_THREADS,
        0,
        &[
            Arg::Ptr(out),
            Arg::Ptr(ptr(&part_o, s)),
            Arg::Ptr(ptr(&part_ml, s)),
            Arg::Ptr(row_ids),
            Arg::I32(hq as i32),
            Arg::I32(d as i32),
            Arg::I32(splits as i32),
            Arg::Ptr(qkv.ptr),
            Arg::I32(qkv.cols as i32),
            Arg::I32(-1),
        ],
    );
}

/// Key splits of an `attention_block` launch of `blocks` blocks a split
/// over at most `max_keys` keys: about `target` blocks in all, each split
/// at least two key tiles (fewer partials to merge), at most what the
/// combine takes.
fn block_splits(target: usize, blocks: usize, max_keys: usize) -> usize {
    let tiles = max_keys.div_ceil(BLOCK_ATTN_KEYS);
    let most = tiles.div_ceil(2).clamp(1, DECODE_MAX_SPLITS);
    (target / blocks.max(1)).clamp(1, most)
}

/// The block attention of the rows `qkv` into `out` (`[rows, Hq*D]` f32).
fn attend_rows(
    cx: &Cx,
    keys: &mut DeviceBlockKeys,
    qkv: RowsAt,
    (q_norm, k_norm): (&CudaWeight, &CudaWeight),
    spec: &AttentionSpec,
    first_position: usize,
    out: u64,
) {
    let (hq, d) = (spec.num_q_heads, spec.head_dim);
    let q_width = spec.q_width();
    let dim_index = FAST_HEAD_DIMS
        .iter()
        .position(|&x| x == d)
        .expect("a device store has a tensor-core head dim");
    let gpu = cx.gpu;
    let s = &gpu.stream;
    let t = qkv.rows;
    if t == 0 {
        return;
    }
    keys.reserve(cx, t);
    let keys_seen = keys.hi - keys.lo + t;
    let l = keys.layout(cx, t, first_position, keys_seen);
    let caches = keys.caches(cx);
    let q = gpu.alloc::<f32>(t * q_width);
    let norms = (ptr(q_norm.f32("q_norm"), s), ptr(k_norm.f32("k_norm"), s));
    let heads = (hq, q_width);
    norm_rope_write(cx, qkv, ptr(&q, s), caches, norms, &l, spec, heads, false);
    Attend {
        cx,
        spec,
        l: &l,
        out,
        q: ptr(&q, s),
        k_cache: caches.0,
        v_cache: caches.1,
        block_size: 1,
        proj: qkv.ptr,
        proj_stride: qkv.cols,
        gate_offset: -1,
        f32_cache: false,
        new_token: None,
    }
    .decode(dim_index);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_fill_the_device_but_keep_two_tiles_a_split() {
        // z-lab drafter at batch 1: 4 kv heads, 1,040 keys (17 tiles).
        assert_eq!(block_splits(264, 4, 1040), 9);
        // Batch 8: 32 blocks a split.
        assert_eq!(block_splits(264, 32, 1040), 8);
        // A short context is never split below two tiles.
        assert_eq!(block_splits(264, 4, 100), 1);
        assert_eq!(block_splits(264, 4, 0), 1);
        // Many blocks: one split.
        assert_eq!(block_splits(264, 512, 8192), 1);
        // A long window stops at what the combine takes.
        assert_eq!(block_splits(100_000, 1, 1 << 20), DECODE_MAX_SPLITS);
    }
}

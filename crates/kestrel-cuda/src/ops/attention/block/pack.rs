//! The per-call inputs of a batched block pass or append, uploaded as one
//! buffer, and the launch of `block_norm_rope_write` that reads them.

use super::*;

/// `block_norm_rope_write` over the rows of `pack` (uploaded as `packed`):
/// `q` (address, heads) receives the normed and rotated q heads of rows
/// `[q | k | v]` (no q with 0 heads, rows `[k | v]`); every row's key and
/// value go to its sequence's stores, keys from column `k_offset`.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage_rows(
    cx: &Cx,
    pack: &BlockPack,
    packed: &CudaSlice<u32>,
    rows: RowsAt,
    (q, hq): (u64, usize),
    (q_norm, k_norm): (&CudaWeight, &CudaWeight),
    spec: &AttentionSpec,
    k_offset: usize,
) {
    let s = &cx.gpu.stream;
    let (hkv, d) = (spec.num_kv_heads, spec.head_dim);
    let at = |offset: usize| ptr(packed, s) + (offset * 4) as u64;
    cx.gpu.launch(
        &cx.k.attention.block_norm_rope_write,
        (
            rows.rows as u32,
            (hq + 2 * hkv).div_ceil(QKN_WARPS) as u32,
            1,
        ),
        32 * QKN_WARPS as u32,
        ((spec.rope.rotary_dim + QKN_WARPS * d) * 4) as u32,
        &[Arg::record(&BlockNormRopeArgs {
            proj: rows.ptr,
            q_out: q,
            k_base: at(pack.k_base),
            v_base: at(pack.v_base),
            q_norm: ptr(q_norm.f32("q_norm"), s),
            k_norm: ptr(k_norm.f32("k_norm"), s),
            positions: at(pack.positions),
            slot_mapping: at(pack.slots),
            row_seq: at(pack.row_seq),
            proj_stride: rows.cols as i32,
            hq: hq as i32,
            hkv: hkv as i32,
            d: d as i32,
            rotary_dim: spec.rope.rotary_dim as i32,
            theta: spec.rope.theta,
            eps: spec.norm_eps,
            k_offset: k_offset as i32,
            v_offset: (k_offset + spec.kv_width()) as i32,
        })],
    );
}

/// The per-call inputs of a batched block pass (or append) as one buffer
/// of 32-bit words: each sequence's K and V store addresses (two words
/// each, at even offsets), then i32 arrays: its first key's slot and key
/// count; each row's position, store slot and sequence; and each row's
/// index (the combine's "sequence" of a query row is the row itself).
/// Fields are word offsets.
pub(super) struct BlockPack {
    pub(super) words: Vec<u32>,
    pub(super) k_base: usize,
    pub(super) v_base: usize,
    pub(super) key_lo: usize,
    pub(super) key_len: usize,
    pub(super) positions: usize,
    pub(super) slots: usize,
    pub(super) row_seq: usize,
    pub(super) row_ids: usize,
}

impl BlockPack {
    pub(super) fn new(seqs: usize, rows: usize) -> Self {
        let (k_base, v_base) = (0, 2 * seqs);
        let key_lo = 4 * seqs;
        let key_len = key_lo + seqs;
        let positions = key_len + seqs;
        let slots = positions + rows;
        let row_seq = slots + rows;
        let row_ids = row_seq + rows;
        let mut words = vec![0u32; row_ids + rows];
        for (r, w) in words[row_ids..].iter_mut().enumerate() {
            *w = r as u32;
        }
        BlockPack {
            words,
            k_base,
            v_base,
            key_lo,
            key_len,
            positions,
            slots,
            row_seq,
            row_ids,
        }
    }

    /// Sequence `i`: stores at `caches`, keys in the slots `keys`; its
    /// `rows` at positions `first..` going to slots `slot..`.
    pub(super) fn set_sequence(
        &mut self,
        i: usize,
        caches: (u64, u64),
        keys: Range<usize>,
        rows: Range<usize>,
        first: usize,
        slot: usize,
    ) {
        let w = &mut self.words;
        for (base, addr) in [(self.k_base, caches.0), (self.v_base, caches.1)] {
            w[base + 2 * i] = addr as u32;
            w[base + 2 * i + 1] = (addr >> 32) as u32;
        }
        w[self.key_lo + i] = keys.start as u32;
        w[self.key_len + i] = keys.len() as u32;
        for (j, r) in rows.enumerate() {
            w[self.positions + r] = (first + j) as u32;
            w[self.slots + r] = (slot + j) as u32;
            w[self.row_seq + r] = i as u32;
        }
    }

    pub(super) fn max_len(&self) -> usize {
        self.words[self.key_len..self.positions]
            .iter()
            .map(|&l| l as usize)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn the_pack_lays_out_sequences_then_rows() {
        let mut p = BlockPack::new(2, 6);
        p.set_sequence(0, (0x1_0000_0010, 0x2_0000_0020), 5..45, 0..2, 100, 37);
        p.set_sequence(1, (0x30, 0x4_0000_0040), 0..19, 2..6, 7, 16);
        let w = &p.words;
        assert_eq!(&w[p.k_base..p.k_base + 4], &[0x10, 1, 0x30, 0]);
        assert_eq!(&w[p.v_base..p.v_base + 4], &[0x20, 2, 0x40, 4]);
        assert_eq!(&w[p.key_lo..p.key_lo + 2], &[5, 0]);
        assert_eq!(&w[p.key_len..p.key_len + 2], &[40, 19]);
        assert_eq!(&w[p.positions..p.slots], &[100, 101, 7, 8, 9, 10]);
        assert_eq!(&w[p.slots..p.row_seq], &[37, 38, 16, 17, 18, 19]);
        assert_eq!(&w[p.row_seq..p.row_ids], &[0, 0, 1, 1, 1, 1]);
        assert_eq!(&w[p.row_ids..], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(w.len(), p.row_ids + 6);
        assert_eq!(p.max_len(), 40);
        // The address arrays are 8-byte aligned in the buffer.
        assert!(p.k_base.is_multiple_of(2) && p.v_base.is_multiple_of(2));
    }
}

//! Keys and values kept outside the paged cache, and non-causal attention of
//! a block of rows over them: what a block drafter (DFlash) runs each step.
//!
//! The store is one layer's bf16 K and V in the paged cache's row layout
//! (`[slot, Hkv, D]`), its live rows a contiguous run of slots `lo..hi`. A
//! block pass stages its own keys in the spare slots right after `hi` (the
//! next append overwrites them), and every one of its rows sees the whole
//! run, which makes the attention non-causal. Order of keys does not matter
//! to a softmax, and RoPE is applied before a key is stored, so slots need
//! not follow positions.
//!
//! At head dims up to `BLOCK_ATTENTION_MAX_HEAD_DIM` one `attention_block`
//! launch serves every sequence of a pass: a block takes all query rows of
//! one (sequence, kv head), so each K/V tile is read once for the block's
//! rows and the q heads of the group (the decode kernels, which take one
//! query row as one sequence, read it once per row and need a launch per
//! sequence). Other tensor-core head dims run the rows through the decode
//! kernels, reading the store through an identity block table with pages
//! of one slot.
//!
//! The f32 precision mode (whose caches are f32) and head dims without a
//! tensor-core kernel keep the rows on the host instead.

use std::ops::Range;

use cudarc::driver::{CudaFunction, CudaSlice};
use kestrel_core::AttentionSpec;
use kestrel_core::block_attention::HostBlockKeys;
use kestrel_kernels::abi::{BlockAttentionArgs, BlockNormRopeArgs};

use super::attend::Attend;
use super::kernels::{
    BLOCK_ATTN_KEYS, BLOCK_ATTN_ROWS, COMBINE_THREADS, DECODE_MAX_SPLITS, QKN_WARPS,
    block_smem_bytes,
};
use crate::context::Cx;
use crate::device::ptr;
use crate::launch::Arg;
use crate::plan::FAST_HEAD_DIMS;
use crate::precision::Precision;
use crate::step::StepLayout;
use crate::tensor::{CudaTensor, CudaWeight};

/// One layer's keys and values outside the paged cache.
pub enum CudaBlockKeys {
    Device(DeviceBlockKeys),
    Host(HostBlockKeys),
}

impl CudaBlockKeys {
    pub fn new(cx: &Cx, spec: &AttentionSpec) -> Self {
        let fast = FAST_HEAD_DIMS.contains(&spec.head_dim);
        if fast && cx.plan.precision != Precision::F32 {
            CudaBlockKeys::Device(DeviceBlockKeys::empty(spec))
        } else {
            CudaBlockKeys::Host(HostBlockKeys::new(spec))
        }
    }

    pub fn len(&self) -> usize {
        match self {
            CudaBlockKeys::Device(d) => d.hi - d.lo,
            CudaBlockKeys::Host(h) => h.len(),
        }
    }

    /// The device stores of `keys` when there are several and every one is
    /// on the device: what the batched launches take (otherwise each store
    /// goes its own way).
    pub fn batch_on_device<'a>(
        keys: &'a mut [&mut CudaBlockKeys],
    ) -> Option<Vec<&'a mut DeviceBlockKeys>> {
        let on_device = keys.iter().all(|k| matches!(**k, CudaBlockKeys::Device(_)));
        if !on_device || keys.len() < 2 {
            return None;
        }
        let device = keys.iter_mut().filter_map(|k| match &mut **k {
            CudaBlockKeys::Device(d) => Some(d),
            CudaBlockKeys::Host(_) => None,
        });
        Some(device.collect())
    }

    pub fn keep(&mut self, range: Range<usize>) {
        match self {
            CudaBlockKeys::Device(d) => d.keep(range),
            CudaBlockKeys::Host(h) => h.keep(range),
        }
    }
}

/// bf16 K and V `[capacity, Hkv, D]`, live slots `lo..hi`.
pub struct DeviceBlockKeys {
    k: Option<CudaSlice<u16>>,
    v: Option<CudaSlice<u16>>,
    /// `0..capacity`: the block table that maps key i of a row to slot
    /// `lo + i` (the row's table offset is `lo`).
    identity: Option<CudaSlice<i32>>,
    capacity: usize,
    lo: usize,
    hi: usize,
    /// Elements of one slot: `Hkv * D`.
    width: usize,
}

impl DeviceBlockKeys {
    fn empty(spec: &AttentionSpec) -> Self {
        DeviceBlockKeys {
            k: None,
            v: None,
            identity: None,
            capacity: 0,
            lo: 0,
            hi: 0,
            width: spec.kv_width(),
        }
    }

    fn keep(&mut self, range: Range<usize>) {
        let len = self.hi - self.lo;
        assert!(
            range.start <= range.end && range.end <= len,
            "keeping rows {range:?} of {len}"
        );
        self.hi = self.lo + range.end;
        self.lo += range.start;
    }

    /// Room for `extra` slots after `hi`. When there is none, the live rows
    /// move to a new store of twice what they and `extra` need, so that a
    /// context growing one token at a time is copied about once per row
    /// kept (and a windowed one stays within twice its window).
    fn reserve(&mut self, cx: &Cx, extra: usize) {
        if self.hi + extra <= self.capacity {
            return;
        }
        let gpu = cx.gpu;
        let s = &gpu.stream;
        let live = self.hi - self.lo;
        let capacity = (2 * (live + extra)).max(64).next_multiple_of(64);
        let (k, v) = (
            gpu.alloc::<u16>(capacity * self.width),
            gpu.alloc::<u16>(capacity * self.width),
        );
        if let (Some(old_k), Some(old_v)) = (&self.k, &self.v)
            && live > 0
        {
            let (from, bytes) = (self.lo * self.width * 2, live * self.width * 2);
            gpu.copy_dtod(ptr(&k, s), ptr(old_k, s) + from as u64, bytes);
            gpu.copy_dtod(ptr(&v, s), ptr(old_v, s) + from as u64, bytes);
        }
        let identity: Vec<i32> = (0..capacity as i32).collect();
        self.identity = Some(gpu.upload(&identity));
        self.k = Some(k);
        self.v = Some(v);
        self.capacity = capacity;
        self.lo = 0;
        self.hi = live;
    }

    fn caches(&self, cx: &Cx) -> (u64, u64) {
        let s = &cx.gpu.stream;
        let k = self.k.as_ref().expect("a reserved store");
        let v = self.v.as_ref().expect("a reserved store");
        (ptr(k, s), ptr(v, s))
    }

    /// The layout of `rows` new rows at positions `first_position..`,
    /// stored at slots `hi..hi + rows`, each attending to the slots
    /// `lo .. lo + keys` (decode-row sections of one sequence).
    fn layout(&self, cx: &Cx, rows: usize, first_position: usize, keys: usize) -> StepLayout {
        let identity = self.identity.as_ref().expect("a reserved store");
        StepLayout::block_rows(
            cx.gpu,
            first_position..first_position + rows,
            self.hi..self.hi + rows,
            self.lo,
            keys,
            ptr(identity, &cx.gpu.stream),
        )
    }
}

/// RMSNorm + RoPE of the q and k heads of `proj` rows and the cache write of
/// k and v (`qk_norm_rope_kv_write`, its f32-cache form with `f32_cache`):
/// `heads` is `(hq, k_offset)`, the q heads to form (0: keys and values
/// only) and the column where k starts (v follows it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn norm_rope_write(
    cx: &Cx,
    proj: RowsAt,
    q_out: u64,
    caches: (u64, u64),
    norms: (u64, u64),
    l: &StepLayout,
    spec: &AttentionSpec,
    heads: (usize, usize),
    f32_cache: bool,
) {
    let (hq, k_offset) = heads;
    let (hkv, d) = (spec.num_kv_heads, spec.head_dim);
    let k = &cx.k.attention;
    cx.gpu.launch(
        if f32_cache {
            &k.qk_norm_rope_kv_write_f32
        } else {
            &k.qk_norm_rope_kv_write
        },
        (
            proj.rows as u32,
            (hq + 2 * hkv).div_ceil(QKN_WARPS) as u32,
            1,
        ),
        32 * QKN_WARPS as u32,
        ((spec.rope.rotary_dim + QKN_WARPS * d) * 4) as u32,
        &[
            Arg::Ptr(proj.ptr),
            Arg::I32(proj.cols as i32),
            Arg::Ptr(q_out),
            Arg::Ptr(caches.0),
            Arg::Ptr(caches.1),
            Arg::Ptr(norms.0),
            Arg::Ptr(norms.1),
            Arg::Ptr(l.positions()),
            Arg::Ptr(l.slot_mapping()),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            Arg::I32(d as i32),
            Arg::I32(spec.rope.rotary_dim as i32),
            Arg::F32(spec.rope.theta),
            Arg::F32(spec.norm_eps),
            Arg::I32(k_offset as i32),
            Arg::I32((k_offset + spec.kv_width()) as i32),
        ],
    );
}

/// Shapes every append checks: rows of `[k | v]`, a norm of one head.
fn check_kv_rows(kv: &CudaTensor, k_norm: &CudaWeight, spec: &AttentionSpec) {
    assert_eq!(
        kv.cols,
        2 * spec.kv_width(),
        "key/value rows must be [k (Hkv*D) | v (Hkv*D)]"
    );
    assert_eq!(
        k_norm.numel(),
        spec.head_dim,
        "k_norm must have head_dim values"
    );
}

/// See `Backend::append_block_keys`.
pub fn append(
    cx: &Cx,
    keys: &mut DeviceBlockKeys,
    kv: &CudaTensor,
    k_norm: &CudaWeight,
    spec: &AttentionSpec,
    first_position: usize,
) {
    check_kv_rows(kv, k_norm, spec);
    if kv.rows == 0 {
        return;
    }
    keys.reserve(cx, kv.rows);
    let l = keys.layout(cx, kv.rows, first_position, 0);
    let s = &cx.gpu.stream;
    let k_norm = ptr(k_norm.f32("k_norm"), s);
    let caches = keys.caches(cx);
    let kv = RowsAt::all(kv, s);
    norm_rope_write(cx, kv, 0, caches, (k_norm, k_norm), &l, spec, (0, 0), false);
    keys.hi += kv.rows;
}

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

/// `block_norm_rope_write` over the rows of `pack` (uploaded as `packed`):
/// `q` (address, heads) receives the normed and rotated q heads of rows
/// `[q | k | v]` (no q with 0 heads, rows `[k | v]`); every row's key and
/// value go to its sequence's stores, keys from column `k_offset`.
#[allow(clippy::too_many_arguments)]
fn stage_rows(
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

/// See `Backend::append_block_keys_batch`: every store's rows in one
/// `block_norm_rope_write` launch.
pub fn append_batch(
    cx: &Cx,
    keys: &mut [&mut DeviceBlockKeys],
    kv: &CudaTensor,
    k_norm: &CudaWeight,
    spec: &AttentionSpec,
    first_positions: &[usize],
    counts: &[usize],
) {
    kestrel_core::block_attention::check_append_batch(
        kv.rows,
        keys.len(),
        first_positions.len(),
        counts,
    );
    check_kv_rows(kv, k_norm, spec);
    if kv.rows == 0 {
        return;
    }
    let mut pack = BlockPack::new(keys.len(), kv.rows);
    let mut start = 0;
    for (i, ((keys, &first), &n)) in keys.iter_mut().zip(first_positions).zip(counts).enumerate() {
        keys.reserve(cx, n);
        let (k, v) = keys.caches(cx);
        pack.set_sequence(
            i,
            (k, v),
            keys.lo..keys.hi,
            start..start + n,
            first,
            keys.hi,
        );
        start += n;
    }
    let packed = cx.gpu.upload(&pack.words);
    let rows = RowsAt::all(kv, &cx.gpu.stream);
    stage_rows(cx, &pack, &packed, rows, (0, 0), (k_norm, k_norm), spec, 0);
    for (keys, &n) in keys.iter_mut().zip(counts) {
        keys.hi += n;
    }
}

/// The per-call inputs of a batched block pass (or append) as one buffer
/// of 32-bit words: each sequence's K and V store addresses (two words
/// each, at even offsets), then i32 arrays: its first key's slot and key
/// count; each row's position, store slot and sequence; and each row's
/// index (the combine's "sequence" of a query row is the row itself).
/// Fields are word offsets.
struct BlockPack {
    words: Vec<u32>,
    k_base: usize,
    v_base: usize,
    key_lo: usize,
    key_len: usize,
    positions: usize,
    slots: usize,
    row_seq: usize,
    row_ids: usize,
}

impl BlockPack {
    fn new(seqs: usize, rows: usize) -> Self {
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
    fn set_sequence(
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

    fn max_len(&self) -> usize {
        self.words[self.key_len..self.positions]
            .iter()
            .map(|&l| l as usize)
            .max()
            .unwrap_or(0)
    }
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

/// Rows of a device matrix of f32 in place: `rows` rows of `cols` values
/// from the address `ptr`.
#[derive(Clone, Copy)]
pub(crate) struct RowsAt {
    pub ptr: u64,
    pub rows: usize,
    pub cols: usize,
}

impl RowsAt {
    pub fn all(t: &CudaTensor, s: &cudarc::driver::CudaStream) -> Self {
        RowsAt {
            ptr: ptr(&t.buf, s),
            rows: t.rows,
            cols: t.cols,
        }
    }

    /// `rows` of these rows from row `first`.
    pub fn range(self, first: usize, rows: usize) -> Self {
        assert!(
            first + rows <= self.rows,
            "rows {first}..{} of {}",
            first + rows,
            self.rows
        );
        RowsAt {
            ptr: self.ptr + (first * self.cols * 4) as u64,
            rows,
            cols: self.cols,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pack_lays_out_sequences_then_rows() {
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

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
//!
//! Here: the stores and their appends; `pass.rs` the block pass, `pack.rs`
//! the per-call inputs both upload.

mod pack;
mod pass;

use std::ops::Range;

use cudarc::driver::{CudaFunction, CudaSlice};
use kestrel_core::AttentionSpec;
use kestrel_core::block_attention::HostBlockKeys;

use kestrel_kernels::abi::{BlockAttentionArgs, BlockNormRopeArgs};
use pack::{BlockPack, stage_rows};
pub use pass::{attend, attend_batch};

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

//! The layout of one forward step on the device: token ids, positions, KV
//! slots, sequence boundaries, state slots and block tables, packed into one
//! i32 buffer and uploaded once per step instead of once per layer.
//!
//! During [`Backend::run_step`](kestrel_core::Backend::run_step) the layout
//! lives in a persistent buffer whose address does not change from step to
//! step, so that recorded (graph-replayed) steps read the current step's
//! values. Sections sit at offsets that depend only on the number of tokens
//! and sequences, with the variable-length block tables last.
//! The backend hands the step in progress to the operations it runs
//! ([`ActiveStep`], in the operations' context); operations called outside
//! a step (tests, direct calls) get a temporary layout built for their batch.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use kestrel_core::ForwardBatch;

use crate::device::{Gpu, check, ptr};

/// Device addresses of one step's packed layout. Every section is i32.
pub struct StepLayout {
    base: u64,
    pub tokens: usize,
    pub seqs: usize,
    /// Largest number of new tokens of one sequence: a host-side hint for
    /// sizing launches of prefill kernels; kernels of decode steps (which may
    /// be replayed with other lengths) must read lengths from `seq_len`.
    pub max_new: usize,
    /// Some chunk of the step is prompt tokens ([`kestrel_core::SeqChunk::prompt`]).
    pub prompt: bool,
    /// Keeps a temporary layout's buffer alive (`None` for the step buffer).
    _owned: Option<CudaSlice<i32>>,
    /// Block tables held elsewhere (`block_rows`); `None`: packed last.
    tables: Option<u64>,
}

impl StepLayout {
    fn at(&self, elems: usize) -> u64 {
        self.base + (elems * 4) as u64
    }
    /// Token ids `[T]`.
    pub fn ids(&self) -> u64 {
        self.at(0)
    }
    /// Absolute position of each new token `[T]`.
    pub fn positions(&self) -> u64 {
        self.at(self.tokens)
    }
    /// Sequence index of each new token `[T]`.
    pub fn token_seq(&self) -> u64 {
        self.at(2 * self.tokens)
    }
    /// KV cache slot (`page * block_size + offset`) of each new token `[T]`.
    pub fn slot_mapping(&self) -> u64 {
        self.at(3 * self.tokens)
    }
    /// First new token of each sequence, plus the total `[S + 1]`.
    pub fn seq_start(&self) -> u64 {
        self.at(4 * self.tokens)
    }
    /// Cached + new tokens of each sequence `[S]`.
    pub fn seq_len(&self) -> u64 {
        self.at(4 * self.tokens + self.seqs + 1)
    }
    /// Recurrent-state slot of each sequence `[S]`.
    pub fn seq_slot(&self) -> u64 {
        self.at(4 * self.tokens + 2 * self.seqs + 1)
    }
    /// Offset of each sequence's block table in `block_tables` `[S]`.
    pub fn table_offset(&self) -> u64 {
        self.at(4 * self.tokens + 3 * self.seqs + 1)
    }
    /// The state slot that also receives the recurrent and conv state after
    /// each new token, or -1 (`SeqChunk::state_checkpoints`) `[T]`.
    pub fn token_checkpoint(&self) -> u64 {
        self.at(4 * self.tokens + 4 * self.seqs + 1)
    }
    /// The new tokens as sequences of one token each, for kernels that give
    /// every query row decode arithmetic (a verify chunk's rows attend as
    /// consecutive decode steps would): `0..=T` `[T + 1]`.
    pub fn row_start(&self) -> u64 {
        self.at(5 * self.tokens + 4 * self.seqs + 1)
    }
    /// Positions each row attends to, its own included: `position + 1` `[T]`.
    pub fn row_len(&self) -> u64 {
        self.at(6 * self.tokens + 4 * self.seqs + 2)
    }
    /// The block table offset of each row's sequence `[T]`.
    pub fn row_table_offset(&self) -> u64 {
        self.at(7 * self.tokens + 4 * self.seqs + 2)
    }
    /// Every sequence's pages, concatenated.
    pub fn block_tables(&self) -> u64 {
        self.tables
            .unwrap_or_else(|| self.at(8 * self.tokens + 4 * self.seqs + 2))
    }

    /// A layout for rows outside the paged cache (a block drafter's, see
    /// `ops::attention::block`): one sequence whose new rows sit at
    /// `positions` and are written to `slots`, and in whose decode-row
    /// sections every row attends to the `keys` keys from table offset
    /// `table_offset` of `tables`, its own row included or not.
    pub fn block_rows(
        gpu: &Gpu,
        positions: std::ops::Range<usize>,
        slots: std::ops::Range<usize>,
        table_offset: usize,
        keys: usize,
        tables: u64,
    ) -> StepLayout {
        let t = positions.len();
        let v = block_rows_values(positions, slots, table_offset, keys);
        let buf = gpu.upload(&v);
        StepLayout {
            base: ptr(&buf, &gpu.stream),
            tokens: t,
            seqs: 1,
            max_new: t,
            prompt: false,
            _owned: Some(buf),
            tables: Some(tables),
        }
    }
}

/// The packed sections of [`StepLayout::block_rows`] (no block tables).
fn block_rows_values(
    positions: std::ops::Range<usize>,
    slots: std::ops::Range<usize>,
    table_offset: usize,
    keys: usize,
) -> Vec<i32> {
    let t = positions.len();
    assert_eq!(slots.len(), t, "one slot per new row");
    let (offset, keys) = (table_offset as i32, keys as i32);
    let mut v = Vec::with_capacity(8 * t + 6);
    v.resize(t, 0);
    v.extend(positions.map(|p| p as i32));
    v.resize(3 * t, 0);
    v.extend(slots.map(|p| p as i32));
    v.extend([0, t as i32, keys, 0, offset]);
    v.resize(5 * t + 5, -1);
    v.extend(0..=t as i32);
    v.resize(7 * t + 6, keys);
    v.resize(8 * t + 6, offset);
    v
}

/// The packed host values and the hints of a layout.
struct Packed {
    values: Vec<i32>,
    tokens: usize,
    seqs: usize,
    max_new: usize,
    prompt: bool,
}

fn pack(ids: Option<&[u32]>, batch: &ForwardBatch, block_size: usize) -> Packed {
    let (t, s) = (batch.num_tokens(), batch.seqs.len());
    let pages: usize = batch.seqs.iter().map(|q| q.block_table.len()).sum();
    let mut v = Vec::with_capacity(8 * t + 4 * s + 2 + pages);
    match ids {
        Some(ids) => {
            assert_eq!(ids.len(), t, "{} token ids for {t} new tokens", ids.len());
            v.extend(ids.iter().map(|&i| i as i32));
        }
        None => v.resize(t, 0),
    }
    v.extend(batch.positions().iter().map(|&p| p as i32));
    for (i, q) in batch.seqs.iter().enumerate() {
        v.extend(std::iter::repeat_n(i as i32, q.num_tokens));
    }
    for q in &batch.seqs {
        for pos in q.cached_len..q.total_len() {
            // Pages a sequence lacks are reported by the operations that
            // need them (attention); here they map to slot -1.
            let slot = q
                .block_table
                .get(pos / block_size)
                .map_or(-1, |&p| (p as usize * block_size + pos % block_size) as i32);
            v.push(slot);
        }
    }
    let mut start = 0;
    v.push(0);
    for q in &batch.seqs {
        start += q.num_tokens as i32;
        v.push(start);
    }
    v.extend(batch.seqs.iter().map(|q| q.total_len() as i32));
    v.extend(batch.seqs.iter().map(|q| q.state_slot as i32));
    let mut offsets = Vec::with_capacity(s);
    let mut offset = 0;
    for q in &batch.seqs {
        offsets.push(offset);
        offset += q.block_table.len() as i32;
    }
    v.extend(&offsets);
    for q in &batch.seqs {
        let first = v.len();
        let checkpoints = q.state_checkpoints.iter().map(|&c| c as i32);
        v.extend(checkpoints.chain(std::iter::repeat(-1)).take(q.num_tokens));
        if let Some(snap) = q.state_snapshot
            && let Some(slot) = snap.slot
        {
            v[first + snap.after - 1] = slot as i32;
        }
    }
    v.extend(0..=t as i32);
    v.extend(batch.positions().iter().map(|&p| p as i32 + 1));
    for (q, &o) in batch.seqs.iter().zip(&offsets) {
        v.extend(std::iter::repeat_n(o, q.num_tokens));
    }
    for q in &batch.seqs {
        v.extend(q.block_table.iter().map(|&p| p as i32));
    }
    Packed {
        values: v,
        tokens: t,
        seqs: s,
        max_new: batch.seqs.iter().map(|q| q.num_tokens).max().unwrap_or(0),
        prompt: batch.seqs.iter().any(|q| q.prompt),
    }
}

/// The step in progress: its layout and the page size it was packed for.
#[derive(Clone)]
pub struct ActiveStep {
    pub layout: Arc<StepLayout>,
    pub block_size: usize,
}

impl ActiveStep {
    /// The step's layout for an operation on `batch`. Inside
    /// [`run_step`](kestrel_core::Backend::run_step) every operation works on
    /// the step's batch (the trait's contract); a batch of another shape is
    /// a caller's bug, refused here rather than computed on the wrong layout.
    pub fn layout_for(&self, batch: &ForwardBatch, block_size: usize) -> Arc<StepLayout> {
        let l = &self.layout;
        assert!(
            batch.num_tokens() == l.tokens
                && batch.seqs.len() == l.seqs
                && block_size == self.block_size,
            "an operation inside a step got a batch of {} tokens in {} sequences \
             (block size {block_size}), not the step's {} in {} (block size {})",
            batch.num_tokens(),
            batch.seqs.len(),
            l.tokens,
            l.seqs,
            self.block_size
        );
        l.clone()
    }
}

/// A layout of `batch` uploaded now, for operations called outside a step.
pub fn temporary_layout(gpu: &Gpu, batch: &ForwardBatch, block_size: usize) -> Arc<StepLayout> {
    let p = pack(None, batch, block_size);
    let buf = gpu.upload(&p.values);
    Arc::new(StepLayout {
        base: ptr(&buf, &gpu.stream),
        tokens: p.tokens,
        seqs: p.seqs,
        max_new: p.max_new,
        prompt: p.prompt,
        _owned: Some(buf),
        tables: None,
    })
}

/// The persistent step buffer and the step in progress.
#[derive(Default)]
pub struct StepState {
    store: Option<CudaSlice<i32>>,
    /// Bumped whenever the store moves: recordings made before read stale addresses.
    pub generation: u64,
    active: Option<ActiveStep>,
}

impl StepState {
    /// Stage `batch` (new tokens `ids`) for the operations of one step.
    pub fn begin(&mut self, gpu: &Gpu, ids: &[u32], batch: &ForwardBatch, block_size: usize) {
        let p = pack(Some(ids), batch, block_size);
        let need = p.values.len().max(1);
        if self.store.as_ref().is_none_or(|s| s.len() < need) {
            let old = self.store.as_ref().map_or(0, |s| s.len());
            let cap = need.max(2 * old).max(1 << 16);
            self.store = Some(gpu.alloc_zeros::<i32>(cap));
            self.generation += 1;
        }
        let store = self.store.as_mut().unwrap();
        check(
            gpu.stream
                .memcpy_htod(&p.values, &mut store.slice_mut(..p.values.len())),
            "uploading the step layout",
        );
        let base = ptr(store, &gpu.stream);
        self.active = Some(ActiveStep {
            block_size,
            layout: Arc::new(StepLayout {
                base,
                tokens: p.tokens,
                seqs: p.seqs,
                max_new: p.max_new,
                prompt: p.prompt,
                _owned: None,
                tables: None,
            }),
        });
    }

    pub fn end(&mut self) {
        self.active = None;
    }

    /// The step in progress, if any.
    pub fn active(&self) -> Option<ActiveStep> {
        self.active.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kestrel_core::SeqChunk;

    #[test]
    fn sections_are_where_the_accessors_say() {
        let batch = ForwardBatch {
            seqs: vec![
                SeqChunk {
                    prompt: false,
                    num_tokens: 3,
                    cached_len: 2,
                    block_table: vec![7, 9],
                    state_slot: 4,
                    state_checkpoints: vec![8, 6],
                    state_snapshot: None,
                },
                SeqChunk {
                    prompt: false,
                    num_tokens: 1,
                    cached_len: 0,
                    block_table: vec![5],
                    state_slot: 1,
                    state_checkpoints: Vec::new(),
                    state_snapshot: None,
                },
            ],
        };
        let p = pack(Some(&[10, 11, 12, 13]), &batch, 4);
        let l = StepLayout {
            base: 0,
            tokens: p.tokens,
            seqs: p.seqs,
            max_new: p.max_new,
            prompt: p.prompt,
            _owned: None,
            tables: None,
        };
        let sec = |addr: u64, n: usize| p.values[addr as usize / 4..][..n].to_vec();
        assert_eq!(sec(l.ids(), 4), [10, 11, 12, 13]);
        assert_eq!(sec(l.positions(), 4), [2, 3, 4, 0]);
        assert_eq!(sec(l.token_seq(), 4), [0, 0, 0, 1]);
        assert_eq!(sec(l.slot_mapping(), 4), [30, 31, 36, 20]);
        assert_eq!(sec(l.seq_start(), 3), [0, 3, 4]);
        assert_eq!(sec(l.seq_len(), 2), [5, 1]);
        assert_eq!(sec(l.seq_slot(), 2), [4, 1]);
        assert_eq!(sec(l.table_offset(), 2), [0, 2]);
        assert_eq!(sec(l.token_checkpoint(), 4), [8, 6, -1, -1]);
        assert_eq!(sec(l.row_start(), 5), [0, 1, 2, 3, 4]);
        assert_eq!(sec(l.row_len(), 4), [3, 4, 5, 1]);
        assert_eq!(sec(l.row_table_offset(), 4), [0, 0, 0, 2]);
        assert_eq!(sec(l.block_tables(), 3), [7, 9, 5]);
        assert_eq!(p.values.len(), 8 * 4 + 4 * 2 + 2 + 3);
        assert_eq!(l.max_new, 3);
    }

    #[test]
    fn block_rows_sections_are_where_the_accessors_say() {
        let v = block_rows_values(7..10, 20..23, 5, 12);
        let l = StepLayout {
            base: 0,
            tokens: 3,
            seqs: 1,
            max_new: 3,
            prompt: false,
            _owned: None,
            tables: Some(0),
        };
        let sec = |addr: u64, n: usize| v[addr as usize / 4..][..n].to_vec();
        assert_eq!(sec(l.positions(), 3), [7, 8, 9]);
        assert_eq!(sec(l.token_seq(), 3), [0, 0, 0]);
        assert_eq!(sec(l.slot_mapping(), 3), [20, 21, 22]);
        assert_eq!(sec(l.seq_start(), 2), [0, 3]);
        assert_eq!(sec(l.seq_len(), 1), [12]);
        assert_eq!(sec(l.table_offset(), 1), [5]);
        assert_eq!(sec(l.token_checkpoint(), 3), [-1, -1, -1]);
        assert_eq!(sec(l.row_start(), 4), [0, 1, 2, 3]);
        assert_eq!(sec(l.row_len(), 3), [12, 12, 12]);
        assert_eq!(sec(l.row_table_offset(), 3), [5, 5, 5]);
        assert_eq!(v.len(), 8 * 3 + 4 + 2);
    }
}

//! Paged KV pools (bf16, or f32 under `Precision::F32`) and Gated DeltaNet
//! state slots (f32) of every layer.
//!
//! KV pool layout per attention layer: `[num_blocks * block_size, Hkv, D]`, so a
//! cache slot is `page * block_size + offset`. Per GDN layer: conv state
//! `[slots, conv_dim, kernel - 1]` (oldest input first) and recurrent state
//! `[slots, Hv, Dk, Dv]`.

use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::CudaSlice;
use kestrel_core::{BackendError, CacheSpec, ForwardBatch, Result};

use crate::device::{Gpu, ptr};
use crate::precision::Precision;

pub struct CudaCache {
    /// Unique per cache of this process: recorded steps name the cache they read.
    pub id: u64,
    pub spec: CacheSpec,
    /// The KV element type, fixed at creation. The pools below are raw
    /// storage of 16-bit words (two per element when f32).
    pub kv_precision: Precision,
    pub k: Vec<CudaSlice<u16>>,
    pub v: Vec<CudaSlice<u16>>,
    pub conv: Vec<CudaSlice<f32>>,
    pub recurrent: Vec<CudaSlice<f32>>,
}

impl CudaCache {
    pub fn new(gpu: &Gpu, spec: &CacheSpec, kv_precision: Precision) -> Result<Self> {
        let kv_len = spec.num_blocks * spec.block_size * spec.num_kv_heads * spec.head_dim;
        let kv_words = kv_len * kv_precision.kv_bytes() / 2;
        let (conv_len, rec_len) = match (&spec.gdn, spec.gdn_layers) {
            (_, 0) => (0, 0),
            (Some(g), _) => (
                spec.num_state_slots * g.conv_state_len(),
                spec.num_state_slots * g.recurrent_state_len(),
            ),
            (None, n) => {
                return Err(BackendError::Invalid(format!(
                    "{n} GDN layers requested without a GdnSpec"
                )));
            }
        };
        let bytes = spec.bytes(kv_precision.kv_bytes());
        let (free, _) = gpu
            .ctx
            .mem_get_info()
            .map_err(|e| BackendError::Unavailable(format!("querying device memory: {e:?}")))?;
        if bytes > free {
            return Err(BackendError::OutOfMemory(format!(
                "cache needs {bytes} bytes, {free} free"
            )));
        }
        let zeros_u16 = |n: usize| gpu.alloc_zeros::<u16>(n);
        let zeros_f32 = |n: usize| gpu.alloc_zeros::<f32>(n);
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Ok(CudaCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            spec: spec.clone(),
            kv_precision,
            k: (0..spec.attn_layers).map(|_| zeros_u16(kv_words)).collect(),
            v: (0..spec.attn_layers).map(|_| zeros_u16(kv_words)).collect(),
            conv: (0..spec.gdn_layers).map(|_| zeros_f32(conv_len)).collect(),
            recurrent: (0..spec.gdn_layers).map(|_| zeros_f32(rec_len)).collect(),
        })
    }

    /// Panics with a clear message when `batch` names pages or state slots
    /// this cache does not have (kernels would read out of bounds).
    pub fn check_batch(&self, batch: &ForwardBatch) {
        if self.spec.attn_layers > 0 {
            self.check_pages(batch);
        }
        if self.spec.gdn_layers > 0 {
            self.check_slots(batch);
        }
    }

    /// Every sequence lists the pages its tokens need, all in range.
    pub fn check_pages(&self, batch: &ForwardBatch) {
        let bs = self.spec.block_size;
        for (s, seq) in batch.seqs.iter().enumerate() {
            let pages_needed = seq.total_len().div_ceil(bs);
            assert!(
                seq.block_table.len() >= pages_needed,
                "sequence {s} holds {} tokens but its block table has {} of {pages_needed} pages",
                seq.total_len(),
                seq.block_table.len()
            );
            if let Some(&bad) = seq
                .block_table
                .iter()
                .find(|&&p| p as usize >= self.spec.num_blocks)
            {
                panic!("page {bad} out of range ({} pages)", self.spec.num_blocks);
            }
        }
    }

    /// Every sequence's state slot is in range and its own: the kernels
    /// update each sequence's state in place, in parallel.
    pub fn check_slots(&self, batch: &ForwardBatch) {
        let mut seen = vec![false; self.spec.num_state_slots];
        for seq in &batch.seqs {
            assert!(
                seq.state_checkpoints.len() <= seq.num_tokens,
                "{} state checkpoints for {} new tokens",
                seq.state_checkpoints.len(),
                seq.num_tokens
            );
            if let Some(snap) = seq.state_snapshot {
                assert!(
                    0 < snap.after
                        && snap.after < seq.num_tokens
                        && seq.state_checkpoints.is_empty(),
                    "a state snapshot after {} of {} new tokens (with {} checkpoints)",
                    snap.after,
                    seq.num_tokens,
                    seq.state_checkpoints.len()
                );
            }
            let snapshot = seq.state_snapshot.and_then(|snap| snap.slot);
            for &slot in std::iter::once(&seq.state_slot)
                .chain(&seq.state_checkpoints)
                .chain(snapshot.as_ref())
            {
                self.check_slot(slot);
                let slot = slot as usize;
                assert!(
                    !seen[slot],
                    "state slot {slot} is written twice in one step"
                );
                seen[slot] = true;
            }
        }
    }

    fn check_slot(&self, slot: u32) {
        assert!(
            (slot as usize) < self.spec.num_state_slots,
            "state slot {slot} out of range ({} slots)",
            self.spec.num_state_slots
        );
    }

    pub fn zero_state(&mut self, gpu: &Gpu, slot: u32) {
        let Some(g) = self.spec.gdn else { return };
        self.check_slot(slot);
        let s = slot as usize;
        let (cl, rl) = (g.conv_state_len(), g.recurrent_state_len());
        for buf in &self.conv {
            gpu.fill_bytes(ptr(buf, &gpu.stream) + (s * cl * 4) as u64, 0, cl * 4);
        }
        for buf in &self.recurrent {
            gpu.fill_bytes(ptr(buf, &gpu.stream) + (s * rl * 4) as u64, 0, rl * 4);
        }
    }

    pub fn copy_state(&mut self, gpu: &Gpu, src: u32, dst: u32) {
        let Some(g) = self.spec.gdn else { return };
        self.check_slot(src);
        self.check_slot(dst);
        if src == dst {
            return;
        }
        let (s, d) = (src as usize, dst as usize);
        for (bufs, len) in [
            (&self.conv, g.conv_state_len()),
            (&self.recurrent, g.recurrent_state_len()),
        ] {
            for buf in bufs {
                let base = ptr(buf, &gpu.stream);
                gpu.copy_dtod(
                    base + (d * len * 4) as u64,
                    base + (s * len * 4) as u64,
                    len * 4,
                );
            }
        }
    }
}

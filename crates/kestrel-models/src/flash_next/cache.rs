//! Per-sequence state of Flash-Next beyond the backend's KV pages and GDN
//! slots: the indexer's raw keys (one row per paged position, so pages
//! shared by a prefix cache share them too), each PLE module's conv state
//! and the n-gram context (per state slot, like the GDN state).
//!
//! `zero_state` and `copy_state` cover all of it; the engine calls these
//! (through [`crate::TargetCache`]) instead of the backend's.
//!
//! It also holds the step's PLE inputs, the n-gram embeddings gathered on
//! the host before the step (`stage_ple`).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use anyhow::Result;
use kestrel_core::Backend;
use kestrel_core::flash_next::{FlashNextOps, IndexerKeys, RowEdit};

pub struct FlashNextCache<B: Backend> {
    /// KV pages of the attention layers and state slots of the GDN layers.
    pub base: B::Cache,
    /// Per attention layer: the raw and pooled indexer keys
    /// ([`IndexerKeys`]: `num_blocks * block_size` and
    /// `num_blocks * block_size / compress_ratio` rows of the indexer head dim).
    pub indexer_keys: Vec<IndexerKeys<B::Tensor>>,
    /// Per PLE module: `[slots * state_len, streams * hidden]`.
    pub ple_conv: Vec<B::Tensor>,
    /// Per slot: the last `ngram_size - 1` tokens, EOS before the first.
    pub ngram_context: Vec<Vec<u32>>,
    pub block_size: usize,
    /// Per PLE module, the embeddings of recorded steps' tokens: one tensor
    /// per token count, kept where a recording reads it and rewritten by
    /// every step of that count.
    ple_recorded: Vec<HashMap<usize, B::Tensor>>,
    /// Per PLE module, the embeddings of the step in progress when it is
    /// not recorded.
    ple_fresh: Vec<B::Tensor>,
    /// The step in progress reads `ple_recorded` (at its token count).
    ple_step: Option<usize>,
    ple_state_rows: usize,
    eos: u32,
    /// The backend's `FlashNextOps::edit_rows`: the engine holds this cache
    /// knowing only `Backend`.
    edit_rows: fn(&B, &mut B::Tensor, RowEdit),
}

impl<B: FlashNextOps> FlashNextCache<B> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        b: &B,
        base: B::Cache,
        indexer: (usize, usize, usize),
        ple: (usize, usize, usize),
        ngram_context: usize,
        eos: u32,
        num_blocks: usize,
        block_size: usize,
        slots: usize,
    ) -> Result<Self> {
        let (attn_layers, key_dim, ratio) = indexer;
        let (ple_modules, state_rows, width) = ple;
        if attn_layers > 0 && !block_size.is_multiple_of(ratio) {
            anyhow::bail!(
                "qwen4_exp needs pages of whole indexer blocks: a block size of {block_size} \
                 is not a multiple of the compress ratio {ratio}"
            );
        }
        let rows = |n: usize| b.from_host(n, key_dim, &vec![0.0; n * key_dim]);
        let keys = |_| IndexerKeys {
            raw: rows(num_blocks * block_size),
            pooled: rows(num_blocks * block_size / ratio),
        };
        let conv = |_| {
            b.from_host(
                slots * state_rows,
                width,
                &vec![0.0; slots * state_rows * width],
            )
        };
        Ok(FlashNextCache {
            base,
            indexer_keys: (0..attn_layers).map(keys).collect(),
            ple_conv: (0..ple_modules).map(conv).collect(),
            ngram_context: vec![vec![eos; ngram_context]; slots],
            block_size,
            ple_recorded: (0..ple_modules).map(|_| HashMap::new()).collect(),
            ple_fresh: Vec::new(),
            ple_step: None,
            ple_state_rows: state_rows,
            eos,
            edit_rows: <B as FlashNextOps>::edit_rows,
        })
    }

    /// Stages each PLE module's embeddings of the next step's `rows` tokens
    /// (`width` values a row): for a recorded step (`recorded`) in that
    /// module's tensor for `rows` rows, which stays where its recordings
    /// read it; otherwise in new tensors.
    pub fn stage_ple(&mut self, b: &B, embeddings: Vec<Vec<f32>>, rows: usize, recorded: bool) {
        self.ple_fresh.clear();
        self.ple_step = recorded.then_some(rows);
        for (module, data) in embeddings.into_iter().enumerate() {
            let width = data.len() / rows.max(1);
            if recorded {
                match self.ple_recorded[module].entry(rows) {
                    Entry::Occupied(mut t) => b.write_rows(t.get_mut(), &data),
                    Entry::Vacant(v) => {
                        v.insert(b.from_host(rows, width, &data));
                    }
                }
            } else {
                self.ple_fresh.push(b.from_host(rows, width, &data));
            }
        }
    }
}

/// What a layer reads and writes besides the backend cache: the indexer
/// keys and the PLE conv pools. Borrowed apart from `base`, which a step
/// hands to the backend (`Backend::run_step`).
pub struct Pools<'a, B: Backend> {
    pub indexer_keys: &'a mut [IndexerKeys<B::Tensor>],
    pub ple_conv: &'a mut [B::Tensor],
    /// Per PLE module, the step's staged embeddings.
    pub ple_input: Vec<&'a B::Tensor>,
    pub block_size: usize,
}

impl<B: Backend> FlashNextCache<B> {
    /// The backend cache and the layers' pools, borrowed apart.
    pub fn split(&mut self) -> (&mut B::Cache, Pools<'_, B>) {
        let ple_input = match self.ple_step {
            Some(rows) => self.ple_recorded.iter().map(|m| &m[&rows]).collect(),
            None => self.ple_fresh.iter().collect(),
        };
        (
            &mut self.base,
            Pools {
                indexer_keys: &mut self.indexer_keys,
                ple_conv: &mut self.ple_conv,
                ple_input,
                block_size: self.block_size,
            },
        )
    }

    /// A sequence starts over in `slot`: GDN, PLE conv and n-gram context.
    pub fn zero_state(&mut self, b: &B, slot: u32) {
        b.zero_state(&mut self.base, slot);
        let (n, slot) = (self.ple_state_rows, slot as usize);
        for t in &mut self.ple_conv {
            (self.edit_rows)(b, t, RowEdit::Zero(slot * n..(slot + 1) * n));
        }
        self.ngram_context[slot].fill(self.eos);
    }

    /// Snapshot all per-slot state of `src` into `dst`.
    pub fn copy_state(&mut self, b: &B, src: u32, dst: u32) {
        b.copy_state(&mut self.base, src, dst);
        let n = self.ple_state_rows;
        let (s, d) = (src as usize, dst as usize);
        if s != d {
            for t in &mut self.ple_conv {
                let edit = RowEdit::Copy {
                    src: s * n..(s + 1) * n,
                    dst: d * n,
                };
                (self.edit_rows)(b, t, edit);
            }
        }
        self.ngram_context[d] = self.ngram_context[s].clone();
    }
}

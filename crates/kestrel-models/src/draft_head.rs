//! The lm_head a drafter scores with: the whole one, or only the rows of a
//! reduced draft vocabulary.
//!
//! Why: one MTP draft step reads the head's one layer and then the whole
//! lm_head, which on Qwen3.6-35B-A3B (248,320 rows) is most of the step's
//! bytes. Drafts only need to be right often, not always, so scoring the
//! few tens of thousands of ids a corpus actually uses keeps nearly all
//! accepted drafts and reads a fraction of the rows. The target still
//! verifies against the whole vocabulary, so output never depends on it.
//!
//! The rows are gathered once, at start-up, with the backend's own
//! operations (an embedding lookup of the chosen ids in the lm_head, read
//! back and uploaded as a weight of its own). For bf16 checkpoints on a
//! bf16 backend the copy is exact; the CPU backend keeps f32 throughout.

use std::borrow::Cow;

use anyhow::{Result, bail};
use kestrel_core::{Backend, DType, HostTensor};

use crate::decoder::Decoder;

/// Rows gathered per lookup while building a reduced head, so the host
/// copy grows in bounded steps.
const GATHER_ROWS: usize = 8192;

pub enum DraftHead<B: Backend> {
    /// Every id below `vocab` (the sampled vocabulary).
    Full { vocab: usize },
    /// Only `ids` (ascending): row `i` of `weight` is lm_head row `ids[i]`.
    Reduced { weight: B::Weight, ids: Vec<u32> },
}

impl<B: Backend> DraftHead<B> {
    /// The whole lm_head, drafting ids below `vocab`.
    pub fn full(vocab: usize) -> Self {
        DraftHead::Full { vocab }
    }

    /// The lm_head rows of `ids`, which must be ascending, unique and inside
    /// the model's vocabulary (ascending keeps ties going to the lower id,
    /// as in the whole head).
    pub fn reduced(b: &B, decoder: &Decoder<B>, ids: &[u32]) -> Result<Self> {
        let vocab = decoder.config.vocab_size;
        if ids.is_empty() {
            bail!("a draft vocabulary needs at least one id");
        }
        if let Some(w) = ids.windows(2).find(|w| w[0] >= w[1]) {
            bail!(
                "draft vocabulary ids must be ascending and unique ({} before {})",
                w[0],
                w[1]
            );
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            bail!("draft vocabulary id {bad} is outside the model's {vocab} ids");
        }
        let h = decoder.config.hidden_size;
        let mut data = Vec::with_capacity(ids.len() * h * 4);
        for chunk in ids.chunks(GATHER_ROWS) {
            let rows = b.to_host(&b.embedding(decoder.lm_head(), chunk));
            data.extend(rows.iter().flat_map(|v| v.to_le_bytes()));
        }
        let weight = b.upload(&HostTensor {
            dtype: DType::F32,
            shape: vec![ids.len(), h],
            data: Cow::Owned(data),
        })?;
        Ok(DraftHead::Reduced {
            weight,
            ids: ids.to_vec(),
        })
    }

    /// Rows of the lm_head one draft step reads.
    pub fn rows(&self) -> usize {
        match self {
            DraftHead::Full { vocab } => *vocab,
            DraftHead::Reduced { ids, .. } => ids.len(),
        }
    }

    /// The best-scoring draftable id of each row of `x` (normalised hidden
    /// states, `[rows, hidden]`).
    pub fn argmax(&self, b: &B, decoder: &Decoder<B>, x: &B::Tensor) -> Vec<u32> {
        match self {
            DraftHead::Full { vocab } => {
                let logits = b.matmul(x, decoder.lm_head());
                b.argmax_rows(&logits, (*vocab).min(b.dims(&logits).1))
            }
            DraftHead::Reduced { weight, ids } => {
                let logits = b.matmul(x, weight);
                b.argmax_rows(&logits, ids.len())
                    .into_iter()
                    .map(|i| ids[i as usize])
                    .collect()
            }
        }
    }
}

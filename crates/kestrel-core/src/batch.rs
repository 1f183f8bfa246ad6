//! What one forward pass computes: new tokens of several sequences, flattened.
//!
//! The scheduler builds a [`ForwardBatch`]; backends read it to find where each
//! token's keys and values live (pages) and which recurrent-state slot a sequence
//! owns. Tokens of a sequence are contiguous and in order.

/// The new tokens of one sequence in this step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqChunk {
    /// Number of new tokens (a prefill chunk, or 1 for a decode step).
    pub num_tokens: usize,
    /// Tokens already in the cache; the first new token sits at this position.
    pub cached_len: usize,
    /// Physical KV pages holding positions `0 .. cached_len + num_tokens`,
    /// `block_size` positions per page.
    pub block_table: Vec<u32>,
    /// Recurrent / conv state slot for linear-attention layers. The engine
    /// zeroes it before a sequence's first chunk (or restores a snapshot).
    pub state_slot: u32,
    /// Speculative verification of a hybrid model: after the `i`-th new
    /// token, the recurrent and conv state is also written to slot
    /// `state_checkpoints[i]` (at most `num_tokens` entries; empty for plain
    /// chunks). The live slot still advances over every new token; when only
    /// a prefix of the drafts is accepted the engine copies the checkpoint of
    /// the last accepted token back. Only backends whose
    /// [`crate::Backend::supports_state_checkpoints`] is true take them.
    pub state_checkpoints: Vec<u32>,
    /// A prefix-cache snapshot taken inside this pass (hybrid models): see
    /// [`StateSnapshot`]. Only backends whose
    /// [`crate::Backend::state_snapshot_alignment`] is `Some` take one.
    pub state_snapshot: Option<StateSnapshot>,
    /// The chunk's tokens are its request's prompt (not decode or verify
    /// rows, nor output replayed after a preemption). A prefix-cache hit
    /// recomputes a prompt's tail in a pass of its own, so a backend whose
    /// in-pass snapshots need it ([`crate::Backend::state_snapshot_alignment`])
    /// computes prompt rows alike whatever their pass's row count.
    pub prompt: bool,
}

/// After the first `after` new tokens of a chunk (`0 < after < num_tokens`),
/// the state continues over the rest of the chunk exactly as if the chunk
/// had ended there and the rest were the next pass, and the recurrent and
/// conv state at that point is also written to `slot`. So a later prompt
/// that resumes from the snapshot computes what this pass computed after
/// it, without the first pass having to stop at the snapshot point. Without
/// a slot (the prefix cache is off, or has no free slot) the boundary still
/// holds, so that outputs never depend on the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateSnapshot {
    pub after: usize,
    pub slot: Option<u32>,
}

impl SeqChunk {
    /// A chunk without state checkpoints.
    pub fn new(
        num_tokens: usize,
        cached_len: usize,
        block_table: Vec<u32>,
        state_slot: u32,
    ) -> Self {
        Self {
            num_tokens,
            cached_len,
            block_table,
            state_slot,
            state_checkpoints: Vec::new(),
            state_snapshot: None,
            prompt: false,
        }
    }

    /// The chunk, marked as prompt tokens ([`SeqChunk::prompt`]).
    pub fn of_prompt(mut self) -> Self {
        self.prompt = true;
        self
    }

    pub fn total_len(&self) -> usize {
        self.cached_len + self.num_tokens
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    pub seqs: Vec<SeqChunk>,
}

impl ForwardBatch {
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.num_tokens).sum()
    }

    /// Absolute position of every new token, in batch order.
    pub fn positions(&self) -> Vec<u32> {
        self.seqs
            .iter()
            .flat_map(|s| (s.cached_len..s.total_len()).map(|p| p as u32))
            .collect()
    }

    /// Where a step that mixes short chunks (decode and verify rows) with
    /// prefill chunks is cut for [`crate::Backend::step_cut`]: after its
    /// leading run of sequences bringing at most `max_new` tokens each, when
    /// that run has 1..=`max_seqs` of them and sequences follow it. `None`
    /// for a step of one kind. With `prompts_apart`, a prompt chunk
    /// ([`SeqChunk::prompt`]) is never short, whatever its length (a backend
    /// that computes prompt rows with its prefill kernels at any count).
    pub fn short_prefix_cut(
        &self,
        max_seqs: usize,
        max_new: usize,
        prompts_apart: bool,
    ) -> Option<usize> {
        let n = self
            .seqs
            .iter()
            .take_while(|s| s.num_tokens <= max_new && !(prompts_apart && s.prompt))
            .count();
        (n > 0 && n <= max_seqs && n < self.seqs.len()).then_some(n)
    }

    /// The sequences `range`, as a batch of their own.
    pub fn part(&self, range: std::ops::Range<usize>) -> ForwardBatch {
        ForwardBatch {
            seqs: self.seqs[range].to_vec(),
        }
    }

    /// Row index (in the flattened batch) of each sequence's last new token.
    pub fn last_token_rows(&self) -> Vec<usize> {
        let mut end = 0;
        self.seqs
            .iter()
            .map(|s| {
                end += s.num_tokens;
                end - 1
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(tokens: &[usize]) -> ForwardBatch {
        ForwardBatch {
            seqs: tokens
                .iter()
                .map(|&num_tokens| SeqChunk {
                    num_tokens,
                    cached_len: 0,
                    block_table: Vec::new(),
                    state_slot: 0,
                    state_checkpoints: Vec::new(),
                    state_snapshot: None,
                    prompt: false,
                })
                .collect(),
        }
    }

    #[test]
    fn a_step_is_cut_after_its_leading_short_chunks_when_prefill_follows() {
        // Decode and verify rows, then prefill chunks.
        assert_eq!(
            batch(&[1, 4, 1, 100, 3]).short_prefix_cut(8, 16, false),
            Some(3)
        );
        // A short prefill tail counts as short.
        assert_eq!(batch(&[1, 16, 17]).short_prefix_cut(8, 16, false), Some(2));
        // One kind only: no cut.
        assert_eq!(batch(&[1, 1, 4]).short_prefix_cut(8, 16, false), None);
        assert_eq!(batch(&[64, 1]).short_prefix_cut(8, 16, false), None);
        // More short chunks than a decode-shaped step takes: no cut.
        assert_eq!(
            batch(&[1; 9].iter().copied().chain([50]).collect::<Vec<_>>())
                .short_prefix_cut(8, 16, false),
            None
        );
        // Prompt chunks kept apart: a short prompt tail ends the short run.
        let mut tail = batch(&[1, 4, 9, 100]);
        tail.seqs[2].prompt = true;
        assert_eq!(tail.short_prefix_cut(8, 16, false), Some(3));
        assert_eq!(tail.short_prefix_cut(8, 16, true), Some(2));
        tail.seqs.swap(0, 2);
        assert_eq!(tail.short_prefix_cut(8, 16, true), None);
        let b = batch(&[1, 2, 30]);
        assert_eq!(
            b.part(1..3)
                .seqs
                .iter()
                .map(|s| s.num_tokens)
                .collect::<Vec<_>>(),
            [2, 30]
        );
    }
}

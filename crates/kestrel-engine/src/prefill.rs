//! Where a sequence's prefill is split into chunks.
//!
//! Outputs must not depend on batching or on the prefix cache. Row-wise
//! operations (matmul, attention) give each token the same result whatever
//! else is in the batch, but a Gated DeltaNet layer's rounding depends on how
//! a sequence's tokens are split into forward passes (its kernels process a
//! chunk at a time). So the split points of a sequence are a function of that
//! sequence alone, never of the step's token budget or of other requests:
//!
//! * inside the prompt, chunks end at every multiple of the grid `G` (a
//!   multiple of the block size) and at the prompt's end; on hybrid models
//!   also at the prompt's last full-block boundary `L` (the deepest point a
//!   prefix-cache hit can reach, where the recurrent state is snapshotted);
//! * tokens generated before a preemption are replayed as they were first
//!   computed: one per step on hybrid models (as decode steps did), in grid
//!   chunks otherwise;
//! * a chunk is scheduled whole or not at all in a step.
//!
//! Attention-only models need no split at `L`: every cached block is exact
//! whatever the passes were, so a prompt no longer than the grid prefills in
//! one forward pass. On hybrid models the split at `L` costs one extra pass
//! over the prompt's last 1-16 tokens; that pass is what lets a repeated
//! prompt resume from `L` exactly.
//!
//! A backend that snapshots the state inside a pass
//! (`Backend::state_snapshot_alignment`) spares that pass: the chunk that
//! crosses `L` carries the snapshot (`SeqChunk::state_snapshot`), and its GDN
//! layers compute the tokens before and after `L` as two runs, exactly as the
//! two passes would, keeping the state in between. `L` is then also a
//! multiple of the backend's alignment, and where the pass does not start on
//! that alignment, the pass ends at `L` as before. The CPU backend takes such
//! snapshots anywhere; CUDA at its GDN chunk boundaries where it computes
//! prompt rows alike whatever the pass's length (its default in bf16; the
//! chunks carry `SeqChunk::prompt` for it), and anywhere in its
//! batch-invariant mode. Otherwise a hit would not repeat the miss there: the
//! products round with the row count.
//!
//! A hybrid-model prefix-cache hit may only resume at a point where this
//! sequence would split anyway, and where the run that cached the state split
//! too: the grid points and `L` (every run splits at grid points; a snapshot
//! at a non-grid point exists only where another prompt had its `L` there,
//! and both runs then split at the same grid points before it). Resuming
//! there computes exactly what a cache miss computes after that point.

use crate::handle::EngineConfig;

/// Upper bound on the grid: prefill chunks of one sequence, and the spacing
/// of the hybrid-model state snapshots that multi-turn prompts resume from.
/// 8192 is what vLLM (`max_num_batched_tokens` for the OpenAI server) and
/// SGLang (`chunked_prefill_size`) use on GPUs of 80 GB and more: a prompt up
/// to that length prefills in one pass (plus the hybrid tail at `L`), and a
/// longer one stalls the other sequences' decode steps for one such pass at
/// a time.
pub const MAX_PREFILL_CHUNK_TOKENS: usize = 8192;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkPolicy {
    block_size: usize,
    grid: usize,
    hybrid: bool,
    /// Hybrid models on a backend that snapshots the state inside a pass
    /// (`Backend::state_snapshot_alignment`): the alignment, from the pass's
    /// first token, that such a snapshot needs. `None`: passes end at `L`.
    in_pass: Option<usize>,
}

impl ChunkPolicy {
    /// The grid is the largest multiple of the block size that fits in a
    /// step next to a decode token of every other running sequence (so a
    /// prefill chunk always finds room), capped at [`MAX_PREFILL_CHUNK_TOKENS`].
    pub fn new(config: &EngineConfig, hybrid: bool) -> Result<Self, String> {
        let block_size = config.block_size;
        if block_size == 0 {
            return Err("block_size must be positive".into());
        }
        let others = config.max_num_seqs.saturating_sub(1);
        let room = config.max_num_batched_tokens.saturating_sub(others);
        let grid = room.min(MAX_PREFILL_CHUNK_TOKENS.max(block_size)) / block_size * block_size;
        if grid == 0 {
            return Err(format!(
                "max_num_batched_tokens ({}) must be at least max_num_seqs - 1 + block_size ({})",
                config.max_num_batched_tokens,
                others + block_size
            ));
        }
        Ok(Self {
            block_size,
            grid,
            hybrid,
            in_pass: None,
        })
    }

    /// Takes the snapshot at `L` inside the pass that crosses it, where the
    /// backend can (`alignment` from `Backend::state_snapshot_alignment`),
    /// instead of ending a pass there. `L` is then the prompt's last
    /// multiple of both the block size and the alignment.
    pub fn with_in_pass_snapshots(mut self, alignment: Option<usize>) -> Self {
        self.in_pass = alignment.filter(|&a| a > 0);
        self
    }

    /// Tokens per grid cell.
    pub fn grid(&self) -> usize {
        self.grid
    }

    /// The prompt's last full-block boundary that still leaves a token to
    /// compute (0 when the prompt fits in one block).
    pub fn last_full_block(&self, prompt_len: usize) -> usize {
        prompt_len.saturating_sub(1) / self.block_size * self.block_size
    }

    /// `L`: the deepest point of a hybrid-model prompt whose state is
    /// snapshotted, a block boundary that leaves a token to compute (and, with
    /// in-pass snapshots, a multiple of their alignment; 0 when there is none).
    pub fn snapshot_point(&self, prompt_len: usize) -> usize {
        let step = match self.in_pass {
            Some(a) => lcm(self.block_size, a),
            None => self.block_size,
        };
        prompt_len.saturating_sub(1) / step * step
    }

    /// Whether a pass starting at `start` takes the snapshot at `at` inside
    /// it rather than ending there.
    fn snapshots_inside(&self, start: usize, at: usize) -> bool {
        self.in_pass.is_some_and(|a| (at - start).is_multiple_of(a))
    }

    /// Where the pass `start..end` of a prompt of `prompt_len` tokens takes a
    /// snapshot inside it (a position strictly between the two), if anywhere.
    pub fn in_pass_snapshot(&self, start: usize, end: usize, prompt_len: usize) -> Option<usize> {
        let at = self.snapshot_point(prompt_len);
        (self.hybrid
            && start < at
            && at < end
            && end <= prompt_len
            && self.snapshots_inside(start, at))
        .then_some(at)
    }

    /// End of the next chunk of a sequence of `len` known tokens (the first
    /// `prompt_len` its request's prompt) with `computed` already in the cache.
    pub fn chunk_end(&self, computed: usize, len: usize, prompt_len: usize) -> usize {
        let next_grid = (computed / self.grid + 1) * self.grid;
        let end = if computed < prompt_len {
            let mut end = next_grid.min(prompt_len);
            let at = self.snapshot_point(prompt_len);
            if self.hybrid && at > computed && !(at < end && self.snapshots_inside(computed, at)) {
                end = end.min(at);
            }
            end
        } else if self.hybrid {
            computed + 1
        } else {
            next_grid
        };
        end.min(len)
    }

    /// Split points of a prompt of `prompt_len` tokens (the chunk ends, in order).
    pub fn prompt_chunk_ends(&self, prompt_len: usize) -> Vec<usize> {
        let mut ends = Vec::new();
        let mut computed = 0;
        while computed < prompt_len {
            computed = self.chunk_end(computed, prompt_len, prompt_len);
            ends.push(computed);
        }
        ends
    }

    /// Can a sequence whose prompt has `prompt_len` tokens resume from a
    /// cached prefix of `pos` tokens and compute exactly what a miss would?
    pub fn is_resume_point(&self, pos: usize, prompt_len: usize) -> bool {
        if !self.hybrid {
            // Attention-only models: every cached block is exact.
            return pos.is_multiple_of(self.block_size);
        }
        let at = self.snapshot_point(prompt_len);
        pos > 0 && pos <= at && (pos.is_multiple_of(self.grid) || pos == at)
    }

    /// Should the recurrent state be snapshotted after `computed` positions
    /// (hybrid models: at the prompt's resume points)?
    pub fn is_snapshot_point(&self, computed: usize, prompt_len: usize) -> bool {
        self.hybrid && self.is_resume_point(computed, prompt_len)
    }
}

fn lcm(a: usize, b: usize) -> usize {
    let gcd = |mut x: usize, mut y: usize| {
        while y != 0 {
            (x, y) = (y, x % y);
        }
        x
    };
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(budget: usize, seqs: usize, block: usize) -> EngineConfig {
        EngineConfig {
            max_num_seqs: seqs,
            max_queued_requests: 8,
            max_num_batched_tokens: budget,
            block_size: block,
            num_blocks: 64,
            num_state_slots: 8,
            enable_prefix_cache: true,
            max_model_len: 512,
            force_preempt_at: None,
            sampled_vocab: None,
        }
    }

    #[test]
    fn grid_leaves_room_for_decodes() {
        let p = ChunkPolicy::new(&config(64, 4, 16), true).unwrap();
        assert_eq!(p.grid(), 48, "64 - 3 decode tokens, rounded down to blocks");
        let big = ChunkPolicy::new(&config(1 << 20, 256, 16), false).unwrap();
        assert_eq!(big.grid(), MAX_PREFILL_CHUNK_TOKENS);
        assert!(ChunkPolicy::new(&config(16, 4, 16), true).is_err());
    }

    #[test]
    fn prompt_splits_at_grid_and_last_full_block() {
        let p = ChunkPolicy::new(&config(64, 4, 16), true).unwrap();
        assert_eq!(p.prompt_chunk_ends(130), vec![48, 96, 128, 130]);
        assert_eq!(p.prompt_chunk_ends(128), vec![48, 96, 112, 128]);
        assert_eq!(p.prompt_chunk_ends(96), vec![48, 80, 96]);
        assert_eq!(p.prompt_chunk_ends(10), vec![10]);
        assert_eq!(p.prompt_chunk_ends(17), vec![16, 17]);
    }

    #[test]
    fn attention_only_prompts_split_at_the_grid_alone() {
        let p = ChunkPolicy::new(&config(64, 4, 16), false).unwrap();
        assert_eq!(p.prompt_chunk_ends(130), vec![48, 96, 130]);
        assert_eq!(p.prompt_chunk_ends(17), vec![17]);
        assert!(p.is_resume_point(112, 130), "any block boundary is exact");
    }

    #[test]
    fn a_long_8k_prompt_prefills_in_as_few_passes_as_it_can() {
        // The server's defaults: 32768 tokens a step, 64 sequences.
        let hybrid = ChunkPolicy::new(&config(32768, 64, 16), true).unwrap();
        assert_eq!(
            hybrid.prompt_chunk_ends(7261),
            vec![7248, 7261],
            "one pass, then the tail after the last full block"
        );
        let attn = ChunkPolicy::new(&config(32768, 64, 16), false).unwrap();
        assert_eq!(attn.prompt_chunk_ends(7261), vec![7261]);
        assert_eq!(attn.prompt_chunk_ends(20000), vec![8192, 16384, 20000]);
    }

    #[test]
    fn replay_after_preemption() {
        let hybrid = ChunkPolicy::new(&config(64, 4, 16), true).unwrap();
        assert_eq!(
            hybrid.chunk_end(20, 30, 20),
            21,
            "one generated token per step"
        );
        let attn = ChunkPolicy::new(&config(64, 4, 16), false).unwrap();
        assert_eq!(attn.chunk_end(20, 100, 20), 48);
        assert_eq!(attn.chunk_end(48, 100, 20), 96);
    }

    #[test]
    fn resume_points_are_split_points() {
        let p = ChunkPolicy::new(&config(64, 4, 16), true).unwrap();
        for prompt_len in 1..300 {
            let ends = p.prompt_chunk_ends(prompt_len);
            for pos in 0..prompt_len {
                if p.is_resume_point(pos, prompt_len) {
                    assert!(ends.contains(&pos), "{pos} of {prompt_len}");
                    // A longer prompt sharing this prefix splits there too
                    // when `pos` is on the grid.
                    if pos % p.grid() == 0 {
                        assert!(p.prompt_chunk_ends(prompt_len + 100).contains(&pos));
                    }
                }
            }
        }
        assert!(p.is_resume_point(96, 200));
        assert!(
            !p.is_resume_point(112, 200),
            "neither grid nor last full block"
        );
        assert!(p.is_resume_point(192, 200));
        assert!(
            !p.is_resume_point(192, 192),
            "the last token must be computed"
        );
    }

    #[test]
    fn in_pass_snapshots_leave_a_long_prompt_one_pass() {
        let anywhere = ChunkPolicy::new(&config(32768, 64, 16), true)
            .unwrap()
            .with_in_pass_snapshots(Some(1));
        assert_eq!(anywhere.prompt_chunk_ends(7261), vec![7261]);
        assert_eq!(anywhere.snapshot_point(7261), 7248);
        assert_eq!(anywhere.in_pass_snapshot(0, 7261, 7261), Some(7248));
        let chunked = ChunkPolicy::new(&config(32768, 64, 16), true)
            .unwrap()
            .with_in_pass_snapshots(Some(64));
        assert_eq!(chunked.prompt_chunk_ends(7261), vec![7261]);
        assert_eq!(
            chunked.snapshot_point(7261),
            7232,
            "a multiple of 16 and of 64"
        );
        assert_eq!(chunked.in_pass_snapshot(0, 7261, 7261), Some(7232));
        // A pass that starts off the alignment still ends at L.
        let small = ChunkPolicy::new(&config(64, 4, 16), true)
            .unwrap()
            .with_in_pass_snapshots(Some(64));
        assert_eq!(small.prompt_chunk_ends(130), vec![48, 96, 128, 130]);
        assert_eq!(small.in_pass_snapshot(96, 130, 130), None);
        let small_any = ChunkPolicy::new(&config(64, 4, 16), true)
            .unwrap()
            .with_in_pass_snapshots(Some(1));
        assert_eq!(small_any.prompt_chunk_ends(130), vec![48, 96, 130]);
        assert_eq!(small_any.in_pass_snapshot(96, 130, 130), Some(128));
        // Attention-only models take no snapshots.
        let attn = ChunkPolicy::new(&config(64, 4, 16), false)
            .unwrap()
            .with_in_pass_snapshots(Some(1));
        assert_eq!(attn.in_pass_snapshot(96, 130, 130), None);
    }

    #[test]
    fn with_in_pass_snapshots_every_resume_point_is_a_split_or_a_snapshot() {
        for align in [1, 16, 64] {
            let p = ChunkPolicy::new(&config(64, 4, 16), true)
                .unwrap()
                .with_in_pass_snapshots(Some(align));
            for prompt_len in 1..300 {
                let ends = p.prompt_chunk_ends(prompt_len);
                let mut starts = vec![0];
                starts.extend(&ends[..ends.len() - 1]);
                let snapshots: Vec<usize> = starts
                    .iter()
                    .zip(&ends)
                    .filter_map(|(&a, &b)| p.in_pass_snapshot(a, b, prompt_len))
                    .collect();
                for pos in 1..prompt_len {
                    if p.is_resume_point(pos, prompt_len) {
                        assert!(
                            ends.contains(&pos) || snapshots.contains(&pos),
                            "align {align}: {pos} of {prompt_len}"
                        );
                    }
                }
            }
        }
    }
}

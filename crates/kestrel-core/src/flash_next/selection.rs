//! The bookkeeping of QSA block selection that every backend shares: which
//! new tokens must choose (those with more complete blocks than the budget
//! keeps), where their block scores go, how scores become each token's
//! selected positions (the reference's top-k tie order), and the cache slots
//! those positions occupy. A backend computes only the scores.

use super::topk::top_k_set;
use super::{QsaSpec, TokenSelection};
use crate::ForwardBatch;

/// A token that chooses its blocks, and where its scores are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScoredToken {
    /// Its row among the step's new tokens.
    pub row: usize,
    /// Its sequence's index in the batch (whose block table holds its
    /// blocks' pooled keys).
    pub seq: usize,
    /// Its complete blocks: scores `at .. at + blocks`.
    pub blocks: usize,
    pub at: usize,
}

/// Where the scores of a step's choosing tokens go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScoreLayout {
    pub scored: Vec<ScoredToken>,
    /// All scores, one scored token after another.
    pub score_len: usize,
    /// The blocks this step completes, `(sequence, block)`, in order: their
    /// pooled keys are made before any score is.
    pub completed: Vec<(usize, usize)>,
}

impl ScoreLayout {
    pub fn new(spec: &QsaSpec, batch: &ForwardBatch) -> Self {
        let (r, top) = (spec.compress_ratio, spec.top_blocks());
        let mut l = ScoreLayout::default();
        let mut row = 0;
        for (seq, q) in batch.seqs.iter().enumerate() {
            for i in 0..q.num_tokens {
                let blocks = (q.cached_len + i + 1) / r;
                if (q.cached_len + i + 1).is_multiple_of(r) {
                    l.completed.push((seq, blocks - 1));
                }
                if blocks > top {
                    l.scored.push(ScoredToken {
                        row,
                        seq,
                        blocks,
                        at: l.score_len,
                    });
                    l.score_len += blocks;
                }
                row += 1;
            }
        }
        l
    }

    /// The selection once `scores` (`score_len` of them) are known: each
    /// scored token's best `top_blocks` blocks, every other token all of its
    /// complete blocks; then the incomplete tail, the token included.
    pub fn selection(
        &self,
        spec: &QsaSpec,
        batch: &ForwardBatch,
        scores: &[f32],
    ) -> TokenSelection {
        assert_eq!(scores.len(), self.score_len, "one score per scored block");
        let r = spec.compress_ratio;
        let mut scored = self.scored.iter().peekable();
        let mut positions = Vec::with_capacity(batch.num_tokens());
        let mut row = 0;
        for q in &batch.seqs {
            for i in 0..q.num_tokens {
                let pos = q.cached_len + i;
                let complete = (pos + 1) / r;
                let chosen: Vec<usize> = match scored.next_if(|u| u.row == row) {
                    Some(u) => {
                        let mut c = top_k_set(&scores[u.at..u.at + u.blocks], spec.top_blocks());
                        c.sort_unstable();
                        c
                    }
                    None => (0..complete).collect(),
                };
                let mut sel: Vec<u32> = chosen
                    .iter()
                    .flat_map(|&b| (b * r..(b + 1) * r).map(|p| p as u32))
                    .collect();
                sel.extend((complete * r..=pos).map(|p| p as u32));
                positions.push(sel);
                row += 1;
            }
        }
        TokenSelection { positions }
    }
}

impl TokenSelection {
    /// The cache slot (`page * block_size + offset`) of every selected
    /// position, per token, through its sequence's block table.
    pub fn slots(&self, batch: &ForwardBatch, block_size: usize) -> Vec<Vec<u32>> {
        assert_eq!(
            self.positions.len(),
            batch.num_tokens(),
            "one selection per new token"
        );
        let mut rows = self.positions.iter();
        let mut out = Vec::with_capacity(self.positions.len());
        for q in &batch.seqs {
            for sel in rows.by_ref().take(q.num_tokens) {
                out.push(
                    sel.iter()
                        .map(|&p| {
                            let p = p as usize;
                            let page = q.block_table[p / block_size] as usize;
                            (page * block_size + p % block_size) as u32
                        })
                        .collect(),
                );
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RopeSpec, SeqChunk};

    fn spec() -> QsaSpec {
        QsaSpec {
            num_heads: 1,
            head_dim: 4,
            budget: 8,
            compress_ratio: 4,
            rope: RopeSpec {
                theta: 1e4,
                rotary_dim: 2,
            },
            eps: 1e-6,
        }
    }

    #[test]
    fn only_tokens_past_the_budget_score_and_each_gets_its_range() {
        // Two blocks are kept. Sequence 0: tokens at 10, 11, 12 (2, 3, 3
        // complete blocks); sequence 1: one token at 3 (0 blocks).
        let batch = ForwardBatch {
            seqs: vec![
                SeqChunk::new(3, 10, vec![0, 1], 0),
                SeqChunk::new(1, 3, vec![2], 1),
            ],
        };
        let l = ScoreLayout::new(&spec(), &batch);
        assert_eq!(
            l.scored,
            [
                ScoredToken {
                    row: 1,
                    seq: 0,
                    blocks: 3,
                    at: 0
                },
                ScoredToken {
                    row: 2,
                    seq: 0,
                    blocks: 3,
                    at: 3
                },
            ]
        );
        assert_eq!(l.score_len, 6);
        // Position 11 completes block 2 of sequence 0, position 3 block 0 of 1.
        assert_eq!(l.completed, [(0, 2), (1, 0)]);
        // Token 11 keeps blocks 0 and 2, token 12 blocks 1 and 2.
        let sel = l.selection(&spec(), &batch, &[3.0, 1.0, 2.0, 0.0, 5.0, 4.0]);
        assert_eq!(sel.positions[0], (0..=10).collect::<Vec<u32>>());
        assert_eq!(sel.positions[1], [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(sel.positions[2], [4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(sel.positions[3], [0, 1, 2, 3]);
        // Pages of 8: sequence 0's positions 8.. are on page 1.
        let slots = sel.slots(&batch, 8);
        assert_eq!(slots[1], [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(slots[3], [16, 17, 18, 19]);
    }

    #[test]
    fn a_token_completing_a_block_the_indexer_leaves_out_does_not_see_itself() {
        // Position 11 completes block 2 (8..=11) and has no tail; with block
        // 2 scored lowest it reads blocks 0 and 1 only, not its own key (as
        // the reference does), so a backend must not assume it does.
        let batch = ForwardBatch {
            seqs: vec![SeqChunk::new(1, 11, vec![0, 1], 0)],
        };
        let l = ScoreLayout::new(&spec(), &batch);
        let sel = l.selection(&spec(), &batch, &[3.0, 2.0, 1.0]);
        assert_eq!(sel.positions[0], [0, 1, 2, 3, 4, 5, 6, 7]);
        assert!(!sel.is_dense(&batch));
    }
}

//! The bookkeeping of QSA block selection that every backend shares: which
//! new tokens must choose (those with more complete blocks than the budget
//! keeps), where their block scores go, how scores become each token's
//! selected positions (the reference's top-k tie order), and the cache slots
//! those positions occupy. A backend computes only the scores.

use rayon::prelude::*;

use super::topk::top_k_sorted;
use super::{QsaSpec, SelectedBlocks, TokenSelection};
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
    /// complete blocks; then the incomplete tail, the token included. The
    /// scored tokens choose in parallel (a long prefill has thousands).
    pub fn selection(
        &self,
        spec: &QsaSpec,
        batch: &ForwardBatch,
        scores: &[f32],
    ) -> TokenSelection {
        assert_eq!(scores.len(), self.score_len, "one score per scored block");
        let top = spec.top_blocks();
        let chosen: Vec<Vec<u32>> = self
            .scored
            .par_iter()
            .map(|u| top_k_sorted(&scores[u.at..u.at + u.blocks], top))
            .collect();
        let mut chosen = self.scored.iter().zip(chosen).peekable();
        let tokens = batch
            .positions()
            .into_iter()
            .enumerate()
            .map(|(row, position)| SelectedBlocks {
                position,
                blocks: chosen.next_if(|(u, _)| u.row == row).map(|(_, c)| c),
            })
            .collect();
        TokenSelection {
            ratio: spec.compress_ratio,
            tokens,
        }
    }
}

impl TokenSelection {
    /// What each token reads as pages of `ratio` cache slots (a block's
    /// positions are consecutive slots of one cache page, since pages hold
    /// whole blocks) and how many of their slots: its blocks' pages, then
    /// the page of its tail when it has one.
    pub fn pages(&self, batch: &ForwardBatch, block_size: usize) -> Vec<(Vec<u32>, usize)> {
        let r = self.ratio;
        assert!(
            block_size.is_multiple_of(r),
            "pages of {block_size} positions are not whole blocks of {r}"
        );
        assert_eq!(
            self.tokens.len(),
            batch.num_tokens(),
            "one selection per new token"
        );
        let tables: Vec<&[u32]> = batch
            .seqs
            .iter()
            .flat_map(|q| std::iter::repeat_n(q.block_table.as_slice(), q.num_tokens))
            .collect();
        self.tokens
            .par_iter()
            .zip(tables)
            .map(|(t, table)| {
                let page = |b: usize| {
                    let p = b * r;
                    ((table[p / block_size] as usize * block_size + p % block_size) / r) as u32
                };
                let complete = t.complete(r);
                let tail = t.position as usize + 1 - complete * r;
                let mut pages: Vec<u32> = match &t.blocks {
                    Some(blocks) => blocks.iter().map(|&b| page(b as usize)).collect(),
                    None => (0..complete).map(page).collect(),
                };
                let len = pages.len() * r + tail;
                if tail > 0 {
                    pages.push(page(complete));
                }
                (pages, len)
            })
            .collect()
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
        let positions = sel.positions();
        assert_eq!(positions[0], (0..=10).collect::<Vec<u32>>());
        assert_eq!(positions[1], [0, 1, 2, 3, 8, 9, 10, 11]);
        assert_eq!(positions[2], [4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(positions[3], [0, 1, 2, 3]);
        assert_eq!(sel.tokens[1].blocks, Some(vec![0, 2]));
        assert_eq!(sel.tokens[0].blocks, None);
        // Cache pages of 8 hold two blocks each. Sequence 0 (pages 0, 1):
        // token 10 reads blocks 0, 1 and the tail 8..=10 (slot page 2, 3 of
        // its 4 slots); token 11 blocks 0 and 2 (slots 0..4 and 8..12).
        // Sequence 1 sits on cache page 2: its block 0 is slot page 4.
        let pages = sel.pages(&batch, 8);
        assert_eq!(pages[0], (vec![0, 1, 2], 11));
        assert_eq!(pages[1], (vec![0, 2], 8));
        assert_eq!(pages[2], (vec![1, 2, 3], 9));
        assert_eq!(pages[3], (vec![4], 4));
        // Every page-listed slot is the slot of the position read there.
        for (t, (pages, len)) in pages.iter().enumerate() {
            let slots: Vec<u32> = (0..*len as u32)
                .map(|i| pages[i as usize / 4] * 4 + i % 4)
                .collect();
            let q = if t < 3 {
                &batch.seqs[0]
            } else {
                &batch.seqs[1]
            };
            let want: Vec<u32> = positions[t]
                .iter()
                .map(|&p| q.block_table[p as usize / 8] * 8 + p % 8)
                .collect();
            assert_eq!(slots, want, "token {t}");
        }
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
        assert_eq!(sel.positions()[0], [0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(sel.pages(&batch, 8), [(vec![0, 1], 8)]);
        assert!(!sel.is_dense());
    }
}

//! Verifying a sequence's draft tokens against the target model's rows, so
//! that speculation never changes what is generated.
//!
//! A verify step has `k` drafts and `k + 1` target rows: row `i` is the
//! target's logits for the position of draft `i` (it sees the history and
//! `drafts[..i]`), row `k` the position after the last draft. Each row goes
//! through exactly what [`Sampler::sample`] applies to a row at that
//! position: the `min_tokens` mask and the penalties counted over the
//! history plus the drafts before it, then temperature, min-p, top-k and
//! top-p. The drafts a row sees are counted only while the verification
//! runs; the sampler keeps counting committed history alone.
//!
//! # Greedy
//!
//! The target token of row `i` is its argmax, the token `sample` returns
//! there. Drafts are accepted while they equal it; the first mismatch's
//! target token, or the bonus token of row `k`, comes next. The tokens are
//! those of sampling row by row without speculation, bit for bit. No RNG
//! value is used and the drafts' probabilities are ignored.
//!
//! # Sampled (temperature > 0)
//!
//! Token-level rejection sampling (Leviathan et al. 2022, Chen et al. 2023):
//! with `p_i` the filtered target distribution of row `i` and `q_i` the one
//! draft `i` was drawn from, draft `i` is accepted when `u < p_i(d_i) /
//! q_i(d_i)` for a fresh uniform `u`; on the first rejection the next token
//! is drawn from `max(p_i - q_i, 0)` renormalised, and when all `k` are
//! accepted the bonus token is drawn from `p_k`. Each emitted token is then
//! distributed as sampling without speculation would give it.
//!
//! - Deterministic drafts (n-gram, greedy drafters) have a Dirac `q`: accept
//!   when `u < p_i(d_i)`, else draw from `p_i` without `d_i`.
//! - `q_i(d_i) = 0` (a draft its own distribution could not have drawn: a
//!   drafter bug) is a rejection; `p_i(d_i) = 0` always is one.
//! - A residual that is zero everywhere (`p_i <= q_i` on all of `p_i`'s
//!   support, e.g. the two are equal and the draft was impossible) falls
//!   back to drawing from `p_i`.
//! - `q` must be filtered the way `p` is (temperature, top-k, top-p, min-p
//!   and penalties at the draft's position, see [`Sampler::distribution`]),
//!   and be the distribution the draft was really drawn from: the output is
//!   exact for any such `q`, the acceptance rate is best when `q` is close
//!   to `p`.
//!
//! # RNG stream
//!
//! A sampled verification takes from the sequence's ChaCha stream one
//! uniform per draft it examines (each accepted draft and the rejected one,
//! even when the outcome is certain) and one for the emitted token (the
//! replacement or the bonus): `accepted + 2` values after a rejection,
//! `k + 1` when all `k` drafts are accepted. With no drafts that is the one
//! value of [`Sampler::sample`], which draws the same token from the same
//! row. A seeded request therefore reproduces given the same drafts.

use crate::filters::argmax;
use crate::{SampleError, Sampler};

/// What the proposer knows about its drafts' distributions.
#[derive(Clone, Copy, Debug)]
pub enum DraftProbs<'a> {
    /// The drafts were chosen without a distribution: `q` is a Dirac at each.
    Deterministic,
    /// One row per draft, `q_i` over the vocabulary (indexed by token id,
    /// ids past the row's end have probability 0), filtered the way the
    /// target is, summing to 1.
    Distributions(&'a [Vec<f32>]),
    /// One [`TokenDistribution`] per draft, as [`Sampler::distribution`] returns.
    Sparse(&'a [TokenDistribution]),
}

impl DraftProbs<'_> {
    /// `q_i(token)` for draft `i`, which was `draft`.
    fn prob(&self, i: usize, draft: u32, token: u32) -> f64 {
        match self {
            DraftProbs::Deterministic => f64::from(u8::from(token == draft)),
            DraftProbs::Distributions(rows) => {
                rows[i].get(token as usize).map_or(0.0, |&q| f64::from(q))
            }
            DraftProbs::Sparse(dists) => dists[i].prob(token),
        }
    }

    fn len(&self) -> Option<usize> {
        match self {
            DraftProbs::Deterministic => None,
            DraftProbs::Distributions(rows) => Some(rows.len()),
            DraftProbs::Sparse(dists) => Some(dists.len()),
        }
    }
}

/// A row's filtered distribution: the tokens that can be drawn, in id
/// order, and their probabilities, which sum to 1 (up to rounding).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenDistribution {
    pub ids: Vec<u32>,
    pub probs: Vec<f64>,
}

impl TokenDistribution {
    /// The probability of `token` (0 when it cannot be drawn).
    pub fn prob(&self, token: u32) -> f64 {
        self.ids
            .binary_search(&token)
            .map_or(0.0, |at| self.probs[at])
    }

    /// The distribution as a dense row of `vocab` probabilities.
    pub fn to_dense(&self, vocab: usize) -> Vec<f32> {
        let mut row = vec![0.0; vocab];
        for (&id, &p) in self.ids.iter().zip(&self.probs) {
            if let Some(slot) = row.get_mut(id as usize) {
                *slot = p as f32;
            }
        }
        row
    }
}

/// The outcome of verifying one sequence's drafts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// Drafts accepted, a prefix of them: `0..=k`.
    pub accepted: usize,
    /// The token after the accepted drafts: the replacement of draft
    /// `accepted`, or the bonus token when all `k` were accepted.
    pub next: u32,
}

impl Verified {
    /// Tokens this step emits: the accepted drafts and `next`.
    pub fn emitted(&self) -> usize {
        self.accepted + 1
    }
}

/// The weight of `token` when it is a kept candidate, else 0.
fn kept_weight(candidates: &[u32], weights: &[f32], token: u32) -> f64 {
    if candidates.binary_search(&token).is_ok() {
        f64::from(weights[token as usize])
    } else {
        0.0
    }
}

impl Sampler {
    /// Verify `drafts` against the target's `rows` (`drafts.len() + 1` raw
    /// logits rows, modified in place as [`Sampler::sample`] modifies its
    /// row). `history` is the prompt and the tokens generated before the
    /// drafts; row `i` sees it followed by `drafts[..i]`. `q` is ignored when
    /// greedy. The rules and the RNG values used are in the module docs.
    ///
    /// Errors as `sample` would on the first row examined that has no
    /// finite logit (or a `+inf` one when sampling); rows after the first
    /// rejection are not read.
    ///
    /// # Panics
    /// When `rows` is not one longer than `drafts`, or `q` does not hold one
    /// distribution per draft.
    pub fn verify<R: AsMut<[f32]>>(
        &mut self,
        rows: &mut [R],
        history: &[u32],
        drafts: &[u32],
        q: DraftProbs<'_>,
    ) -> Result<Verified, SampleError> {
        assert_eq!(rows.len(), drafts.len() + 1, "one row per draft, plus one");
        if let Some(n) = q.len() {
            assert_eq!(n, drafts.len(), "one draft distribution per draft");
        }
        self.counts.sync(history);
        let verified = self.verify_rows(rows, drafts, q);
        self.counts.pop_pending();
        verified
    }

    /// The filtered target distribution of `logits` (modified in place as
    /// by [`Sampler::sample`]) at the position after `history` and then
    /// `pending` (drafts not yet verified, counted for the penalties and the
    /// `min_tokens` mask only during this call): the distribution `sample`
    /// draws from there. Greedy requests get a one-hot at the argmax. For
    /// drafters that draw with the target's filters and must report `q`.
    pub fn distribution(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
        pending: &[u32],
    ) -> Result<TokenDistribution, SampleError> {
        self.counts.sync(history);
        for &token in pending {
            self.counts.push_pending(token);
        }
        let dist = self.row_distribution(logits);
        self.counts.pop_pending();
        dist
    }

    fn row_distribution(&mut self, logits: &mut [f32]) -> Result<TokenDistribution, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        self.penalise(logits);
        if self.params.is_greedy() {
            let id = argmax(logits).ok_or(SampleError::NoCandidate)?;
            return Ok(TokenDistribution {
                ids: vec![id],
                probs: vec![1.0],
            });
        }
        self.keep(logits)?;
        let total = self.kept_total();
        Ok(TokenDistribution {
            ids: self.candidates.clone(),
            probs: self
                .candidates
                .iter()
                .map(|&id| f64::from(self.weights[id as usize]) / total)
                .collect(),
        })
    }

    fn verify_rows<R: AsMut<[f32]>>(
        &mut self,
        rows: &mut [R],
        drafts: &[u32],
        q: DraftProbs<'_>,
    ) -> Result<Verified, SampleError> {
        for (i, row) in rows.iter_mut().enumerate() {
            if i > 0 {
                self.counts.push_pending(drafts[i - 1]);
            }
            let row = row.as_mut();
            if row.is_empty() {
                return Err(SampleError::EmptyLogits);
            }
            self.penalise(row);
            let draft = drafts.get(i).copied();
            if self.params.is_greedy() {
                let target = argmax(row).ok_or(SampleError::NoCandidate)?;
                if draft != Some(target) {
                    return Ok(Verified {
                        accepted: i,
                        next: target,
                    });
                }
                continue;
            }
            self.keep(row)?;
            let Some(draft) = draft else {
                let next = self.draw_kept()?;
                return Ok(Verified { accepted: i, next });
            };
            let total = self.kept_total();
            let p_draft = kept_weight(&self.candidates, &self.weights, draft) / total;
            let q_draft = q.prob(i, draft, draft);
            let u = self.uniform();
            if q_draft > 0.0 && u * q_draft < p_draft {
                continue;
            }
            let next = self.draw_residual(i, draft, &q, total)?;
            return Ok(Verified { accepted: i, next });
        }
        unreachable!("the last row has no draft and always decides")
    }

    /// The kept candidates' weight sum, in id order as `draw` sums it.
    fn kept_total(&self) -> f64 {
        self.candidates
            .iter()
            .map(|&id| f64::from(self.weights[id as usize]))
            .sum()
    }

    /// One draw from `max(p - q_i, 0)` over the kept candidates (`p` their
    /// weights over `total`), or from `p` when that is zero everywhere.
    fn draw_residual(
        &mut self,
        i: usize,
        draft: u32,
        q: &DraftProbs<'_>,
        total: f64,
    ) -> Result<u32, SampleError> {
        self.residual.clear();
        let mut mass = 0.0;
        for &id in &self.candidates {
            let p = f64::from(self.weights[id as usize]) / total;
            let r = (p - q.prob(i, draft, id)).max(0.0);
            mass += r;
            self.residual.push(r);
        }
        if mass <= 0.0 {
            return self.draw_kept();
        }
        let target = self.uniform() * mass;
        let mut sum = 0.0;
        for (&id, &r) in self.candidates.iter().zip(&self.residual) {
            sum += r;
            if target < sum {
                return Ok(id);
            }
        }
        // Rounding with a uniform close to 1: the last id with any residual.
        let last = self.residual.iter().rposition(|&r| r > 0.0);
        last.map(|at| self.candidates[at])
            .ok_or(SampleError::NoCandidate)
    }
}

/// Greedy acceptance when the target tokens are already known: each row's
/// argmax of the raw logits, picked on the device when
/// [`Sampler::is_plain_argmax`] holds for the history (it then holds for
/// every row after it, which only adds generated tokens). The longest prefix of `drafts` equal to `targets`, then the
/// first mismatch's target or the bonus. `targets` holds `drafts.len() + 1`
/// tokens.
///
/// # Panics
/// When `targets` is not one longer than `drafts`.
pub fn accept_greedy(targets: &[u32], drafts: &[u32]) -> Verified {
    assert_eq!(
        targets.len(),
        drafts.len() + 1,
        "one target per draft, plus one"
    );
    let accepted = drafts
        .iter()
        .zip(targets)
        .take_while(|(d, t)| d == t)
        .count();
    Verified {
        accepted,
        next: targets[accepted],
    }
}

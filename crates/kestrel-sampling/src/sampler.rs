//! The per-sequence sampler: RNG, token counts and reusable scratch buffers.

use kestrel_core::candidates::KeptDraw;
use kestrel_core::{CandidateRequest, RowCandidates};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;

use crate::filters::{
    argmax, collect_candidates, compute_weights, draw, min_p_threshold, top_k, top_p, top_p_within,
};
use crate::penalties::TokenCounts;
use crate::{InvalidParam, SamplingParams, StopConditions};

/// A logits row no token can be drawn from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SampleError {
    #[error("the logits row is empty")]
    EmptyLogits,
    #[error("no token has a finite logit (the row is all NaN or -inf)")]
    NoCandidate,
    #[error("the logits row contains +inf")]
    InfiniteLogit,
}

/// Samples the tokens of one sequence. Created at admission, kept for the
/// sequence's lifetime: it owns the RNG stream, so the same seed, prompt and
/// logits give the same tokens.
#[derive(Clone, Debug)]
pub struct Sampler {
    pub(crate) params: SamplingParams,
    rng: ChaCha20Rng,
    pub(crate) counts: TokenCounts,
    /// Ids masked while fewer than `min_tokens` were generated.
    stopping_ids: Vec<u32>,
    pub(crate) candidates: Vec<u32>,
    /// Indexed by token id; only candidates' entries are meaningful.
    pub(crate) weights: Vec<f32>,
    /// Scratch for a rejected draft's residual distribution, one entry per
    /// kept candidate ([`crate::verify`]).
    pub(crate) residual: Vec<f64>,
    prompt_len: usize,
    /// The RNG's next uniform, drawn early for a device draw
    /// ([`Sampler::candidate_request`]) and used by the next token drawn,
    /// whichever path draws it: the stream stays one value per sampled token.
    next_uniform: Option<f64>,
}

impl Sampler {
    /// `prompt_len` splits the history passed to [`Sampler::sample`] into
    /// prompt and output; `eos_token_ids` are the model's end ids.
    pub fn new(
        params: &SamplingParams,
        prompt_len: usize,
        eos_token_ids: &[u32],
    ) -> Result<Self, InvalidParam> {
        params.validate()?;
        let rng = match params.seed {
            Some(seed) => ChaCha20Rng::seed_from_u64(seed),
            None => ChaCha20Rng::from_rng(&mut rand::rng()),
        };
        Ok(Self {
            params: params.clone(),
            rng,
            counts: TokenCounts::new(prompt_len, params.repetition_penalty != 1.0),
            stopping_ids: StopConditions::new(params, eos_token_ids).stopping_ids(),
            candidates: Vec::new(),
            weights: Vec::new(),
            residual: Vec::new(),
            prompt_len,
            next_uniform: None,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether the next token is simply the argmax of the raw logits: greedy,
    /// no penalties, and no end token masked by `min_tokens`. A backend can
    /// then pick it without copying the logits to the host; [`Sampler::sample`]
    /// would return the same token (except that it reports a row without any
    /// finite logit as an error). `history` as for `sample`.
    pub fn is_plain_argmax(&self, history: &[u32]) -> bool {
        let p = &self.params;
        p.is_greedy()
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && history.len().saturating_sub(self.prompt_len) >= p.min_tokens
    }

    /// Choose the next token. `logits` is the raw row for the next position
    /// (it is modified in place: penalties and masks); `history` is prompt +
    /// tokens generated so far and only ever grows between calls.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32, SampleError> {
        if logits.is_empty() {
            return Err(SampleError::EmptyLogits);
        }
        self.counts.sync(history);
        self.penalise(logits);
        self.choose(logits)
    }

    /// The `min_tokens` mask and the penalties, for the tokens counted so
    /// far (the synced history and any pending drafts).
    pub(crate) fn penalise(&self, logits: &mut [f32]) {
        if self.masks_stopping_ids() {
            for &id in &self.stopping_ids {
                if let Some(logit) = logits.get_mut(id as usize) {
                    *logit = f32::NEG_INFINITY;
                }
            }
        }
        let p = &self.params;
        self.counts.apply(
            logits,
            p.repetition_penalty,
            p.frequency_penalty,
            p.presence_penalty,
        );
    }

    /// The request for [`Backend::top_candidates`](kestrel_core::Backend::top_candidates)
    /// that lets [`Sampler::sample_candidates`] choose this step's token from
    /// row `row` (of which the first `cols` ids may be sampled), asking for at
    /// most `max_candidates` when `top_k` does not bound them (the engine uses
    /// [`DEFAULT_MAX_CANDIDATES`]). When nothing cuts the row (no top-k below
    /// `cols`, top-p 1, min-p 0) and it is longer than that, the request asks
    /// for one candidate and carries this token's uniform draw instead, taken
    /// from the RNG now (the token drawn next uses it, on any path). `None`
    /// when the answer could never decide: a top-k above `max_candidates`
    /// that cuts the row, with top-p 1 and min-p 0. `history` as for
    /// [`Sampler::sample`].
    pub fn candidate_request(
        &mut self,
        history: &[u32],
        row: usize,
        cols: usize,
        max_candidates: usize,
    ) -> Option<CandidateRequest> {
        if cols == 0 || max_candidates == 0 {
            return None;
        }
        self.counts.sync(history);
        let p = &self.params;
        let unfiltered = p.top_p >= 1.0 && p.min_p <= 0.0;
        let mut uniform = None;
        let count = if p.is_greedy() {
            1
        } else {
            match p.top_k_limit() {
                Some(k) if k <= max_candidates => k,
                // Every eligible id is kept: the device draws over the row.
                k if unfiltered && cols > max_candidates && k.is_none_or(|k| k >= cols) => {
                    uniform = Some(*self.next_uniform.get_or_insert_with(|| self.rng.random()));
                    1
                }
                _ if unfiltered && cols > max_candidates => return None,
                _ => max_candidates,
            }
        }
        .min(cols);
        // The weight sum only matters for top-p over a kept set longer than
        // the answer, and for the device's draw.
        let needs_weight = uniform.is_some()
            || !p.is_greedy() && p.top_p < 1.0 && p.top_k_limit().is_none_or(|k| k > count);
        let masked = if self.masks_stopping_ids() {
            self.stopping_ids
                .iter()
                .copied()
                .filter(|&id| (id as usize) < cols)
                .collect()
        } else {
            Vec::new()
        };
        Some(CandidateRequest {
            row,
            cols,
            count,
            penalties: self.counts.penalties(
                p.repetition_penalty,
                p.frequency_penalty,
                p.presence_penalty,
            ),
            masked,
            repetition: p.repetition_penalty,
            frequency: p.frequency_penalty,
            presence: p.presence_penalty,
            min_p_offset: if p.is_greedy() || p.min_p <= 0.0 {
                f32::NEG_INFINITY
            } else {
                p.temperature * p.min_p.ln()
            },
            inv_temperature: if needs_weight {
                1.0 / p.temperature
            } else {
                0.0
            },
            uniform,
        })
    }

    /// Choose the token from a backend's answer to `request` (made by
    /// [`Sampler::candidate_request`] for this step): the same token, and the
    /// same RNG draw, as [`Sampler::sample`] on the whole row. `None` when the
    /// candidates cannot decide it (then no uniform was used up: `sample` on
    /// the row draws with the one a draw request carried, or a fresh one).
    /// The rules are in the crate documentation.
    pub fn sample_candidates(
        &mut self,
        request: &CandidateRequest,
        found: &RowCandidates,
    ) -> Option<Result<u32, SampleError>> {
        // The candidates as a short row in id order: position i holds the
        // i-th smallest id, so filters that break ties by position (and sum
        // in position order) act on it as on the whole row.
        let mut by_id: Vec<(u32, f32)> = found
            .ids
            .iter()
            .copied()
            .zip(found.logits.iter().copied())
            .collect();
        by_id.sort_unstable_by_key(|c| c.0);
        let short_row: Vec<f32> = by_id.iter().map(|c| c.1).collect();
        let id_at = |i: u32| by_id[i as usize].0;
        match self.coverage(request, found) {
            Coverage::Decides => Some(self.choose(&short_row).map(id_at)),
            Coverage::TopPInside => self
                .choose_in_nucleus(&short_row, found.kept_weight)
                .map(|r| r.map(id_at)),
            Coverage::Drawn(uniform) => {
                let id = drawn_id(found, uniform)?;
                debug_assert_eq!(self.next_uniform, Some(uniform), "a stale request");
                self.next_uniform = None;
                Some(Ok(id))
            }
            Coverage::NeedsRow => None,
        }
    }

    /// Whether the kept set of the full pipeline is known to lie within `found`.
    fn coverage(&self, request: &CandidateRequest, found: &RowCandidates) -> Coverage {
        let p = &self.params;
        let n = found.ids.len();
        let threshold = min_p_threshold(found.max_logit, p.temperature, p.min_p);
        let whole_row = n < request.count;
        let min_p_cuts_inside = found.logits.last().is_some_and(|&last| last < threshold);
        let top_k_inside = p.top_k_limit().is_some_and(|k| k <= n);
        if p.is_greedy()
            || whole_row
            || found.max_logit == f32::INFINITY
            || min_p_cuts_inside
            || top_k_inside
            || found.kept <= n
        {
            return Coverage::Decides;
        }
        // The min-p kept set reaches past the candidates; top-k does not cut
        // it, so only top-p can end the kept set inside them.
        if p.top_p < 1.0
            && p.top_k_limit().is_none_or(|k| k >= found.kept)
            && request.inv_temperature > 0.0
        {
            Coverage::TopPInside
        } else if let Some(uniform) = request.uniform {
            // Asked for only when nothing cuts the row: the kept set is every
            // eligible id, over which the backend drew.
            Coverage::Drawn(uniform)
        } else {
            Coverage::NeedsRow
        }
    }

    /// Top-p and the draw on the best candidates of a longer kept set whose
    /// weight sum the backend reported (`kept_weight`, within
    /// [`KEPT_WEIGHT_TOLERANCE`] of the host's): `None` when that uncertainty
    /// leaves the nucleus's end open, or it ends past the candidates.
    fn choose_in_nucleus(
        &mut self,
        short_row: &[f32],
        kept_weight: f64,
    ) -> Option<Result<u32, SampleError>> {
        let p = &self.params;
        let max_logit = max_logit(short_row);
        collect_candidates(short_row, f32::NEG_INFINITY, &mut self.candidates);
        compute_weights(
            short_row,
            &self.candidates,
            max_logit,
            1.0 / p.temperature,
            &mut self.weights,
        );
        let bounds = (
            kept_weight * (1.0 - KEPT_WEIGHT_TOLERANCE),
            kept_weight * (1.0 + KEPT_WEIGHT_TOLERANCE),
        );
        if !top_p_within(
            short_row,
            &mut self.candidates,
            p.top_p,
            &self.weights,
            bounds,
        ) {
            return None;
        }
        Some(self.draw_kept())
    }

    /// Whether the end tokens are masked this step (fewer than `min_tokens` generated).
    fn masks_stopping_ids(&self) -> bool {
        self.counts.num_output() < self.params.min_tokens
    }

    /// The pipeline after penalties: greedy argmax, or temperature, min-p,
    /// top-k, top-p and one draw. The result indexes `logits`.
    fn choose(&mut self, logits: &[f32]) -> Result<u32, SampleError> {
        let p = &self.params;
        if p.is_greedy() {
            return argmax(logits).ok_or(SampleError::NoCandidate);
        }
        self.keep(logits)?;
        self.draw_kept()
    }

    /// Temperature, min-p, top-k and top-p of a sampled (not greedy) row:
    /// leaves the kept ids in `candidates`, in id order, and their weights
    /// at their ids in `weights`.
    pub(crate) fn keep(&mut self, logits: &[f32]) -> Result<(), SampleError> {
        let p = &self.params;
        let max_logit = max_logit(logits);
        if max_logit == f32::NEG_INFINITY {
            return Err(SampleError::NoCandidate);
        }
        if max_logit == f32::INFINITY {
            return Err(SampleError::InfiniteLogit);
        }
        // vLLM order after temperature: min-p, then top-k, then top-p.
        let threshold = min_p_threshold(max_logit, p.temperature, p.min_p);
        collect_candidates(logits, threshold, &mut self.candidates);
        if let Some(k) = p.top_k_limit() {
            top_k(logits, &mut self.candidates, k);
        }
        let total = compute_weights(
            logits,
            &self.candidates,
            max_logit,
            1.0 / p.temperature,
            &mut self.weights,
        );
        top_p(logits, &mut self.candidates, p.top_p, &self.weights, total);
        Ok(())
    }

    /// The one RNG draw of a sampled token, over the kept candidates (the
    /// uniform a device draw was asked with, if it did not decide).
    pub(crate) fn draw_kept(&mut self) -> Result<u32, SampleError> {
        let uniform = self.uniform();
        draw(&self.candidates, &self.weights, uniform).ok_or(SampleError::NoCandidate)
    }

    /// The next value of the RNG stream in `[0, 1)`: the one a device draw
    /// was asked with, if it is still unused, else a fresh one.
    pub(crate) fn uniform(&mut self) -> f64 {
        self.next_uniform
            .take()
            .unwrap_or_else(|| self.rng.random())
    }
}

/// Candidates asked for when `top_k` does not bound them: enough for the
/// nucleus of a peaked distribution, a few kilobytes to copy per row.
pub const DEFAULT_MAX_CANDIDATES: usize = 1024;

/// How far a backend's [`RowCandidates::kept_weight`] may be from the host's
/// sum, relative: each weight is an f32 `exp` within 1 ulp on the host (libm)
/// and 2 ulp on a GPU (CUDA `expf`) of the true value, so sums of the same
/// terms differ by at most 3 * 2^-23 ≈ 3.6e-7 of the total (f64 summation
/// adds ~1e-11); this leaves a margin of more than 5. The same holds for
/// every partial sum of the backend's draw ([`kestrel_core::candidates::KeptDraw`]).
pub const KEPT_WEIGHT_TOLERANCE: f64 = 2e-6;

/// What a backend's candidates can decide.
enum Coverage {
    /// The whole kept set lies within them: run the pipeline on them.
    Decides,
    /// The min-p kept set is longer, but top-p may end inside them.
    TopPInside,
    /// Every eligible id is kept and the backend drew over them with this uniform.
    Drawn(f64),
    NeedsRow,
}

/// The id the host's draw (`filters::draw` over every kept id, in id order)
/// picks, when the backend's report proves it: `None` when the report is
/// missing or the target lies too close to a boundary to tell.
///
/// The host picks the first id whose cumulative weight `C(id)` exceeds its
/// target `T = uniform * C(last)`, i.e. `id` exactly when
/// `C(id - 1) <= T < C(id)`. The backend's sums are of the same penalised
/// logits' weights, each within a relative [`KEPT_WEIGHT_TOLERANCE`] of the
/// host's (all terms are positive, so every prefix sum is too), plus an
/// absolute `2^-126` per term for weights one side flushes to zero. So the
/// host's `C(id - 1)` is at most `before * (1 + tol) + slack`, its `C(id)` at
/// least `after * (1 - tol) - slack`, and its `T` within `uniform *
/// kept_weight * (1 ± tol) ± slack` (its product rounds by 2^-53, far inside
/// the margin); the id is accepted only when those intervals do not touch.
fn drawn_id(found: &RowCandidates, uniform: f64) -> Option<u32> {
    let KeptDraw { id, before, after } = found.draw?;
    let tol = KEPT_WEIGHT_TOLERANCE;
    let slack = found.kept as f64 * f64::from(f32::MIN_POSITIVE);
    let target = uniform * found.kept_weight;
    let target_low = target * (1.0 - tol) - slack;
    let target_high = target * (1.0 + tol) + slack;
    let settled = before * (1.0 + tol) + slack <= target_low
        && target_high < after * (1.0 - tol) - slack
        && found.max_logit.is_finite();
    settled.then_some(id)
}

/// Largest non-NaN logit (`-inf` when none).
fn max_logit(logits: &[f32]) -> f32 {
    logits
        .iter()
        .copied()
        .filter(|l| !l.is_nan())
        .fold(f32::NEG_INFINITY, f32::max)
}

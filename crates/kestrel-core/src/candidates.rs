//! Sampling candidates: the few best tokens of a logits row after penalties,
//! so that a sampler can finish on them without copying the whole row.
//!
//! [`Backend::top_candidates`](crate::Backend::top_candidates) answers a
//! [`CandidateRequest`] per row with a [`RowCandidates`]. The penalties are the
//! sampler's (`kestrel-sampling/src/penalties.rs`), in the same f32 operations,
//! so both sides see bit-identical penalised logits. [`top_candidates_host`] is
//! the reference every backend is checked against.
//!
//! A request may also carry the sampler's uniform draw: the backend then
//! walks the kept logits in id order and reports where their cumulative
//! weight crosses `uniform * kept_weight` ([`KeptDraw`]), so a row that no
//! filter cuts (every finite logit kept) is sampled without copying it.

/// Penalties of one token id that occurs in a sequence's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenPenalty {
    pub id: u32,
    /// In the prompt or the output: the repetition penalty applies.
    pub seen: bool,
    /// Occurrences in the output: frequency (per occurrence) and presence
    /// (once, when non-zero) apply.
    pub output_count: u32,
}

/// What to find in one row of a logits matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct CandidateRequest {
    /// The row of the logits matrix.
    pub row: usize,
    /// Only the first `cols` columns take part (a padded vocabulary's tail
    /// stays out); `1..=row length`.
    pub cols: usize,
    /// Candidates wanted, at least 1.
    pub count: usize,
    /// Distinct ids; ids at or past `cols` are ignored.
    pub penalties: Vec<TokenPenalty>,
    /// Ids whose logit becomes `-inf` (end tokens before `min_tokens`).
    pub masked: Vec<u32>,
    /// Divides positive / multiplies other logits of seen ids; 1 is off.
    pub repetition: f32,
    pub frequency: f32,
    pub presence: f32,
    /// Logits at least `max_logit + min_p_offset` are counted into
    /// [`RowCandidates::kept`]; `-inf` counts every finite one.
    pub min_p_offset: f32,
    /// When positive, [`RowCandidates::kept_weight`] sums
    /// `exp((logit - max_logit) * inv_temperature)` over the counted logits;
    /// 0 skips that work.
    pub inv_temperature: f32,
    /// The sampler's uniform draw in `[0, 1)`: with a positive
    /// `inv_temperature`, also find [`RowCandidates::draw`]. `None` skips it.
    pub uniform: Option<f64>,
}

/// Where the kept logits' cumulative weight, walked in id order, first
/// exceeds `uniform * kept_weight`: the sampler's draw (`filters::draw` in
/// kestrel-sampling) as the backend's arithmetic sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeptDraw {
    pub id: u32,
    /// The weight of the kept ids below `id`, and with it: the sampler checks
    /// that its own sums, which may differ by rounding, cross at the same id.
    pub before: f64,
    pub after: f64,
}

/// The answer for one [`CandidateRequest`].
#[derive(Clone, Debug, PartialEq)]
pub struct RowCandidates {
    /// The `min(count, eligible)` best ids, best first (see [`rank_key`]);
    /// eligible means a penalised logit that is neither NaN nor `-inf`.
    pub ids: Vec<u32>,
    /// Their penalised logits.
    pub logits: Vec<f32>,
    /// The largest eligible penalised logit (a zero reported as `+0`), `-inf`
    /// when none is eligible.
    pub max_logit: f32,
    /// Eligible logits at least `max_logit + min_p_offset`: an exact count.
    pub kept: usize,
    /// Their weight sum (see [`CandidateRequest::inv_temperature`]). A device
    /// may differ from the host's f32 `exp` by a few ulp per term.
    pub kept_weight: f64,
    /// Asked for by [`CandidateRequest::uniform`]; `None` also when rounding
    /// left the target at or past the last cumulative weight.
    pub draw: Option<KeptDraw>,
}

impl RowCandidates {
    /// Orders `(id, logit)` pairs best first, as [`RowCandidates::ids`] promises.
    pub fn new(
        mut found: Vec<(u32, f32)>,
        max_logit: f32,
        kept: usize,
        kept_weight: f64,
        draw: Option<KeptDraw>,
    ) -> Self {
        found.sort_unstable_by(|a, b| rank_key(b.1).cmp(&rank_key(a.1)).then(a.0.cmp(&b.0)));
        Self {
            ids: found.iter().map(|c| c.0).collect(),
            logits: found.iter().map(|c| c.1).collect(),
            max_logit,
            kept,
            kept_weight,
            draw,
        }
    }
}

/// An integer that orders logits like their values, with `-0.0` equal to
/// `+0.0` (so ties between zeros go to the lower id, as in an argmax).
/// Candidates are ranked by key, descending, then by id, ascending.
pub fn rank_key(logit: f32) -> u32 {
    let bits = if logit == 0.0 { 0 } else { logit.to_bits() };
    if bits & 0x8000_0000 != 0 {
        !bits
    } else {
        bits | 0x8000_0000
    }
}

/// The logit of a [`rank_key`] (a zero comes back as `+0.0`).
pub fn logit_of_key(key: u32) -> f32 {
    f32::from_bits(if key & 0x8000_0000 != 0 {
        key & 0x7fff_ffff
    } else {
        !key
    })
}

/// A logit that can become a candidate: not NaN, above `-inf`.
pub fn is_eligible(logit: f32) -> bool {
    logit > f32::NEG_INFINITY
}

/// `logit` after the sampler's penalties, in its order and f32 operations:
/// repetition, then frequency, then presence.
pub fn penalised_logit(
    logit: f32,
    p: &TokenPenalty,
    repetition: f32,
    frequency: f32,
    presence: f32,
) -> f32 {
    let mut l = logit;
    if p.seen && repetition != 1.0 {
        l = if l > 0.0 {
            l / repetition
        } else {
            l * repetition
        };
    }
    if p.output_count > 0 && (frequency != 0.0 || presence != 0.0) {
        l -= frequency * p.output_count as f32;
        l -= presence;
    }
    l
}

/// The min-p line: `-inf` when `offset` is, else `max_logit + offset` in f32.
pub fn kept_threshold(max_logit: f32, min_p_offset: f32) -> f32 {
    if min_p_offset == f32::NEG_INFINITY {
        f32::NEG_INFINITY
    } else {
        max_logit + min_p_offset
    }
}

/// [`Backend::top_candidates`](crate::Backend::top_candidates) over a host
/// matrix with `row_len` columns: the reference implementation.
pub fn top_candidates_host(
    values: &[f32],
    row_len: usize,
    rows: &[CandidateRequest],
) -> Vec<RowCandidates> {
    rows.iter()
        .map(|req| {
            check_request(req, values.len() / row_len.max(1), row_len);
            let start = req.row * row_len;
            let row = penalised_row(&values[start..start + req.cols], req);
            row_candidates(&row, req)
        })
        .collect()
}

/// Panics on a request no backend can answer (a caller's bug).
pub fn check_request(req: &CandidateRequest, rows: usize, row_len: usize) {
    assert!(req.row < rows, "candidate row {} of {rows}", req.row);
    assert!(
        (1..=row_len).contains(&req.cols),
        "candidates over {} of {row_len} columns",
        req.cols
    );
    assert!(req.count >= 1, "at least one candidate must be asked for");
    assert!(
        req.uniform.is_none_or(|u| (0.0..1.0).contains(&u)),
        "uniform draw {:?} outside [0, 1)",
        req.uniform
    );
}

/// The first `cols` logits of a row with the request's penalties and mask.
fn penalised_row(raw: &[f32], req: &CandidateRequest) -> Vec<f32> {
    let mut row = raw.to_vec();
    for p in &req.penalties {
        if let Some(l) = row.get_mut(p.id as usize) {
            *l = penalised_logit(*l, p, req.repetition, req.frequency, req.presence);
        }
    }
    // After the penalties (the sampler masks first): -inf stays -inf either way.
    for &id in &req.masked {
        if let Some(l) = row.get_mut(id as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    row
}

fn row_candidates(row: &[f32], req: &CandidateRequest) -> RowCandidates {
    let eligible = || row.iter().enumerate().filter(|(_, l)| is_eligible(**l));
    let max_logit = eligible()
        .map(|(_, &l)| rank_key(l))
        .max()
        .map_or(f32::NEG_INFINITY, logit_of_key);
    let threshold = kept_threshold(max_logit, req.min_p_offset);
    let kept_ids = || eligible().filter(|(_, l)| **l >= threshold);
    let weight = |l: f32| ((l - max_logit) * req.inv_temperature).exp();
    let (mut kept, mut kept_weight) = (0usize, 0f64);
    for (_, &l) in kept_ids() {
        kept += 1;
        if req.inv_temperature > 0.0 {
            kept_weight += weight(l) as f64;
        }
    }
    // The sampler's draw, operation for operation: f32 weights, f64 sums in
    // id order, the first id whose cumulative weight exceeds the target.
    let draw = req
        .uniform
        .filter(|_| req.inv_temperature > 0.0)
        .and_then(|u| {
            let target = u * kept_weight;
            let mut mass = 0.0f64;
            kept_ids().find_map(|(id, &l)| {
                let before = mass;
                mass += weight(l) as f64;
                (target < mass).then_some(KeptDraw {
                    id: id as u32,
                    before,
                    after: mass,
                })
            })
        });
    let mut found: Vec<(u32, f32)> = eligible().map(|(id, &l)| (id as u32, l)).collect();
    let by_rank =
        |a: &(u32, f32), b: &(u32, f32)| rank_key(b.1).cmp(&rank_key(a.1)).then(a.0.cmp(&b.0));
    if req.count < found.len() {
        found.select_nth_unstable_by(req.count - 1, by_rank);
        found.truncate(req.count);
    }
    RowCandidates::new(found, max_logit, kept, kept_weight, draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(cols: usize, count: usize) -> CandidateRequest {
        CandidateRequest {
            row: 0,
            cols,
            count,
            penalties: Vec::new(),
            masked: Vec::new(),
            repetition: 1.0,
            frequency: 0.0,
            presence: 0.0,
            min_p_offset: f32::NEG_INFINITY,
            inv_temperature: 0.0,
            uniform: None,
        }
    }

    #[test]
    fn keys_order_like_values_with_equal_zeros() {
        let v = [
            f32::NEG_INFINITY,
            -3.5,
            -1e-40,
            -0.0,
            0.0,
            1e-40,
            2.0,
            f32::INFINITY,
        ];
        for w in v.windows(2) {
            assert!(rank_key(w[0]) <= rank_key(w[1]), "{w:?}");
        }
        assert_eq!(rank_key(-0.0), rank_key(0.0));
        for x in v {
            let back = logit_of_key(rank_key(x));
            assert!(back == x && (x != 0.0 || back.is_sign_positive()), "{x}");
        }
    }

    #[test]
    fn best_first_ties_to_lower_ids_nan_and_masked_never() {
        let row = [1.0, f32::NAN, 3.0, 3.0, f32::NEG_INFINITY, 2.0, 9.0];
        let mut req = request(6, 3);
        req.masked = vec![5];
        let c = &top_candidates_host(&row, 7, &[req.clone()])[0];
        assert_eq!(c.ids, vec![2, 3, 0]);
        assert_eq!(c.logits, vec![3.0, 3.0, 1.0]);
        assert_eq!((c.max_logit, c.kept), (3.0, 3));
        req.count = 10;
        let c = &top_candidates_host(&row, 7, &[req])[0];
        assert_eq!(c.ids, vec![2, 3, 0], "fewer eligible than asked");
    }

    #[test]
    fn penalties_and_kept_weight() {
        let row = [2.0, -1.0, 0.5, 1.0];
        let mut req = request(4, 2);
        req.repetition = 2.0;
        req.frequency = 0.5;
        req.presence = 0.25;
        req.penalties = vec![
            TokenPenalty {
                id: 0,
                seen: true,
                output_count: 0,
            },
            TokenPenalty {
                id: 1,
                seen: true,
                output_count: 2,
            },
            TokenPenalty {
                id: 9,
                seen: true,
                output_count: 1,
            },
        ];
        req.min_p_offset = -1.0;
        req.inv_temperature = 1.0;
        let c = &top_candidates_host(&row, 4, &[req])[0];
        // Penalised: [1.0, -3.25, 0.5, 1.0]; kept: >= 0.0.
        assert_eq!(c.ids, vec![0, 3]);
        assert_eq!(c.kept, 3);
        let want = 1.0 + (-0.5f32).exp() as f64 + 1.0;
        assert!((c.kept_weight - want).abs() < 1e-12);
        assert_eq!(c.draw, None, "not asked for");
    }

    #[test]
    fn draw_walks_kept_ids_in_id_order() {
        // Weights 1, -, 1, 0.5 (id 1 masked): cumulative 1, 2, 2.5.
        let row = [0.0, 5.0, 0.0, -(2.0f32.ln())];
        let mut req = request(4, 1);
        req.masked = vec![1];
        req.inv_temperature = 1.0;
        let draw_at = |u: f64| {
            let req = CandidateRequest {
                uniform: Some(u),
                ..req.clone()
            };
            top_candidates_host(&row, 4, &[req]).remove(0).draw.unwrap()
        };
        assert_eq!(
            draw_at(0.0),
            KeptDraw {
                id: 0,
                before: 0.0,
                after: 1.0
            }
        );
        assert_eq!(draw_at(0.3999).id, 0);
        // Target 1.0 is not below the cumulative 1.0: the next kept id.
        assert_eq!(
            draw_at(0.4),
            KeptDraw {
                id: 2,
                before: 1.0,
                after: 2.0
            }
        );
        assert_eq!(draw_at(0.7999).id, 2);
        assert_eq!(draw_at(0.8).id, 3);
        assert_eq!(draw_at(0.999).id, 3);
    }
}

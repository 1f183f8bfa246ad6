//! Candidate filters over one logits row: greedy argmax, min-p, top-k, top-p
//! and the final draw.
//!
//! Temperature is folded into the weights (`exp((logit - max) / T)`) instead
//! of rewriting the whole row: min-p becomes a logit threshold and top-k does
//! not depend on it, so only the surviving candidates are ever exponentiated.
//! Candidates are token ids; NaN and `-inf` logits never become candidates.
//!
//! Every filter leaves the candidates in ascending id order, whatever order
//! it works in: the weight sums and the draw walk them in that order, so a
//! sampler that sees only some of a row's ids (the device's best candidates)
//! sums and draws exactly as one that sees the whole row.

use std::cmp::Ordering;

use kestrel_core::candidates::rank_key;

/// Largest logit, ties to the lowest id; NaN is skipped. `None` when no
/// logit is a number above `-inf`.
pub(crate) fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best = f32::NEG_INFINITY;
    let mut best_id = None;
    for (id, &logit) in logits.iter().enumerate() {
        // Strictly greater: the first of equal logits wins, NaN never does.
        if logit > best {
            best = logit;
            best_id = Some(id as u32);
        }
    }
    best_id
}

/// Higher logit first, then lower id: a total order, so every selection and
/// sort below is deterministic. `-0.0` and `+0.0` are equal (as in
/// [`argmax`] and the device's candidate search, which share [`rank_key`]).
fn by_logit_desc(logits: &[f32]) -> impl Fn(&u32, &u32) -> Ordering + '_ {
    move |&a, &b| {
        rank_key(logits[b as usize])
            .cmp(&rank_key(logits[a as usize]))
            .then(a.cmp(&b))
    }
}

/// Ids whose logit is at least `threshold`, excluding NaN and `-inf`.
pub(crate) fn collect_candidates(logits: &[f32], threshold: f32, out: &mut Vec<u32>) {
    out.clear();
    out.extend(
        logits
            .iter()
            .enumerate()
            .filter(|&(_, &l)| l > f32::NEG_INFINITY && l >= threshold)
            .map(|(id, _)| id as u32),
    );
}

/// The logit a token needs to survive min-p: `p_i >= min_p * p_max` is
/// `exp((l_i - max) / T) >= min_p`, i.e. `l_i >= max + T * ln(min_p)`.
pub(crate) fn min_p_threshold(max_logit: f32, temperature: f32, min_p: f32) -> f32 {
    if min_p <= 0.0 {
        f32::NEG_INFINITY
    } else {
        max_logit + temperature * min_p.ln()
    }
}

/// Keep the `k` best candidates (ties at the boundary go to lower ids).
/// A linear selection, then a sort of the `k` kept ids back into id order.
pub(crate) fn top_k(logits: &[f32], candidates: &mut Vec<u32>, k: usize) {
    if k == 0 || k >= candidates.len() {
        return;
    }
    candidates.select_nth_unstable_by(k - 1, by_logit_desc(logits));
    candidates.truncate(k);
    candidates.sort_unstable();
}

/// Unnormalised probabilities `exp((logit - max) / T)` of the candidates,
/// written at their ids in `weights` (scratch the size of the row, reused
/// between steps so each candidate is exponentiated once). Returns their sum.
pub(crate) fn compute_weights(
    logits: &[f32],
    candidates: &[u32],
    max_logit: f32,
    inv_temp: f32,
    weights: &mut Vec<f32>,
) -> f64 {
    weights.resize(logits.len(), 0.0);
    let mut total = 0.0f64;
    for &id in candidates {
        let w = ((logits[id as usize] - max_logit) * inv_temp).exp();
        weights[id as usize] = w;
        total += w as f64;
    }
    total
}

/// First window of best candidates examined by top-p before widening it;
/// for peaked distributions the nucleus fits and the rest is never sorted.
const TOP_P_FIRST_WINDOW: usize = 256;

/// Keep the smallest set of best candidates whose probability mass reaches
/// `top_p` (at least one). Equivalent to vLLM's rule of dropping the tokens
/// whose ascending cumulative probability is at most `1 - top_p`.
/// Sorts only a window of the best candidates, widening it when the nucleus
/// does not fit, so a peaked distribution over a large vocabulary costs one
/// linear pass plus a small sort. `weights`/`total` come from [`compute_weights`].
pub(crate) fn top_p(
    logits: &[f32],
    candidates: &mut Vec<u32>,
    top_p: f32,
    weights: &[f32],
    total: f64,
) {
    if top_p >= 1.0 || candidates.len() <= 1 {
        return;
    }
    let target = top_p as f64 * total;
    let cmp = by_logit_desc(logits);
    let mut window = TOP_P_FIRST_WINDOW.min(candidates.len());
    loop {
        if window < candidates.len() {
            candidates.select_nth_unstable_by(window - 1, &cmp);
        }
        candidates[..window].sort_unstable_by(&cmp);
        if let Some(len) = nucleus_len(&candidates[..window], weights, target) {
            candidates.truncate(len);
            break;
        }
        if window == candidates.len() {
            // Rounding left the sum just short of the target: keep everything.
            break;
        }
        window = (window * 8).min(candidates.len());
    }
    candidates.sort_unstable();
}

/// How many of `best_first` (sorted by [`by_logit_desc`]) top-p keeps when
/// their mass, accumulated in that order, reaches `target`; `None` when it
/// never does within them.
fn nucleus_len(best_first: &[u32], weights: &[f32], target: f64) -> Option<usize> {
    let mut mass = 0.0;
    for (i, &id) in best_first.iter().enumerate() {
        mass += weights[id as usize] as f64;
        if mass >= target {
            return Some(i + 1);
        }
    }
    None
}

/// [`top_p`] when `candidates` are only the best ids of a longer kept set
/// whose weight sum is known to lie in `[total_lo, total_hi]`: applies it and
/// returns `true` when the nucleus ends inside `candidates` at the same place
/// for every total in that range (then it is exactly `top_p`'s); leaves
/// `candidates` unchanged and returns `false` otherwise. `top_p < 1`.
pub(crate) fn top_p_within(
    logits: &[f32],
    candidates: &mut Vec<u32>,
    top_p: f32,
    weights: &[f32],
    (total_lo, total_hi): (f64, f64),
) -> bool {
    let mut best_first = candidates.clone();
    best_first.sort_unstable_by(by_logit_desc(logits));
    // The f64 product rounds monotonically, so the true target lies between these.
    let low = nucleus_len(&best_first, weights, top_p as f64 * total_lo);
    let high = nucleus_len(&best_first, weights, top_p as f64 * total_hi);
    match (low, high) {
        (Some(a), Some(b)) if a == b => {
            best_first.truncate(a);
            best_first.sort_unstable();
            *candidates = best_first;
            true
        }
        _ => false,
    }
}

/// Draw one candidate with probability proportional to its weight; `uniform`
/// is in `[0, 1)`.
pub(crate) fn draw(candidates: &[u32], weights: &[f32], uniform: f64) -> Option<u32> {
    let total: f64 = candidates
        .iter()
        .map(|&id| weights[id as usize] as f64)
        .sum();
    let target = uniform * total;
    let mut mass = 0.0;
    for &id in candidates {
        mass += weights[id as usize] as f64;
        if target < mass {
            return Some(id);
        }
    }
    // `uniform` close to 1 and rounding: the last candidate with any weight.
    candidates
        .iter()
        .rev()
        .find(|&&id| weights[id as usize] > 0.0)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut v: Vec<u32>) -> Vec<u32> {
        v.sort();
        v
    }

    #[test]
    fn argmax_ties_go_to_lowest_id_and_nan_is_skipped() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NAN, 0.5, f32::NAN]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY, -1e30]), Some(1));
        assert_eq!(argmax(&[f32::NAN, f32::NEG_INFINITY]), None);
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn candidates_exclude_masked_and_below_threshold() {
        let logits = [0.0, f32::NEG_INFINITY, 2.0, f32::NAN, -1.0];
        let mut c = Vec::new();
        collect_candidates(&logits, f32::NEG_INFINITY, &mut c);
        assert_eq!(c, vec![0, 2, 4]);
        collect_candidates(&logits, -0.5, &mut c);
        assert_eq!(c, vec![0, 2]);
    }

    #[test]
    fn top_k_keeps_the_k_largest() {
        let logits = [0.1, 5.0, -3.0, 4.0, 4.0, 2.0];
        let mut c: Vec<u32> = (0..6).collect();
        top_k(&logits, &mut c, 3);
        // 5.0, then the tie at 4.0 (ids 3 and 4) both fit.
        assert_eq!(sorted(c.clone()), vec![1, 3, 4]);
        let mut c: Vec<u32> = (0..6).collect();
        top_k(&logits, &mut c, 2);
        // Tie at the boundary: the lower id wins.
        assert_eq!(sorted(c), vec![1, 3]);
        let mut c: Vec<u32> = (0..6).collect();
        top_k(&logits, &mut c, 10);
        assert_eq!(c.len(), 6);
    }

    #[test]
    fn min_p_threshold_matches_probability_rule() {
        // probs ∝ exp(l): [e^2, e^1, e^0] / Z; p/p_max = [1, e^-1, e^-2] = [1, .368, .135].
        let logits = [2.0f32, 1.0, 0.0];
        let mut c = Vec::new();
        collect_candidates(&logits, min_p_threshold(2.0, 1.0, 0.2), &mut c);
        assert_eq!(c, vec![0, 1]);
        collect_candidates(&logits, min_p_threshold(2.0, 1.0, 0.1), &mut c);
        assert_eq!(c, vec![0, 1, 2]);
        // Temperature 0.5 doubles the gaps: ratios [1, e^-2, e^-4] = [1, .135, .018].
        collect_candidates(&logits, min_p_threshold(2.0, 0.5, 0.1), &mut c);
        assert_eq!(c, vec![0, 1]);
        assert_eq!(min_p_threshold(2.0, 1.0, 0.0), f32::NEG_INFINITY);
    }

    /// Run top-p over all ids of `logits` at temperature `1 / inv_temp`.
    fn nucleus(logits: &[f32], p: f32, inv_temp: f32) -> Vec<u32> {
        let mut c: Vec<u32> = (0..logits.len() as u32).collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut w = Vec::new();
        let total = compute_weights(logits, &c, max, inv_temp, &mut w);
        top_p(logits, &mut c, p, &w, total);
        c
    }

    #[test]
    fn top_p_keeps_smallest_nucleus() {
        // Probabilities 0.5, 0.25, 0.125, 0.125 (log-space logits).
        let logits = [0.5f32.ln(), 0.125f32.ln(), 0.25f32.ln(), 0.125f32.ln()];
        assert_eq!(nucleus(&logits, 0.4, 1.0), vec![0]);
        assert_eq!(nucleus(&logits, 0.49, 1.0), vec![0]);
        assert_eq!(nucleus(&logits, 0.6, 1.0), vec![0, 2]);
        assert_eq!(nucleus(&logits, 0.74, 1.0), vec![0, 2]);
        // Kept sets come back in id order.
        assert_eq!(nucleus(&logits, 0.8, 1.0), vec![0, 1, 2]);
        assert_eq!(nucleus(&logits, 1.0, 1.0), vec![0, 1, 2, 3]);
        // Temperature 2 flattens to ∝ sqrt(p): [.707, .5, .354, .354] / 1.914 = [.369, .261, .185, .185].
        assert_eq!(nucleus(&logits, 0.6, 0.5), vec![0, 2]);
        assert_eq!(nucleus(&logits, 0.7, 0.5), vec![0, 1, 2]);
    }

    #[test]
    fn top_p_widens_its_window_on_flat_distributions() {
        // 5000 equal logits: half the mass needs 2500 tokens, beyond the first window.
        let c = nucleus(&[0.0f32; 5000], 0.5, 1.0);
        assert_eq!(c.len(), 2500);
        // Ties are broken by id, so the nucleus is the lowest ids.
        assert_eq!(sorted(c), (0..2500).collect::<Vec<u32>>());
    }

    #[test]
    fn top_k_and_top_p_leave_ids_in_order_and_zeros_tie() {
        let logits = [-0.0f32, 3.0, 0.0, 5.0, 1.0];
        let mut c: Vec<u32> = (0..5).collect();
        top_k(&logits, &mut c, 4);
        assert_eq!(c, vec![0, 1, 3, 4], "-0.0 ties +0.0: the lower id stays");
        assert_eq!(argmax(&[-0.0, 0.0]), Some(0));
    }

    #[test]
    fn top_p_within_decides_only_when_the_bounds_agree() {
        // Weights 4, 2, 1, 1 (best first: ids 2, 0, 1, 3), of a longer set of total 10.
        let logits = [2.0f32.ln(), 0.0, 4.0f32.ln(), 0.0];
        let w = [2.0f32, 1.0, 4.0, 1.0];
        let mut c: Vec<u32> = (0..4).collect();
        // Target 0.5 * 10 = 5: ids 2 and 0 (mass 6) whatever the total in [9.9, 10.1].
        assert!(top_p_within(&logits, &mut c, 0.5, &w, (9.9, 10.1)));
        assert_eq!(c, vec![0, 2]);
        // Target 0.6 * [9.9, 10.1] = [5.94, 6.06]: mass 6 is reached or not.
        let mut c: Vec<u32> = (0..4).collect();
        assert!(!top_p_within(&logits, &mut c, 0.6, &w, (9.9, 10.1)));
        assert_eq!(c, vec![0, 1, 2, 3]);
        // Target 0.9 * 10 = 9: beyond these candidates' mass 8.
        assert!(!top_p_within(&logits, &mut c, 0.9, &w, (10.0, 10.0)));
    }

    #[test]
    fn draw_follows_cumulative_weights() {
        let logits = [0.0f32, 0.0, 2.0f32.ln()];
        // weights 1, 1, 2 → cumulative 0.25, 0.5, 1.0
        let c = [0u32, 1, 2];
        let mut w = Vec::new();
        let total = compute_weights(&logits, &c, logits[2], 1.0, &mut w);
        assert!((total - 2.0).abs() < 1e-6, "{total}");
        assert_eq!(draw(&c, &w, 0.0), Some(0));
        assert_eq!(draw(&c, &w, 0.24), Some(0));
        assert_eq!(draw(&c, &w, 0.26), Some(1));
        assert_eq!(draw(&c, &w, 0.51), Some(2));
        assert_eq!(draw(&c, &w, 0.999_999), Some(2));
        assert_eq!(draw(&[], &w, 0.5), None);
    }
}

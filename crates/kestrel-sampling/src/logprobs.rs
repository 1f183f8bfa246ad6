//! Log-probabilities of a generated token and the row's most likely ids,
//! from the raw logits row that chose it: the model's own distribution,
//! before any mask, penalty, temperature or filter of the sampler (what
//! OpenAI's `logprobs` report).

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One generated token's log-probability and the row's `top` best ids.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    /// The most likely ids with their log-probabilities, best first (ties:
    /// lower id first); as many as the request asked for.
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of a raw logits row, kept until the row's token is known.
#[derive(Clone, Debug)]
pub struct RowLogprobs {
    values: Vec<f32>,
}

impl RowLogprobs {
    /// The log-softmax of `logits`, summed in f64 so that long rows lose no
    /// precision. Ids at `-inf` (padding) get `-inf`.
    pub fn new(logits: &[f32]) -> Self {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if !max.is_finite() {
            // No finite logit: nothing to normalise (every id is -inf or NaN).
            return Self {
                values: vec![f32::NAN; logits.len()],
            };
        }
        let sum: f64 = logits
            .iter()
            .map(|&x| (f64::from(x) - f64::from(max)).exp())
            .sum();
        let log_norm = f64::from(max) + sum.ln();
        let values = logits
            .iter()
            .map(|&x| (f64::from(x) - log_norm) as f32)
            .collect();
        Self { values }
    }

    /// The log-probability of every id.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// `token`'s log-probability and the `top` most likely ids.
    pub fn token(&self, token: u32, top: usize) -> TokenLogprobs {
        TokenLogprobs {
            token,
            logprob: self
                .values
                .get(token as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
            top: self.top(top),
        }
    }

    /// `token`'s rank in the row: 1 + the number of ids more likely than
    /// it (vLLM's `rank`); ids at NaN are not counted.
    pub fn rank(&self, token: u32) -> usize {
        let Some(&v) = self.values.get(token as usize) else {
            return self.values.len() + 1;
        };
        1 + self.values.iter().filter(|&&x| x > v).count()
    }

    /// The `n` most likely ids, best first, lower id first among equals;
    /// ids at `-inf` never appear.
    fn top(&self, n: usize) -> Vec<(u32, f32)> {
        let mut best: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
        for (id, &v) in self.values.iter().enumerate() {
            if v == f32::NEG_INFINITY || v.is_nan() {
                continue;
            }
            if best.len() == n && best.last().is_none_or(|&(_, worst)| v <= worst) {
                continue;
            }
            // Insert after every value at least as large: ties keep id order.
            let at = best.partition_point(|&(_, b)| b >= v);
            best.insert(at, (id as u32, v));
            best.truncate(n);
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_sums_to_one_and_keeps_differences() {
        let row = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY];
        let lp = RowLogprobs::new(&row);
        let total: f64 = lp.values().iter().map(|&v| f64::from(v).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((lp.values()[2] - lp.values()[1] - 1.0).abs() < 1e-6);
        assert_eq!(lp.values()[3], f32::NEG_INFINITY);
        // ln(e^1 + e^2 + e^3) = 3.40760596...
        assert!((lp.values()[2] - (3.0 - 3.407_606)).abs() < 1e-5);
    }

    #[test]
    fn top_is_best_first_with_ties_in_id_order_and_skips_padding() {
        let row = [0.5f32, 2.0, 2.0, -1.0, f32::NEG_INFINITY, 3.0];
        let lp = RowLogprobs::new(&row);
        let t = lp.token(3, 4);
        assert_eq!(t.token, 3);
        assert_eq!(t.logprob, lp.values()[3]);
        let ids: Vec<u32> = t.top.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, [5, 1, 2, 0]);
        assert!(t.top.iter().all(|&(id, v)| v == lp.values()[id as usize]));
        let all: Vec<u32> = lp.token(0, 10).top.iter().map(|&(id, _)| id).collect();
        assert_eq!(all, [5, 1, 2, 0, 3], "padding (-inf) never appears");
        assert!(lp.token(0, 0).top.is_empty());
        assert_eq!(lp.rank(5), 1);
        assert_eq!(lp.rank(1), 2);
        assert_eq!(lp.rank(2), 2, "ties share a rank");
        assert_eq!(lp.rank(3), 5);
    }
}

//! Prompt lookup: draft the tokens that followed the latest earlier
//! occurrence of the sequence's last n tokens. No weights, CPU only.

/// vLLM's `prompt_lookup_min` / `prompt_lookup_max` and its draft cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    pub min_n: usize,
    pub max_n: usize,
    pub max_drafts: usize,
}

impl NgramConfig {
    pub fn new(min_n: usize, max_n: usize, max_drafts: usize) -> Result<Self, String> {
        if min_n == 0 || min_n > max_n || max_drafts == 0 {
            return Err(format!(
                "n-gram lookup needs 1 <= min_n <= max_n and max_drafts >= 1 (got {min_n}, {max_n}, {max_drafts})"
            ));
        }
        Ok(Self {
            min_n,
            max_n,
            max_drafts,
        })
    }
}

/// Up to `min(cfg.max_drafts, limit)` tokens that followed the most recent
/// earlier occurrence of the longest suffix of `tokens` (of `max_n` down to
/// `min_n` tokens) found again; empty when none recurs.
pub fn propose(tokens: &[u32], cfg: &NgramConfig, limit: usize) -> Vec<u32> {
    let want = cfg.max_drafts.min(limit);
    let len = tokens.len();
    if want == 0 {
        return Vec::new();
    }
    for n in (cfg.min_n..=cfg.max_n.min(len.saturating_sub(1))).rev() {
        let pattern = &tokens[len - n..];
        // Occurrences starting at `start < len - n`, latest first.
        for start in (0..len - n).rev() {
            if &tokens[start..start + n] == pattern {
                let from = start + n;
                let to = (from + want).min(len);
                return tokens[from..to].to_vec();
            }
        }
    }
    Vec::new()
}

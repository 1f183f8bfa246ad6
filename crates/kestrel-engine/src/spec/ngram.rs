//! N-gram (prompt-lookup) drafts: when the text being generated repeats a
//! span of the context (a file being edited, a quoted passage, arguments of
//! an earlier tool call), the tokens that followed that span last time are a
//! good guess for the next ones, found on the CPU with no weights.
//!
//! # The rule
//!
//! For `n` from `max_n` down to `min_n`, the pattern is the last `n` tokens;
//! an *occurrence* is a span `tokens[s..s + n]` equal to it with `s < len -
//! n` (any span but the suffix itself; it may overlap the suffix), so at
//! least one token follows it. The first `n` that has an occurrence wins,
//! and of its occurrences the most recent one (largest `s`); the drafts are
//! the tokens after it, `tokens[s + n..]`, at most `min(max_drafts, limit)`
//! of them: fewer when the occurrence ends near the end of the context
//! (a run `a a a a` with `n = 2` proposes one `a`), none without an
//! occurrence.
//!
//! vLLM's proposer (`vllm/v1/spec_decode/ngram_proposer.py`) also takes the
//! longest `n` up to `prompt_lookup_max`, but keeps the *earliest*
//! occurrence of it; this one keeps the most recent, whose continuation is
//! the copy in progress more often in edit workloads.
//!
//! # Cost
//!
//! One backward pass over the context for all `n` at once: each candidate
//! end is tested on its last token, and only matches are extended (at most
//! `max_n` comparisons), stopping at the first occurrence of `max_n`
//! tokens. No allocation: the drafts are a slice of the context.

/// vLLM's `prompt_lookup_min` and `prompt_lookup_max` when neither is given.
pub const VLLM_DEFAULT_N: usize = 5;

/// How the n-gram proposer matches and how many drafts it proposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NgramConfig {
    /// Shortest pattern matched (vLLM's `prompt_lookup_min`), at least 1.
    pub min_n: usize,
    /// Longest pattern matched (vLLM's `prompt_lookup_max`), at least `min_n`.
    pub max_n: usize,
    /// Most drafts proposed per step (vLLM's `num_speculative_tokens`), at least 1.
    pub max_drafts: usize,
}

/// An [`NgramConfig`] that cannot propose anything.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InvalidNgramConfig {
    #[error("prompt_lookup_min must be at least 1, got 0")]
    ZeroMinN,
    #[error("prompt_lookup_min={min_n} must be at most prompt_lookup_max={max_n}")]
    MinAboveMax { min_n: usize, max_n: usize },
    #[error("num_speculative_tokens must be at least 1, got 0")]
    NoDrafts,
}

impl NgramConfig {
    /// A checked configuration: `1 <= min_n <= max_n` and `max_drafts >= 1`.
    pub fn new(min_n: usize, max_n: usize, max_drafts: usize) -> Result<Self, InvalidNgramConfig> {
        if min_n == 0 {
            return Err(InvalidNgramConfig::ZeroMinN);
        }
        if min_n > max_n {
            return Err(InvalidNgramConfig::MinAboveMax { min_n, max_n });
        }
        if max_drafts == 0 {
            return Err(InvalidNgramConfig::NoDrafts);
        }
        Ok(Self {
            min_n,
            max_n,
            max_drafts,
        })
    }

    /// The configuration vLLM's `--speculative-config` gives: both bounds
    /// [`VLLM_DEFAULT_N`] when neither is set, the other's value when one is.
    pub fn from_vllm(
        prompt_lookup_min: Option<usize>,
        prompt_lookup_max: Option<usize>,
        num_speculative_tokens: usize,
    ) -> Result<Self, InvalidNgramConfig> {
        let (min_n, max_n) = match (prompt_lookup_min, prompt_lookup_max) {
            (None, None) => (VLLM_DEFAULT_N, VLLM_DEFAULT_N),
            (Some(min), None) => (min, min),
            (None, Some(max)) => (max, max),
            (Some(min), Some(max)) => (min, max),
        };
        Self::new(min_n, max_n, num_speculative_tokens)
    }
}

/// The drafts for the position after `tokens` (the sequence's prompt and
/// generated tokens), by the rule in the module docs: at most
/// `min(cfg.max_drafts, limit)`, possibly none. `limit` is the caller's
/// bound (tokens left before `max_tokens` or the context length). A config
/// that [`NgramConfig::new`] would reject proposes nothing (`min_n` 0 is
/// read as 1).
pub fn propose<'a>(tokens: &'a [u32], cfg: &NgramConfig, limit: usize) -> &'a [u32] {
    let len = tokens.len();
    let count = cfg.max_drafts.min(limit);
    let min_n = cfg.min_n.max(1);
    // An occurrence ends before the last token, so it is at most len - 1 long.
    let max_n = cfg.max_n.min(len.saturating_sub(1));
    if count == 0 || min_n > max_n {
        return &[];
    }
    let last = tokens[len - 1];
    // The best (pattern length, occurrence end) so far, scanning the ends
    // from the most recent: only a strictly longer match replaces it.
    let mut best: Option<(usize, usize)> = None;
    for end in (min_n..len).rev() {
        if tokens[end - 1] != last {
            continue;
        }
        let cap = max_n.min(end);
        let mut n = 1;
        while n < cap && tokens[end - 1 - n] == tokens[len - 1 - n] {
            n += 1;
        }
        if n >= min_n && best.is_none_or(|(longest, _)| n > longest) {
            best = Some((n, end));
            if n == max_n {
                break;
            }
        }
    }
    best.map_or(&[], |(_, end)| &tokens[end..(end + count).min(len)])
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha20Rng;

    use super::*;

    fn cfg(min_n: usize, max_n: usize, max_drafts: usize) -> NgramConfig {
        NgramConfig::new(min_n, max_n, max_drafts).unwrap()
    }

    /// The rule read literally: each `n` from the longest, each start from the latest.
    fn by_definition(tokens: &[u32], cfg: &NgramConfig, limit: usize) -> Vec<u32> {
        let len = tokens.len();
        let count = cfg.max_drafts.min(limit);
        for n in (cfg.min_n..=cfg.max_n).rev() {
            if n >= len {
                continue;
            }
            let pattern = &tokens[len - n..];
            if let Some(s) = (0..len - n).rev().find(|&s| &tokens[s..s + n] == pattern) {
                return tokens[s + n..(s + n + count).min(len)].to_vec();
            }
        }
        Vec::new()
    }

    #[test]
    fn a_copy_in_progress_proposes_the_rest_of_the_copied_span() {
        // A "file" of distinct tokens in the prompt, then the output
        // re-typing it from token 10 on.
        let file: Vec<u32> = (100..160).collect();
        let mut tokens = vec![1, 2, 3];
        tokens.extend(&file);
        tokens.extend([7, 8]);
        tokens.extend(&file[10..20]);
        let drafts = propose(&tokens, &cfg(2, 4, 5), 16);
        assert_eq!(drafts, &file[20..25]);
    }

    #[test]
    fn no_occurrence_proposes_nothing() {
        let tokens: Vec<u32> = (0..50).collect();
        assert!(propose(&tokens, &cfg(1, 3, 4), 4).is_empty());
        // The suffix itself is not an occurrence.
        assert!(propose(&[5, 6, 7], &cfg(3, 3, 4), 4).is_empty());
        // Contexts shorter than a pattern plus one token.
        assert!(propose(&[], &cfg(1, 3, 4), 4).is_empty());
        assert!(propose(&[9, 9], &cfg(2, 3, 4), 4).is_empty());
    }

    #[test]
    fn the_draft_count_is_bounded_by_max_drafts_limit_and_the_context() {
        let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2];
        assert_eq!(propose(&tokens, &cfg(2, 2, 3), 10), &[3, 4, 5]);
        assert_eq!(propose(&tokens, &cfg(2, 2, 8), 2), &[3, 4]);
        assert!(propose(&tokens, &cfg(2, 2, 8), 0).is_empty());
        // An occurrence near the end: only the tokens after it, overlapping
        // the suffix; a run proposes one token of itself.
        assert_eq!(propose(&[1, 2, 3, 1, 2], &cfg(2, 2, 5), 5), &[3, 1, 2]);
        assert_eq!(propose(&[7, 7, 7, 7], &cfg(2, 2, 5), 5), &[7]);
    }

    #[test]
    fn of_equal_patterns_the_most_recent_occurrence_wins() {
        let tokens = [1, 2, 3, 7, 1, 2, 3, 8, 9, 1, 2, 3];
        assert_eq!(propose(&tokens, &cfg(3, 3, 2), 2), &[8, 9]);
    }

    #[test]
    fn longer_patterns_are_preferred_over_more_recent_shorter_ones() {
        let tokens = [5, 1, 2, 9, 0, 1, 2, 8, 5, 1, 2];
        assert_eq!(propose(&tokens, &cfg(2, 3, 1), 1), &[9]);
        assert_eq!(propose(&tokens, &cfg(2, 2, 1), 1), &[8]);
        // Beyond max_n the match length no longer matters: recency decides.
        let tokens = [4, 5, 1, 2, 9, 0, 5, 1, 2, 8, 4, 5, 1, 2];
        assert_eq!(propose(&tokens, &cfg(2, 3, 1), 1), &[8]);
        assert_eq!(propose(&tokens, &cfg(2, 4, 1), 1), &[9]);
    }

    #[test]
    fn the_single_pass_matches_the_rule_on_random_contexts() {
        let mut rng = ChaCha20Rng::seed_from_u64(21);
        for _ in 0..3000 {
            let len = rng.random_range(0..60);
            let alphabet = rng.random_range(1..5);
            let tokens: Vec<u32> = (0..len).map(|_| rng.random_range(0..alphabet)).collect();
            let min_n = rng.random_range(1..5);
            let c = cfg(
                min_n,
                min_n + rng.random_range(0..4),
                rng.random_range(1..6),
            );
            let limit = rng.random_range(0..8);
            assert_eq!(
                propose(&tokens, &c, limit),
                by_definition(&tokens, &c, limit),
                "{tokens:?} {c:?} limit {limit}"
            );
        }
    }

    #[test]
    fn configs_are_checked_and_follow_vllms_defaults() {
        assert_eq!(NgramConfig::new(0, 3, 2), Err(InvalidNgramConfig::ZeroMinN));
        assert_eq!(
            NgramConfig::new(4, 3, 2),
            Err(InvalidNgramConfig::MinAboveMax { min_n: 4, max_n: 3 })
        );
        assert_eq!(NgramConfig::new(1, 3, 0), Err(InvalidNgramConfig::NoDrafts));
        assert_eq!(
            InvalidNgramConfig::MinAboveMax { min_n: 4, max_n: 3 }.to_string(),
            "prompt_lookup_min=4 must be at most prompt_lookup_max=3"
        );
        assert_eq!(NgramConfig::from_vllm(None, None, 3), Ok(cfg(5, 5, 3)));
        assert_eq!(NgramConfig::from_vllm(Some(2), None, 3), Ok(cfg(2, 2, 3)));
        assert_eq!(NgramConfig::from_vllm(None, Some(4), 3), Ok(cfg(4, 4, 3)));
        assert_eq!(
            NgramConfig::from_vllm(Some(2), Some(4), 3),
            Ok(cfg(2, 4, 3))
        );
        // An unchecked config proposes nothing rather than panicking.
        let bad = NgramConfig {
            min_n: 3,
            max_n: 2,
            max_drafts: 2,
        };
        assert!(propose(&[1, 2, 3, 1, 2, 3], &bad, 2).is_empty());
        let zero = NgramConfig {
            min_n: 0,
            max_n: 1,
            max_drafts: 2,
        };
        assert_eq!(propose(&[1, 2, 1], &zero, 2), &[2, 1]);
    }
}

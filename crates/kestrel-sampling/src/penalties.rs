//! Repetition, frequency and presence penalties, with the token counts they need.
//!
//! Counts are updated incrementally from the sequence's history, so a decode
//! step costs work proportional to the new tokens plus the distinct tokens
//! seen, never to the vocabulary or the prompt length.

use std::collections::{BTreeMap, HashMap, HashSet};

use kestrel_core::TokenPenalty;

/// Distinct tokens of prompt + output, and per-token counts of the output.
#[derive(Clone, Debug, Default)]
pub(crate) struct TokenCounts {
    prompt_len: usize,
    /// How much of the history has been counted.
    synced_len: usize,
    /// Tracked only when the repetition penalty is on.
    track_seen: bool,
    seen: HashSet<u32>,
    output: HashMap<u32, u32>,
    /// Draft tokens counted after the synced history for one verification
    /// ([`TokenCounts::push_pending`]), each with whether it was newly
    /// seen and whether it counted as output, so it can be taken back.
    pending: Vec<(u32, bool, bool)>,
}

impl TokenCounts {
    pub(crate) fn new(prompt_len: usize, track_seen: bool) -> Self {
        Self {
            prompt_len,
            track_seen,
            ..Self::default()
        }
    }

    /// Count the tokens appended to `history` since the last call. History is
    /// append-only; if it got shorter (a rewritten sequence) everything is recounted.
    pub(crate) fn sync(&mut self, history: &[u32]) {
        debug_assert!(self.pending.is_empty(), "sync with drafts pending");
        if history.len() < self.synced_len {
            self.seen.clear();
            self.output.clear();
            self.synced_len = 0;
        }
        for (pos, &token) in history.iter().enumerate().skip(self.synced_len) {
            if self.track_seen {
                self.seen.insert(token);
            }
            if pos >= self.prompt_len {
                *self.output.entry(token).or_insert(0) += 1;
            }
        }
        self.synced_len = history.len();
    }

    /// Generated tokens counted so far.
    pub(crate) fn num_output(&self) -> usize {
        (self.synced_len + self.pending.len()).saturating_sub(self.prompt_len)
    }

    /// Count `token` as if appended after the synced history and the
    /// tokens already pending: a draft that a later row of the same
    /// verification sees. [`TokenCounts::pop_pending`] takes them all back,
    /// so the counts only ever hold committed history between calls.
    pub(crate) fn push_pending(&mut self, token: u32) {
        let position = self.synced_len + self.pending.len();
        let newly_seen = self.track_seen && self.seen.insert(token);
        let is_output = position >= self.prompt_len;
        if is_output {
            *self.output.entry(token).or_insert(0) += 1;
        }
        self.pending.push((token, newly_seen, is_output));
    }

    /// Undo every [`TokenCounts::push_pending`] since the last sync.
    pub(crate) fn pop_pending(&mut self) {
        while let Some((token, newly_seen, is_output)) = self.pending.pop() {
            if newly_seen {
                self.seen.remove(&token);
            }
            if is_output && let Some(count) = self.output.get_mut(&token) {
                *count -= 1;
                if *count == 0 {
                    self.output.remove(&token);
                }
            }
        }
    }

    /// Apply the penalties in vLLM's order: repetition over prompt + output,
    /// then frequency, then presence over the output. Ids outside the logits
    /// row are skipped: they have no logit to penalise.
    pub(crate) fn apply(&self, logits: &mut [f32], repetition: f32, frequency: f32, presence: f32) {
        if repetition != 1.0 {
            for &token in &self.seen {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit = repetition_penalised(*logit, repetition);
                }
            }
        }
        if frequency != 0.0 || presence != 0.0 {
            for (&token, &count) in &self.output {
                if let Some(logit) = logits.get_mut(token as usize) {
                    *logit -= frequency * count as f32;
                    *logit -= presence;
                }
            }
        }
    }
}

impl TokenCounts {
    /// The tokens [`TokenCounts::apply`] would change with these penalties,
    /// one entry per id in id order, for a backend to apply on the device.
    pub(crate) fn penalties(
        &self,
        repetition: f32,
        frequency: f32,
        presence: f32,
    ) -> Vec<TokenPenalty> {
        let mut by_id = BTreeMap::new();
        let blank = |id| TokenPenalty {
            id,
            seen: false,
            output_count: 0,
        };
        if repetition != 1.0 {
            for &id in &self.seen {
                by_id.entry(id).or_insert_with(|| blank(id)).seen = true;
            }
        }
        if frequency != 0.0 || presence != 0.0 {
            for (&id, &count) in &self.output {
                by_id.entry(id).or_insert_with(|| blank(id)).output_count = count;
            }
        }
        by_id.into_values().collect()
    }
}

/// A penalty above 1 makes a seen token less likely whatever its sign:
/// positive logits shrink, negative ones grow more negative.
pub(crate) fn repetition_penalised(logit: f32, penalty: f32) -> f32 {
    if logit > 0.0 {
        logit / penalty
    } else {
        logit * penalty
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_split_prompt_and_output() {
        let mut counts = TokenCounts::new(3, true);
        counts.sync(&[1, 2, 2, 2, 4, 4]);
        assert_eq!(counts.num_output(), 3);
        assert_eq!(counts.output.get(&2), Some(&1));
        assert_eq!(counts.output.get(&4), Some(&2));
        assert_eq!(counts.output.get(&1), None);
        let mut seen: Vec<u32> = counts.seen.iter().copied().collect();
        seen.sort();
        assert_eq!(seen, vec![1, 2, 4]);
    }

    #[test]
    fn incremental_sync_equals_full_sync() {
        let history = [5, 6, 7, 5, 5, 8, 6, 9];
        let mut step = TokenCounts::new(3, true);
        for end in 0..=history.len() {
            step.sync(&history[..end]);
        }
        let mut full = TokenCounts::new(3, true);
        full.sync(&history);
        assert_eq!(step.output, full.output);
        assert_eq!(step.seen, full.seen);
        // A shorter history is recounted from scratch.
        step.sync(&history[..4]);
        assert_eq!(step.num_output(), 1);
        assert_eq!(step.output.get(&5), Some(&1));
        assert_eq!(step.output.len(), 1);
    }

    #[test]
    fn penalty_list_matches_apply() {
        let mut counts = TokenCounts::new(4, true);
        counts.sync(&[1, 2, 3, 1, 2, 2, 5, 7]);
        let raw: Vec<f32> = (0..8).map(|i| i as f32 * 0.7 - 2.0).collect();
        for (rep, freq, pres) in [
            (1.3, 0.4, -0.6),
            (1.0, 0.4, 0.0),
            (0.8, 0.0, 0.0),
            (1.0, 0.0, 0.0),
        ] {
            let mut want = raw.clone();
            counts.apply(&mut want, rep, freq, pres);
            let mut got = raw.clone();
            for p in counts.penalties(rep, freq, pres) {
                let l = &mut got[p.id as usize];
                *l = kestrel_core::candidates::penalised_logit(*l, &p, rep, freq, pres);
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{rep} {freq} {pres}");
        }
        assert!(counts.penalties(1.0, 0.0, 0.0).is_empty());
    }

    #[test]
    fn pending_tokens_count_like_history_and_are_taken_back() {
        let history = [1, 2, 3, 2, 5];
        let drafts = [2, 9, 9, 1];
        let mut counts = TokenCounts::new(3, true);
        counts.sync(&history);
        let (seen, output) = (counts.seen.clone(), counts.output.clone());
        for i in 0..=drafts.len() {
            let mut full = TokenCounts::new(3, true);
            full.sync(&[&history[..], &drafts[..i]].concat());
            assert_eq!(counts.seen, full.seen, "{i} drafts");
            assert_eq!(counts.output, full.output, "{i} drafts");
            assert_eq!(counts.num_output(), full.num_output(), "{i} drafts");
            if let Some(&d) = drafts.get(i) {
                counts.push_pending(d);
            }
        }
        counts.pop_pending();
        assert_eq!((counts.seen.clone(), counts.output.clone()), (seen, output));
        assert_eq!(counts.num_output(), 2);
        // Drafts inside the prompt's span (a history shorter than the prompt)
        // are seen but not output.
        let mut short = TokenCounts::new(3, true);
        short.sync(&[7]);
        short.push_pending(8);
        assert!(short.seen.contains(&8) && short.output.is_empty());
        short.pop_pending();
        assert!(!short.seen.contains(&8));
    }

    #[test]
    fn out_of_vocab_history_is_ignored() {
        let mut counts = TokenCounts::new(0, true);
        counts.sync(&[0, 100]);
        let mut logits = [1.0, 1.0];
        counts.apply(&mut logits, 2.0, 1.0, 0.0);
        assert_eq!(logits, [-0.5, 1.0]);
    }
}

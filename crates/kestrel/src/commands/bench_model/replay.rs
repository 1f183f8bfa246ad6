//! The replay proposer: drafts at a chosen acceptance profile on any
//! weights. Random weights make any real drafter's acceptance meaningless,
//! so this one replays the target's own greedy continuation (recorded in a
//! plain run) and corrupts it on purpose: to time whole speculative steps at
//! a known acceptance. Every output it contributes to is labelled with its
//! profile.
//!
//! A profile lists, per draft position i = 1..k, the unconditional
//! acceptance rate a_i (the share of speculative steps whose first i drafts
//! were all accepted, what vLLM's per-position metric reports). The draft
//! at position i is the recorded token with probability a_i / a_{i-1}
//! (a_0 = 1) given that the drafts before it were, else a token the target
//! will not pick (the recorded one plus one), so that position i is
//! accepted with probability a_i. After the first wrong draft the rest are
//! the recorded tokens: verification stops at the first mismatch anyway.

use std::collections::HashMap;
use std::sync::Mutex;

use anyhow::{Result, bail};
use kestrel_engine::spec::DraftSource;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Per-position unconditional acceptance rates, non-increasing, in [0, 1].
#[derive(Clone, Debug, PartialEq)]
pub struct Profile(Vec<f64>);

impl Profile {
    pub fn new(rates: Vec<f64>) -> Result<Self> {
        if rates.is_empty() {
            bail!("--acceptance needs at least one rate (one per draft position)");
        }
        for (i, &a) in rates.iter().enumerate() {
            if !(0.0..=1.0).contains(&a) {
                bail!(
                    "--acceptance: rate {} of position {} is not in [0, 1]",
                    a,
                    i + 1
                );
            }
            if i > 0 && a > rates[i - 1] {
                bail!(
                    "--acceptance: rates must not increase (position {} has {a} after {}): \
                     a draft is accepted only if every draft before it was",
                    i + 1,
                    rates[i - 1]
                );
            }
        }
        Ok(Self(rates))
    }

    /// Drafts per step (k).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn rates(&self) -> &[f64] {
        &self.0
    }

    /// The probability that the draft at `position` (0-based) is right given
    /// that the ones before it were.
    fn conditional(&self, position: usize) -> f64 {
        let before = if position == 0 {
            1.0
        } else {
            self.0[position - 1]
        };
        if before == 0.0 {
            0.0
        } else {
            self.0[position] / before
        }
    }

    /// Mean tokens a speculative step emits at this profile: 1 + sum a_i.
    pub fn expected_acceptance_length(&self) -> f64 {
        1.0 + self.0.iter().sum::<f64>()
    }

    /// How every output names it: "replay proposer, profile 0.87/0.74/0.61".
    pub fn label(&self) -> String {
        let rates: Vec<String> = self.0.iter().map(|a| a.to_string()).collect();
        format!("replay proposer, profile {}", rates.join("/"))
    }
}

struct State {
    /// Each request's recorded continuation (generated tokens only).
    recordings: HashMap<String, Vec<u32>>,
    /// Off: no drafts (the engine decodes plainly).
    on: bool,
    rng: ChaCha8Rng,
}

/// A [`DraftSource`] replaying recorded continuations at a [`Profile`].
pub struct ReplaySource {
    profile: Profile,
    /// Ids a wrong draft wraps around in.
    vocab: u32,
    state: Mutex<State>,
}

impl ReplaySource {
    /// Starts switched off; `seed` seeds the draws that corrupt drafts.
    pub fn new(profile: Profile, vocab: usize, seed: u64) -> Self {
        Self {
            profile,
            vocab: vocab as u32,
            state: Mutex::new(State {
                recordings: HashMap::new(),
                on: false,
                rng: ChaCha8Rng::seed_from_u64(seed),
            }),
        }
    }

    /// Replay `recording` (its generated tokens) for `request_id` from now on.
    pub fn record(&self, request_id: &str, recording: Vec<u32>) {
        let mut state = self.state.lock().unwrap();
        state.recordings.insert(request_id.to_string(), recording);
    }

    /// Switch drafting on or off.
    pub fn set_on(&self, on: bool) {
        self.state.lock().unwrap().on = on;
    }
}

impl DraftSource for ReplaySource {
    fn drafts(&self, request_id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let mut guard = self.state.lock().unwrap();
        let state = &mut *guard;
        let Some(recording) = state.recordings.get(request_id).filter(|_| state.on) else {
            return Vec::new();
        };
        let generated = &tokens[prompt_len.min(tokens.len())..];
        let ahead = recording.get(generated.len()..).unwrap_or_default();
        let ahead = &ahead[..max.min(self.profile.len()).min(ahead.len())];
        // Once the live sequence has left the recording, the drafts are
        // simply what the recording says (and will mostly be rejected).
        let on_track = recording.starts_with(generated);
        let mut drafts = ahead.to_vec();
        if on_track {
            for (i, draft) in drafts.iter_mut().enumerate() {
                if !state.rng.random_bool(self.profile.conditional(i)) {
                    *draft = (*draft + 1) % self.vocab.max(1);
                    break;
                }
            }
        }
        drafts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_must_be_rates_that_never_increase() {
        let ok = Profile::new(vec![0.87, 0.74, 0.61]).unwrap();
        assert_eq!(ok.len(), 3);
        assert_eq!(ok.label(), "replay proposer, profile 0.87/0.74/0.61");
        assert!((ok.expected_acceptance_length() - 3.22).abs() < 1e-12);
        for (bad, says) in [
            (vec![], "at least one rate"),
            (vec![0.5, 1.2], "rate 1.2 of position 2 is not in [0, 1]"),
            (vec![-0.1], "not in [0, 1]"),
            (vec![f64::NAN], "not in [0, 1]"),
            (
                vec![0.5, 0.7],
                "must not increase (position 2 has 0.7 after 0.5)",
            ),
        ] {
            let e = Profile::new(bad.clone()).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
        Profile::new(vec![1.0, 1.0, 0.0, 0.0]).unwrap();
    }

    #[test]
    fn drafts_follow_the_recording_at_the_profile() {
        let recording: Vec<u32> = (10..60).collect();
        let prompt = [1, 2, 3];
        let source = ReplaySource::new(Profile::new(vec![0.8, 0.4]).unwrap(), 100, 7);
        source.record("r", recording.clone());
        assert!(source.drafts("r", &prompt, 3, 2).is_empty(), "off");
        source.set_on(true);
        assert!(source.drafts("other", &prompt, 3, 2).is_empty());
        let mut tokens = prompt.to_vec();
        tokens.extend_from_slice(&recording[..5]);
        let (mut first, mut both) = (0, 0);
        let n = 20_000;
        for _ in 0..n {
            let d = source.drafts("r", &tokens, 3, 4);
            assert_eq!(d.len(), 2, "at most k drafts");
            first += usize::from(d[0] == 15);
            both += usize::from(d == [15, 16]);
            if d[0] != 15 {
                assert_eq!(d, [16, 16], "a wrong draft, then the recording");
            }
        }
        let (a1, a2) = (first as f64 / n as f64, both as f64 / n as f64);
        assert!(
            (a1 - 0.8).abs() < 0.02 && (a2 - 0.4).abs() < 0.02,
            "{a1} {a2}"
        );
        // Off the recording: the recorded tokens, uncorrupted.
        tokens[4] = 99;
        assert_eq!(source.drafts("r", &tokens, 3, 4), [15, 16]);
        // At the recording's end: fewer drafts, then none.
        let mut at_end = prompt.to_vec();
        at_end.extend_from_slice(&recording[..49]);
        assert!(source.drafts("r", &at_end, 3, 4).len() <= 1);
        at_end.push(59);
        assert!(source.drafts("r", &at_end, 3, 4).is_empty());
    }
}

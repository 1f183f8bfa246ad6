//! Replayed drafts at a chosen acceptance profile, for benchmarks on any
//! weights. Random weights make any real drafter's acceptance meaningless,
//! so a replay proposer drafts the target's own greedy continuation (as
//! recorded earlier) and corrupts it on purpose: to time whole speculative
//! steps at a known acceptance. `bench-model` records in a plain run; the
//! server records each prompt's output ([`super::prompt_replay`]). Both
//! draw drafts here.
//!
//! A profile lists, per draft position i = 1..k, the unconditional
//! acceptance rate a_i (the share of speculative steps whose first i drafts
//! were all accepted, what vLLM's per-position metric reports). The draft
//! at position i is the recorded token with probability a_i / a_{i-1}
//! (a_0 = 1) given that the drafts before it were, else a token the target
//! will not pick (the recorded one minus one, or 1 for 0: an id inside
//! the vocabulary whenever the recorded one is), so that position i is
//! accepted with probability a_i. After the first wrong draft the rest are
//! the recorded tokens: verification stops at the first mismatch anyway.

use anyhow::{Result, bail};
use rand::Rng;

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

    /// Never true: a profile has at least one position.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
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

    /// The drafts after `generated` (the tokens a sequence has generated so
    /// far) from `recording` (a recorded continuation of the same prompt):
    /// at most `max` and at most k, corrupted at this profile with draws
    /// from `rng` while the sequence follows the recording. Once it has left
    /// the recording the drafts are simply what the recording says (and
    /// will mostly be rejected).
    pub fn drafts(
        &self,
        recording: &[u32],
        generated: &[u32],
        max: usize,
        rng: &mut impl Rng,
    ) -> Vec<u32> {
        let ahead = recording.get(generated.len()..).unwrap_or_default();
        let mut drafts = ahead[..max.min(self.len()).min(ahead.len())].to_vec();
        if recording.starts_with(generated) {
            for (i, draft) in drafts.iter_mut().enumerate() {
                if !rng.random_bool(self.conditional(i)) {
                    *draft = if *draft == 0 { 1 } else { *draft - 1 };
                    break;
                }
            }
        }
        drafts
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

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
        let profile = Profile::new(vec![0.8, 0.4]).unwrap();
        let recording: Vec<u32> = (10..60).collect();
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let generated = &recording[..5];
        let (mut first, mut both) = (0, 0);
        let n = 20_000;
        for _ in 0..n {
            let d = profile.drafts(&recording, generated, 4, &mut rng);
            assert_eq!(d.len(), 2, "at most k drafts");
            first += usize::from(d[0] == 15);
            both += usize::from(d == [15, 16]);
            if d[0] != 15 {
                assert_eq!(d, [14, 16], "a wrong draft, then the recording");
            }
        }
        let (a1, a2) = (first as f64 / n as f64, both as f64 / n as f64);
        assert!(
            (a1 - 0.8).abs() < 0.02 && (a2 - 0.4).abs() < 0.02,
            "{a1} {a2}"
        );
        // Off the recording: the recorded tokens, uncorrupted.
        let mut off = generated.to_vec();
        off[1] = 99;
        assert_eq!(profile.drafts(&recording, &off, 4, &mut rng), [15, 16]);
        // At most `max`; at the recording's end fewer, then none.
        assert_eq!(profile.drafts(&recording, generated, 1, &mut rng).len(), 1);
        assert!(
            profile
                .drafts(&recording, &recording[..49], 4, &mut rng)
                .len()
                <= 1
        );
        assert!(
            profile
                .drafts(&recording, &recording, 4, &mut rng)
                .is_empty()
        );
        // A wrong draft stays inside the vocabulary.
        let all_wrong = Profile::new(vec![0.0]).unwrap();
        assert_eq!(all_wrong.drafts(&[99], &[], 1, &mut rng), [98]);
        assert_eq!(all_wrong.drafts(&[0], &[], 1, &mut rng), [1]);
    }
}

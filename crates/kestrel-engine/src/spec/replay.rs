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
//!
//! Whether a draft is right is a pure function of the seed and the step's
//! index in its request ([`StepDraws`]), not of a random stream whose
//! position depends on scheduling. So every request that follows its
//! recording takes the same speculative steps, from round to round, from
//! prompt to prompt, and in `bench-model` as through the server with the
//! same seed: a benchmark's rounds repeat their work, and the server's
//! figure and the in-process one compare equal work.
//! A step takes one draw u, and its first i drafts are right when u < a_i;
//! the draws of a request's steps are a low-discrepancy (golden-ratio)
//! sequence, so even the ~40 steps of one 128-token request accept within
//! a few percent of the profile, where independent draws would miss by
//! ~10 %. The price: at batch > 1 all sequences accept at the same steps.

use anyhow::{Result, bail};

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
    /// at most `max` and at most k, corrupted at this profile with `draws`
    /// while the sequence follows the recording. Once it has left the
    /// recording the drafts are simply what the recording says (and will
    /// mostly be rejected).
    pub fn drafts(
        &self,
        recording: &[u32],
        generated: &[u32],
        max: usize,
        draws: StepDraws,
    ) -> Vec<u32> {
        let ahead = recording.get(generated.len()..).unwrap_or_default();
        let mut drafts = ahead[..max.min(self.len()).min(ahead.len())].to_vec();
        if recording.starts_with(generated) {
            // One draw u a step: the first i drafts are right when u < a_i,
            // which happens with probability a_i as the profile says.
            let u = draws.uniform();
            let right = self.0.iter().take_while(|&&a| u < a).count();
            if let Some(draft) = drafts.get_mut(right) {
                *draft = if *draft == 0 { 1 } else { *draft - 1 };
            }
        }
        drafts
    }
}

/// The draws of one speculative step: the proposer's seed and the index of
/// the step among its request's speculative steps ([`StepCounter`]).
#[derive(Clone, Copy, Debug)]
pub struct StepDraws {
    pub seed: u64,
    pub step: u64,
}

/// Numbers a request's speculative steps, for [`StepDraws::step`], by the
/// sequence's length at each draft call: a longer sequence is the next
/// step; the same length is the same step asked again (a scheduler may
/// propose before it knows whether the step runs), which gets the same
/// number and so the same drafts; a shorter one starts a new run of the
/// request (a benchmark that sends the same request id again).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepCounter {
    /// Generated tokens at the previous call, and that call's step.
    last: Option<(usize, u64)>,
}

impl StepCounter {
    /// The draws of the step that follows `generated` generated tokens.
    pub fn draws(&mut self, seed: u64, generated: usize) -> StepDraws {
        StepDraws {
            seed,
            step: self.step(generated),
        }
    }

    /// The number of the step that follows `generated` generated tokens.
    pub fn step(&mut self, generated: usize) -> u64 {
        let step = match self.last {
            Some((len, step)) if generated == len => step,
            Some((len, step)) if generated > len => step + 1,
            _ => 0,
        };
        self.last = Some((generated, step));
        step
    }
}

/// The golden ratio's fractional part: the step of the draws, whose
/// sequence (s + 1) * PHI mod 1 covers [0, 1) most evenly.
const PHI: f64 = 0.618_033_988_749_894_9;

impl StepDraws {
    /// The step's draw in [0, 1): the seed's offset plus (step + 1) times
    /// PHI, modulo 1.
    fn uniform(self) -> f64 {
        (seed_offset(self.seed) + (self.step + 1) as f64 * PHI).fract()
    }
}

/// The seed's offset in [0, 1): SplitMix64's finaliser, three times, over
/// the seed plus the golden-ratio constant (stable across runs, builds and
/// machines).
fn seed_offset(seed: u64) -> f64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let h = mix(mix(mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15))));
    (h >> 11) as f64 / (1u64 << 53) as f64
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

    const D: StepDraws = StepDraws { seed: 7, step: 0 };

    #[test]
    fn drafts_follow_the_recording_at_the_profile() {
        let profile = Profile::new(vec![0.8, 0.4]).unwrap();
        let recording: Vec<u32> = (10..60).collect();
        let generated = &recording[..5];
        let (mut first, mut both) = (0, 0);
        let n = 20_000;
        for step in 0..n {
            let d = profile.drafts(&recording, generated, 4, StepDraws { seed: 7, step });
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
        assert_eq!(profile.drafts(&recording, &off, 4, D), [15, 16]);
        // At most `max`; at the recording's end fewer, then none.
        assert_eq!(profile.drafts(&recording, generated, 1, D).len(), 1);
        assert!(profile.drafts(&recording, &recording[..49], 4, D).len() <= 1);
        assert!(profile.drafts(&recording, &recording, 4, D).is_empty());
        // A wrong draft stays inside the vocabulary.
        let all_wrong = Profile::new(vec![0.0]).unwrap();
        assert_eq!(all_wrong.drafts(&[99], &[], 1, D), [98]);
        assert_eq!(all_wrong.drafts(&[0], &[], 1, D), [1]);
    }

    /// The draws are part of recorded benchmark results: seed 0's first
    /// ones stay what they were.
    #[test]
    fn seed_zeros_first_draws_are_stable() {
        let got: Vec<f64> = (0..6)
            .map(|step| StepDraws { seed: 0, step }.uniform())
            .collect();
        for (g, want) in got.iter().zip([0.821, 0.439, 0.057, 0.675, 0.293, 0.911]) {
            assert!((g - want).abs() < 1e-3, "{got:?}");
        }
    }

    #[test]
    fn steps_are_numbered_by_the_sequences_length() {
        let mut c = StepCounter::default();
        let got: Vec<u64> = [1, 3, 3, 3, 4, 8, 2, 2, 5]
            .iter()
            .map(|&g| c.step(g))
            .collect();
        assert_eq!(got, [0, 1, 1, 1, 2, 3, 0, 0, 1]);
    }

    /// A sequence verified greedily along its recording, `steps` steps or
    /// to the end: per position, the share of steps whose first i drafts
    /// were accepted.
    fn achieved(rates: &[f64], seed: u64, steps: usize, recording: &[u32]) -> Vec<f64> {
        let profile = Profile::new(rates.to_vec()).unwrap();
        let k = rates.len();
        let (mut done, mut accepted_at) = (0usize, vec![0usize; k]);
        let mut at = 0;
        while done < steps && at + k < recording.len() {
            let draws = StepDraws {
                seed,
                step: done as u64,
            };
            let drafts = profile.drafts(recording, &recording[..at], k, draws);
            let accepted = drafts
                .iter()
                .zip(&recording[at..])
                .take_while(|(d, r)| d == r)
                .count();
            for a in accepted_at.iter_mut().take(accepted) {
                *a += 1;
            }
            done += 1;
            at += accepted + 1;
        }
        accepted_at
            .iter()
            .map(|&n| n as f64 / done as f64)
            .collect()
    }

    #[test]
    fn a_sequence_following_its_recording_accepts_at_the_profile_even_in_few_steps() {
        let recording: Vec<u32> = (1..=100_000).collect();
        for (rates, steps, tolerance) in [
            (vec![0.87, 0.74, 0.61], 30_000, 0.002),
            (vec![0.87, 0.74, 0.61], 40, 0.05),
            (vec![0.9, 0.5, 0.5, 0.1], 40, 0.05),
            ((1..=15).map(|i| 0.871f64.powi(i)).collect(), 20_000, 0.005),
        ] {
            for seed in [0, 1, 99] {
                let got = achieved(&rates, seed, steps, &recording);
                for (i, (g, a)) in got.iter().zip(&rates).enumerate() {
                    assert!(
                        (g - a).abs() < tolerance,
                        "{rates:?}, seed {seed}, {steps} steps, position {}: {g} against {a}",
                        i + 1
                    );
                }
            }
        }
        // Seeds give different patterns.
        let pattern = |seed| {
            let p = Profile::new(vec![0.5, 0.5]).unwrap();
            (0..64)
                .map(|step| p.drafts(&recording, &[], 2, StepDraws { seed, step }))
                .collect::<Vec<_>>()
        };
        assert_ne!(pattern(0), pattern(1));
    }
}

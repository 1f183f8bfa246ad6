//! `bench-model`'s replay proposer: drafts at a chosen acceptance profile
//! on any weights, replaying the target's own greedy continuation recorded
//! in a plain run of the same request (kestrel-engine's `spec::replay` has
//! the profile and how drafts are corrupted; the server's replay proposer
//! shares it). Every output it contributes to is labelled with its profile.

use std::collections::HashMap;
use std::sync::Mutex;

use kestrel_engine::spec::DraftSource;
pub use kestrel_engine::spec::replay::Profile;
use kestrel_engine::spec::replay::StepCounter;

struct State {
    /// Each request's recorded continuation (generated tokens only).
    recordings: HashMap<String, Vec<u32>>,
    /// Off: no drafts (the engine decodes plainly).
    on: bool,
    /// Each request's step numbers.
    steps: HashMap<String, StepCounter>,
}

/// A [`DraftSource`] replaying recorded continuations at a [`Profile`].
pub struct ReplaySource {
    profile: Profile,
    seed: u64,
    state: Mutex<State>,
}

impl ReplaySource {
    /// Starts switched off; `seed` picks the corrupted drafts (the server's
    /// replay proposer, seeded alike, picks the same ones).
    pub fn new(profile: Profile, seed: u64) -> Self {
        Self {
            profile,
            seed,
            state: Mutex::new(State {
                recordings: HashMap::new(),
                on: false,
                steps: HashMap::new(),
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
        let steps = state.steps.entry(request_id.to_string()).or_default();
        let draws = steps.draws(self.seed, generated.len());
        self.profile.drafts(recording, generated, max, draws)
    }

    fn label(&self) -> String {
        self.profile.label()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_replay_each_requests_recording_while_on() {
        let recording: Vec<u32> = (10..60).collect();
        let prompt = [1, 2, 3];
        let source = ReplaySource::new(Profile::new(vec![1.0, 1.0]).unwrap(), 7);
        source.record("r", recording.clone());
        assert!(source.drafts("r", &prompt, 3, 2).is_empty(), "off");
        source.set_on(true);
        assert!(source.drafts("other", &prompt, 3, 2).is_empty());
        let mut tokens = prompt.to_vec();
        tokens.extend_from_slice(&recording[..5]);
        assert_eq!(source.drafts("r", &tokens, 3, 4), [15, 16]);
        assert_eq!(
            source.label(),
            "replay proposer, profile 1/1",
            "labelled with its profile"
        );
    }

    #[test]
    fn the_servers_replay_proposer_with_the_same_seed_drafts_the_same() {
        use kestrel_engine::spec::Retired;
        use kestrel_engine::spec::prompt_replay::PromptReplay;

        let profile = Profile::new(vec![0.87, 0.74, 0.61]).unwrap();
        let prompt = [5u32, 6, 7];
        let recording: Vec<u32> = (100..400).collect();
        let tokens: Vec<u32> = prompt.iter().chain(&recording).copied().collect();
        let local = ReplaySource::new(profile.clone(), 0);
        local.record("r", recording.clone());
        local.set_on(true);
        let served = PromptReplay::new(profile, 0);
        served.retired(&Retired {
            request_id: "warm-up",
            tokens: &tokens,
            prompt_len: prompt.len(),
            greedy: true,
            completed: true,
        });
        // Greedy verification along the recording, twice (a benchmark's
        // rounds): both proposers take the same steps every time.
        let walk = |id: &str| {
            let mut steps = Vec::new();
            let mut n = prompt.len() + 1;
            while n + 3 < tokens.len() {
                let d = local.drafts(id, &tokens[..n], prompt.len(), 3);
                let s = served.drafts(id, &tokens[..n], prompt.len(), 3);
                assert_eq!(d, s, "at {n}");
                let accepted = d
                    .iter()
                    .zip(&tokens[n..])
                    .take_while(|(a, b)| a == b)
                    .count();
                steps.push(accepted);
                n += accepted + 1;
            }
            served.retired(&Retired {
                request_id: id,
                tokens: &tokens,
                prompt_len: prompt.len(),
                greedy: true,
                completed: true,
            });
            steps
        };
        let first = walk("r");
        assert!(first.iter().any(|&a| a < 3) && first.contains(&3));
        assert_eq!(walk("r"), first, "the next round repeats it");
    }
}

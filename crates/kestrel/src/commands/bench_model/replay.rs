//! `bench-model`'s replay proposer: drafts at a chosen acceptance profile
//! on any weights, replaying the target's own greedy continuation recorded
//! in a plain run of the same request (kestrel-engine's `spec::replay` has
//! the profile and how drafts are corrupted; the server's replay proposer
//! shares it). Every output it contributes to is labelled with its profile.

use std::collections::HashMap;
use std::sync::Mutex;

use kestrel_engine::spec::DraftSource;
pub use kestrel_engine::spec::replay::Profile;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

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
    state: Mutex<State>,
}

impl ReplaySource {
    /// Starts switched off; `seed` seeds the draws that corrupt drafts.
    pub fn new(profile: Profile, seed: u64) -> Self {
        Self {
            profile,
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
        self.profile
            .drafts(recording, generated, max, &mut state.rng)
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
}

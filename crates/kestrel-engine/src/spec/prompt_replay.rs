//! The replay proposer of `serve` and `generate`: a benchmark proposer for
//! dummy weights. There is no plain run to record from behind a server, so
//! it records as it serves: each greedy request that completes leaves its
//! output as the recording of its prompt (keyed by the prompt's token ids),
//! replacing the previous one; a later request with the same prompt gets
//! that recording as drafts, corrupted at the profile ([`super::replay`]).
//! A prompt not seen yet gets no drafts (it decodes plainly) and is
//! recorded, so a benchmark sends its prompts once to warm up and measures
//! the rounds after.
//!
//! Why recordings are replaced: on a GPU in its default (not batch
//! invariant) mode, verification may round differently from plain decoding,
//! so a speculative run's output can leave a recording made by a plain
//! one; recording every finished output makes the two converge over
//! rounds. The achieved per-position acceptance (the server's
//! `spec_decode_num_accepted_tokens_per_pos_total` over its
//! `spec_decode_num_drafts_total`) shows whether a run hit the profile.
//!
//! Sampled requests (temperature > 0) get no drafts and are not recorded: a
//! greedy recording says nothing about a sampled continuation, and drafts
//! it would reject only cost time.
//!
//! Which drafts are corrupted depends only on the proposer's seed and the
//! step numbers ([`super::replay`]): a request that follows its
//! recording takes the same steps in every round, so a benchmark's rounds
//! repeat their work exactly, and `bench-model` with the same seed takes
//! the same steps in process.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use super::replay::{Profile, StepCounter};
use super::{DraftSource, Retired};

/// Prompts remembered at most; the oldest recording goes first.
const MAX_RECORDINGS: usize = 4096;

/// A [`DraftSource`] replaying each prompt's recorded greedy output.
pub struct PromptReplay {
    profile: Profile,
    seed: u64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last greedy output (generated tokens) of each prompt.
    recordings: HashMap<Vec<u32>, Arc<[u32]>>,
    /// Prompts in the order they were first recorded, for eviction.
    order: VecDeque<Vec<u32>>,
    /// Requests being decoded.
    live: HashMap<String, Live>,
}

/// A request being decoded: the recording it replays (none: its prompt had
/// none when it started) and its step numbers.
type Live = (Option<Arc<[u32]>>, StepCounter);

impl PromptReplay {
    /// Corrupts drafts at `profile`, with draws seeded by `seed`.
    pub fn new(profile: Profile, seed: u64) -> Self {
        Self {
            profile,
            seed,
            state: Mutex::new(State::default()),
        }
    }

    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Prompts with a recording.
    pub fn num_recordings(&self) -> usize {
        self.lock().recordings.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl State {
    fn record(&mut self, prompt: &[u32], output: &[u32]) {
        if !self.recordings.contains_key(prompt) {
            if self.order.len() >= MAX_RECORDINGS
                && let Some(oldest) = self.order.pop_front()
            {
                self.recordings.remove(&oldest);
            }
            self.order.push_back(prompt.to_vec());
        }
        self.recordings.insert(prompt.to_vec(), output.into());
    }
}

impl DraftSource for PromptReplay {
    fn drafts(&self, request_id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let prompt_len = prompt_len.min(tokens.len());
        if !state.live.contains_key(request_id) {
            let recording = state.recordings.get(&tokens[..prompt_len]).cloned();
            state
                .live
                .insert(request_id.to_string(), (recording, StepCounter::default()));
        }
        let (recording, steps) = state.live.get_mut(request_id).expect("inserted above");
        let Some(recording) = recording else {
            return Vec::new();
        };
        let generated = &tokens[prompt_len..];
        let draws = steps.draws(self.seed, generated.len());
        self.profile.drafts(recording, generated, max, draws)
    }

    fn drafts_sampled(&self) -> bool {
        false
    }

    fn retired(&self, request: &Retired<'_>) {
        let mut state = self.lock();
        state.live.remove(request.request_id);
        let prompt_len = request.prompt_len.min(request.tokens.len());
        if request.greedy && request.completed && prompt_len < request.tokens.len() {
            let (prompt, output) = request.tokens.split_at(prompt_len);
            state.record(prompt, output);
        }
    }

    fn label(&self) -> String {
        format!(
            "{} (a benchmark proposer for dummy weights: replays each prompt's recorded \
             greedy output)",
            self.profile.label()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn retire(source: &PromptReplay, id: &str, tokens: &[u32], prompt_len: usize, greedy: bool) {
        source.retired(&Retired {
            request_id: id,
            tokens,
            prompt_len,
            greedy,
            completed: true,
        });
    }

    #[test]
    fn a_prompt_is_replayed_once_a_greedy_request_of_it_completed() {
        let source = PromptReplay::new(Profile::new(vec![1.0, 1.0]).unwrap(), 1);
        let prompt = [1, 2, 3];
        let full = [1, 2, 3, 40, 41, 42, 43];
        assert!(source.drafts("a", &prompt, 3, 2).is_empty(), "not seen yet");
        retire(&source, "a", &full, 3, true);
        assert_eq!(source.num_recordings(), 1);
        assert_eq!(source.drafts("b", &full[..4], 3, 2), [41, 42]);
        // Another prompt, or one aborted or sampled, records nothing.
        assert!(source.drafts("c", &[1, 2, 4], 3, 2).is_empty());
        source.retired(&Retired {
            request_id: "c",
            tokens: &[1, 2, 4, 9],
            prompt_len: 3,
            greedy: true,
            completed: false,
        });
        retire(&source, "d", &[1, 2, 5, 9], 3, false);
        assert_eq!(source.num_recordings(), 1);
        // A new output replaces the recording, for requests that start later.
        retire(&source, "e", &[1, 2, 3, 40, 50, 51], 3, true);
        assert_eq!(
            source.drafts("b", &full[..4], 3, 2),
            [41, 42],
            "b keeps its own"
        );
        assert_eq!(source.drafts("f", &full[..4], 3, 2), [50, 51]);
        assert!(!source.drafts_sampled());
        assert!(
            source
                .label()
                .contains("benchmark proposer for dummy weights")
        );
    }

    /// Drafts of request `id` at every length of `tokens` past the prompt.
    fn all_drafts(
        source: &PromptReplay,
        id: &str,
        tokens: &[u32],
        prompt_len: usize,
    ) -> Vec<Vec<u32>> {
        (prompt_len..tokens.len())
            .map(|n| source.drafts(id, &tokens[..n], prompt_len, 2))
            .collect()
    }

    #[test]
    fn replays_repeat_from_round_to_round_and_prompt_to_prompt_and_follow_the_seed() {
        let profile = Profile::new(vec![0.5, 0.25]).unwrap();
        let source = PromptReplay::new(profile.clone(), 9);
        let a: Vec<u32> = (0..200).collect();
        let b: Vec<u32> = [7, 7, 7, 7].into_iter().chain(1000..1196).collect();
        retire(&source, "rec a", &a, 4, true);
        retire(&source, "rec b", &b, 4, true);
        let rounds: Vec<_> = (0..3)
            .map(|r| {
                let d = all_drafts(&source, &format!("a{r}"), &a, 4);
                retire(&source, &format!("a{r}"), &a, 4, true);
                d
            })
            .collect();
        assert!(rounds.iter().all(|d| *d == rounds[0]), "rounds differ");
        // Which drafts are right depends on the step numbers only.
        let right = |d: &[Vec<u32>], tokens: &[u32]| -> Vec<Vec<bool>> {
            d.iter()
                .enumerate()
                .map(|(n, d)| {
                    d.iter()
                        .zip(&tokens[4 + n..])
                        .map(|(x, y)| x == y)
                        .collect()
                })
                .collect()
        };
        let other = all_drafts(&source, "b0", &b, 4);
        assert_eq!(right(&rounds[0], &a), right(&other, &b));
        assert!(
            right(&other, &b).iter().any(|r| !r[0]),
            "some are corrupted"
        );
        // Another seed, other draws.
        let reseeded = PromptReplay::new(profile, 10);
        retire(&reseeded, "rec", &a, 4, true);
        assert_ne!(all_drafts(&reseeded, "x", &a, 4), rounds[0]);
    }

    #[test]
    fn the_oldest_prompt_is_forgotten_first() {
        let source = PromptReplay::new(Profile::new(vec![1.0]).unwrap(), 1);
        for p in 0..MAX_RECORDINGS as u32 + 1 {
            retire(&source, "x", &[p, 7], 1, true);
        }
        assert_eq!(source.num_recordings(), MAX_RECORDINGS);
        assert!(source.drafts("y", &[0], 1, 1).is_empty());
        assert_eq!(source.drafts("z", &[1], 1, 1), [7]);
    }
}

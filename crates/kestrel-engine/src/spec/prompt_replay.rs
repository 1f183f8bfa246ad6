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
//! Each request draws its corruptions from its own RNG, seeded by the
//! proposer's seed, the prompt and how many requests of that prompt were
//! replayed before, so a run repeats its drafts exactly.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::replay::Profile;
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
    /// Requests replayed so far, per prompt (seeds the next one's RNG).
    replays: HashMap<Vec<u32>, u64>,
    /// Requests being decoded: what they replay and their RNG.
    live: HashMap<String, Live>,
}

struct Live {
    recording: Option<Arc<[u32]>>,
    rng: ChaCha8Rng,
}

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
    fn start(&mut self, prompt: &[u32], seed: u64) -> Live {
        let Some(recording) = self.recordings.get(prompt).cloned() else {
            return Live {
                recording: None,
                rng: ChaCha8Rng::seed_from_u64(seed),
            };
        };
        let replays = self.replays.entry(prompt.to_vec()).or_default();
        let rng = ChaCha8Rng::seed_from_u64(mix(seed, prompt, *replays));
        *replays += 1;
        Live {
            recording: Some(recording),
            rng,
        }
    }

    fn record(&mut self, prompt: &[u32], output: &[u32]) {
        if !self.recordings.contains_key(prompt) {
            if self.order.len() >= MAX_RECORDINGS
                && let Some(oldest) = self.order.pop_front()
            {
                self.recordings.remove(&oldest);
                self.replays.remove(&oldest);
            }
            self.order.push_back(prompt.to_vec());
        }
        self.recordings.insert(prompt.to_vec(), output.into());
    }
}

/// A seed from the proposer's seed, the prompt and the replay count
/// (FNV-1a over their words: stable across runs and builds).
fn mix(seed: u64, prompt: &[u32], replays: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let words = [seed, replays]
        .into_iter()
        .chain(prompt.iter().map(|&t| u64::from(t)));
    for w in words {
        for byte in w.to_le_bytes() {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

impl DraftSource for PromptReplay {
    fn drafts(&self, request_id: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let prompt_len = prompt_len.min(tokens.len());
        if !state.live.contains_key(request_id) {
            let live = state.start(&tokens[..prompt_len], self.seed);
            state.live.insert(request_id.to_string(), live);
        }
        let live = state.live.get_mut(request_id).expect("inserted above");
        let Some(recording) = &live.recording else {
            return Vec::new();
        };
        self.profile
            .drafts(recording, &tokens[prompt_len..], max, &mut live.rng)
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

    #[test]
    fn replays_of_a_prompt_repeat_from_run_to_run_but_differ_from_each_other() {
        let run = || {
            let source = PromptReplay::new(Profile::new(vec![0.5, 0.25]).unwrap(), 9);
            let tokens: Vec<u32> = (0..200).collect();
            retire(&source, "rec", &tokens, 4, true);
            (0..8)
                .map(|r| {
                    let id = format!("r{r}");
                    let d: Vec<Vec<u32>> = (4..100)
                        .map(|n| source.drafts(&id, &tokens[..n], 4, 2))
                        .collect();
                    retire(&source, &id, &tokens, 4, true);
                    d
                })
                .collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        assert_ne!(a[0], a[1]);
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

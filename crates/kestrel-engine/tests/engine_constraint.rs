//! Output constraints in the engine: every generated token is one the
//! constraint allowed (greedy and sampled), the sequence stops when the
//! constraint is complete, drafts the constraint rejects are never
//! verified, and speculation leaves constrained output unchanged.

mod common;

use std::sync::Arc;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{DraftSource, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Constraint, Engine, EngineOptions, GenerateRequest, TokenConstraint};
use kestrel_sampling::{FinishReason, SamplingParams};

/// Allows only ids that are multiples of `step`, and is complete after
/// `len` tokens.
#[derive(Clone)]
struct Multiples {
    step: u32,
    left: usize,
}

impl TokenConstraint for Multiples {
    fn allowed(&mut self, ids: usize) -> Result<Vec<u32>, String> {
        let mut words = vec![0u32; ids.div_ceil(32)];
        for id in (0..ids).step_by(self.step as usize) {
            words[id / 32] |= 1 << (id % 32);
        }
        Ok(words)
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        if !token.is_multiple_of(self.step) || self.left == 0 {
            return Err(format!("{token} is not allowed"));
        }
        self.left -= 1;
        Ok(())
    }

    fn valid_prefix(&mut self, tokens: &[u32]) -> usize {
        tokens
            .iter()
            .take(self.left)
            .take_while(|&&t| t % self.step == 0)
            .count()
    }

    fn is_complete(&self) -> bool {
        self.left == 0
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

const LEN: usize = 12;

fn constrained(id: &str, seed: u64, params: SamplingParams) -> GenerateRequest {
    GenerateRequest {
        constraint: Some(Constraint::new(Multiples { step: 3, left: LEN })),
        ..named(id, &prompt(seed, 40, TestModel::Bundled.vocab()), params)
    }
}

fn sampled() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        top_k: 50,
        top_p: 0.9,
        seed: Some(11),
        max_tokens: Some(40),
        ..SamplingParams::default()
    }
}

#[test]
fn constrained_tokens_are_allowed_and_the_sequence_stops_when_complete() {
    let engine = spawn(TestModel::Bundled, config());
    for params in [greedy(40), sampled()] {
        let out = run_one(&engine, constrained("c", 1, params));
        assert_eq!(out.tokens.len(), LEN, "{:?}", out.tokens);
        assert!(out.tokens.iter().all(|t| t % 3 == 0), "{:?}", out.tokens);
        assert_eq!(out.reason, FinishReason::Stop);
    }
    // Unconstrained neighbours in the same batch are unaffected.
    let plain = run_one(&engine, named("p", &prompt(2, 40, 4096), greedy(20)));
    let mixed = run_together(
        &engine,
        &[
            constrained("c", 1, greedy(40)),
            named("p", &prompt(2, 40, 4096), greedy(20)),
        ],
    );
    assert_eq!(mixed[1].tokens, plain.tokens);
    wait_idle(&engine);
}

/// Drafts from a reference run, with a rejected id after the first few.
struct Reference {
    tokens: Vec<u32>,
    prompt: usize,
}

impl DraftSource for Reference {
    fn drafts(&self, _: &str, tokens: &[u32], prompt_len: usize, max: usize) -> Vec<u32> {
        let done = tokens.len() - prompt_len;
        let _ = self.prompt;
        let mut d: Vec<u32> = self.tokens.iter().skip(done).take(max).copied().collect();
        // A draft the constraint rejects: never verified.
        if d.len() > 1 {
            d[1] = 1;
        }
        d
    }
}

#[test]
fn speculation_keeps_constrained_output_and_cuts_rejected_drafts() {
    let plain = spawn(TestModel::Bundled, config());
    for params in [greedy(40), sampled()] {
        let want = run_one(&plain, constrained("c", 3, params.clone()));
        let options = EngineOptions {
            speculative: Some(SpeculativeConfig {
                method: SpeculativeMethod::External(Arc::new(Reference {
                    tokens: want.tokens.clone(),
                    prompt: 40,
                })),
                num_speculative_tokens: 3,
            }),
            ..EngineOptions::default()
        };
        let spec = Engine::spawn_with_options(
            CpuBackend::new(),
            TestModel::Bundled.load(),
            config(),
            options,
        )
        .expect("engine starts");
        let got = run_one(&spec, constrained("c", 3, params));
        assert_eq!(got.tokens, want.tokens);
        assert_eq!(got.reason, want.reason);
        let stats = wait_idle(&spec);
        // Each step's drafts were cut to the one before the rejected id.
        assert!(stats.spec_decode_num_drafts_total > 0);
        assert_eq!(
            stats.spec_decode_num_draft_tokens_total,
            stats.spec_decode_num_drafts_total
        );
    }
}

/// A request with logprobs has its rows masked on the host (the values come
/// from the raw row); one without, by the backend before the row is chosen.
/// Both give the same tokens, greedy and sampled, alone and batched.
#[test]
fn rows_masked_by_the_backend_choose_what_rows_masked_on_the_host_choose() {
    let engine = spawn(TestModel::Bundled, config());
    for params in [greedy(40), sampled()] {
        let on_backend = run_one(&engine, constrained("b", 5, params.clone()));
        let with_logprobs = SamplingParams {
            logprobs: Some(0),
            ..params.clone()
        };
        let on_host = run_one(&engine, constrained("h", 5, with_logprobs.clone()));
        assert_eq!(on_backend.tokens, on_host.tokens);
        assert_eq!(on_backend.tokens.len(), LEN);
        let together = run_together(
            &engine,
            &[
                constrained("b", 5, params),
                constrained("h", 5, with_logprobs),
                named("p", &prompt(2, 40, 4096), greedy(20)),
            ],
        );
        assert_eq!(together[0].tokens, on_backend.tokens);
        assert_eq!(together[1].tokens, on_backend.tokens);
    }
    wait_idle(&engine);
}

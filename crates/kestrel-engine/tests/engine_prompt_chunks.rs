//! The engine marks exactly its prompt chunks (`SeqChunk::prompt`): a
//! backend that computes prompt rows with its prefill kernels at any size
//! (CUDA's invariant prompt rows) relies on it, so that a prefix-cache hit
//! recomputes a prompt's tail as the cold prompt computed it, while decode
//! and verify rows, and output replayed after a preemption, keep the
//! kernels of decode steps.
//!
//! A backend that forwards everything to the CPU records every chunk it is
//! given; every request has a prompt of the same length, so a chunk is a
//! prompt chunk exactly when it ends within that length.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use kestrel_core::block_attention::HostBlockKeys;
use kestrel_core::{Backend, ForwardBatch, StepKey};
use kestrel_cpu::{CpuBackend, CpuCache, CpuTensor, CpuWeight};
use kestrel_engine::spec::SpeculativeConfig;
use kestrel_engine::{Engine, EngineConfig, EngineOptions, GenerateRequest};
use kestrel_models::Model;

const PROMPT_LEN: usize = 100;

/// Every chunk a step brought: (cached tokens, new tokens, marked prompt).
type Seen = Arc<Mutex<Vec<(usize, usize, bool)>>>;

/// The CPU backend, recording the chunks of every step.
struct Spy {
    cpu: CpuBackend,
    seen: Seen,
}

impl Backend for Spy {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;
    type Cache = CpuCache;
    type BlockKeys = HostBlockKeys;

    fn name(&self) -> String {
        "cpu, recording chunks".into()
    }
    fn run_step(
        &self,
        ids: &[u32],
        batch: &ForwardBatch,
        cache: &mut CpuCache,
        key: Option<StepKey>,
        f: &mut dyn FnMut(&mut CpuCache) -> CpuTensor,
    ) -> CpuTensor {
        self.seen.lock().unwrap().extend(
            batch
                .seqs
                .iter()
                .map(|q| (q.cached_len, q.num_tokens, q.prompt)),
        );
        self.cpu.run_step(ids, batch, cache, key, f)
    }
    fn supports_state_checkpoints(&self) -> bool {
        self.cpu.supports_state_checkpoints()
    }
    fn state_snapshot_alignment(&self) -> Option<usize> {
        self.cpu.state_snapshot_alignment()
    }
    fn step_cut(&self, batch: &ForwardBatch) -> Option<usize> {
        self.cpu.step_cut(batch)
    }
    kestrel_cpu::forward_required_to_cpu!(cpu);
}

/// The chunks the engine gave the backend while serving `reqs`.
fn chunks_of(
    config: EngineConfig,
    speculative: Option<SpeculativeConfig>,
    reqs: &[GenerateRequest],
) -> Vec<(usize, usize, bool)> {
    let seen = Seen::default();
    let spy = Spy {
        cpu: CpuBackend::new(),
        seen: Arc::clone(&seen),
    };
    let model = Model::load(&TestModel::HybridGolden.dir(), &spy).expect("the fixture loads");
    let options = EngineOptions {
        speculative,
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(spy, model, config, options).expect("engine starts");
    run_together(&engine, reqs);
    engine.shutdown();
    seen.lock().unwrap().clone()
}

#[test]
fn only_prompt_chunks_are_marked_as_prompt() {
    let vocab = TestModel::HybridGolden.vocab();
    // A repeating prompt, so that n-gram drafts find matches and verify.
    let phrase = prompt(7, 9, vocab);
    let looping: Vec<u32> = phrase.iter().cycle().take(PROMPT_LEN).copied().collect();
    let two = [
        named("a", &prompt(1, PROMPT_LEN, vocab), greedy(12)),
        named("b", &looping, greedy(12)),
    ];
    for (name, config, spec) in serving_variants() {
        let chunks = chunks_of(config, spec, &two);
        let prompt_chunks = chunks.iter().filter(|c| c.2).count();
        assert!(prompt_chunks >= 2, "{name}: {chunks:?}");
        assert!(chunks.len() > prompt_chunks, "{name}: no decode rows");
        for &(cached, new, marked) in &chunks {
            assert_eq!(
                marked,
                cached + new <= PROMPT_LEN,
                "{name}: chunk of {new} tokens after {cached}"
            );
        }
        if name == "n-gram speculation" {
            assert!(
                chunks
                    .iter()
                    .any(|&(cached, new, _)| cached >= PROMPT_LEN && new > 1),
                "{name}: no verify chunk"
            );
        }
    }
}

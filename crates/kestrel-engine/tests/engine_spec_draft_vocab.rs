//! MTP drafting over a reduced draft vocabulary, on the golden hybrid model
//! and the bundled model: greedy output is the same as without speculation
//! whatever the subset; a subset of every id drafts exactly as no subset
//! (same draft and acceptance counts); drafts never leave the subset (with
//! every emitted id left out, no draft is ever accepted); drafts from a
//! subset are accepted and reported per position.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{DraftVocab, MtpOptions, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineOptions, EngineStats};

const K: usize = 3;

fn run(model: TestModel, draft_vocab: Option<Option<DraftVocab>>) -> (Vec<Output>, EngineStats) {
    let options = EngineOptions {
        speculative: draft_vocab.map(|v| SpeculativeConfig {
            method: SpeculativeMethod::Mtp(MtpOptions {
                draft_vocab: v.map(Arc::new),
            }),
            num_speculative_tokens: K,
        }),
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(CpuBackend::new(), model.load(), config(), options)
        .expect("engine starts");
    let vocab = model.vocab();
    let requests: Vec<_> = [(5, 11), (37, 12), (90, 13)]
        .iter()
        .enumerate()
        .map(|(i, &(len, seed))| named(&format!("r{i}"), &prompt(seed, len, vocab), greedy(24)))
        .collect();
    let outputs = run_together(&engine, &requests);
    (outputs, wait_idle(&engine))
}

fn counts(s: &EngineStats) -> (u64, u64, u64, Vec<u64>) {
    (
        s.spec_decode_num_drafts_total,
        s.spec_decode_num_draft_tokens_total,
        s.spec_decode_num_accepted_tokens_total,
        s.spec_decode_num_accepted_tokens_per_pos_total.clone(),
    )
}

#[test]
fn a_reduced_draft_vocabulary_never_changes_greedy_output() {
    for model in [TestModel::HybridGolden, TestModel::Bundled] {
        let vocab = model.vocab() as usize;
        let (off, _) = run(model, None);
        let (whole_head, whole_stats) = run(model, Some(None));
        assert_eq!(whole_head, off, "{model:?}: MTP over the whole head");

        let every_id = DraftVocab::first(vocab).unwrap();
        let (all, all_stats) = run(model, Some(Some(every_id)));
        assert_eq!(all, off, "{model:?}: a subset of every id");
        assert_eq!(
            counts(&all_stats),
            counts(&whole_stats),
            "{model:?}: a subset of every id drafts as no subset"
        );
        assert!(
            whole_stats.spec_decode_num_accepted_tokens_total > 0,
            "{model:?}"
        );

        // Every id the target emits left out: drafts stay in the subset, so
        // none can match.
        let emitted: BTreeSet<u32> = off.iter().flat_map(|o| o.tokens.iter().copied()).collect();
        let others = DraftVocab::new(
            (0..vocab as u32)
                .filter(|id| !emitted.contains(id))
                .collect(),
        )
        .unwrap();
        let (out, stats) = run(model, Some(Some(others)));
        assert_eq!(out, off, "{model:?}: a subset without the emitted ids");
        assert!(
            stats.spec_decode_num_draft_tokens_total > 0,
            "{model:?}: drafted"
        );
        assert_eq!(stats.spec_decode_num_accepted_tokens_total, 0, "{model:?}");

        // Only the emitted ids (and a few more): drafts are accepted and
        // counted per position as without a subset.
        let mut few: Vec<u32> = emitted.iter().copied().collect();
        few.extend((0..8).filter(|id| !emitted.contains(id)));
        let (out, stats) = run(model, Some(Some(DraftVocab::new(few).unwrap())));
        assert_eq!(out, off, "{model:?}: a subset of the emitted ids");
        let per_pos = &stats.spec_decode_num_accepted_tokens_per_pos_total;
        assert_eq!(per_pos.len(), K, "{model:?}");
        assert_eq!(
            per_pos.iter().sum::<u64>(),
            stats.spec_decode_num_accepted_tokens_total,
            "{model:?}"
        );
        assert!(
            stats.spec_decode_num_accepted_tokens_total > 0,
            "{model:?}: {:?}",
            counts(&stats)
        );
    }
}

#[test]
fn draft_ids_outside_the_vocabulary_are_refused_at_start() {
    let model = TestModel::Bundled;
    let vocab = DraftVocab::new(vec![1, model.vocab()]).unwrap();
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method: SpeculativeMethod::Mtp(MtpOptions {
                draft_vocab: Some(Arc::new(vocab)),
            }),
            num_speculative_tokens: 2,
        }),
        ..EngineOptions::default()
    };
    let err = Engine::spawn_with_options(CpuBackend::new(), model.load(), config(), options)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("out of range"), "{err}");
}

//! The proposer's plumbing against the drafter's PyTorch reference: the
//! target's own step records the context (not the fixture's recorded
//! states), and a verify step whose drafts were all rejected adds only the
//! committed position.

use std::path::PathBuf;

use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_cpu::CpuBackend;
use kestrel_models::Model;
use serde_json::Value;

use super::{DflashOptions, DflashProposer};
use crate::spec::mtp::CommittedRows;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Sequence 1's rows `start..committed` at the start of the step; its
/// known tokens run one past `committed`.
fn rows(start: usize, committed: usize, tokens: &[u32]) -> CommittedRows<'_> {
    CommittedRows {
        id: 1,
        first_row: 0,
        start,
        committed,
        tokens,
        block_table: &[],
        decodes_next: true,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn drafts_follow_the_reference_through_prefill_and_a_rejected_verify() {
    let b = CpuBackend::new();
    let model = Model::load(&testdata().join("golden/qwen3_5_moe/model"), &b).unwrap();
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("dflash/reference.json")).unwrap(),
    )
    .unwrap();
    let seq = ids(&meta["sequence"]);
    let steps = meta["steps"].as_array().unwrap();
    let options = DflashOptions::new(testdata().join("dflash/drafter"));
    let mut proposer = DflashProposer::new(&b, &model, &options, 7, 512).unwrap();
    let d = &model.decoder;
    let mut cache = b.new_cache(&d.cache_spec(4, 16, 1)).unwrap();
    b.zero_state(&mut cache, 0);
    let table = vec![2u32, 0, 3, 1];
    let tapped = proposer.taps().to_vec();
    let mut step = |ids: &[u32], start: usize| {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk::new(ids.len(), start, table.clone(), 0)],
        };
        let last = [ids.len() - 1];
        d.step_with_taps(&b, ids, &batch, &mut cache, &last, &tapped)
            .taps
    };

    // Prefill of the 5-token prompt; its next token is known (seq[5]).
    let prompt = steps[0]["context_len"].as_u64().unwrap() as usize;
    let taps = step(&seq[..prompt], 0);
    let known = &seq[..=prompt];
    proposer
        .after_step(&b, &model, &taps, &[rows(0, prompt, known)])
        .unwrap();
    assert_eq!(proposer.drafts(1), ids(&steps[0]["drafts"]).as_slice());

    // Verify [anchor, drafts]: the target keeps only the anchor (the
    // drafts are wrong), so the context grows by one position.
    let mut verify = vec![seq[prompt]];
    verify.extend_from_slice(proposer.drafts(1));
    let taps = step(&verify, prompt);
    let known = &seq[..=prompt + 1];
    proposer
        .after_step(&b, &model, &taps, &[rows(prompt, prompt + 1, known)])
        .unwrap();
    assert_eq!(
        steps[1]["context_len"].as_u64().unwrap() as usize,
        prompt + 1
    );
    assert_eq!(proposer.drafts(1), ids(&steps[1]["drafts"]).as_slice());

    // Released once the sequence is gone.
    proposer.retain(|id| id != 1);
    assert!(proposer.contexts.is_empty());
}

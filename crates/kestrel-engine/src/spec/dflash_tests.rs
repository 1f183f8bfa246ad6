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
    seq_rows(1, start, committed, tokens)
}

fn seq_rows(id: u64, start: usize, committed: usize, tokens: &[u32]) -> CommittedRows<'_> {
    CommittedRows {
        id,
        first_row: 0,
        start,
        committed,
        tokens,
        block_table: &[],
        decodes_next: true,
        draft_limit: usize::MAX,
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The hybrid golden target and the DFlash fixture's reference drafts.
fn golden_with_reference() -> (CpuBackend, Model<CpuBackend>, Value) {
    let b = CpuBackend::new();
    let model = Model::load(&testdata().join("golden/qwen3_5_moe/model"), &b).unwrap();
    let meta = serde_json::from_str(
        &std::fs::read_to_string(testdata().join("dflash/reference.json")).unwrap(),
    )
    .unwrap();
    (b, model, meta)
}

#[test]
fn drafts_follow_the_reference_through_prefill_and_a_rejected_verify() {
    let (b, model, meta) = golden_with_reference();
    let seq = ids(&meta["sequence"]);
    let steps = meta["steps"].as_array().unwrap();
    let options = DflashOptions::new(testdata().join("dflash/drafter"));
    let mut proposer = DflashProposer::new(&b, &model, &options, 7, None, 512).unwrap();
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

#[test]
fn a_pass_drafts_only_what_the_next_step_can_verify() {
    let (b, model, meta) = golden_with_reference();
    let seq = ids(&meta["sequence"]);
    let prompt = meta["steps"][0]["context_len"].as_u64().unwrap() as usize;
    let options = DflashOptions::new(testdata().join("dflash/drafter"));
    let d = &model.decoder;
    // Two sequences with the same prompt, prefilled in one step.
    let taps = |proposer: &DflashProposer<CpuBackend>| {
        let mut cache = b.new_cache(&d.cache_spec(4, 16, 2)).unwrap();
        b.zero_state(&mut cache, 0);
        b.zero_state(&mut cache, 1);
        let mut ids = seq[..prompt].to_vec();
        ids.extend_from_slice(&seq[..prompt]);
        let batch = ForwardBatch {
            seqs: vec![
                SeqChunk::new(prompt, 0, vec![0], 0),
                SeqChunk::new(prompt, 0, vec![1], 1),
            ],
        };
        d.step_with_taps(
            &b,
            &ids,
            &batch,
            &mut cache,
            &[prompt - 1, 2 * prompt - 1],
            proposer.taps(),
        )
        .taps
    };
    let known = &seq[..=prompt];
    let both = |p: &mut DflashProposer<CpuBackend>| {
        let t = taps(p);
        let mut second = seq_rows(2, 0, prompt, known);
        second.first_row = prompt;
        p.after_step(&b, &model, &t, &[seq_rows(1, 0, prompt, known), second])
            .unwrap();
    };
    // Unbudgeted: the whole block (7 drafts) for each.
    let mut unlimited = DflashProposer::new(&b, &model, &options, 7, None, 512).unwrap();
    both(&mut unlimited);
    assert_eq!(unlimited.drafts(1).len(), 7);
    assert_eq!(unlimited.drafts(1), unlimited.drafts(2));
    // 8 rows for 2 sequences: 3 drafts each, from a block of 4.
    let mut budget = DflashProposer::new(&b, &model, &options, 7, Some(8), 512).unwrap();
    both(&mut budget);
    assert_eq!((budget.drafts(1).len(), budget.drafts(2).len()), (3, 3));
    let mut ctx = budget.contexts.remove(&1).unwrap();
    let alone = budget
        .drafter
        .drafts(&b, d, &mut ctx, seq[prompt], 4, &budget.head);
    assert_eq!(budget.drafts(1), alone.as_slice());
    // 3 rows for 2 sequences: nothing to verify, so no pass, but the
    // contexts still follow the committed rows.
    let mut none = DflashProposer::new(&b, &model, &options, 7, Some(3), 512).unwrap();
    both(&mut none);
    assert!(none.drafts(1).is_empty() && none.drafts(2).is_empty());
    assert_eq!(none.contexts[&1].end(), prompt);
    assert_eq!(none.contexts[&2].end(), prompt);
    // Adapted lengths of 2 and 4: one block of 5 serves both.
    let mut adapted = DflashProposer::new(&b, &model, &options, 7, None, 512).unwrap();
    let t = taps(&adapted);
    let mut first = seq_rows(1, 0, prompt, known);
    first.draft_limit = 2;
    let mut second = seq_rows(2, 0, prompt, known);
    second.first_row = prompt;
    second.draft_limit = 4;
    adapted
        .after_step(&b, &model, &t, &[first, second])
        .unwrap();
    assert_eq!((adapted.drafts(1).len(), adapted.drafts(2).len()), (4, 4));
}

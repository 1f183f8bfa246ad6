//! The bundled model's trained DFlash drafter (models/kestrel-tiny-qwen35-dflash)
//! against the drafts its training script recorded (`reference.json`, made by
//! scripts/bundled_model/train_dflash.py with scripts/dflash_reference.py from
//! the saved bf16 weights): kestrel replays the recorded held-out sequence
//! through its own target, feeds the tapped states to its own drafter and
//! must draft the same tokens at every recorded context length.
//!
//! Both sides compute in f32 from the same bf16 weights, but the taps come
//! from two implementations of the target (differences near 1e-5), so a
//! row whose recorded top-1/top-2 margin is below `NEAR_TIE` may flip; the
//! comparison of a block stops at its first such row.

use std::path::PathBuf;

use kestrel_cpu::CpuBackend;
use kestrel_models::runner::SequenceRunner;
use kestrel_models::{DflashDrafter, DraftContext, DraftHead, Model};
use serde_json::Value;

const NEAR_TIE: f64 = 1e-2;

fn models() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn the_bundled_drafter_drafts_what_its_training_script_recorded() {
    let b = CpuBackend::new();
    let target = Model::load(&models().join("kestrel-tiny-qwen35"), &b).expect("target loads");
    let dir = models().join("kestrel-tiny-qwen35-dflash");
    let drafter = DflashDrafter::load(&dir, &b, &target.decoder).expect("drafter loads");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let config = &drafter.config;
    assert_eq!(meta["block_size"].as_u64(), Some(config.block_size as u64));
    assert_eq!(
        meta["mask_token_id"].as_u64(),
        Some(u64::from(config.mask_token_id))
    );
    let vocab = target.config().vocab_size;
    let seq = ids(&meta["sequence"]);
    let taps = config.target_layer_ids.clone();
    let mut runner = SequenceRunner::new(&b, &target, seq.len() + 1).unwrap();
    let mut ctx = DraftContext::new(8192);
    let (mut compared, mut steps) = (0, 0);
    for step in meta["steps"].as_array().unwrap() {
        let c = step["context_len"].as_u64().unwrap() as usize;
        let (states, _) = runner.feed_tapped(&seq[ctx.end()..c], &taps).unwrap();
        ctx.append(&b, &drafter, &states);
        assert_eq!((ctx.first(), ctx.end()), (0, c));
        let anchor = step["anchor"].as_u64().unwrap() as u32;
        assert_eq!(
            anchor, seq[c],
            "the anchor is the token at the context's end"
        );
        let got = drafter.drafts(
            &b,
            &target.decoder,
            &mut ctx,
            anchor,
            config.block_size,
            &DraftHead::full(vocab),
        );
        let want = ids(&step["drafts"]);
        let margins: Vec<f64> = step["margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let firm = margins
            .iter()
            .position(|&m| m < NEAR_TIE)
            .unwrap_or(want.len());
        assert_eq!(
            got[..firm],
            want[..firm],
            "context {c}: drafts (the first {firm} rows, those before any near-tie)"
        );
        compared += firm;
        steps += 1;
    }
    assert!(steps >= 4, "the reference has {steps} steps");
    assert!(
        compared >= steps * 4,
        "only {compared} draft rows were clear of near-ties"
    );
}

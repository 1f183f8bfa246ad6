//! The DFlash drafter on the CPU backend against its PyTorch reference
//! (`scripts/make_dflash_fixture.py`, testdata/dflash/README.md): a tiny
//! random drafter for the hybrid golden target, its draft logits at five
//! context lengths reached incrementally and with a draft window.
//!
//! Tolerance: the golden tests' 2e-3 absolute on logits (both sides f32
//! from the same stored weights; the drafts' top-1 margins are at least
//! 0.73, so drafts must match token for token).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_models::runner::SequenceRunner;
use kestrel_models::{DflashDrafter, DraftContext, DraftHead, Model};
use serde_json::Value;

const LOGIT_TOL: f32 = 2e-3;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

struct Fixture {
    b: CpuBackend,
    target: Model<CpuBackend>,
    drafter: DflashDrafter<CpuBackend>,
    meta: Value,
    tensors: HashMap<String, (Vec<usize>, Vec<f32>)>,
}

fn read_f32_tensors(path: &Path) -> HashMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

fn load() -> Fixture {
    let b = CpuBackend::new();
    let target = Model::load(&root().join("golden/qwen3_5_moe/model"), &b).expect("target loads");
    let drafter = DflashDrafter::load(&root().join("dflash/drafter"), &b, &target.decoder)
        .expect("drafter loads");
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("dflash/reference.json")).unwrap(),
    )
    .unwrap();
    let tensors = read_f32_tensors(&root().join("dflash/reference.safetensors"));
    Fixture {
        b,
        target,
        drafter,
        meta,
        tensors,
    }
}

impl Fixture {
    /// Rows `from..to` of the recorded target taps, one backend tensor per
    /// tapped layer.
    fn taps(&self, from: usize, to: usize) -> Vec<<CpuBackend as Backend>::Tensor> {
        let (shape, values) = &self.tensors["target_taps"];
        let (w, h) = (shape[1], 64);
        (0..w / h)
            .map(|j| {
                let rows: Vec<f32> = (from..to)
                    .flat_map(|r| values[r * w + j * h..r * w + (j + 1) * h].iter().copied())
                    .collect();
                self.b.from_host(to - from, h, &rows)
            })
            .collect()
    }

    fn check_step(&self, ctx: &mut DraftContext<CpuBackend>, step: &Value, logits_name: &str) {
        let (b, d) = (&self.b, &self.target.decoder);
        let anchor = step["anchor"].as_u64().unwrap() as u32;
        let block = self.drafter.config.block_size;
        let logits = b.to_host(&self.drafter.block_logits(b, d, ctx, anchor, block));
        let (shape, want) = &self.tensors[logits_name];
        assert_eq!(logits.len(), shape[0] * shape[1]);
        let diff = logits
            .iter()
            .zip(want)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(diff < LOGIT_TOL, "{logits_name}: max |diff| {diff}");
        let drafts = self
            .drafter
            .drafts(b, d, ctx, anchor, block, &DraftHead::full(512));
        let want: Vec<u32> = step["drafts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(drafts, want, "{logits_name}: drafts");
    }
}

#[test]
fn drafts_and_logits_match_the_reference_as_the_context_grows() {
    let f = load();
    assert_eq!(f.drafter.config.block_size, 8);
    assert_eq!(f.drafter.config.target_layer_ids, vec![1, 3, 5]);
    let mut ctx = DraftContext::new(8192);
    let steps = f.meta["steps"].as_array().unwrap();
    for (i, step) in steps.iter().enumerate() {
        let c = step["context_len"].as_u64().unwrap() as usize;
        ctx.append(&f.b, &f.drafter, &f.taps(ctx.end(), c));
        assert_eq!((ctx.first(), ctx.end()), (0, c));
        f.check_step(&mut ctx, step, &format!("step.{i}.logits"));
    }
}

#[test]
fn a_draft_window_keeps_only_the_newest_context_at_its_positions() {
    let f = load();
    let window = &f.meta["window"];
    let c = window["context_len"].as_u64().unwrap() as usize;
    let first = window["context_first"].as_u64().unwrap() as usize;
    let mut ctx = DraftContext::new(c - first);
    // Grown in uneven pieces, the oldest rows dropping out on the way.
    for (from, to) in [(0, 7), (7, 8), (8, 21), (21, c)] {
        ctx.append(&f.b, &f.drafter, &f.taps(from, to));
    }
    assert_eq!((ctx.first(), ctx.end()), (first, c));
    f.check_step(&mut ctx, window, "window.logits");
    // A context started at the window's first position is the same one.
    let mut direct = DraftContext::starting_at(first, c - first);
    direct.append(&f.b, &f.drafter, &f.taps(first, c));
    f.check_step(&mut direct, window, "window.logits");
}

#[test]
fn truncating_the_context_forgets_the_newest_rows() {
    let f = load();
    let steps = f.meta["steps"].as_array().unwrap();
    let c = steps[2]["context_len"].as_u64().unwrap() as usize;
    let mut ctx = DraftContext::new(8192);
    ctx.append(&f.b, &f.drafter, &f.taps(0, c + 5));
    ctx.truncate(&f.b, c);
    assert_eq!(ctx.end(), c);
    f.check_step(&mut ctx, &steps[2], "step.2.logits");
}

#[test]
fn one_pass_for_several_sequences_drafts_what_each_pass_drafts_alone() {
    let f = load();
    let steps = f.meta["steps"].as_array().unwrap();
    let (d, head) = (&f.target.decoder, DraftHead::full(512));
    // Three sequences' contexts: the reference's at two lengths, a window,
    // and an empty one (which gets no drafts).
    let len = |i: usize| steps[i]["context_len"].as_u64().unwrap() as usize;
    let mut a = DraftContext::new(8192);
    a.append(&f.b, &f.drafter, &f.taps(0, len(1)));
    let mut b = DraftContext::new(8192);
    b.append(&f.b, &f.drafter, &f.taps(0, len(4)));
    let mut w = DraftContext::new(9);
    w.append(&f.b, &f.drafter, &f.taps(0, len(3)));
    let mut empty = DraftContext::new(8192);
    let anchor =
        |c: &DraftContext<CpuBackend>| f.meta["sequence"][c.end()].as_u64().unwrap() as u32;
    let anchors = [anchor(&a), anchor(&b), anchor(&w), 7];
    let block = f.drafter.config.block_size;
    let alone: Vec<Vec<u32>> = [&mut a, &mut b, &mut w, &mut empty]
        .into_iter()
        .zip(anchors)
        .map(|(c, x)| f.drafter.drafts(&f.b, d, c, x, block, &head))
        .collect();
    let mut seqs = vec![
        (&mut a, anchors[0]),
        (&mut b, anchors[1]),
        (&mut w, anchors[2]),
    ];
    seqs.insert(1, (&mut empty, anchors[3]));
    let together = f.drafter.drafts_batch(&f.b, d, &mut seqs, block, &head);
    let expected = vec![
        alone[0].clone(),
        Vec::new(),
        alone[1].clone(),
        alone[2].clone(),
    ];
    assert_eq!(together, expected);
    assert!(alone[..3].iter().all(|d| d.len() == block - 1));
    // The passes left every context as it was.
    assert_eq!((a.end(), b.end(), w.len()), (len(1), len(4), 9));
}

#[test]
fn malformed_drafter_folders_are_refused_with_the_reason() {
    let b = CpuBackend::new();
    let target = Model::load(&root().join("golden/qwen3_5_moe/model"), &b).unwrap();
    let err = |dir: &Path| {
        format!(
            "{:#}",
            DflashDrafter::load(dir, &b, &target.decoder)
                .err()
                .expect("refused")
        )
    };
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        err(tmp.path()).contains("config.json"),
        "{}",
        err(tmp.path())
    );
    // The target itself is no drafter.
    assert!(err(&root().join("golden/qwen3_5_moe/model")).contains("dflash_config"));
    // A drafter config without its weights.
    let src = root().join("dflash/drafter");
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    assert!(
        err(tmp.path()).contains("safetensors"),
        "{}",
        err(tmp.path())
    );
    // A drafter whose taps the target does not have.
    let cfg = std::fs::read_to_string(src.join("config.json"))
        .unwrap()
        .replace(
            "\"target_layer_ids\": [\n      1,\n      3,\n      5\n    ]",
            "\"target_layer_ids\": [1, 3, 9]",
        );
    assert!(cfg.contains("[1, 3, 9]"));
    std::fs::write(tmp.path().join("config.json"), cfg).unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    assert!(
        err(tmp.path()).contains("target layer 9"),
        "{}",
        err(tmp.path())
    );
}

#[test]
fn the_target_records_the_tapped_hidden_states_without_changing_its_logits() {
    let f = load();
    let seq: Vec<u32> = f.meta["sequence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    let taps = &f.drafter.config.target_layer_ids;
    let (shape, want) = &f.tensors["target_taps"];
    let (w, h) = (shape[1], 64);
    let mut tapped = SequenceRunner::new(&f.b, &f.target, 64).unwrap();
    let mut plain = SequenceRunner::new(&f.b, &f.target, 64).unwrap();
    let mut worst = 0.0f32;
    // A prefill chunk, then verify-sized and decode-sized steps.
    for (from, to) in [(0, 5), (5, 6), (6, 14), (14, 15), (15, seq.len())] {
        let (states, logits) = tapped.feed_tapped(&seq[from..to], taps).unwrap();
        let reference = plain.feed_last_logits(&seq[from..to]).unwrap();
        assert_eq!(logits, reference, "logits with taps are bit-identical");
        for (j, state) in states.iter().enumerate() {
            let got = f.b.to_host(state);
            assert_eq!(got.len(), (to - from) * h);
            for (r, row) in got.chunks_exact(h).enumerate() {
                let start = (from + r) * w + j * h;
                for (x, y) in row.iter().zip(&want[start..start + h]) {
                    worst = worst.max((x - y).abs() / y.abs().max(1.0));
                }
            }
        }
    }
    assert!(
        worst < 1e-3,
        "tapped states differ from transformers' by {worst}"
    );
}

#[test]
fn a_reduced_draft_vocabulary_drafts_the_best_of_its_own_ids() {
    let f = load();
    let steps = f.meta["steps"].as_array().unwrap();
    let (b, d) = (&f.b, &f.target.decoder);
    let c = steps[2]["context_len"].as_u64().unwrap() as usize;
    let anchor = steps[2]["anchor"].as_u64().unwrap() as u32;
    let block = f.drafter.config.block_size;
    let mut ctx = DraftContext::new(8192);
    ctx.append(b, &f.drafter, &f.taps(0, c));
    let full = f
        .drafter
        .drafts(b, d, &mut ctx, anchor, block, &DraftHead::full(512));
    // The reference's logits: each draft of a reduced head is the best
    // scoring of its ids, ties to the lower id.
    let logits = b.to_host(&f.drafter.block_logits(b, d, &mut ctx, anchor, block));
    let vocab = logits.len() / (block - 1);
    let best_of = |ids: &[u32]| -> Vec<u32> {
        logits
            .chunks(vocab)
            .map(|row| {
                *ids.iter()
                    .reduce(|a, x| {
                        if row[*x as usize] > row[*a as usize] {
                            x
                        } else {
                            a
                        }
                    })
                    .unwrap()
            })
            .collect()
    };
    // Every odd id, and the full drafts' ids with every id above 300.
    let odd: Vec<u32> = (1..512).step_by(2).collect();
    let mut kept: Vec<u32> = full.iter().copied().chain(300..512).collect();
    kept.sort_unstable();
    kept.dedup();
    for ids in [odd, kept.clone()] {
        let head = DraftHead::reduced(b, d, &ids).unwrap();
        let drafts = f.drafter.drafts(b, d, &mut ctx, anchor, block, &head);
        assert!(drafts.iter().all(|t| ids.contains(t)), "{drafts:?}");
        assert_eq!(drafts, best_of(&ids));
    }
    // A vocabulary holding the whole head's choices drafts what it drafts.
    let head = DraftHead::reduced(b, d, &kept).unwrap();
    assert_eq!(f.drafter.drafts(b, d, &mut ctx, anchor, block, &head), full);
}

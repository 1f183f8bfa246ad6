//! The reduced draft head on the golden hybrid model and the bundled model:
//! its choices always lie in the subset and are the whole head's best among
//! the subset's ids; a subset of every id chooses as the whole head does.

use std::path::PathBuf;

use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_models::{DraftHead, Model};

fn models() -> [PathBuf; 2] {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    [
        root.join("testdata/golden/qwen3_5_moe/model"),
        root.join("models/kestrel-tiny-qwen35"),
    ]
}

/// Hidden rows from the model itself: normalised embeddings of some ids.
fn rows(b: &CpuBackend, model: &Model<CpuBackend>, n: u32) -> <CpuBackend as Backend>::Tensor {
    let vocab = model.config().vocab_size as u32;
    let ids: Vec<u32> = (0..n).map(|i| (i * 7919 + 13) % vocab).collect();
    let e = b.embedding(&model.decoder.embed, &ids);
    b.rms_norm(&e, &model.decoder.final_norm, model.config().rms_norm_eps)
}

#[test]
fn reduced_drafts_lie_in_the_subset_and_are_its_best_ids() {
    let b = CpuBackend::new();
    for dir in models() {
        let model = Model::load(&dir, &b).unwrap();
        let vocab = model.config().vocab_size;
        let x = rows(&b, &model, 24);
        let logits = b.to_host(&b.matmul(&x, model.decoder.lm_head()));
        let full = DraftHead::<CpuBackend>::full(vocab).argmax(&b, &model.decoder, &x);
        // Every third id, skipping each row's whole-vocabulary best, so the
        // subset's choice must differ from the whole head's.
        let subset: Vec<u32> = (0..vocab as u32)
            .filter(|id| id % 3 == 1 && !full.contains(id))
            .collect();
        let head = DraftHead::reduced(&b, &model.decoder, &subset).unwrap();
        assert_eq!(head.rows(), subset.len());
        let drafts = head.argmax(&b, &model.decoder, &x);
        for (r, &d) in drafts.iter().enumerate() {
            assert!(
                subset.contains(&d),
                "{}: draft {d} outside the subset",
                dir.display()
            );
            let row = &logits[r * vocab..(r + 1) * vocab];
            let best = subset
                .iter()
                .copied()
                .reduce(|a, c| {
                    if row[c as usize] > row[a as usize] {
                        c
                    } else {
                        a
                    }
                })
                .unwrap();
            assert_eq!(d, best, "{}: row {r}", dir.display());
            assert_ne!(d, full[r]);
        }
    }
}

#[test]
fn a_subset_of_every_id_drafts_as_the_whole_head() {
    let b = CpuBackend::new();
    for dir in models() {
        let model = Model::load(&dir, &b).unwrap();
        let vocab = model.config().vocab_size;
        let x = rows(&b, &model, 32);
        let all: Vec<u32> = (0..vocab as u32).collect();
        let reduced = DraftHead::reduced(&b, &model.decoder, &all).unwrap();
        let full = DraftHead::<CpuBackend>::full(vocab);
        assert_eq!(
            reduced.argmax(&b, &model.decoder, &x),
            full.argmax(&b, &model.decoder, &x),
            "{}",
            dir.display()
        );
    }
}

#[test]
fn bad_subsets_are_refused() {
    let b = CpuBackend::new();
    let model = Model::load(&models()[0], &b).unwrap();
    let vocab = model.config().vocab_size as u32;
    for (ids, needle) in [
        (vec![], "at least one"),
        (vec![3, 3], "unique"),
        (vec![5, 2], "ascending"),
        (vec![1, vocab], "outside"),
    ] {
        let err = DraftHead::reduced(&b, &model.decoder, &ids)
            .err()
            .expect("refused");
        assert!(err.to_string().contains(needle), "{ids:?}: {err}");
    }
}

//! Golden test of Qwen3.8-Flash-Next (`qwen4_exp`): the CPU backend against
//! Hugging Face transformers (float32) on the tiny random-weight fixture of
//! `scripts/make_golden.py` (testdata/golden/qwen4_exp, see its README).
//!
//! The fixture's prompts (5, 40 and 100 tokens, with EOS inside) are longer
//! than the indexer budget (16 tokens in 4 blocks of 4), so the block
//! selection decides what attention sees; PLE runs on layer 0. The tolerance
//! is the one of the other golden tests (2e-3 absolute), far above
//! transformers' own path-to-path disagreement on this fixture (4e-5) and
//! below its smallest teacher-forced top-1 margin (4e-3). Greedy
//! continuations must match token for token (greedy margins above 0.06).

use std::collections::HashMap;
use std::path::PathBuf;

use kestrel_cpu::CpuBackend;
use kestrel_models::flash_next::FlashNext;
use kestrel_models::flash_next::runner::FlashNextRunner;
use serde_json::Value;

mod common;
use common::{argmax, ids, max_abs_diff};

const LOGIT_TOL: f32 = 2e-3;

struct Fixture {
    model: FlashNext<CpuBackend>,
    meta: Value,
    tensors: HashMap<String, Vec<f32>>,
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/golden/qwen4_exp")
}

/// Logits of every position of `tokens` fed in one pass.
fn all_logits(b: &CpuBackend, model: &FlashNext<CpuBackend>, tokens: &[u32]) -> Vec<f32> {
    let mut runner = FlashNextRunner::new(b, model, tokens.len()).unwrap();
    runner.feed_all_logits(tokens).unwrap()
}

fn load() -> Fixture {
    let dir = fixture_dir();
    let model = FlashNext::load(&dir.join("model"), &CpuBackend::new()).expect("model loads");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let bytes = std::fs::read(dir.join("reference.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            assert_eq!(view.dtype(), safetensors::Dtype::F32, "{name}");
            let values = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, values)
        })
        .collect();
    Fixture {
        model,
        meta,
        tensors,
    }
}

/// Logits of every position of `tokens`, fed in chunks of the given sizes.
fn logits_in_chunks(f: &Fixture, tokens: &[u32], chunks: &[usize]) -> Vec<f32> {
    let b = CpuBackend::new();
    let mut runner = FlashNextRunner::new(&b, &f.model, tokens.len()).unwrap();
    runner.feed_all_logits_in_chunks(tokens, chunks).unwrap()
}

#[test]
fn flash_next_teacher_forced_logits_match_transformers_in_one_pass_and_in_chunks() {
    let f = load();
    for case in f.meta["teacher_forced"].as_array().unwrap() {
        let tokens = ids(&case["input_ids"]);
        let reference = &f.tensors[case["logits_tensor"].as_str().unwrap()];
        for chunks in [&[tokens.len()][..], &[1], &[7, 1, 13, 64, 3]] {
            let got = logits_in_chunks(&f, &tokens, chunks);
            let err = max_abs_diff(&got, reference);
            eprintln!(
                "{} tokens, chunks {chunks:?}: max |logit diff| {err:.2e}",
                tokens.len()
            );
            assert!(
                err <= LOGIT_TOL,
                "{} tokens, chunks {chunks:?}: max |diff| {err}",
                tokens.len()
            );
        }
    }
}

#[test]
fn flash_next_greedy_continuations_match_transformers_after_whole_and_chunked_prefill() {
    let f = load();
    let b = CpuBackend::new();
    for case in f.meta["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["new_ids"]);
        assert!(expected.len() >= 32);
        for chunks in [&[prompt.len()][..], &[3, 17, 1]] {
            let mut runner =
                FlashNextRunner::new(&b, &f.model, prompt.len() + expected.len()).unwrap();
            let mut start = 0;
            let mut logits = Vec::new();
            for &c in chunks.iter().cycle() {
                if start == prompt.len() {
                    break;
                }
                let end = (start + c).min(prompt.len());
                logits = runner.feed_last_logits(&prompt[start..end]).unwrap();
                start = end;
            }
            let mut got = Vec::new();
            for _ in 0..expected.len() {
                let t = argmax(&logits);
                got.push(t);
                logits = runner.feed_last_logits(&[t]).unwrap();
            }
            assert_eq!(
                got,
                expected,
                "greedy continuation of a {}-token prompt fed in chunks {chunks:?}",
                prompt.len()
            );
        }
    }
}

/// Two sequences in one batch (their own pages and state slots, fed in
/// chunks of different sizes side by side) give each its own reference
/// logits: the indexer keys, PLE conv state and n-gram context stay apart.
#[test]
fn flash_next_batched_sequences_keep_their_state_apart() {
    use kestrel_core::{Backend, ForwardBatch, SeqChunk};

    let f = load();
    let b = CpuBackend::new();
    let cases = f.meta["teacher_forced"].as_array().unwrap();
    let prompts: Vec<Vec<u32>> = [1, 2]
        .iter()
        .map(|&i| ids(&cases[i]["input_ids"]))
        .collect();
    let refs: Vec<&Vec<f32>> = [1, 2]
        .iter()
        .map(|&i| &f.tensors[cases[i]["logits_tensor"].as_str().unwrap()])
        .collect();
    let block = 16;
    let pages: Vec<Vec<u32>> = vec![(0..8).rev().collect(), (8..16).collect()];
    let mut cache = f.model.new_cache(&b, 16, block, 2).unwrap();
    cache.zero_state(&b, 0);
    cache.zero_state(&b, 1);
    let chunks = [[9usize, 23], [31, 5], [100, 100]];
    let (mut done, mut got) = ([0usize; 2], [Vec::new(), Vec::new()]);
    for step in chunks {
        let mut seqs = Vec::new();
        let mut ids_step = Vec::new();
        let mut take = [0usize; 2];
        for s in 0..2 {
            take[s] = step[s].min(prompts[s].len() - done[s]);
            if take[s] == 0 {
                continue;
            }
            let total = done[s] + take[s];
            seqs.push(SeqChunk::new(
                take[s],
                done[s],
                pages[s][..total.div_ceil(block)].to_vec(),
                s as u32,
            ));
            ids_step.extend_from_slice(&prompts[s][done[s]..total]);
        }
        let batch = ForwardBatch { seqs };
        let hidden = f.model.forward(&b, &ids_step, &batch, &mut cache).unwrap();
        let rows: Vec<usize> = (0..ids_step.len()).collect();
        let logits = b.to_host(&f.model.logits(&b, &hidden, &rows));
        let vocab = logits.len() / ids_step.len();
        let mut row = 0;
        for s in 0..2 {
            got[s].extend_from_slice(&logits[row * vocab..(row + take[s]) * vocab]);
            row += take[s];
            done[s] += take[s];
        }
    }
    for s in 0..2 {
        let err = max_abs_diff(&got[s], refs[s]);
        assert!(err <= LOGIT_TOL, "sequence {s}: max |diff| {err}");
    }
}

/// A prefix-cache hit: the state after a 32-token prefix (GDN, PLE conv,
/// n-gram context) copied to another slot, and the pages of the prefix
/// shared, continues exactly (bit for bit) as the sequence that computed
/// the prefix itself does, and within tolerance of transformers.
#[test]
fn flash_next_state_copied_after_a_prefix_continues_bit_for_bit() {
    use kestrel_core::{Backend, ForwardBatch, SeqChunk};

    let f = load();
    let b = CpuBackend::new();
    let case = &f.meta["teacher_forced"].as_array().unwrap()[2];
    let tokens = ids(&case["input_ids"]);
    let reference = &f.tensors[case["logits_tensor"].as_str().unwrap()];
    let (prefix, block) = (32, 16);
    let n = tokens.len();
    let run = |cache: &mut kestrel_models::flash_next::FlashNextCache<CpuBackend>,
               slot: u32,
               pages: &[u32],
               start: usize,
               end: usize| {
        let batch = ForwardBatch {
            seqs: vec![SeqChunk::new(
                end - start,
                start,
                pages[..end.div_ceil(block)].to_vec(),
                slot,
            )],
        };
        let hidden = f
            .model
            .forward(&b, &tokens[start..end], &batch, cache)
            .unwrap();
        let rows: Vec<usize> = (0..end - start).collect();
        b.to_host(&f.model.logits(&b, &hidden, &rows))
    };
    let mut cache = f.model.new_cache(&b, 16, block, 3).unwrap();
    for slot in 0..3 {
        cache.zero_state(&b, slot);
    }
    // Slot 0 computes the prefix and goes on; slot 2 is a snapshot of it
    // after the prefix, resumed in slot 1 over the same first two pages.
    let own: Vec<u32> = (0..7).collect();
    let shared: Vec<u32> = [0, 1].into_iter().chain(7..12).collect();
    run(&mut cache, 0, &own, 0, prefix);
    cache.copy_state(&b, 0, 2);
    let miss = run(&mut cache, 0, &own, prefix, n);
    cache.copy_state(&b, 2, 1);
    let hit = run(&mut cache, 1, &shared, prefix, n);
    assert!(
        miss == hit,
        "a resumed snapshot differs from the uninterrupted sequence"
    );
    let vocab = hit.len() / (n - prefix);
    let err = max_abs_diff(&hit, &reference[prefix * vocab..]);
    assert!(err <= LOGIT_TOL, "max |diff| {err}");
}

/// `--lm-head-dtype fp8` on Flash-Next: the head is the checkpoint's,
/// quantised with the official block rule (its rows are the dequantised
/// codes), and the logits move by the head's rounding only.
#[test]
fn flash_next_fp8_lm_head_is_the_quantised_head_and_nothing_else_changes() {
    use kestrel_core::{Backend, HostTensor};
    use kestrel_models::{Quantization, WeightForm};

    let f = load();
    let b = CpuBackend::new();
    let dir = fixture_dir().join("model");
    let form = WeightForm {
        quantization: Quantization::AsStored,
        lm_head_fp8: true,
    };
    let fp8_head = FlashNext::load_as(&dir, &b, form).unwrap();
    let vocab = f.model.config.base.vocab_size;
    let all: Vec<u32> = (0..vocab as u32).collect();
    let rows = |w| b.to_host(&b.embedding(w, &all));
    let stored = rows(f.model.lm_head());
    let h = stored.len() / vocab;
    let want = kestrel_models::fp8::quantize(&HostTensor::from_f32(vec![vocab, h], &stored))
        .dequantize()
        .to_f32();
    assert_eq!(rows(fp8_head.lm_head()), want, "head");
    let case = &f.meta["teacher_forced"][1];
    let tokens = ids(&case["input_ids"]);
    let got = all_logits(&b, &fp8_head, &tokens);
    let reference = logits_in_chunks(&f, &tokens, &[tokens.len()]);
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let err = max_abs_diff(&got, &reference);
    eprintln!("fp8 lm_head: max |logit diff| {err:.2e} of max |logit| {scale:.2e}");
    assert!(err > 0.0 && err < 0.1 * scale, "{err} of {scale}");
}

/// `--quantization fp8` on Flash-Next: the projections and experts are
/// quantised while loading, so the logits move by more than the lm_head's
/// rounding alone but stay those of the same model (the top token of most
/// positions kept), and quantising is deterministic.
#[test]
fn flash_next_quantised_at_load_time_moves_the_logits_by_rounding_only() {
    use kestrel_models::{Quantization, WeightForm};

    let f = load();
    let b = CpuBackend::new();
    let dir = fixture_dir().join("model");
    let case = &f.meta["teacher_forced"][1];
    let tokens = ids(&case["input_ids"]);
    let logits =
        |form: WeightForm| all_logits(&b, &FlashNext::load_as(&dir, &b, form).unwrap(), &tokens);
    let head_only = logits(WeightForm {
        quantization: Quantization::AsStored,
        lm_head_fp8: true,
    });
    let fp8 = logits(Quantization::Fp8.into());
    assert_eq!(fp8, logits(Quantization::Fp8.into()), "deterministic");
    let reference = logits_in_chunks(&f, &tokens, &[tokens.len()]);
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (err, head_err) = (
        max_abs_diff(&fp8, &reference),
        max_abs_diff(&head_only, &reference),
    );
    eprintln!(
        "fp8 weights: max |logit diff| {err:.2e} (lm_head alone {head_err:.2e}) of max |logit| {scale:.2e}"
    );
    assert!(
        err > head_err,
        "the body was not quantised: {err} vs {head_err}"
    );
    assert!(err < 0.25 * scale, "{err} of {scale}");
    let vocab = f.model.config.base.vocab_size;
    let top = |l: &[f32]| l.chunks(vocab).map(argmax).collect::<Vec<_>>();
    let (got, want) = (top(&fp8), top(&reference));
    let same = got.iter().zip(&want).filter(|(a, b)| a == b).count();
    assert!(
        same * 10 >= want.len() * 8,
        "top token kept at {same} of {} positions",
        want.len()
    );
}

/// Dummy FP8 weights (what `bench-model --quantization fp8` times on the
/// full-size model) draw the quantised weights as FP8: seeded, finite, and
/// not the dense draw.
#[test]
fn flash_next_dummy_fp8_weights_run() {
    use kestrel_models::{Quantization, WeightForm};

    let b = CpuBackend::new();
    let config = fixture_dir().join("model/config.json");
    let tables = tempfile::tempdir().unwrap();
    let tokens: Vec<u32> = (0..30).map(|i| i * 37 % 500).collect();
    let logits = |form: WeightForm| {
        let model = FlashNext::load_dummy_as(&config, &b, 5, Some(tables.path()), form).unwrap();
        all_logits(&b, &model, &tokens)
    };
    let fp8 = logits(Quantization::Fp8.into());
    assert!(fp8.iter().all(|v| v.is_finite()));
    assert_eq!(fp8, logits(Quantization::Fp8.into()), "seeded");
    assert_ne!(
        fp8,
        logits(Quantization::AsStored.into()),
        "FP8 draws its own weights"
    );
}

//! Block-FP8 checkpoints in the official format (`testdata/fp8/`, written by
//! `scripts/make_fp8_fixtures.py` from the golden tiny models): the CPU
//! backend on an FP8 checkpoint computes what it computes on the
//! dequantised weights (`dequantized/`: every FP8 weight replaced by
//! `e4m3 * scale` in f32, by the script), to the golden tolerance, and
//! continues greedily as recorded; quantising a dense checkpoint at load
//! time gives the script's checkpoint; broken FP8 checkpoints fail with one
//! clear error.

use std::path::{Path, PathBuf};

use kestrel_core::{Backend, HostTensor, HostWeight};
use kestrel_cpu::CpuBackend;
use kestrel_models::runner::SequenceRunner;
use kestrel_models::{LayerKind, Model, Quantization, WeightForm};
use serde_json::Value;

mod common;
use common::{argmax, ids, max_abs_diff};

/// The golden tests' tolerance (`tests/golden.rs`).
const LOGIT_TOL: f32 = 2e-3;
const ARCHES: [&str; 4] = ["qwen3", "qwen3_moe", "qwen3_5_moe", "qwen3_next"];
const GREEDY_TOKENS: usize = 24;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

fn json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The golden fixture's teacher-forced prompts.
fn prompts(arch: &str) -> Vec<Vec<u32>> {
    let meta = json(&testdata().join("golden").join(arch).join("reference.json"));
    meta["teacher_forced"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| ids(&case["input_ids"]))
        .collect()
}

fn teacher_forced(model: &Model<CpuBackend>, tokens: &[u32]) -> (Vec<f32>, Option<Vec<f32>>) {
    let b = CpuBackend::new();
    let mut runner = SequenceRunner::new(&b, model, tokens.len()).unwrap();
    runner.teacher_forced(tokens).unwrap()
}

fn greedy(model: &Model<CpuBackend>, prompt: &[u32], n: usize) -> Vec<u32> {
    let b = CpuBackend::new();
    let mut runner = SequenceRunner::new(&b, model, prompt.len() + n).unwrap();
    let mut logits = runner.feed_last_logits(prompt).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let next = argmax(&logits);
        out.push(next);
        logits = runner.feed_last_logits(&[next]).unwrap();
    }
    out
}

fn load(dir: &Path) -> Model<CpuBackend> {
    Model::load(dir, &CpuBackend::new()).unwrap_or_else(|e| panic!("{}: {e:#}", dir.display()))
}

#[test]
fn fp8_checkpoints_give_the_logits_of_their_dequantized_weights() {
    for arch in ARCHES {
        let dir = testdata().join("fp8").join(arch);
        let fp8 = load(&dir.join("model"));
        let reference = load(&dir.join("dequantized"));
        for tokens in prompts(arch) {
            let (got, got_mtp) = teacher_forced(&fp8, &tokens);
            let (want, want_mtp) = teacher_forced(&reference, &tokens);
            let err = max_abs_diff(&got, &want);
            eprintln!(
                "{arch}, {} tokens: max |logit diff| {err:.2e}",
                tokens.len()
            );
            assert!(err <= LOGIT_TOL, "{arch}, {} tokens: {err}", tokens.len());
            assert_eq!(got_mtp.is_some(), arch == "qwen3_5_moe", "{arch}: MTP head");
            if let (Some(g), Some(w)) = (got_mtp, want_mtp) {
                let err = max_abs_diff(&g, &w);
                assert!(err <= LOGIT_TOL, "{arch} MTP: {err}");
            }
        }
    }
}

#[test]
fn fp8_checkpoints_continue_greedily_as_recorded() {
    for arch in ARCHES {
        let dir = testdata().join("fp8").join(arch);
        let recorded = json(&dir.join("greedy.json"));
        let prompt = ids(&recorded["prompt_ids"]);
        let got = greedy(&load(&dir.join("model")), &prompt, GREEDY_TOKENS);
        let want = greedy(&load(&dir.join("dequantized")), &prompt, GREEDY_TOKENS);
        assert_eq!(got, want, "{arch}: FP8 against dequantised");
        assert_eq!(
            got,
            ids(&recorded["new_ids"]),
            "{arch}: against greedy.json"
        );
    }
}

#[test]
fn quantizing_at_load_time_gives_the_official_block_format() {
    // The fixtures with f32 scales are exactly what quantising the golden
    // checkpoint at load time must produce; their logits then agree bit for bit.
    for arch in ["qwen3", "qwen3_moe"] {
        let golden = testdata().join("golden").join(arch).join("model");
        let (quantized, _) =
            Model::load_as(&golden, &CpuBackend::new(), Quantization::Fp8).unwrap();
        let fp8 = load(&testdata().join("fp8").join(arch).join("model"));
        let dense = load(&golden);
        let tokens = &prompts(arch)[1];
        let (got, _) = teacher_forced(&quantized, tokens);
        assert_eq!(got, teacher_forced(&fp8, tokens).0, "{arch}");
        // And quantising changed the model: FP8 is not the dense checkpoint.
        assert!(
            max_abs_diff(&got, &teacher_forced(&dense, tokens).0) > 1e-2,
            "{arch}"
        );
    }
}

#[test]
fn dummy_fp8_weights_run_at_the_real_shapes() {
    let config = testdata().join("golden/qwen3_5_moe/model/config.json");
    let b = CpuBackend::new();
    let fp8 = Model::load_dummy_as(&config, &b, 3, Quantization::Fp8).unwrap();
    let again = Model::load_dummy_as(&config, &b, 3, Quantization::Fp8).unwrap();
    let dense = Model::load_dummy(&config, &b, 3).unwrap();
    let tokens: Vec<u32> = (0..9).map(|i| i * 31 % 500).collect();
    let (logits, _) = teacher_forced(&fp8, &tokens);
    assert!(logits.iter().all(|v| v.is_finite()));
    assert_eq!(logits, teacher_forced(&again, &tokens).0, "seeded");
    assert_ne!(
        logits,
        teacher_forced(&dense, &tokens).0,
        "FP8 draws its own weights"
    );
}

/// `--lm-head-dtype fp8`: the head is the checkpoint's, quantised with the
/// official block rule (its rows are exactly the dequantised codes), the
/// embedding and every other weight stay as stored, and the logits move by
/// the head's rounding only.
#[test]
fn an_fp8_lm_head_is_the_quantised_head_and_nothing_else_changes() {
    let b = CpuBackend::new();
    let form = WeightForm {
        quantization: Quantization::AsStored,
        lm_head_fp8: true,
    };
    for arch in ARCHES {
        let golden = testdata().join("golden").join(arch).join("model");
        let dense = load(&golden);
        let (fp8_head, _) = Model::load_as(&golden, &b, form).unwrap();
        let vocab = dense.config().vocab_size;
        let all: Vec<u32> = (0..vocab as u32).collect();
        let rows = |w| b.to_host(&b.embedding(w, &all));
        let stored = rows(dense.decoder.lm_head());
        let h = stored.len() / vocab;
        let want = kestrel_models::fp8::quantize(&HostTensor::from_f32(vec![vocab, h], &stored))
            .dequantize()
            .to_f32();
        assert_eq!(rows(fp8_head.decoder.lm_head()), want, "{arch}: head");
        assert_eq!(
            rows(&fp8_head.decoder.embed),
            rows(&dense.decoder.embed),
            "{arch}: embedding"
        );
        let tokens = &prompts(arch)[1];
        let (got, _) = teacher_forced(&fp8_head, tokens);
        let (reference, _) = teacher_forced(&dense, tokens);
        let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let err = max_abs_diff(&got, &reference);
        eprintln!("{arch}: max |logit diff| {err:.2e} of max |logit| {scale:.2e}");
        assert!(err > 0.0 && err < 0.1 * scale, "{arch}: {err} of {scale}");
    }
}

/// With tied embeddings the FP8 head is a second weight: the embedding the
/// tokens are looked up in stays as it is.
#[test]
fn a_tied_embedding_stays_when_the_lm_head_is_fp8() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = json(&testdata().join("golden/qwen3/model/config.json"));
    config["tie_word_embeddings"] = Value::Bool(true);
    let path = dir.path().join("config.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let b = CpuBackend::new();
    let form = WeightForm {
        quantization: Quantization::AsStored,
        lm_head_fp8: true,
    };
    let tied = Model::load_dummy(&path, &b, 5).unwrap();
    let fp8_head = Model::load_dummy_as(&path, &b, 5, form).unwrap();
    let ids: Vec<u32> = (0..64).collect();
    let rows = |w| b.to_host(&b.embedding(w, &ids));
    assert_eq!(
        rows(tied.decoder.lm_head()),
        rows(&tied.decoder.embed),
        "tied"
    );
    assert_eq!(rows(&fp8_head.decoder.embed), rows(&tied.decoder.embed));
    assert_ne!(rows(fp8_head.decoder.lm_head()), rows(&tied.decoder.embed));
}

/// The CPU backend taking block-FP8 weights as they are, as the CUDA backend
/// does, and recording each weight it is handed: `(shape, block-FP8?)`.
struct KeepsFp8 {
    cpu: CpuBackend,
    uploads: std::sync::Mutex<Vec<(Vec<usize>, bool)>>,
}

impl Backend for KeepsFp8 {
    type Tensor = kestrel_cpu::CpuTensor;
    type Weight = kestrel_cpu::CpuWeight;
    type Cache = kestrel_cpu::CpuCache;
    type BlockKeys = kestrel_core::block_attention::HostBlockKeys;

    fn name(&self) -> String {
        "cpu, taking FP8 as it is".into()
    }

    fn fp8_dequantize_to(&self) -> Option<kestrel_core::DType> {
        None
    }

    fn upload_weight(&self, w: &HostWeight) -> kestrel_core::Result<Self::Weight> {
        let fp8 = matches!(w, HostWeight::BlockFp8(_));
        self.uploads.lock().unwrap().push((w.shape().to_vec(), fp8));
        self.cpu.upload_weight(w)
    }

    kestrel_cpu::forward_required_to_cpu!(cpu);
}

/// The hybrids' Gated DeltaNet in_proj on a backend that reads FP8: the
/// q/k/v and z rows reach it apart from the bf16 b and a rows, as block-FP8
/// where their blocks stay whole (not dequantised to join b and a), and the
/// model computes what it computes on the CPU. (The tiny Qwen3-Next's
/// per-head regrouping cuts its 128-row blocks, so its q/k/v/z rows go
/// dense, apart all the same; at Qwen3-Next-80B's heads of 128 they stay
/// whole.)
#[test]
fn a_gdn_in_proj_keeps_its_fp8_rows_fp8() {
    for (arch, fp8_rows, dense_rows) in [("qwen3_5_moe", 384, 8), ("qwen3_next", 384, 8)] {
        let regrouped = arch == "qwen3_next";
        let dir = testdata().join("fp8").join(arch).join("model");
        let spy = KeepsFp8 {
            cpu: CpuBackend::new(),
            uploads: Default::default(),
        };
        let model = Model::load(&dir, &spy).unwrap();
        let uploads = spy.uploads.lock().unwrap().clone();
        let layers = model
            .config()
            .layer_kinds
            .iter()
            .filter(|k| **k == LayerKind::LinearAttention)
            .count();
        let count = |rows: usize, fp8: bool| {
            uploads
                .iter()
                .filter(|(shape, f)| *shape == [rows, 64] && *f == fp8)
                .count()
        };
        assert!(layers > 0, "{arch}: has Gated DeltaNet layers");
        if !regrouped {
            assert_eq!(count(fp8_rows, true), layers, "{arch}: q/k/v + z as FP8");
        }
        assert_eq!(
            count(fp8_rows + dense_rows, false),
            0,
            "{arch}: no in_proj made dense whole"
        );
        assert!(
            count(dense_rows, false) >= layers,
            "{arch}: b + a as stored"
        );
        let tokens = &prompts(arch)[0];
        let want = teacher_forced(&load(&dir), tokens).0;
        let mut runner = SequenceRunner::new(&spy, &model, tokens.len()).unwrap();
        let got = runner.teacher_forced(tokens).unwrap().0;
        assert_eq!(got, want, "{arch}");
    }
}

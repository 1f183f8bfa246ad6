//! The bundled trained model (models/kestrel-tiny-qwen35) against the
//! references transformers recorded when it was trained (see its README):
//! teacher-forced and MTP logits, greedy continuations of ten held-out
//! prompts, held-out perplexity and MTP accuracy.

use std::path::PathBuf;

use kestrel_cpu::CpuBackend;
use kestrel_models::Model;
use kestrel_models::eval::evaluate;
use kestrel_models::runner::SequenceRunner;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35")
}

struct Reference {
    meta: Value,
    bytes: Vec<u8>,
}

impl Reference {
    fn load() -> Self {
        let r = dir().join("reference");
        Reference {
            meta: serde_json::from_str(&std::fs::read_to_string(r.join("reference.json")).unwrap())
                .unwrap(),
            bytes: std::fs::read(r.join("reference.safetensors")).unwrap(),
        }
    }

    fn tensor(&self, name: &str) -> (Vec<usize>, Vec<u8>, safetensors::Dtype) {
        let st = safetensors::SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(name).unwrap();
        (t.shape().to_vec(), t.data().to_vec(), t.dtype())
    }

    fn f32s(&self, name: &str) -> Vec<f32> {
        let (_, data, dtype) = self.tensor(name);
        assert_eq!(dtype, safetensors::Dtype::F32, "{name}");
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn ids(&self, name: &str) -> (Vec<usize>, Vec<u32>) {
        let (shape, data, dtype) = self.tensor(name);
        let ids = match dtype {
            safetensors::Dtype::I32 => data
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            safetensors::Dtype::I64 => data
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32)
                .collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        };
        (shape, ids)
    }
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best }) as u32
}

/// Logits and MTP logits of the two teacher-forced prompts. Tolerance as in
/// the golden tests: transformers on GPU and CPU differ by 2e-5 here; 2e-3
/// leaves room for f32 summation order while catching any structural error.
#[test]
fn teacher_forced_and_mtp_logits_match_transformers() {
    let backend = CpuBackend::new();
    let model = Model::load(&dir(), &backend).unwrap();
    let r = Reference::load();
    for i in 0..2 {
        let (_, ids) = r.ids(&format!("teacher_forced.{i}.input_ids"));
        let mut runner = SequenceRunner::new(&backend, &model, ids.len()).unwrap();
        let (lm, mtp) = runner.teacher_forced(&ids).unwrap();
        let err = max_abs_diff(&lm, &r.f32s(&format!("teacher_forced.{i}.logits")));
        eprintln!("prompt {i}: max |logit diff| {err:.2e}");
        assert!(err < 2e-3, "prompt {i}: logits differ by {err}");
        // The reference's last MTP slot reads the model's greedy next token,
        // which is outside the prompt; compare the slots inside it.
        let want = r.f32s(&format!("teacher_forced.{i}.mtp_logits"));
        let mtp = mtp.expect("the bundled model has an MTP head");
        let err = max_abs_diff(&mtp, &want[..mtp.len()]);
        eprintln!("prompt {i}: max |MTP logit diff| {err:.2e}");
        assert!(err < 2e-3, "prompt {i}: MTP logits differ by {err}");
    }
}

#[test]
fn greedy_continuations_of_ten_prompts_match_transformers() {
    let backend = CpuBackend::new();
    let model = Model::load(&dir(), &backend).unwrap();
    let r = Reference::load();
    let cases = r.meta["greedy"]["prompts"]
        .as_array()
        .expect("greedy cases");
    assert_eq!(cases.len(), 10);
    for case in cases {
        let prompt: Vec<u32> = serde_json::from_value(case["prompt_ids"].clone()).unwrap();
        let want: Vec<u32> = serde_json::from_value(case["output_ids"].clone()).unwrap();
        let mut runner = SequenceRunner::new(&backend, &model, prompt.len() + want.len()).unwrap();
        let mut logits = runner.feed_last_logits(&prompt).unwrap();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let t = argmax(&logits);
            got.push(t);
            logits = runner.feed_last_logits(&[t]).unwrap();
        }
        assert_eq!(got, want, "greedy continuation of {:?}", case["path"]);
    }
}

/// Held-out perplexity and MTP accuracy on the first 16 windows (8,192
/// predicted tokens) equal PyTorch's within 1% (the full 256 windows are
/// measured by `kestrel eval`, see the model card).
#[test]
fn heldout_perplexity_and_mtp_accuracy_match_pytorch() {
    let backend = CpuBackend::new();
    let model = Model::load(&dir(), &backend).unwrap();
    let r = Reference::load();
    let (shape, ids) = r.ids("heldout.windows");
    let windows: Vec<Vec<u32>> = ids
        .chunks_exact(shape[1])
        .take(16)
        .map(|w| w.to_vec())
        .collect();
    let report = evaluate(&backend, &model, &windows).unwrap();
    let want = &r.meta["heldout"]["first_16_windows"];
    let close = |got: f64, key: &str| {
        let want = want[key].as_f64().unwrap();
        assert!(
            (got - want).abs() / want < 0.01,
            "{key}: kestrel {got}, PyTorch {want}"
        );
    };
    close(report.lm_perplexity(), "lm_perplexity");
    close(report.lm_top1(), "lm_top1");
    close(report.mtp_perplexity(), "mtp_perplexity");
    close(report.mtp_top1(), "mtp_top1");
    close(report.mtp_acceptance(), "mtp_agrees_with_lm_greedy");
}

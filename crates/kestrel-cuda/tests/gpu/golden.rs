//! The golden fixtures (testdata/golden: tiny models of each architecture
//! with Hugging Face transformers float32 references) on a chosen backend.
//!
//! Checks teacher-forced logits (one pass over each prompt) against the
//! reference with a bf16-scale tolerance, and greedy continuations token for
//! token; and, on CUDA, that decode recorded as CUDA graphs equals eager
//! decode bit for bit. The `golden_check` example runs them all into one JSON
//! report; the GPU tests run one architecture and precision each.

use std::collections::HashMap;
use std::path::Path;

use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_cuda::CudaBackend;
use kestrel_models::Model;
use kestrel_models::runner::SequenceRunner;
use serde_json::{Value, json};

/// ||got - ref|| / ||ref|| over all logits of a prompt. bf16 weights and
/// bf16-rounded matmul inputs (relative error about 4e-3 per rounding) over
/// a few layers land around 1e-2; a structural bug gives order 1.
pub const REL_TOL: f64 = 3e-2;

pub const ARCHS: [&str; 4] = ["qwen3", "qwen3_moe", "qwen3_5_moe", "qwen3_next"];

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// A fixture's `reference.json` and the f32 tensors of its `reference.safetensors`.
pub fn read_reference(dir: &Path) -> Result<(Value, HashMap<String, Vec<f32>>), String> {
    let meta: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("reference.json"))
            .map_err(|e| format!("{}: {e}", dir.display()))?,
    )
    .map_err(|e| e.to_string())?;
    let bytes = std::fs::read(dir.join("reference.safetensors")).map_err(|e| e.to_string())?;
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| e.to_string())?;
    let tensors = st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let v = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, v)
        })
        .collect();
    Ok((meta, tensors))
}

pub fn check_arch<B: Backend>(b: &B, dir: &Path) -> Result<Value, String> {
    let model = Model::load(&dir.join("model"), b).map_err(|e| format!("{e:#}"))?;
    let (meta, tensors) = read_reference(dir)?;
    let vocab = model.config().vocab_size;
    let mut ok = true;
    let mut tf = Vec::new();
    for case in meta["teacher_forced"].as_array().unwrap() {
        let tokens = ids(&case["input_ids"]);
        let reference = &tensors[case["logits_tensor"].as_str().unwrap()];
        let mut runner = SequenceRunner::new(b, &model, tokens.len()).map_err(|e| e.to_string())?;
        let got = runner.feed_all_logits(&tokens).map_err(|e| e.to_string())?;
        let (mut d2, mut r2, mut max_d, mut max_r) = (0f64, 0f64, 0f32, 0f32);
        for (g, r) in got.iter().zip(reference) {
            d2 += ((g - r) as f64).powi(2);
            r2 += (*r as f64).powi(2);
            max_d = max_d.max((g - r).abs());
            max_r = max_r.max(r.abs());
        }
        let rel = (d2 / r2).sqrt();
        let nan = got.iter().any(|x| !x.is_finite());
        let top1 = got
            .chunks_exact(vocab)
            .zip(reference.chunks_exact(vocab))
            .filter(|(g, r)| argmax(g) == argmax(r))
            .count();
        let pass = !nan && rel <= REL_TOL;
        ok &= pass;
        tf.push(json!({
            "tokens": tokens.len(), "rel_l2": rel, "max_abs_diff": max_d, "max_abs_ref": max_r,
            "top1_agree": top1, "rows": tokens.len(), "non_finite": nan, "pass": pass,
        }));
    }
    let mut greedy = Vec::new();
    for case in meta["greedy"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let expected = ids(&case["new_ids"]);
        let mut runner = SequenceRunner::new(b, &model, prompt.len() + expected.len())
            .map_err(|e| e.to_string())?;
        let mut logits = runner
            .feed_last_logits(&prompt)
            .map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        for _ in 0..expected.len() {
            let t = argmax(&logits);
            got.push(t);
            logits = runner.feed_last_logits(&[t]).map_err(|e| e.to_string())?;
        }
        let matched = got
            .iter()
            .zip(&expected)
            .take_while(|(a, b)| a == b)
            .count();
        let pass = matched == expected.len();
        ok &= pass;
        greedy.push(json!({
            "prompt_tokens": prompt.len(), "new_tokens": expected.len(),
            "matched_before_divergence": matched, "pass": pass,
        }));
    }
    Ok(json!({ "pass": ok, "teacher_forced": tf, "greedy": greedy }))
}

/// Dummy weights (`--load-format dummy`) filled by the backend must equal the
/// host-generated ones bit for bit: read back through an embedding lookup.
pub fn check_dummy<B: Backend>(b: &B) -> Value {
    let (rows, cols) = (1000, 37);
    let host = CpuBackend::new();
    let ids: Vec<u32> = (0..rows as u32).collect();
    let make = |seed| {
        let w = b
            .dummy_weight(&[rows, cols], kestrel_core::DType::BF16, seed, 0.25, 0.5)
            .unwrap();
        b.to_host(&b.embedding(&w, &ids))
    };
    let expect = |seed| {
        let w = host
            .dummy_weight(&[rows, cols], kestrel_core::DType::BF16, seed, 0.25, 0.5)
            .unwrap();
        host.to_host(&host.embedding(&w, &ids))
    };
    let mismatches: usize = [1u64, 0xdead_beef_cafe]
        .into_iter()
        .map(|seed| {
            make(seed)
                .iter()
                .zip(expect(seed))
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count()
        })
        .sum();
    println!(
        "dummy fill   {}  {mismatches} of {} values differ from the host's",
        if mismatches == 0 { "PASS" } else { "FAIL" },
        2 * rows * cols
    );
    json!({ "pass": mismatches == 0, "mismatches": mismatches })
}

/// Greedy decode of one golden model with recorded steps (CUDA graphs) and
/// without, each on a backend of its own: the logits of every step must be
/// identical bit for bit, and the recorded run must really have replayed
/// steps. Prints one line and returns the record (`"pass"` says the verdict).
pub fn graph_replay(root: &Path, arch: &str) -> Value {
    const STEPS: usize = 24;
    type Decoded = (Vec<Vec<f32>>, (u64, u64));
    let decode = |graphs: bool| -> Result<Decoded, String> {
        let mut b = CudaBackend::new(0).map_err(|e| e.to_string())?;
        b.set_graphs(graphs);
        let model =
            Model::load(&root.join(arch).join("model"), &b).map_err(|e| format!("{e:#}"))?;
        let prompt: Vec<u32> = (0..7).map(|i| (i * 37 + 5) % 200).collect();
        let mut runner =
            SequenceRunner::new(&b, &model, prompt.len() + STEPS).map_err(|e| e.to_string())?;
        let mut logits = runner
            .feed_last_logits(&prompt)
            .map_err(|e| e.to_string())?;
        let mut all = vec![logits.clone()];
        for _ in 1..STEPS {
            logits = runner
                .feed_last_logits(&[argmax(&logits)])
                .map_err(|e| e.to_string())?;
            all.push(logits.clone());
        }
        drop(runner);
        drop(model);
        Ok((all, b.graph_counts()))
    };
    let r = match (decode(false), decode(true)) {
        (Ok((eager, _)), Ok((replayed, (captures, replays)))) => {
            let differing = eager
                .iter()
                .zip(&replayed)
                .filter(|(a, b)| {
                    a.len() != b.len()
                        || a.iter()
                            .zip(b.iter())
                            .any(|(x, y)| x.to_bits() != y.to_bits())
                })
                .count();
            let pass = differing == 0 && replays > 0;
            json!({ "steps": STEPS, "differing_steps": differing, "captures": captures,
                    "replays": replays, "pass": pass })
        }
        (Err(e), _) | (_, Err(e)) => json!({ "pass": false, "error": e }),
    };
    println!(
        "graph replay {arch:<12} {}  {}",
        if passed(&r) { "PASS" } else { "FAIL" },
        r
    );
    r
}

/// The verdict of a record made here.
pub fn passed(record: &Value) -> bool {
    record["pass"].as_bool().unwrap_or(false)
}

/// One line for an architecture's record from `check_arch` (or its error).
pub fn arch_line(arch: &str, r: &Value) -> String {
    let tf: Vec<String> = r["teacher_forced"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    format!(
                        "{}t rel {:.1e} top1 {}/{}",
                        c["tokens"],
                        c["rel_l2"].as_f64().unwrap_or(f64::NAN),
                        c["top1_agree"],
                        c["rows"]
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let gr: Vec<String> = r["greedy"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| format!("{}/{}", c["matched_before_divergence"], c["new_tokens"]))
                .collect()
        })
        .unwrap_or_default();
    format!(
        "{arch:<12} {}  teacher-forced: {}  greedy matched: {}{}",
        if passed(r) { "PASS" } else { "FAIL" },
        tf.join(", "),
        gr.join(", "),
        r.get("error")
            .map(|e| format!("  error: {e}"))
            .unwrap_or_default()
    )
}

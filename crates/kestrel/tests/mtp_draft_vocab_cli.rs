//! The reduced draft vocabulary through the command line, on the bundled
//! model: `kestrel draft-vocab` makes the file from a corpus, `generate`
//! with it prints the same greedy text as without speculation, an id out
//! of range is a clear error, and `bench-model --mtp-draft-k` times draft
//! phases with the whole lm_head and with the reduced one.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn kestrel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn generate(extra: &[&str]) -> String {
    let mut args = vec![
        "generate",
        "-p",
        "def read_lines(path):",
        "--max-tokens",
        "24",
    ];
    args.extend_from_slice(extra);
    ok(&kestrel(&args))
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn a_corpus_draft_vocabulary_keeps_generate_output_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("draft.txt");
    let corpus = root().join("crates/kestrel-engine/src/spec/mtp.rs");
    ok(&kestrel(&[
        "draft-vocab",
        "--size",
        "300",
        "--out",
        path(&file),
        path(&corpus),
    ]));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# kestrel draft vocabulary"), "{text}");
    assert_eq!(text.lines().skip(1).count(), 300);

    let plain = generate(&[]);
    let reduced = generate(&["--speculative", "mtp", "--draft-vocab", path(&file)]);
    assert_eq!(reduced, plain);
    let json = format!(r#"{{"method": "mtp", "draft_vocab": "{}"}}"#, path(&file));
    assert_eq!(generate(&["--speculative-config", &json]), plain);

    std::fs::write(&file, "5\n99999\n").unwrap();
    let out = kestrel(&[
        "generate",
        "-p",
        "x",
        "--speculative",
        "mtp",
        "--draft-vocab",
        path(&file),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("99999") && stderr.contains("out of range"),
        "{stderr}"
    );
}

#[test]
fn bench_model_times_mtp_draft_phases_with_and_without_a_reduced_vocabulary() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let stdout = ok(&kestrel(&[
        "bench-model",
        "--backend",
        "cpu",
        "--model",
        "models/kestrel-tiny-qwen35",
        "--bandwidth-gbs",
        "10",
        "--prefill",
        "--decode-batch",
        "--context",
        "20",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--breakdown-steps",
        "1",
        "--mtp-draft-k",
        "1,3",
        "--mtp-draft-batches",
        "1,2",
        "--draft-vocab-size",
        "256",
        "--json",
        path(&json),
    ]));
    assert!(stdout.contains("MTP draft phases"), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let phases = v["mtp_draft"].as_array().unwrap();
    assert_eq!(phases.len(), 8, "{phases:?}");
    let hidden = v["model"]["hidden_size"].as_f64().unwrap();
    for pair in phases.chunks(2) {
        let (full, reduced) = (&pair[0], &pair[1]);
        assert_eq!(full["draft_vocab"], Value::Null);
        assert_eq!(full["lm_head_rows"], 4096);
        assert_eq!(reduced["draft_vocab"], "ids 0..256");
        assert_eq!(reduced["lm_head_rows"], 256);
        let k = reduced["k"].as_f64().unwrap();
        // f32 rows on the CPU backend, once per head step.
        let rows_read = reduced["bytes_per_phase"]["lm_head"].as_f64().unwrap();
        assert_eq!(rows_read, k * 256.0 * hidden * 4.0);
        assert_eq!(
            full["bytes_per_phase"]["layer_weights"],
            reduced["bytes_per_phase"]["layer_weights"]
        );
        for p in pair {
            let ms = p["phase_time"]["median_ms"].as_f64().unwrap();
            assert!(ms > 0.0);
            assert!((p["ms_per_draft_token"].as_f64().unwrap() - ms / k).abs() < 1e-9);
            assert!(p["floor_ms"].as_f64().unwrap() > 0.0);
            assert!(p["breakdown"].is_object(), "{p}");
        }
    }
}

#[test]
fn mtp_draft_timing_is_skipped_without_an_mtp_head() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    ok(&kestrel(&[
        "bench-model",
        "--backend",
        "cpu",
        "--model",
        "testdata/golden/qwen3_moe/model",
        "--prefill",
        "--decode-batch",
        "--context",
        "8",
        "--steps",
        "1",
        "--breakdown-steps",
        "0",
        "--mtp-draft-k",
        "1",
        "--json",
        path(&json),
    ]));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["mtp_draft"].as_array().unwrap().len(), 0);
    assert!(
        v["skipped"][0].as_str().unwrap().contains("no MTP head"),
        "{}",
        v["skipped"]
    );
}

//! `kestrel bench-model --backend cpu` on the bundled model with the
//! speculative flags: verify steps and the replay proposer through the
//! engine, every figure present and labelled in the JSON.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[test]
fn bench_model_times_verify_steps_and_replayed_speculation() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("bench.json");
    let output = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .current_dir(&root)
        .args(["bench-model", "--backend", "cpu"])
        .args([
            "--model",
            "models/kestrel-tiny-qwen35",
            "--bandwidth-gbs",
            "10",
        ])
        .args(["--prefill", "--decode-batch", "1", "--context", "16"])
        .args(["--steps", "2", "--warmup", "1", "--breakdown-steps", "1"])
        .args(["--verify-k", "1,3", "--verify-batches", "1,2"])
        .args(["--speculative", "replay", "--acceptance", "1,0.5"])
        .args(["--replay-batches", "1,2", "--replay-tokens", "9"])
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("replay proposer, profile 1/0.5"),
        "{stdout}"
    );
    assert!(stdout.contains("verify steps"), "{stdout}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(
        v["skipped"].as_array().unwrap().len(),
        0,
        "{}",
        v["skipped"]
    );
    let verify = v["verify"].as_array().unwrap();
    assert_eq!(verify.len(), 4);
    for step in verify {
        assert!(step["step_time"]["median_ms"].as_f64().unwrap() > 0.0);
        assert_eq!(step["experts"], "expected union, uniform routing");
        let k = step["k"].as_f64().unwrap();
        let bytes = &step["bytes_per_step"];
        assert!(
            bytes["state_checkpoints"].as_f64().unwrap() > 0.0,
            "hybrid: {bytes}"
        );
        let ratio = bytes["state_checkpoints"].as_f64().unwrap()
            / bytes["recurrent_state"].as_f64().unwrap();
        assert!((ratio - k).abs() < 1e-9);
    }
    let spec = &v["speculative"];
    assert_eq!(spec["proposer"], "replay proposer, profile 1/0.5");
    let runs = spec["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        assert_eq!(run["proposer"], "replay proposer, profile 1/0.5");
        assert!(run["plain_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert!(run["speculative_tokens_per_s"].as_f64().unwrap() > 0.0);
        assert_eq!(run["per_position_acceptance"][0], 1.0, "{run}");
        assert_eq!(run["outputs_same_as_plain"], run["requests"]);
    }
}

#[test]
fn a_bad_acceptance_profile_is_refused_before_anything_loads() {
    for (profile, says) in [
        (
            "0.5,0.7",
            "rates must not increase (position 2 has 0.7 after 0.5)",
        ),
        ("0.9,1.5", "rate 1.5 of position 2 is not in [0, 1]"),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_kestrel"))
            .args(["bench-model", "--backend", "cpu", "--speculative", "replay"])
            .args(["--acceptance", profile])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{profile}: {stderr}");
        assert!(stderr.contains(says), "{profile}: {stderr}");
        assert!(!stderr.contains("loaded"), "{profile}: {stderr}");
    }
}

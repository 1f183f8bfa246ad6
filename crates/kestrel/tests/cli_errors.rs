//! Broken inputs end `kestrel generate` with one clear error line naming the
//! file (and tensor), a non-zero exit code, and no panic.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bundled() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/kestrel-tiny-qwen35")
}

fn copy_of_bundled() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(bundled()).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    dir
}

/// Runs `kestrel generate` on `dir`; returns the stderr of a failed run.
fn generate_error(dir: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        // The CPU explicitly: `auto` would add its fallback note to stderr.
        .args([
            "generate",
            "--backend",
            "cpu",
            "--max-tokens",
            "2",
            "--prompt",
            "def f():",
            "--model",
        ])
        .arg(dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

#[test]
fn truncated_weights() {
    let dir = copy_of_bundled();
    let file = dir.path().join("model.safetensors");
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(1_000_000).unwrap();
    let err = generate_error(dir.path());
    assert!(
        err.contains("model.safetensors") && err.contains("truncated or corrupt"),
        "{err}"
    );
}

#[test]
fn unknown_model_type() {
    let dir = copy_of_bundled();
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"qwen3_5_moe\"", "\"mamba9\"");
    std::fs::write(&path, text).unwrap();
    let err = generate_error(dir.path());
    assert!(
        err.contains("config.json") && err.contains("mamba9"),
        "{err}"
    );
}

#[test]
fn unreadable_tokenizer() {
    let dir = copy_of_bundled();
    std::fs::write(dir.path().join("tokenizer.json"), b"{\"model\": [1, 2").unwrap();
    let err = generate_error(dir.path());
    assert!(err.contains("tokenizer.json"), "{err}");
}

#[test]
fn missing_model_folder() {
    let err = generate_error(Path::new("/nonexistent/kestrel-model"));
    assert!(err.contains("/nonexistent/kestrel-model"), "{err}");
}

/// `--backend cuda` runs on a GPU; without one it is a clear one-line error.
#[test]
fn cuda_backend_without_a_gpu_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args([
            "generate",
            "--backend",
            "cuda",
            "--max-tokens",
            "2",
            "--prompt",
            "def f():",
            "--model",
        ])
        .arg(bundled())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        // A machine with a GPU and the compiled kernels: it ran there.
        assert!(stderr.contains("on cuda:0"), "{stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(1), "exit code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(
        stderr.starts_with("error: cannot open the CUDA backend"),
        "{stderr}"
    );
}

#[test]
fn unsupported_quantization_names_the_method_and_the_config() {
    let dir = copy_of_bundled();
    let path = dir.path().join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["quantization_config"] = serde_json::json!({"quant_method": "awq", "bits": 4});
    std::fs::write(&path, config.to_string()).unwrap();
    let err = generate_error(dir.path());
    assert!(
        err.contains("config.json: unsupported quantization: quant_method \"awq\""),
        "{err}"
    );
}

#[test]
fn quantizing_at_load_time_generates() {
    let out = Command::new(env!("CARGO_BIN_EXE_kestrel"))
        .args([
            "generate",
            "--max-tokens",
            "4",
            "--prompt",
            "def f():",
            "--quantization",
            "fp8",
            "--model",
        ])
        .arg(bundled())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!out.stdout.is_empty());
}

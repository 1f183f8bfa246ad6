//! Broken model folders give one clear error naming the file and the tensor,
//! never a panic.

use std::path::{Path, PathBuf};

use kestrel_cpu::CpuBackend;
use kestrel_models::Model;

fn golden_model(arch: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden")
        .join(arch)
        .join("model")
}

/// A private copy of a golden model folder to break.
fn copy_of(arch: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(golden_model(arch)).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir, &CpuBackend::new()) {
        Ok(_) => panic!("a broken model folder loaded"),
        Err(e) => format!("{e:#}"),
    }
}

/// Rewrite a single-file safetensors checkpoint through a header edit.
fn edit_header(file: &Path, edit: impl Fn(&mut serde_json::Map<String, serde_json::Value>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut out = (text.len() as u64).to_le_bytes().to_vec();
    out.extend(text);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(file, out).unwrap();
}

const EMBED: &str = "model.embed_tokens.weight";

#[test]
fn truncated_file_names_the_file() {
    let dir = copy_of("qwen3");
    let file = dir.path().join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len / 2).unwrap();
    let err = load_error(dir.path());
    assert!(err.contains("model.safetensors"), "{err}");
    assert!(err.contains("truncated or corrupt"), "{err}");
    assert!(!err.contains('\n'), "one line: {err}");
}

#[test]
fn garbage_header_is_rejected() {
    let dir = copy_of("qwen3");
    let file = dir.path().join("model.safetensors");
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[8..24].copy_from_slice(b"this is not json");
    std::fs::write(&file, bytes).unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("model.safetensors") && err.contains("not a valid safetensors"),
        "{err}"
    );
}

#[test]
fn tiny_file_is_rejected() {
    let dir = copy_of("qwen3");
    std::fs::write(dir.path().join("model.safetensors"), b"abc").unwrap();
    let err = load_error(dir.path());
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn missing_tensor_is_named() {
    let dir = copy_of("qwen3");
    edit_header(&dir.path().join("model.safetensors"), |h| {
        let entry = h.remove("model.layers.2.mlp.down_proj.weight").unwrap();
        h.insert("model.layers.2.mlp.down_proj.weight_renamed".into(), entry);
    });
    let err = load_error(dir.path());
    assert!(
        err.contains("missing tensor model.layers.2.mlp.down_proj.weight"),
        "{err}"
    );
    assert!(err.contains("model.safetensors"), "{err}");
}

#[test]
fn wrong_shape_is_named() {
    let dir = copy_of("qwen3");
    edit_header(&dir.path().join("model.safetensors"), |h| {
        // Same byte count, different shape.
        let shape = h[EMBED]["shape"].as_array().unwrap().clone();
        let (a, b) = (shape[0].as_u64().unwrap(), shape[1].as_u64().unwrap());
        h.get_mut(EMBED).unwrap()["shape"] = serde_json::json!([a * 2, b / 2]);
    });
    let err = load_error(dir.path());
    assert!(err.contains(EMBED) && err.contains("shape"), "{err}");
}

#[test]
fn unsupported_dtype_is_named() {
    let dir = copy_of("qwen3");
    edit_header(&dir.path().join("model.safetensors"), |h| {
        // F32 -> I32 keeps the byte count.
        h.get_mut(EMBED).unwrap()["dtype"] = serde_json::json!("I32");
    });
    let err = load_error(dir.path());
    assert!(
        err.contains(EMBED) && err.contains("unsupported dtype"),
        "{err}"
    );
}

#[test]
fn unknown_model_type_is_named() {
    let dir = copy_of("qwen3");
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"qwen3\"", "\"llama_next\"");
    std::fs::write(&path, text).unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("config.json") && err.contains("llama_next"),
        "{err}"
    );
}

#[test]
fn missing_shard_is_named() {
    let dir = copy_of("qwen3_moe");
    let shard = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with("00002-of-00002.safetensors"))
        .expect("the qwen3_moe fixture is sharded");
    std::fs::remove_file(&shard).unwrap();
    let err = load_error(dir.path());
    assert!(err.contains("00002-of-00002.safetensors"), "{err}");
}

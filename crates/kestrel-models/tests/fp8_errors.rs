//! Broken block-FP8 checkpoints and unsupported quantisation configs fail
//! the load with one error that names the file and the tensor (or the quant
//! method and the config file), never a panic or a silently dense model.

use std::path::{Path, PathBuf};

use kestrel_cpu::CpuBackend;
use kestrel_models::Model;
use serde_json::{Map, Value, json};

/// qwen3's FP8 fixture: one file, float32 scales.
fn copy_of_fixture() -> tempfile::TempDir {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/fp8/qwen3/model");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    dir
}

fn load_error(dir: &Path) -> String {
    match Model::load(dir, &CpuBackend::new()) {
        Ok(_) => panic!("a broken FP8 checkpoint loaded"),
        Err(e) => {
            let text = format!("{e:#}");
            assert_eq!(text.lines().count(), 1, "one line: {text}");
            text
        }
    }
}

/// Rewrites the header of the fixture's `model.safetensors`. Tensors must
/// keep tiling the data, so edits rename entries rather than drop or copy them.
fn rename(dir: &Path, from: &str, to: &str) {
    edit_header(dir, |h| {
        let entry = h.remove(from).unwrap();
        h.insert(to.to_string(), entry);
    });
}

fn edit_header(dir: &Path, edit: impl Fn(&mut Map<String, Value>)) {
    let file = dir.join("model.safetensors");
    let bytes = std::fs::read(&file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
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

fn edit_quantization_config(dir: &Path, key: &str, value: Value) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["quantization_config"][key] = value;
    std::fs::write(path, config.to_string()).unwrap();
}

const Q: &str = "model.layers.0.self_attn.q_proj.weight";
const Q_SCALE: &str = "model.layers.0.self_attn.q_proj.weight_scale_inv";
const Q_NORM: &str = "model.layers.0.self_attn.q_norm.weight";

#[test]
fn the_fixture_loads_before_it_is_broken() {
    let dir = copy_of_fixture();
    Model::load(dir.path(), &CpuBackend::new()).unwrap();
}

#[test]
fn a_missing_scale_names_the_weight_and_the_scale() {
    let dir = copy_of_fixture();
    rename(
        dir.path(),
        Q_SCALE,
        "model.layers.0.self_attn.q_proj.weight_scale",
    );
    let err = load_error(dir.path());
    assert!(
        err.contains("model.safetensors")
            && err.contains(&format!("FP8 weight {Q} has no scale tensor {Q_SCALE}")),
        "{err}"
    );
}

#[test]
fn a_misshaped_scale_names_both_shapes() {
    let dir = copy_of_fixture();
    // q_proj is [128, 64]: one block, one scale; the same 4 bytes claimed
    // as another grid.
    edit_header(dir.path(), |h| {
        h[Q_SCALE]["shape"] = json!([1, 1, 1]);
    });
    let err = load_error(dir.path());
    assert!(
        err.contains(&format!("scale tensor {Q_SCALE} has shape [1, 1, 1]"))
            && err.contains("needs [1, 1]"),
        "{err}"
    );
}

#[test]
fn a_scale_without_its_weight_is_refused() {
    let dir = copy_of_fixture();
    // An f32 vector of the file, renamed into the scale of a weight it lacks.
    let orphan = "model.layers.0.self_attn.a_proj.weight_scale_inv";
    rename(dir.path(), Q_NORM, orphan);
    let err = load_error(dir.path());
    assert!(
        err.contains(&format!(
            "scale tensor {orphan} has no weight model.layers.0.self_attn.a_proj.weight"
        )),
        "{err}"
    );
}

#[test]
fn a_scale_for_a_dense_weight_is_refused() {
    let dir = copy_of_fixture();
    rename(dir.path(), Q_NORM, "model.norm.weight_scale_inv");
    let err = load_error(dir.path());
    assert!(err.contains("which is F32, not F8_E4M3"), "{err}");
}

#[test]
fn fp8_weights_need_a_quantization_config() {
    let dir = copy_of_fixture();
    let path = dir.path().join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config
        .as_object_mut()
        .unwrap()
        .remove("quantization_config");
    std::fs::write(&path, config.to_string()).unwrap();
    let err = load_error(dir.path());
    assert!(
        err.contains("is F8_E4M3 but config.json has no quantization_config"),
        "{err}"
    );
}

#[test]
fn a_module_kept_dense_must_not_be_fp8() {
    let dir = copy_of_fixture();
    edit_quantization_config(
        dir.path(),
        "modules_to_not_convert",
        json!(["self_attn.q_proj"]),
    );
    let err = load_error(dir.path());
    assert!(
        err.contains(&format!(
            "{Q} is F8_E4M3 but its module is in modules_to_not_convert"
        )),
        "{err}"
    );
}

#[test]
fn other_quant_methods_formats_and_blocks_name_themselves_and_the_config() {
    for (key, value, shown) in [
        ("quant_method", json!("awq"), "quant_method \"awq\""),
        ("quant_method", json!("gptq"), "quant_method \"gptq\""),
        ("fmt", json!("e5m2"), "fmt \"e5m2\""),
        (
            "weight_block_size",
            json!([64, 64]),
            "weight_block_size [64,64]",
        ),
        (
            "activation_scheme",
            json!("static"),
            "activation_scheme \"static\"",
        ),
    ] {
        let dir = copy_of_fixture();
        edit_quantization_config(dir.path(), key, value);
        let err = load_error(dir.path());
        assert!(
            err.contains("config.json: unsupported quantization") && err.contains(shown),
            "{key}: {err}"
        );
    }
}

//! `config.json` as real checkpoints write it: field spellings that differ
//! between Qwen's own configs and newer transformers load alike, and a wrong
//! field is named in the error.

use std::path::PathBuf;

use kestrel_models::ModelConfig;
use serde_json::Value;

fn config_json(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs")
        .join(name)
        .join("config.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn parse(v: &Value) -> ModelConfig {
    ModelConfig::from_json(&v.to_string()).unwrap()
}

/// Renames `num_experts` to `num_local_experts` in the object that holds it.
fn rename_experts(fields: &mut Value) {
    let map = fields.as_object_mut().unwrap();
    let n = map.remove("num_experts").expect("config has num_experts");
    map.insert("num_local_experts".into(), n);
}

#[test]
fn num_local_experts_loads_at_the_top_level() {
    let original = config_json("qwen3-30b-a3b");
    let mut renamed = original.clone();
    rename_experts(&mut renamed);
    let c = parse(&renamed);
    assert_eq!(c.moe.as_ref().unwrap().num_experts, 128);
    assert_eq!(c, parse(&original));
}

#[test]
fn num_local_experts_loads_inside_text_config() {
    let original = config_json("qwen3.6-35b-a3b");
    let mut renamed = original.clone();
    rename_experts(&mut renamed["text_config"]);
    let c = parse(&renamed);
    assert_eq!(c.moe.as_ref().unwrap().num_experts, 256);
    assert_eq!(c, parse(&original));
}

#[test]
fn num_experts_wins_over_num_local_experts() {
    let mut both = config_json("qwen3-30b-a3b");
    both["num_local_experts"] = 64.into();
    assert_eq!(parse(&both).moe.unwrap().num_experts, 128);
}

#[test]
fn neither_name_is_an_error() {
    let mut none = config_json("qwen3-30b-a3b");
    none.as_object_mut().unwrap().remove("num_experts");
    let err = ModelConfig::from_json(&none.to_string()).unwrap_err();
    assert!(format!("{err:#}").contains("num_experts"), "{err:#}");
}

fn load_error(v: &Value) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, v.to_string()).unwrap();
    format!("{:#}", ModelConfig::from_file(&path).unwrap_err())
}

#[test]
fn wrong_type_inside_text_config_names_the_field() {
    let mut v = config_json("qwen3.6-35b-a3b");
    v["text_config"]["hidden_size"] = "2048".into();
    let err = load_error(&v);
    assert!(err.contains("config.json"), "{err}");
    assert!(
        err.contains("text_config.hidden_size: invalid type: string"),
        "{err}"
    );
}

#[test]
fn wrong_type_at_the_top_level_names_the_field() {
    let mut v = config_json("qwen3-30b-a3b");
    v["num_experts_per_tok"] = (-8).into();
    let err = load_error(&v);
    assert!(
        err.contains("num_experts_per_tok: invalid value: integer `-8`"),
        "{err}"
    );
}

#[test]
fn missing_field_names_the_object() {
    let mut v = config_json("qwen3.6-35b-a3b");
    v["text_config"]
        .as_object_mut()
        .unwrap()
        .remove("vocab_size");
    let err = load_error(&v);
    assert!(
        err.contains("text_config: missing field `vocab_size`"),
        "{err}"
    );
}

#[test]
fn broken_json_names_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, "{\n  \"model_type\": \"qwen3\",\n  oops\n}").unwrap();
    let err = format!("{:#}", ModelConfig::from_file(&path).unwrap_err());
    assert!(
        err.contains("config.json") && err.contains("line 3"),
        "{err}"
    );
}

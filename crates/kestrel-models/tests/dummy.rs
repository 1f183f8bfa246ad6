//! `--load-format dummy`: the bundled full-size configs parse to the published
//! shapes, and scaled-down copies build random-weight models that run.

use std::path::PathBuf;

use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_models::runner::SequenceRunner;
use kestrel_models::{Arch, LayerKind, Model, ModelConfig};
use serde_json::{Value, json};

fn config_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../configs")
        .join(name)
        .join("config.json")
}

#[test]
fn qwen3_30b_a3b_config_has_the_published_shapes() {
    let c = ModelConfig::from_file(&config_path("qwen3-30b-a3b")).unwrap();
    assert_eq!(c.arch, Arch::Qwen3Moe);
    assert_eq!(
        (c.num_layers, c.hidden_size, c.vocab_size),
        (48, 2048, 151_936)
    );
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (32, 4, 128));
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.intermediate),
        (128, 8, 768)
    );
    assert!(moe.norm_topk_prob && moe.shared_intermediate.is_none());
    assert!(c.sparse_layers.iter().all(|&s| s));
    assert!(!c.tie_word_embeddings);
}

#[test]
fn qwen3_6_35b_a3b_config_has_the_published_shapes() {
    let c = ModelConfig::from_file(&config_path("qwen3.6-35b-a3b")).unwrap();
    assert_eq!(c.arch, Arch::Qwen35Moe);
    assert_eq!(c.weight_prefix, "model.language_model.");
    assert_eq!(
        (c.num_layers, c.hidden_size, c.vocab_size),
        (40, 2048, 248_320)
    );
    assert_eq!(
        (c.num_heads, c.num_kv_heads, c.head_dim, c.rotary_dim),
        (16, 2, 256, 64)
    );
    assert_eq!(c.num_attention_layers(), 10);
    assert!(
        c.layer_kinds
            .iter()
            .enumerate()
            .all(|(i, k)| { (*k == LayerKind::FullAttention) == (i % 4 == 3) })
    );
    let la = c.linear_attn.as_ref().unwrap();
    assert_eq!(
        (la.num_k_heads, la.num_v_heads, la.head_k_dim, la.head_v_dim),
        (16, 32, 128, 128)
    );
    let moe = c.moe.as_ref().unwrap();
    assert_eq!(
        (moe.num_experts, moe.top_k, moe.intermediate),
        (256, 8, 512)
    );
    assert_eq!(moe.shared_intermediate, Some(512));
    assert_eq!(c.mtp_layers, 1);
    assert_eq!(c.max_position_embeddings, 262_144);
    assert_eq!(c.rope_theta, 1e7);
}

/// A copy of a full-size config with small dimensions, written to a folder.
fn scaled_down(name: &str, text_overrides: Value) -> tempfile::TempDir {
    let mut v: Value =
        serde_json::from_str(&std::fs::read_to_string(config_path(name)).unwrap()).unwrap();
    let text = if v.get("text_config").is_some() {
        &mut v["text_config"]
    } else {
        &mut v
    };
    for (k, x) in text_overrides.as_object().unwrap() {
        text[k] = x.clone();
    }
    if let Some(types) = text.get("layer_types").cloned() {
        let n = text["num_hidden_layers"].as_u64().unwrap() as usize;
        text["layer_types"] = Value::Array(types.as_array().unwrap()[..n].to_vec());
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), v.to_string()).unwrap();
    dir
}

fn small_moe() -> Value {
    json!({
        "hidden_size": 64, "vocab_size": 512, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 32,
    })
}

/// Greedy tokens and the last logits of a short prompt plus a few decode steps.
fn run(model: &Model<CpuBackend>) -> (Vec<u32>, Vec<f32>) {
    let b = CpuBackend::new();
    let mut runner = SequenceRunner::new(&b, model, 64).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 37 % 512) as u32).collect();
    let mut logits = runner.feed_last_logits(&prompt).unwrap();
    let mut tokens = Vec::new();
    for _ in 0..4 {
        assert!(logits.iter().all(|x| x.is_finite()), "non-finite logits");
        let t = logits
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map(|(i, _)| i as u32)
            .unwrap();
        tokens.push(t);
        logits = runner.feed_last_logits(&[t]).unwrap();
    }
    (tokens, logits)
}

#[test]
fn scaled_down_qwen3_6_loads_dummy_weights_and_runs() {
    let mut o = small_moe();
    let extra = json!({
        "num_hidden_layers": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "shared_expert_intermediate_size": 48,
    });
    o.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let dir = scaled_down("qwen3.6-35b-a3b", o);
    let b = CpuBackend::new();
    let model = Model::load_dummy(dir.path(), &b, 1).unwrap();
    assert!(model.mtp.is_some(), "the config has an MTP layer");
    assert_eq!(model.decoder.layers.len(), 4);
    let (tokens, logits) = run(&model);
    // Same seed, same model; another seed, another model.
    let again = Model::load_dummy(&dir.path().join("config.json"), &b, 1).unwrap();
    assert_eq!(run(&again), (tokens, logits.clone()));
    let other = Model::load_dummy(dir.path(), &b, 2).unwrap();
    assert_ne!(run(&other).1, logits);
    // Logits spread like a trained model's: not all equal, not huge.
    let max = logits.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(max > 1e-3 && max < 100.0, "max |logit| {max}");
}

#[test]
fn scaled_down_qwen3_30b_loads_dummy_weights_and_runs() {
    let mut o = small_moe();
    o["num_hidden_layers"] = json!(2);
    o["intermediate_size"] = json!(128);
    let dir = scaled_down("qwen3-30b-a3b", o);
    let b = CpuBackend::new();
    let model = Model::load_dummy(dir.path(), &b, 7).unwrap();
    assert!(model.mtp.is_none());
    let (_, logits) = run(&model);
    assert!(logits.iter().any(|&x| x != logits[0]));
}

#[test]
fn dummy_weights_are_the_shared_hash_values() {
    // The host default of Backend::dummy_weight draws kestrel_core::dummy values
    // (a GPU backend must reproduce them bit for bit).
    let b = CpuBackend::new();
    let w = b
        .dummy_weight(&[3, 5], kestrel_core::DType::F32, 99, 0.5, 0.25)
        .unwrap();
    let expected: Vec<f32> = (0..15)
        .map(|i| kestrel_core::dummy::dummy_value(99, i, 0.5, 0.25))
        .collect();
    assert_eq!(w.data, expected);
}

#[test]
fn dummy_load_reports_a_bad_config_path() {
    let err = Model::load_dummy(
        std::path::Path::new("/nonexistent/config.json"),
        &CpuBackend::new(),
        0,
    )
    .err()
    .expect("a missing config is an error");
    assert!(format!("{err:#}").contains("cannot read"), "{err:#}");
}

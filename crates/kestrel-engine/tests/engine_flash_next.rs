//! Qwen3.8-Flash-Next through the serving engine: the fixture's greedy
//! continuations (made by transformers' `qwen4_exp`) come out token for
//! token, alone, batched, with n-gram speculation, with the prefix cache
//! hitting, and after forced preemption. That the engine's variants agree
//! bit for bit is checked in `engine_cache.rs` and `engine_spec.rs`; this
//! test ties them to the reference.

mod common;

use std::path::PathBuf;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineConfig, EngineOptions, GenerateRequest};
use serde_json::Value;

fn reference() -> Vec<(Vec<u32>, Vec<u32>)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/golden/qwen4_exp/reference.json");
    let meta: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    meta["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| (ids(&case["prompt_ids"]), ids(&case["new_ids"])))
        .collect()
}

fn engine(
    config: EngineConfig,
    speculative: Option<SpeculativeConfig>,
) -> kestrel_engine::EngineHandle {
    let options = EngineOptions {
        speculative,
        ..EngineOptions::default()
    };
    Engine::spawn_with_options(
        CpuBackend::new(),
        TestModel::FlashNext.target(),
        config,
        options,
    )
    .expect("engine starts")
}

#[test]
fn flash_next_serves_the_transformers_greedy_continuations() {
    let cases = reference();
    let reqs: Vec<GenerateRequest> = cases
        .iter()
        .enumerate()
        .map(|(i, (prompt, want))| named(&format!("g{i}"), prompt, greedy(want.len())))
        .collect();
    for (name, cfg, spec) in serving_variants() {
        let e = engine(cfg, spec);
        let alone: Vec<_> = reqs.iter().map(|r| run_one(&e, r.clone())).collect();
        let together = run_together(&e, &reqs);
        for (i, (_, want)) in cases.iter().enumerate() {
            assert_eq!(&alone[i].tokens, want, "{name}: case {i} alone");
            assert_eq!(&together[i].tokens, want, "{name}: case {i} batched");
        }
        // The second round hits the pages and snapshots of the first.
        assert!(
            together.iter().any(|o| o.usage.cached_tokens > 0),
            "{name}: the prefix cache hit"
        );
        wait_idle(&e);
    }
}

#[test]
fn flash_next_refuses_drafters_that_read_the_decoder() {
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method: SpeculativeMethod::mtp(),
            num_speculative_tokens: 2,
        }),
        ..EngineOptions::default()
    };
    let err = Engine::spawn_with_options(
        CpuBackend::new(),
        TestModel::FlashNext.target(),
        config(),
        options,
    )
    .err()
    .expect("MTP on Flash-Next is refused");
    let message = format!("{err:#}");
    assert!(message.contains("use ngram"), "{message}");
}

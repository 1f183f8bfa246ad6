use super::*;
use std::collections::HashMap;

fn parse(vars: &[(&str, &str)]) -> (Overrides, Vec<String>) {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Overrides::parse(&|name| map.get(name).cloned()).unwrap()
}

#[test]
fn an_empty_environment_gives_the_defaults_without_warnings() {
    let (o, w) = parse(&[]);
    assert_eq!(o, Overrides::default());
    assert!(w.is_empty(), "{w:?}");
}

#[test]
fn each_switch_takes_its_values() {
    let (o, w) = parse(&[
        (GRAPHS, "0"),
        (ATTN_PREFILL, "v1"),
        (ATTN_DECODE, "unfused"),
        (GDN_PREFILL, "3xtf32"),
        (GDN_STATE, "mma"),
        (MOE_GEMM, "mma"),
        (MOE_TILES, "narrow"),
        (NORM_FUSION, "off"),
        (MIXED_STEPS, "one"),
        (DECODE_SPLITS, "sequence"),
        (PROMPT_ROWS, "by-size"),
        (PRECISION, "f32"),
    ]);
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        o,
        Overrides {
            precision: Precision::F32,
            graphs: false,
            attn_prefill: AttnPrefillChoice::V1,
            attn_decode_fused: false,
            gdn_math: GdnMathChoice::Tf32x3,
            gdn_state_wgmma: false,
            moe_gemm_wgmma: false,
            moe_wide_tiles: false,
            norm_fusion: false,
            split_mixed_steps: false,
            decode_splits_one_sequence: true,
            invariant_prompts: false,
            ..Overrides::default()
        }
    );
}

#[test]
fn an_unknown_value_warns_and_keeps_the_default() {
    let (o, w) = parse(&[(MOE_TILES, "narow"), (ATTN_PREFILL, "v3")]);
    assert!(o.moe_wide_tiles);
    assert_eq!(o.attn_prefill, AttnPrefillChoice::Best);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("KESTREL_ATTN_PREFILL=v3"), "{w:?}");
}

#[test]
fn a_bad_precision_is_an_error() {
    let lookup = |name: &str| (name == PRECISION).then(|| "fp16".to_string());
    assert!(Overrides::parse(&lookup).is_err());
}

#[test]
fn experiments_are_taken_only_by_a_build_that_has_them() {
    let (o, w) = parse(&[(MOE_PREFILL, "host"), (DENSE_GEMM, "lt"), (PDL, "1")]);
    assert_eq!(o.moe_prefill_host, EXPERIMENTS);
    assert_eq!(o.dense_gemm_lt, EXPERIMENTS);
    assert_eq!(o.pdl, EXPERIMENTS);
    assert_eq!(w.len(), if EXPERIMENTS { 0 } else { 3 }, "{w:?}");
}

#[test]
fn only_unregistered_kestrel_names_are_unknown() {
    let names = [
        "KESTREL_CACHE_DIR",
        "KESTREL_MOE_TILE",
        "PATH",
        "KESTREL_NVCC",
        "KESTREL_L2_PREFETCH",
    ];
    assert_eq!(
        unknown_names(names),
        ["KESTREL_MOE_TILE", "KESTREL_L2_PREFETCH"]
    );
}

/// docs/cuda.md's table documents every registered variable.
#[test]
fn the_docs_table_lists_every_variable() {
    let docs = include_str!("../../../../docs/cuda.md");
    for s in REGISTRY {
        assert!(
            docs.contains(&format!("| `{}", s.name)),
            "docs/cuda.md has no table row for {}",
            s.name
        );
    }
}

#[test]
fn names_are_unique() {
    for (i, s) in REGISTRY.iter().enumerate() {
        assert!(
            REGISTRY[i + 1..].iter().all(|t| t.name != s.name),
            "{}",
            s.name
        );
    }
}

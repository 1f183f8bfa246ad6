//! Speculation at full-size decode shapes in the serving precision: on a
//! model of Qwen3.6-35B-A3B's shapes (its first four layers, random weights),
//! in the default bf16 mode, a request decoding alone and batches of two and
//! four give the same greedy tokens with speculation on and off.
//!
//! That holds for decode-shaped steps (up to 8 sequences, each with at most 16
//! new tokens): their rows all take the decode kernels, whose splits follow
//! the step's sequence count rather than its rows, and the fused and
//! separate norms form the same sums. Four sequences at k = 3 bring 16 rows,
//! k = 4 twenty: more than one `gemv` launch takes, and more tokens than the
//! MoE decode path's own limit. The golden models are too small to show it:
//! their products are never split over warps, nor their attention over key
//! ranges.

use std::path::PathBuf;
use std::sync::Arc;

use crate::device::with_gpu;
use crate::speculative::{BF16, Reference, Run, Source, methods, run_from};

/// The full model's config, cut to four layers (three linear-attention ones
/// and a full-attention one) and its MTP head, in a temporary folder.
pub(crate) fn four_layer_config() -> PathBuf {
    let full =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/qwen3.6-35b-a3b/config.json");
    let text = std::fs::read_to_string(&full).expect("the Qwen3.6 config is in the repo");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("config parses");
    let t = &mut config["text_config"];
    t["num_hidden_layers"] = 4.into();
    let types = t["layer_types"].as_array_mut().expect("layer_types");
    types.truncate(4);
    let dir = std::env::temp_dir().join(format!("kestrel-qwen3.6-4-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary folder");
    let path = dir.join("config.json");
    std::fs::write(&path, config.to_string()).expect("config written");
    path
}

#[test]
fn qwen3_6_shapes_decode_the_same_with_speculation_in_bf16_in_decode_shaped_steps() {
    with_gpu(|_gpu| {
        let config = four_layer_config();
        let source = Source::Dummy(&config);
        let mut differ = Vec::new();
        // Alone with up to 4 drafts (5 rows); two together with up to 3 (8);
        // four with up to 3 (16) and 4 (20).
        let groups = [
            (&[0usize][..], 4),
            (&[1], 4),
            (&[3], 4),
            (&[0, 1], 3),
            (&[0, 1, 2, 3], 3),
            (&[0, 1, 2, 3], 4),
        ];
        for (group, k) in groups {
            let off: Run = run_from(source, BF16, None, Some(group));
            let reference: Reference = Arc::new(off.tokens.clone());
            for (name, spec) in methods(off.has_mtp, &reference, off.vocab, k) {
                let on = run_from(source, BF16, Some(spec), Some(group));
                let what = format!("requests {group:?} / {name}");
                let n = off
                    .tokens
                    .iter()
                    .filter(|(id, t)| on.tokens.get(*id) != Some(t))
                    .count();
                let (drafts, accepted) = (
                    on.stats.spec_decode_num_draft_tokens_total,
                    on.stats.spec_decode_num_accepted_tokens_total,
                );
                println!("{what}: {n} differ; drafts {drafts}, accepted {accepted}");
                if name == "AllRight" && accepted != drafts {
                    differ.push(format!(
                        "{what}: {accepted} of {drafts} right drafts accepted"
                    ));
                }
                if n > 0 {
                    differ.push(format!("{what}: {n} requests differ"));
                }
            }
        }
        let _ = std::fs::remove_dir_all(config.parent().expect("config has a folder"));
        assert!(
            differ.is_empty(),
            "speculation changed bf16 output at decode sizes:\n{}",
            differ.join("\n")
        );
    });
}

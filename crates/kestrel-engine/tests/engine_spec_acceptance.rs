//! Acceptance of the proposers on the bundled model (trained on Python
//! source): MTP at depth 1..4 on held-out-style code, and n-gram lookup on a
//! copy-heavy prompt (a function followed by the start of an edited copy of
//! it), and the bundled DFlash drafter on held-out file openings (with its
//! output checked against plain decoding). The floors sit below the figures
//! measured when they were set (see
//! docs/benchmarks/2026-12-01-cpu-speculative-acceptance and
//! models/kestrel-tiny-qwen35-dflash/README.md), so a change that breaks
//! drafting fails here; outputs are checked lossless elsewhere.

mod common;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{DflashOptions, NgramConfig, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineConfig, EngineOptions, EngineStats};
use kestrel_text::Tokenizer;

const CODE: &str = "import os\nimport sys\n\n\ndef read_lines(path, encoding=\"utf-8\"):\n    \"\"\"Return the lines of the file at path.\"\"\"\n    with open(path, encoding=encoding) as f:\n        return f.read().splitlines()\n\n\nclass Config:\n    def __init__(self, name, values=None):\n        self.name = name\n        self.values = values or {}\n\n    def get(self, key, default=None):\n        return self.values.get(key, default)\n\n    def ";

const EDIT: &str = "def parse_header(line):\n    \"\"\"Split a header line into its name and value.\"\"\"\n    name, _, value = line.partition(\":\")\n    name = name.strip().lower()\n    value = value.strip()\n    if not name:\n        raise ValueError(\"empty header name\")\n    return name, value\n\n\n# The same function, renamed:\ndef parse_field(line):\n    \"\"\"Split a header line into its name and value.\"\"\"\n";

fn measure(text: &str, method: SpeculativeMethod, k: usize, max_tokens: usize) -> EngineStats {
    let model = TestModel::Bundled;
    let tokenizer = Tokenizer::from_model_dir(model.dir()).unwrap();
    let prompt = tokenizer.encode(text, false).unwrap();
    let options = EngineOptions {
        speculative: Some(SpeculativeConfig {
            method,
            num_speculative_tokens: k,
        }),
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(CpuBackend::new(), model.load(), config(), options)
        .expect("engine starts");
    run_one(&engine, named("a", &prompt, greedy(max_tokens)));
    wait_idle(&engine)
}

fn acceptance(s: &EngineStats) -> (f64, Vec<f64>) {
    let drafts = s.spec_decode_num_drafts_total.max(1) as f64;
    (
        s.spec_decode_num_accepted_tokens_total as f64
            / s.spec_decode_num_draft_tokens_total.max(1) as f64,
        s.spec_decode_num_accepted_tokens_per_pos_total
            .iter()
            .map(|&n| n as f64 / drafts)
            .collect(),
    )
}

#[test]
fn mtp_drafts_are_accepted_on_code() {
    // Per-position floors: (k, first position, last position).
    for (k, floor_first, floor_last) in [
        (1, 0.6, 0.6),
        (2, 0.6, 0.35),
        (3, 0.6, 0.15),
        (4, 0.6, 0.07),
    ] {
        let s = measure(CODE, SpeculativeMethod::mtp(), k, 96);
        let (rate, per_pos) = acceptance(&s);
        let length = 1.0 + per_pos.iter().sum::<f64>();
        println!(
            "MTP k={k}: acceptance {rate:.3}, per position {per_pos:.3?}, accepted length {length:.2}"
        );
        assert!(
            per_pos[0] >= floor_first,
            "k={k}: first-position acceptance {per_pos:?}"
        );
        assert!(
            per_pos[k - 1] >= floor_last,
            "k={k}: last-position acceptance {per_pos:?}"
        );
    }
}

#[test]
fn ngram_drafts_are_accepted_on_a_copy() {
    let cfg = NgramConfig::new(2, 4, 4).unwrap();
    let s = measure(EDIT, SpeculativeMethod::Ngram(cfg), 4, 64);
    let (rate, per_pos) = acceptance(&s);
    println!(
        "n-gram k=4: {} drafts, acceptance {rate:.3}, per position {per_pos:.3?}",
        s.spec_decode_num_drafts_total
    );
    assert!(
        s.spec_decode_num_drafts_total >= 5,
        "the copy gives lookups"
    );
    assert!(rate >= 0.5, "acceptance {rate}");
}

/// Mean accepted DFlash drafts per verify step (block 16, 15 drafts) that the
/// bundled drafter must keep on the held-out prompts below: it measured 0.38
/// when it was committed (`cargo test -p kestrel-engine --test
/// engine_spec_acceptance dflash -- --nocapture` prints the figure), and the
/// CPU run is deterministic; the floor sits below it as the MTP floors above
/// sit below theirs.
const DFLASH_ACCEPTED_PER_STEP_FLOOR: f64 = 0.3;

#[test]
fn the_bundled_dflash_drafter_is_accepted_on_held_out_code() {
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let drafter = root.join("models/kestrel-tiny-qwen35-dflash");
    // Openings of held-out files (the bundled model's reference prompts).
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/kestrel-tiny-qwen35/reference/reference.json"))
            .unwrap(),
    )
    .unwrap();
    let prompts: Vec<Vec<u32>> = reference["greedy"]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .step_by(3)
        .map(|p| {
            p["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let run = |speculative: Option<SpeculativeConfig>| {
        let options = EngineOptions {
            speculative,
            ..EngineOptions::default()
        };
        // A recurrent-state checkpoint per draft of every sequence, so that
        // no step's drafts are cut short for want of slots.
        let engine_config = EngineConfig {
            num_state_slots: prompts.len() * 16 + 8,
            enable_prefix_cache: false,
            ..config()
        };
        let engine = Engine::spawn_with_options(
            CpuBackend::new(),
            TestModel::Bundled.load(),
            engine_config,
            options,
        )
        .expect("engine starts");
        let mut streams: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                engine
                    .submit(named(&format!("p{i}"), p, greedy(48)))
                    .expect("submitted")
            })
            .collect();
        let outputs: Vec<Vec<u32>> = streams.iter_mut().map(|s| collect(s).tokens).collect();
        (outputs, wait_idle(&engine))
    };
    let (plain, _) = run(None);
    let (drafted, stats) = run(Some(SpeculativeConfig {
        method: SpeculativeMethod::Dflash(DflashOptions::new(&drafter)),
        num_speculative_tokens: 15,
    }));
    assert_eq!(drafted, plain, "greedy output is the same with DFlash");
    let (rate, per_pos) = acceptance(&stats);
    let per_step = stats.spec_decode_num_accepted_tokens_total as f64
        / stats.spec_decode_num_drafts_total.max(1) as f64;
    println!(
        "DFlash k=15: {} steps drafted, acceptance {rate:.3}, accepted per step {per_step:.2}, \
         per position {per_pos:.3?}",
        stats.spec_decode_num_drafts_total
    );
    assert!(stats.spec_decode_num_drafts_total >= 10, "{stats:?}");
    let floor = DFLASH_ACCEPTED_PER_STEP_FLOOR;
    assert!(
        per_step >= floor,
        "accepted drafts per step {per_step:.2} fell below the floor {floor}"
    );
}

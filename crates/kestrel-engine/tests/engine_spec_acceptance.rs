//! Acceptance of the proposers on the bundled model (trained on Python
//! source): MTP at depth 1..4 on held-out-style code, and n-gram lookup on a
//! copy-heavy prompt (a function followed by the start of an edited copy of
//! it). The floors sit below the figures measured when they were set (see
//! docs/benchmarks/2026-12-01-cpu-speculative-acceptance), so a change that
//! breaks drafting fails here; outputs are checked lossless elsewhere.

mod common;

use common::*;
use kestrel_cpu::CpuBackend;
use kestrel_engine::spec::{NgramConfig, SpeculativeConfig, SpeculativeMethod};
use kestrel_engine::{Engine, EngineOptions, EngineStats};
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

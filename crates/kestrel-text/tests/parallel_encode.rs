//! Parallel encoding of long texts gives the ids of one pass, on the Qwen3.6
//! tokenizer and the bundled model's, over real source files, the tokenizer
//! corpus and generated texts built to probe every kind of cut.

mod common;

use common::{qwen_tokenizer, read_json, testdata};
use kestrel_text::Tokenizer;
use kestrel_text::parallel_encode::{PARALLEL_MIN_BYTES, cut_points};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn bundled_tokenizer() -> Tokenizer {
    let dir = testdata().join("../models/kestrel-tiny-qwen35");
    Tokenizer::from_model_dir(&dir).expect("bundled tokenizer")
}

fn assert_same_ids(tok: &Tokenizer, text: &str, what: &str) {
    assert!(
        text.len() >= PARALLEL_MIN_BYTES,
        "{what}: too short to test"
    );
    assert!(
        !cut_points(text, 8).is_empty(),
        "{what}: no safe point, the parallel path would not run"
    );
    let parallel = tok.encode(text, false).unwrap();
    let whole = tok.encode_one_pass(text, false).unwrap();
    if parallel != whole {
        let at = parallel
            .iter()
            .zip(&whole)
            .take_while(|(a, b)| a == b)
            .count();
        panic!(
            "{what}: ids differ from position {at} ({} vs {} ids): {:?} vs {:?}",
            parallel.len(),
            whole.len(),
            &parallel[at..(at + 8).min(parallel.len())],
            &whole[at..(at + 8).min(whole.len())]
        );
    }
}

fn tokenizers() -> Vec<(&'static str, Tokenizer)> {
    let tokenizers = vec![
        ("qwen3.6", qwen_tokenizer().clone()),
        ("bundled", bundled_tokenizer()),
    ];
    for (name, tok) in &tokenizers {
        assert!(
            tok.encodes_in_parallel(),
            "{name}: expected a split-safe tokenizer"
        );
    }
    tokenizers
}

#[test]
fn benchmark_corpus_sources_encode_identically() {
    let dir = testdata().join("../bench/corpus");
    let mut all = String::new();
    for entry in std::fs::read_dir(&dir).expect("bench corpus") {
        all.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    for (name, tok) in tokenizers() {
        assert_same_ids(&tok, &all, &format!("{name}, bench corpus"));
        // A chat-rendered prompt: special tokens around the source.
        let chat = format!("<|im_start|>user\n{all}<|im_end|>\n<|im_start|>assistant\n<think>\n");
        assert_same_ids(&tok, &chat, &format!("{name}, chat prompt"));
    }
}

#[test]
fn tokenizer_corpus_cases_joined_encode_identically() {
    let doc = read_json(&testdata().join("tokenizer/qwen3_6_corpus.json"));
    let texts: Vec<&str> = doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["text"].as_str().unwrap())
        .collect();
    for (name, tok) in tokenizers() {
        for sep in ["\n", ";\n", ".\nx", "\n\n", "\r\n"] {
            let text = texts.join(sep).repeat(2);
            if cut_points(&text, 8).is_empty() {
                continue;
            }
            assert_same_ids(&tok, &text, &format!("{name}, corpus joined by {sep:?}"));
        }
    }
}

/// Lines made to sit on both sides of every kind of cut: trailing and
/// leading whitespace, CRLF, tabs, Unicode spaces and marks, digits,
/// contractions, punctuation runs, special tokens, CJK and emoji.
fn adversarial_text(rng: &mut StdRng, bytes: usize) -> String {
    const PIECES: &[&str] = &[
        "def",
        "x",
        "'s",
        "'LL",
        "42",
        "3.14",
        "  ",
        "\t",
        " ",
        "\u{3000}",
        "\u{a0}",
        "é",
        "e\u{301}",
        "\u{301}",
        "你好",
        "😀",
        "(",
        ")",
        "::",
        "->",
        "#",
        "\"",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "user",
        "?!",
        "...",
        "_",
        "`",
        "$",
        "@",
    ];
    const ENDS: &[&str] = &[
        "\n", "\n", "\n", "\r\n", " \n", "\n\n", "\t\n", ".\n", "\u{a0}\n",
    ];
    let mut text = String::new();
    while text.len() < bytes {
        for _ in 0..rng.random_range(0..8) {
            text.push_str(PIECES[rng.random_range(0..PIECES.len())]);
            if rng.random_bool(0.3) {
                text.push(' ');
            }
        }
        text.push_str(ENDS[rng.random_range(0..ENDS.len())]);
    }
    text
}

#[test]
fn adversarial_texts_encode_identically() {
    let mut rng = StdRng::seed_from_u64(7);
    for (name, tok) in tokenizers() {
        for i in 0..24 {
            let text = adversarial_text(&mut rng, 12 * 1024 + 1024 * i);
            assert_same_ids(&tok, &text, &format!("{name}, adversarial text {i}"));
        }
    }
}

#[test]
fn a_tokenizer_outside_the_proven_forms_encodes_in_one_pass() {
    let mut doc: serde_json::Value = serde_json::from_slice(common::qwen_tokenizer_json()).unwrap();
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = serde_json::json!(r"\s+|\S+");
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&doc).unwrap(), "altered").unwrap();
    assert!(!tok.encodes_in_parallel());
    let mut doc: serde_json::Value = serde_json::from_slice(common::qwen_tokenizer_json()).unwrap();
    doc["added_tokens"][0]["lstrip"] = serde_json::json!(true);
    let tok = Tokenizer::from_bytes(&serde_json::to_vec(&doc).unwrap(), "altered").unwrap();
    assert!(!tok.encodes_in_parallel());
}

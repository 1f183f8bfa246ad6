mod common;

use common::{qwen_model_dir, qwen_tokenizer, read_json, testdata};
use kestrel_text::Tokenizer;

#[test]
fn corpus_ids_match_reference_encoder() {
    let tok = qwen_tokenizer();
    let doc = read_json(&testdata().join("tokenizer/qwen3_6_corpus.json"));
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 300, "corpus too small: {}", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let ids = tok.encode(text, false).unwrap();
        if ids != expected {
            failures.push(format!(
                "{text:?}\n  kestrel:   {ids:?}\n  reference: {expected:?}"
            ));
            continue;
        }
        // decode(encode(x)) is x in NFC form, as the reference decodes it.
        let decoded = tok.decode(&ids, false).unwrap();
        if decoded != case["decoded"].as_str().unwrap() {
            failures.push(format!("round trip of {text:?} gave {decoded:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn special_tokens_and_sizes() {
    let tok = qwen_tokenizer();
    assert_eq!(tok.vocab_size(), 248_044 + 33);
    assert_eq!(tok.token_id("<|endoftext|>"), Some(248_044));
    assert_eq!(tok.token_id("<|im_start|>"), Some(248_045));
    assert_eq!(tok.token_id("<|im_end|>"), Some(248_046));
    assert_eq!(tok.token_id("<think>"), Some(248_068));
    assert_eq!(tok.token_id("</think>"), Some(248_069));
    assert_eq!(tok.token_id("<|no such token|>"), None);
    assert!(tok.is_special(248_046));
    assert!(
        !tok.is_special(248_068),
        "<think> must survive skip_special decoding"
    );

    let ids = tok
        .encode(
            "<|im_start|>assistant\n<think>\nhm\n</think>\n\nHi<|im_end|>",
            false,
        )
        .unwrap();
    assert_eq!(ids[0], 248_045);
    assert_eq!(*ids.last().unwrap(), 248_046);
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        "assistant\n<think>\nhm\n</think>\n\nHi"
    );
}

#[test]
fn out_of_vocabulary_id_is_an_error() {
    let tok = qwen_tokenizer();
    let err = tok.decode(&[100, 248_077], false).unwrap_err().to_string();
    assert!(
        err.contains("248077") && err.contains("out of vocabulary"),
        "{err}"
    );
    assert!(tok.decode(&[u32::MAX], false).is_err());
}

#[test]
fn model_dir_loads_eos_ids_from_all_configs() {
    let dir = qwen_model_dir();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [248046, 248044]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"text_config": {"eos_token_id": 248044}}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_model_dir(dir.path()).unwrap();
    // generation_config order first; tokenizer_config's "<|im_end|>" is already there.
    assert_eq!(tok.eos_token_ids(), &[248_046, 248_044]);
    assert_eq!(
        tok.encode("hello world", true).unwrap(),
        qwen_tokenizer().encode("hello world", true).unwrap()
    );

    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": "x"}"#,
    )
    .unwrap();
    let err = format!("{:#}", Tokenizer::from_model_dir(dir.path()).unwrap_err());
    assert!(err.contains("generation_config.json"), "{err}");
}

#[test]
fn broken_tokenizer_files_give_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let full = common::qwen_tokenizer_json();
    let cases: [(&str, &[u8]); 4] = [
        ("truncated", &full[..full.len() / 2]),
        ("not json", b"this is not json"),
        ("wrong shape", br#"{"model": {"type": "BPE", "vocab": 3}}"#),
        ("not utf8", b"\xff\xfe{}"),
    ];
    for (what, bytes) in cases {
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, bytes).unwrap();
        let err = Tokenizer::from_file(&path).expect_err(what);
        let message = format!("{err:#}");
        assert!(
            message.contains(&path.display().to_string()),
            "{what}: error does not name the file: {message}"
        );
        assert!(
            !message.contains('\n'),
            "{what}: error is not one line: {message}"
        );
    }
    let missing = dir.path().join("nowhere/tokenizer.json");
    let message = format!("{:#}", Tokenizer::from_file(&missing).unwrap_err());
    assert!(message.contains("nowhere/tokenizer.json"), "{message}");
}

#[test]
fn token_bytes_rebuild_the_text_even_where_tokens_split_characters() {
    let tok = qwen_tokenizer();
    let text = "naïve café 世界 🦀 <|im_end|>\n\tend";
    let ids = tok.encode(text, false).unwrap();
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| tok.token_bytes(id).unwrap())
        .collect();
    assert_eq!(bytes, text.as_bytes());
    // The crab (4 bytes) is split across byte-level tokens: some token's
    // bytes are not UTF-8 on their own.
    assert!(
        ids.iter()
            .any(|&id| std::str::from_utf8(&tok.token_bytes(id).unwrap()).is_err()),
        "no token splits a character: {ids:?}"
    );
    assert_eq!(tok.token_bytes(u32::MAX), None);
}

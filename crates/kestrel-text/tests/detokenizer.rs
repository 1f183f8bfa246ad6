mod common;

use common::qwen_tokenizer;
use kestrel_text::Detokenizer;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Streams `ids` through a detokeniser and returns the deltas.
fn stream(ids: &[u32], skip_special: bool) -> Vec<String> {
    let mut detok = Detokenizer::new(qwen_tokenizer(), skip_special);
    let mut deltas: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    deltas.push(detok.finish());
    deltas
}

fn random_text(rng: &mut StdRng, len: usize) -> String {
    const PIECES: &[&str] = &[
        " ",
        "  ",
        "\n",
        "\t",
        "a",
        "the",
        " quick",
        "Qwen",
        "数据",
        "模型",
        "推理",
        "テスト",
        "한국",
        "é",
        "ß",
        "😀",
        "👨‍👩‍👧‍👦",
        "🏳️‍🌈",
        "∑",
        "0",
        "42",
        "3.14",
        "<think>",
        "</think>",
        "<|im_end|>",
        "<tool_call>",
        "'s",
        "\u{200d}",
        "\u{301}",
        "fn",
        "()",
        "{}",
        ";",
        "\r\n",
    ];
    (0..len)
        .map(|_| PIECES[rng.random_range(0..PIECES.len())])
        .collect()
}

#[test]
fn deltas_concatenate_to_the_full_decode_for_random_texts() {
    let tok = qwen_tokenizer();
    let mut rng = StdRng::seed_from_u64(7);
    for _ in 0..150 {
        let len = rng.random_range(1..40);
        let text = random_text(&mut rng, len);
        let ids = tok.encode(&text, false).unwrap();
        for skip_special in [false, true] {
            let deltas = stream(&ids, skip_special);
            let full = tok.decode(&ids, skip_special).unwrap();
            assert_eq!(deltas.concat(), full, "text {text:?} ids {ids:?}");
            // Valid text never shows a replacement character mid-stream.
            assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')), "{deltas:?}");
        }
    }
}

#[test]
fn deltas_concatenate_to_the_full_decode_for_random_ids() {
    // Arbitrary ids can form invalid UTF-8; the stream must still equal the
    // (lossy) full decode.
    let tok = qwen_tokenizer();
    let vocab = tok.vocab_size() as u32;
    let mut rng = StdRng::seed_from_u64(11);
    for _ in 0..150 {
        let len = rng.random_range(1..30);
        let ids: Vec<u32> = (0..len)
            .map(|_| match rng.random_range(0..10) {
                // Low ids are the 256 single bytes: lots of broken sequences.
                0..=3 => rng.random_range(0..256),
                4 => rng.random_range(248_044..vocab),
                _ => rng.random_range(0..vocab),
            })
            .collect();
        for skip_special in [false, true] {
            let deltas = stream(&ids, skip_special);
            assert_eq!(
                deltas.concat(),
                tok.decode(&ids, skip_special).unwrap(),
                "ids {ids:?}"
            );
        }
    }
}

/// The byte-level BPE spelling of a single byte (GPT-2's byte-to-unicode map:
/// printable Latin-1 bytes stand for themselves, the rest map from U+0100 on).
fn byte_level_char(byte: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(byte) {
        return byte as char;
    }
    let shift = (0..byte).filter(|&b| !printable(b)).count() as u32;
    char::from_u32(256 + shift).unwrap()
}

#[test]
fn multibyte_characters_are_never_split() {
    let tok = qwen_tokenizer();
    let byte_token = |b: u8| {
        tok.token_id(&byte_level_char(b).to_string())
            .expect("single-byte token")
    };
    // "a", the four bytes of 😀 (F0 9F 98 80) as separate tokens, then "b".
    let mut ids = vec![byte_token(b'a')];
    ids.extend("😀".bytes().map(byte_token));
    ids.push(byte_token(b'b'));
    let mut detok = Detokenizer::new(tok, false);
    let deltas: Vec<String> = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
    assert_eq!(deltas, ["a", "", "", "", "😀", "b"]);
    assert_eq!(detok.finish(), "");

    // A character cut off at the end comes out as U+FFFD, like a full decode.
    let mut detok = Detokenizer::new(tok, false);
    assert_eq!(detok.push(byte_token(0xE4)).unwrap(), "");
    assert_eq!(detok.finish(), "\u{FFFD}");
}

#[test]
fn out_of_vocabulary_id_is_an_error_not_a_panic() {
    let tok = qwen_tokenizer();
    let mut detok = Detokenizer::new(tok, false);
    assert_eq!(detok.push(tok.token_id("Hello").unwrap()).unwrap(), "Hello");
    assert!(detok.push(tok.vocab_size() as u32 + 10).is_err());
    assert_eq!(
        detok.push(tok.encode(" world", false).unwrap()[0]).unwrap(),
        " world"
    );
}

#[test]
fn context_is_not_emitted() {
    let tok = qwen_tokenizer();
    let prompt = tok.encode("<|im_start|>assistant\n", false).unwrap();
    let mut detok = Detokenizer::with_context(tok, false, &prompt);
    let ids = tok.encode("Hi there", false).unwrap();
    let text = detok.push_all(&ids).unwrap() + &detok.finish();
    assert_eq!(text, "Hi there");
}

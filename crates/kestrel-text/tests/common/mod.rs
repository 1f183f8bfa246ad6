//! Shared test data: the Qwen3.5/3.6 tokenizer built by
//! scripts/build_qwen_tokenizer.py, stored zstd-compressed in testdata/.

#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use kestrel_text::Tokenizer;

pub fn testdata() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

pub fn qwen_dir() -> PathBuf {
    testdata().join("tokenizer/qwen3_6")
}

/// The decompressed tokenizer.json (about 10 MB).
pub fn qwen_tokenizer_json() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let path = qwen_dir().join("tokenizer.json.zst");
        let file = std::fs::File::open(&path).unwrap_or_else(|e| {
            panic!(
                "cannot open {}: {e}; regenerate it with `python3 scripts/build_qwen_tokenizer.py DIR` \
                 and `zstd -19 DIR/tokenizer.json -o {}`",
                path.display(),
                path.display()
            )
        });
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(std::io::BufReader::new(file))
            .unwrap_or_else(|e| panic!("{} is not a zstd stream: {e}", path.display()));
        let mut out = Vec::new();
        decoder.read_to_end(&mut out).unwrap_or_else(|e| panic!("decompressing {}: {e}", path.display()));
        out
    })
}

/// The Qwen tokenizer, loaded once per test binary.
pub fn qwen_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let tok = Tokenizer::from_bytes(qwen_tokenizer_json(), "qwen3_6 tokenizer.json")
            .expect("load tokenizer");
        let eos = tok.token_id("<|im_end|>").expect("<|im_end|> id");
        tok.with_eos_token_ids(vec![eos])
    })
}

/// A model folder in a temporary directory holding the Qwen tokenizer.json
/// and tokenizer_config.json, for the from_model_dir loaders.
pub fn qwen_model_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("tokenizer.json"), qwen_tokenizer_json())
        .expect("write tokenizer.json");
    std::fs::copy(
        qwen_dir().join("tokenizer_config.json"),
        dir.path().join("tokenizer_config.json"),
    )
    .expect("copy tokenizer_config.json");
    dir
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

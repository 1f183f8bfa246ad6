//! The vocabulary as llguidance sees it: each id's bytes, from the model's
//! `tokenizer.json` (byte-level BPE and byte-fallback tokenizers; special
//! tokens carry llguidance's marker byte, so text can never spell them).
//!
//! llguidance's own reader is used rather than `toktrie_hf_tokenizers`,
//! which would bring a second, older copy of the `tokenizers` crate. Only
//! masks are computed from this environment; its greedy tokenisation (used
//! by llguidance for forced tokens, which the engine does not ask for) is
//! not the model's.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// The token environment of a `tokenizer.json`. `eos_token_ids` are the
/// model's end-of-sequence ids (those inside the vocabulary are used; the
/// first is the one llguidance treats as EOS).
pub fn token_env(tokenizer_json: &[u8], eos_token_ids: &[u32]) -> Result<TokEnv> {
    let doc: serde_json::Value =
        serde_json::from_slice(tokenizer_json).context("tokenizer.json is not JSON")?;
    // The reader panics on some malformed vocabularies; a panic here must
    // only fail structured outputs.
    let words = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&doc))
        .map_err(|_| anyhow::anyhow!("cannot read the token bytes of tokenizer.json"))??;
    let vocab_size = u32::try_from(words.len()).context("vocabulary too large")?;
    let eos: Vec<u32> = eos_token_ids
        .iter()
        .copied()
        .filter(|&id| id < vocab_size)
        .collect();
    let Some(&first_eos) = eos.first() else {
        bail!("the model has no end-of-sequence id inside its vocabulary");
    };
    let trie = TokTrie::from(&TokRxInfo::new(vocab_size, first_eos), &words).with_eos_tokens(&eos);
    Ok(Arc::new(ApproximateTokEnv::new(trie)))
}

//! The model's tokenizer: a Hugging Face `tokenizer.json` plus the model's
//! end-of-sequence ids.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Result, anyhow, bail};

use crate::model_files;
use crate::parallel_encode::{PARALLEL_MIN_BYTES, encode_in_pieces, is_split_safe};

/// A loaded tokenizer. Cloning is cheap (the vocabulary is shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    hf: tokenizers::Tokenizer,
    /// Where it was loaded from, for error messages.
    origin: String,
    eos_ids: Vec<u32>,
    /// Added tokens flagged `special` (skipped by `decode(.., true)`).
    special_ids: HashSet<u32>,
    vocab_size: usize,
    /// Whether long texts may be encoded in parallel pieces (`parallel_encode`).
    split_safe: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("origin", &self.inner.origin)
            .field("vocab_size", &self.inner.vocab_size)
            .field("eos_ids", &self.inner.eos_ids)
            .finish()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and the eos ids from the folder's configs.
    pub fn from_model_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join(model_files::TOKENIZER_JSON))
    }

    /// Loads a `tokenizer.json`; eos ids come from the configs next to it
    /// (`generation_config.json`, `config.json`, `tokenizer_config.json`).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|e| anyhow!("cannot read {}: {e}", path.display()))?;
        let tokenizer = Self::from_bytes(&bytes, &path.display().to_string())?;
        let dir = model_files::parent_dir(path);
        let eos = model_files::eos_token_ids(&dir, |text| tokenizer.token_id(text))?;
        Ok(tokenizer.with_eos_token_ids(eos))
    }

    /// Parses the contents of a `tokenizer.json`; `origin` names it in errors.
    /// The tokenizer has no eos ids until [`Tokenizer::with_eos_token_ids`].
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<Self> {
        let hf = tokenizers::Tokenizer::from_bytes(bytes)
            .map_err(|e| anyhow!("{origin} is not a valid tokenizer.json: {e}"))?;
        let special_ids = hf
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, token)| token.special)
            .map(|(id, _)| id)
            .collect();
        let vocab_size = hf.get_vocab_size(true);
        let split_safe =
            serde_json::from_slice::<serde_json::Value>(bytes).is_ok_and(|doc| is_split_safe(&doc));
        Ok(Self {
            inner: Arc::new(Inner {
                hf,
                origin: origin.to_string(),
                eos_ids: Vec::new(),
                special_ids,
                vocab_size,
                split_safe,
            }),
        })
    }

    /// Replaces the end-of-sequence ids.
    pub fn with_eos_token_ids(self, eos_ids: Vec<u32>) -> Self {
        let inner = Arc::try_unwrap(self.inner).unwrap_or_else(|shared| Inner {
            hf: shared.hf.clone(),
            origin: shared.origin.clone(),
            eos_ids: Vec::new(),
            special_ids: shared.special_ids.clone(),
            vocab_size: shared.vocab_size,
            split_safe: shared.split_safe,
        });
        Self {
            inner: Arc::new(Inner { eos_ids, ..inner }),
        }
    }

    /// Token ids of `text`. `add_special` applies the tokenizer's
    /// post-processor (BOS/EOS insertion where the model has one); special
    /// tokens written in the text are recognised either way. A long text
    /// without special-token insertion is encoded in parallel pieces with
    /// the ids of one pass (`parallel_encode`).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        if !add_special && self.inner.split_safe && text.len() >= PARALLEL_MIN_BYTES {
            return encode_in_pieces(text, |piece| self.encode_one_pass(piece, false));
        }
        self.encode_one_pass(text, add_special)
    }

    /// [`Tokenizer::encode`] in one pass on the calling thread.
    pub fn encode_one_pass(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .hf
            .encode_fast(text, add_special)
            .map_err(|e| anyhow!("encoding with {} failed: {e}", self.inner.origin))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Whether long texts are encoded in parallel pieces.
    pub fn encodes_in_parallel(&self) -> bool {
        self.inner.split_safe
    }

    /// Text of `ids`; `skip_special` drops added tokens flagged special
    /// (`<|im_end|>`, ...) but keeps `<think>`, `<tool_call>` and the like.
    /// An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.check_ids(ids)?;
        self.inner
            .hf
            .decode(ids, skip_special)
            .map_err(|e| anyhow!("decoding with {} failed: {e}", self.inner.origin))
    }

    /// Fails on the first id the tokenizer cannot decode.
    pub fn check_ids(&self, ids: &[u32]) -> Result<()> {
        for &id in ids {
            if self.inner.hf.id_to_token(id).is_none() {
                bail!(
                    "token id {id} is out of vocabulary (size {})",
                    self.inner.vocab_size
                );
            }
        }
        Ok(())
    }

    /// Id of a token given by its text (a vocabulary entry in the tokenizer's
    /// own spelling, or an added token such as `<|im_end|>`).
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.hf.token_to_id(token)
    }

    /// The vocabulary spelling of `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.hf.id_to_token(id)
    }

    /// The bytes `id` stands for (possibly part of a UTF-8 character), as
    /// OpenAI's logprobs report them: an added token's content, a byte-level
    /// token's bytes, else the token decoded alone. `None` outside the
    /// vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let added = self.inner.hf.get_added_vocabulary();
        if let Some(content) = added.simple_id_to_token(id) {
            return Some(content.into_bytes());
        }
        let spelling = self.inner.hf.id_to_token(id)?;
        crate::token_bytes::byte_level_bytes(&spelling)
            .or_else(|| self.decode(&[id], false).ok().map(String::into_bytes))
    }

    /// Number of ids the tokenizer knows, added tokens included. The model's
    /// embedding table may be larger (padded); those extra ids do not decode.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    /// Ids that end generation (see `model_files::eos_token_ids` for sources).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Whether `id` is an added token flagged special.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special_ids.contains(&id)
    }

    /// Where the tokenizer came from (a path or a caller-given name).
    pub fn origin(&self) -> &str {
        &self.inner.origin
    }
}

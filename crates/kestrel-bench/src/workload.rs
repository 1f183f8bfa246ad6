//! Versioned workload files and deterministic prompt construction.
//!
//! A workload is a TOML file under `bench/workloads/`. Its prompt body is cut
//! from the corpus shipped in `bench/corpus/` (files concatenated in the listed
//! order, each preceded by a `# file: NAME` line), starting at `offset_chars`
//! and wrapping around cyclically until the body has
//! `round(target_prompt_tokens * chars_per_token)` characters minus the
//! instruction and question. The same file and corpus always give the same
//! bytes; `prompt_sha256` pins them, and loading fails when they drift.
//!
//! Token counts are approximate by characters (the corpus measures about 4.0
//! characters per token with the Qwen3.x tokenizer); the exact count comes from
//! the server's `usage`. With `exact_tokens = true` the body is trimmed with the
//! server's `/tokenize` instead, which ties the bytes to that tokenizer.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::client::ApiKind;

pub const WORKLOAD_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Unique nonce line at the start of every request: nothing can be reused.
    Cold,
    /// The shared prefix is sent first (max_tokens 1), then the timed request
    /// reuses it; reports cached and uncached prefill rates.
    Primed,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Cold => "cold",
            Mode::Primed => "primed",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CorpusSpec {
    /// Folder with the corpus files, relative to the workload file.
    pub dir: PathBuf,
    pub files: Vec<String>,
    #[serde(default)]
    pub offset_chars: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub schema_version: u32,
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub api: ApiKind,
    pub corpus: CorpusSpec,
    pub target_prompt_tokens: u64,
    #[serde(default = "default_chars_per_token")]
    pub chars_per_token: f64,
    #[serde(default)]
    pub exact_tokens: bool,
    pub instruction: String,
    pub question: String,
    pub max_tokens: u32,
    #[serde(default)]
    pub temperature: f64,
    #[serde(default = "yes")]
    pub ignore_eos: bool,
    /// Ask for usage on every chunk (vLLM `continuous_usage_stats`); exact
    /// window token counts, but not every server accepts the field.
    #[serde(default)]
    pub continuous_usage: bool,
    #[serde(default = "default_rounds")]
    pub rounds: u32,
    #[serde(default = "default_modes")]
    pub modes: Vec<Mode>,
    /// Concurrency ladder for the stream curve (cold prompts); empty skips it.
    #[serde(default)]
    pub stream_curve: Vec<u32>,
    /// Untimed requests before the first round (short, unique nonce).
    #[serde(default = "default_warmup")]
    pub warmup_requests: u32,
    /// Fraction of the body sent as the priming prefix in primed mode.
    #[serde(default = "default_prefix_fraction")]
    pub primed_prefix_fraction: f64,
    /// Fail the run when the primed (cache-hit) output differs from the cold
    /// (cache-miss) output of the same round.
    #[serde(default = "yes")]
    pub require_identical_outputs: bool,
    /// Send one untimed request with a fixed nonce after warmup and record its
    /// output: at temperature 0 it must be identical across runs of the same
    /// model (prefix cache on or off, speculative decoding on or off, another
    /// build), so runs can be compared by its hash.
    #[serde(default)]
    pub output_probe: bool,
    /// Stream-curve requests carry a fixed nonce per concurrency and stream
    /// (`c8-stream-0`, ...) instead of a random one: the same bytes every
    /// round, distinct within a round and between concurrencies (a GPU's
    /// greedy output may depend on the batch). For servers that learn from
    /// the prompts they saw (kestrel's replay proposer); with the prefix
    /// cache on, later rounds hit it.
    #[serde(default)]
    pub repeat_prompts: bool,
    /// Whole rounds run before the measured ones and left out of the results.
    #[serde(default)]
    pub warmup_rounds: u32,
    /// SHA-256 of the base prompt (instruction, body and question, no nonce).
    #[serde(default)]
    pub prompt_sha256: Option<String>,
    /// Extra JSON fields merged into every request body.
    #[serde(default)]
    pub extra_body: serde_json::Map<String, serde_json::Value>,
}

fn default_chars_per_token() -> f64 {
    4.0
}
fn yes() -> bool {
    true
}
fn default_rounds() -> u32 {
    3
}
fn default_modes() -> Vec<Mode> {
    vec![Mode::Cold]
}
fn default_warmup() -> u32 {
    1
}
fn default_prefix_fraction() -> f64 {
    1.0
}

/// The deterministic parts of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptParts {
    pub instruction: String,
    pub body: String,
    pub question: String,
}

impl PromptParts {
    pub fn base_prompt(&self) -> String {
        format!("{}\n\n{}\n\n{}", self.instruction, self.body, self.question)
    }

    /// Full prompt with a nonce line first (cold and primed requests).
    pub fn with_nonce(&self, nonce: &str) -> String {
        format!("{}{}", nonce_line(nonce), self.base_prompt())
    }

    /// The priming request: nonce, instruction and the first part of the body.
    pub fn priming_prefix(&self, nonce: &str, fraction: f64) -> String {
        let n = (self.body.chars().count() as f64 * fraction.clamp(0.0, 1.0)).round() as usize;
        let prefix: String = self.body.chars().take(n).collect();
        format!("{}{}\n\n{}", nonce_line(nonce), self.instruction, prefix)
    }

    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.base_prompt().as_bytes()))
    }
}

pub fn nonce_line(nonce: &str) -> String {
    format!("Request id: {nonce}\n")
}

pub fn random_nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Workload {
    pub fn load(path: &Path) -> Result<(Self, PathBuf)> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading workload {}", path.display()))?;
        let w: Workload = toml::from_str(&text)
            .with_context(|| format!("parsing workload {}", path.display()))?;
        w.validate()?;
        let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        Ok((w, base))
    }

    pub fn validate(&self) -> Result<()> {
        if self.schema_version != WORKLOAD_SCHEMA_VERSION {
            bail!(
                "workload {}: schema_version {} unsupported (expected {})",
                self.name,
                self.schema_version,
                WORKLOAD_SCHEMA_VERSION
            );
        }
        if self.corpus.files.is_empty() {
            bail!("workload {}: corpus.files is empty", self.name);
        }
        if !(self.chars_per_token > 0.0 && self.chars_per_token.is_finite()) {
            bail!("workload {}: chars_per_token must be positive", self.name);
        }
        if self.max_tokens < 2 {
            bail!(
                "workload {}: max_tokens must be at least 2 for a decode rate",
                self.name
            );
        }
        if self.rounds == 0 {
            bail!("workload {}: rounds must be at least 1", self.name);
        }
        if self.modes.is_empty() && self.stream_curve.is_empty() {
            bail!(
                "workload {}: neither modes nor stream_curve: nothing to measure",
                self.name
            );
        }
        if self.stream_curve.contains(&0) {
            bail!("workload {}: stream_curve entries must be >= 1", self.name);
        }
        if !(0.0..=1.0).contains(&self.primed_prefix_fraction) {
            bail!(
                "workload {}: primed_prefix_fraction must be within [0, 1]",
                self.name
            );
        }
        Ok(())
    }

    pub fn read_corpus(&self, base: &Path) -> Result<String> {
        let dir = base.join(&self.corpus.dir);
        let mut text = String::new();
        for f in &self.corpus.files {
            let p = dir.join(f);
            let content = std::fs::read_to_string(&p)
                .with_context(|| format!("reading corpus file {}", p.display()))?;
            text.push_str(&format!("# file: {f}\n"));
            text.push_str(&content);
            if !content.ends_with('\n') {
                text.push('\n');
            }
        }
        if text.is_empty() {
            bail!("corpus for workload {} is empty", self.name);
        }
        Ok(text)
    }

    /// Character budget of the body for the approximate (character) sizing.
    pub fn body_chars(&self) -> usize {
        let total = (self.target_prompt_tokens as f64 * self.chars_per_token).round() as usize;
        let fixed = self.instruction.chars().count() + self.question.chars().count() + 4;
        total.saturating_sub(fixed).max(1)
    }

    /// Prompt parts with the body cut to `body_chars` from the corpus.
    pub fn parts_with_body_chars(&self, corpus: &str, body_chars: usize) -> PromptParts {
        PromptParts {
            instruction: self.instruction.clone(),
            body: cyclic_slice(corpus, self.corpus.offset_chars, body_chars),
            question: self.question.clone(),
        }
    }

    /// Deterministic prompt by characters; verifies `prompt_sha256` when set.
    pub fn build_parts(&self, base: &Path) -> Result<PromptParts> {
        let corpus = self.read_corpus(base)?;
        let parts = self.parts_with_body_chars(&corpus, self.body_chars());
        if let Some(expected) = &self.prompt_sha256 {
            let got = parts.sha256();
            if !got.eq_ignore_ascii_case(expected) {
                bail!(
                    "workload {}: prompt bytes changed (sha256 {got}, file pins {expected}); the corpus or the workload was edited",
                    self.name
                );
            }
        }
        Ok(parts)
    }
}

/// `len` characters of `text` starting at char `offset`, wrapping around.
pub fn cyclic_slice(text: &str, offset: usize, len: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return String::new();
    }
    (0..len)
        .map(|i| chars[(offset + i) % chars.len()])
        .collect()
}

/// Largest body length (in chars, within `[lo, hi]`) whose token count is at
/// most `target`, found by bisection over a monotone counter. Returns the
/// length and its count.
pub async fn fit_body_to_tokens<F, Fut>(
    target: u64,
    mut lo: usize,
    mut hi: usize,
    mut count: F,
) -> Result<(usize, u64)>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut best = (lo, count(lo).await?);
    if best.1 > target {
        bail!("even {lo} characters exceed {target} tokens");
    }
    let top = count(hi).await?;
    if top <= target {
        return Ok((hi, top));
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        let n = count(mid).await?;
        if n <= target {
            lo = mid;
            best = (mid, n);
            if n == target {
                break;
            }
        } else {
            hi = mid;
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cyclic_slice_wraps_and_respects_chars() {
        assert_eq!(cyclic_slice("abc", 1, 7), "bcabcab");
        assert_eq!(cyclic_slice("é✓x", 2, 4), "xé✓x");
        assert_eq!(cyclic_slice("", 0, 3), "");
    }

    #[tokio::test]
    async fn bisection_finds_exact_count() {
        // A fake tokenizer: 10 fixed tokens + one per 4 characters.
        let count = |n: usize| async move { Ok::<u64, anyhow::Error>(10 + (n as u64) / 4) };
        let (len, n) = fit_body_to_tokens(1000, 0, 8000, count).await.unwrap();
        assert_eq!(n, 1000);
        assert_eq!(10 + len as u64 / 4, 1000);
    }
}

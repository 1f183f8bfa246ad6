//! The speculative-decoding flags of `serve` and `generate`: kestrel's own
//! (`--speculative ngram|mtp|dflash --num-speculative-tokens K`, with
//! `--draft-model DIR` and `--draft-window N` for DFlash) and vLLM's
//! `--speculative-config '{"method": ..., "num_speculative_tokens": ...}'`,
//! accepted as vLLM users write it, plus `--draft-vocab FILE` (in the JSON:
//! `"draft_vocab"`) for MTP or DFlash drafting over a reduced vocabulary.
//! `--speculative replay --acceptance 0.87,0.74,0.61` is the replay proposer,
//! a benchmark proposer for dummy weights (kestrel-engine's
//! `spec::prompt_replay`).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use kestrel_engine::spec::prompt_replay::PromptReplay;
use kestrel_engine::spec::replay::Profile;
use kestrel_engine::spec::{
    DflashOptions, DraftRows, DraftVocab, MtpOptions, NgramConfig, SpeculativeConfig,
    SpeculativeMethod,
};
use serde_json::Value;

#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpeculativeArgs {
    /// Speculative decoding: `ngram` (prompt lookup), `mtp` (the model's
    /// multi-token-prediction head) or `dflash` (a DFlash block drafter,
    /// --draft-model); `replay` is a benchmark proposer for
    /// dummy weights (see --acceptance). Output is the same with it on or off.
    #[arg(long, value_name = "METHOD")]
    speculative: Option<String>,
    /// Most draft tokens a sequence verifies per step.
    #[arg(long, value_name = "K")]
    num_speculative_tokens: Option<usize>,
    /// vLLM's JSON form, e.g. '{"method": "ngram", "num_speculative_tokens": 4}'.
    #[arg(long, value_name = "JSON", conflicts_with = "speculative")]
    speculative_config: Option<String>,
    /// Shortest n-gram prompt lookup matches (vLLM `prompt_lookup_min`).
    #[arg(long)]
    prompt_lookup_min: Option<usize>,
    /// Longest n-gram prompt lookup matches (vLLM `prompt_lookup_max`).
    #[arg(long)]
    prompt_lookup_max: Option<usize>,
    /// MTP or DFlash drafts only these token ids (a file: one id per line,
    /// or a JSON array), scoring only their rows of the lm_head. Output is
    /// unchanged.
    #[arg(long, value_name = "FILE")]
    draft_vocab: Option<PathBuf>,
    /// The drafter folder of `--speculative dflash` (z-lab form; in the
    /// JSON: `"model"`). K defaults to its block size minus one.
    #[arg(long, value_name = "DIR")]
    draft_model: Option<PathBuf>,
    /// Most context tokens the DFlash drafter keeps per sequence (in the
    /// JSON: `"draft_window"`).
    #[arg(long, value_name = "TOKENS")]
    draft_window: Option<usize>,
    /// Per-position acceptance rates of `--speculative replay`, e.g.
    /// 0.87,0.74,0.61 (k is their number): a greedy request whose prompt the
    /// server has answered before gets that answer as drafts, corrupted at
    /// these rates; a new prompt decodes plainly and is recorded. For
    /// timing speculative steps on dummy weights.
    #[arg(long, value_name = "RATES", value_delimiter = ',', num_args = 1..)]
    acceptance: Option<Vec<f64>>,
    /// Most decode and verify rows a speculative step brings, drafts
    /// shortened evenly to fit: `auto` (what the backend runs in one pass:
    /// 16 rows on CUDA, no limit on the CPU), `all` (no limit) or a number.
    #[arg(long, value_name = "ROWS", default_value = "auto")]
    pub draft_rows: DraftRows,
    /// Adapt each request's draft length to what it accepts: two more after
    /// a step that accepts a whole run, one fewer after a rejection, between
    /// 1 and K. Output is unchanged.
    #[arg(long)]
    pub adaptive_drafts: bool,
}

/// Drafts a step when no count is given: what both peers' Qwen3.6 recipes use for MTP (2-3).
const DEFAULT_DRAFTS: usize = 3;

impl SpeculativeArgs {
    /// Whether the method is the replay proposer (which drafts only for
    /// prompts it has seen answered).
    pub fn is_replay(&self) -> bool {
        let from_json = self.speculative_config.as_deref().and_then(|json| {
            let v: Value = serde_json::from_str(json).ok()?;
            Some(v.get("method")?.as_str()? == "replay")
        });
        self.speculative.as_deref() == Some("replay") || from_json == Some(true)
    }

    /// The settings, with no default DFlash drafter.
    #[cfg(test)]
    pub fn config(&self) -> Result<Option<SpeculativeConfig>> {
        self.config_with(|| Ok(None))
    }

    /// The settings; `default_drafter` names the drafter of `--speculative
    /// dflash` when no `--draft-model` is given (asked only then: for the
    /// bundled model, the bundled drafter).
    pub fn config_with(
        &self,
        default_drafter: impl FnOnce() -> Result<Option<PathBuf>>,
    ) -> Result<Option<SpeculativeConfig>> {
        let mut method = self.speculative.clone();
        let mut k = self.num_speculative_tokens;
        let (mut min, mut max) = (self.prompt_lookup_min, self.prompt_lookup_max);
        let mut draft_vocab = self.draft_vocab.clone();
        let mut acceptance = self.acceptance.clone();
        let mut draft_model = self.draft_model.clone();
        let mut draft_window = self.draft_window;
        if let Some(json) = &self.speculative_config {
            let v: Value = serde_json::from_str(json)
                .map_err(|e| anyhow::anyhow!("--speculative-config is not JSON: {e}"))?;
            let Some(obj) = v.as_object() else {
                bail!("--speculative-config must be a JSON object");
            };
            for (key, value) in obj {
                let as_count = || {
                    value.as_u64().map(|n| n as usize).ok_or_else(|| {
                        anyhow::anyhow!(
                            "--speculative-config: {key} must be a non-negative integer"
                        )
                    })
                };
                match key.as_str() {
                    "method" => {
                        method = Some(
                            value
                                .as_str()
                                .ok_or_else(|| {
                                    anyhow::anyhow!("--speculative-config: method must be a string")
                                })?
                                .to_string(),
                        )
                    }
                    "num_speculative_tokens" => k = Some(as_count()?),
                    "prompt_lookup_min" => min = Some(as_count()?),
                    "prompt_lookup_max" => max = Some(as_count()?),
                    "draft_vocab" => {
                        let path = value.as_str().ok_or_else(|| {
                            anyhow::anyhow!("--speculative-config: draft_vocab must be a file path")
                        })?;
                        draft_vocab = Some(path.into());
                    }
                    "acceptance" => acceptance = Some(rates(value)?),
                    "model" => {
                        let path = value.as_str().ok_or_else(|| {
                            anyhow::anyhow!("--speculative-config: model must be a folder path")
                        })?;
                        draft_model = Some(path.into());
                    }
                    "draft_window" => draft_window = Some(as_count()?),
                    other => {
                        eprintln!("warning: --speculative-config: `{other}` is not used by kestrel")
                    }
                }
            }
            if method.is_none() {
                bail!("--speculative-config needs a \"method\"");
            }
        }
        let Some(method) = method else {
            if k.is_some() {
                bail!("--num-speculative-tokens needs --speculative (ngram or mtp)");
            }
            if draft_vocab.is_some() {
                bail!("--draft-vocab needs --speculative mtp or dflash");
            }
            if acceptance.is_some() {
                bail!("--acceptance needs --speculative replay");
            }
            if draft_model.is_some() || draft_window.is_some() {
                bail!("--draft-model and --draft-window need --speculative dflash");
            }
            return Ok(None);
        };
        if method == "replay" {
            if draft_vocab.is_some() {
                bail!(NOT_DRAFTED);
            }
            return replay(acceptance, k).map(Some);
        }
        if acceptance.is_some() {
            bail!("--acceptance is for --speculative replay, not {method}");
        }
        if method == "dflash" {
            let dir = match draft_model {
                Some(dir) => Some(dir),
                None => default_drafter()?,
            };
            return dflash(dir, draft_window, k, draft_vocab.as_deref()).map(Some);
        }
        if draft_model.is_some() || draft_window.is_some() {
            bail!("--draft-model and --draft-window are for --speculative dflash");
        }
        let k = k.unwrap_or(DEFAULT_DRAFTS);
        if k == 0 {
            bail!("--num-speculative-tokens must be at least 1");
        }
        let method = match method.as_str() {
            "ngram" | "prompt_lookup" => {
                if draft_vocab.is_some() {
                    bail!(NOT_DRAFTED);
                }
                SpeculativeMethod::Ngram(NgramConfig::from_vllm(min, max, k)?)
            }
            "mtp" | "qwen3_next_mtp" | "qwen3_5_mtp" => SpeculativeMethod::Mtp(MtpOptions {
                draft_vocab: match &draft_vocab {
                    Some(path) => Some(Arc::new(DraftVocab::from_file(path)?)),
                    None => None,
                },
            }),
            other => {
                bail!(
                    "speculative method `{other}` is not supported (kestrel has: ngram, mtp, \
                     dflash, and replay for benchmarks)"
                )
            }
        };
        Ok(Some(SpeculativeConfig {
            method,
            num_speculative_tokens: k,
        }))
    }
}

/// What a draft vocabulary given to a method without a drafting head says.
const NOT_DRAFTED: &str =
    "a draft vocabulary is for MTP or DFlash drafting (--speculative mtp or dflash)";

/// DFlash drafting with the drafter in `dir`; k defaults to the drafter's
/// block size minus one.
fn dflash(
    dir: Option<PathBuf>,
    window: Option<usize>,
    k: Option<usize>,
    draft_vocab: Option<&std::path::Path>,
) -> Result<SpeculativeConfig> {
    let Some(dir) = dir else {
        bail!(
            "--speculative dflash needs --draft-model DIR (a DFlash drafter folder; only the \
             bundled model has a default one)"
        );
    };
    let k = match k {
        Some(k) => k,
        None => kestrel_models::DflashConfig::from_file(&dir.join("config.json"))?.block_size - 1,
    };
    if k == 0 {
        bail!("--num-speculative-tokens must be at least 1");
    }
    let mut options = DflashOptions::new(dir);
    if let Some(w) = window {
        options.window = w;
    }
    if let Some(path) = draft_vocab {
        options.draft_vocab = Some(Arc::new(DraftVocab::from_file(path)?));
    }
    Ok(SpeculativeConfig {
        method: SpeculativeMethod::Dflash(options),
        num_speculative_tokens: k,
    })
}

/// The replay proposer at the profile `rates`; k is the number of rates.
fn replay(rates: Option<Vec<f64>>, k: Option<usize>) -> Result<SpeculativeConfig> {
    let Some(rates) = rates else {
        bail!("--speculative replay needs --acceptance (per-position rates, e.g. 0.87,0.74,0.61)");
    };
    let profile = Profile::new(rates)?;
    if let Some(k) = k.filter(|&k| k != profile.len()) {
        bail!(
            "--num-speculative-tokens {k} disagrees with --acceptance, which gives {} positions",
            profile.len()
        );
    }
    Ok(SpeculativeConfig {
        num_speculative_tokens: profile.len(),
        method: SpeculativeMethod::External(Arc::new(PromptReplay::new(profile, 0))),
    })
}

/// A JSON array of rates (`"acceptance": [0.87, 0.74, 0.61]`).
fn rates(value: &Value) -> Result<Vec<f64>> {
    value
        .as_array()
        .and_then(|a| a.iter().map(Value::as_f64).collect::<Option<Vec<f64>>>())
        .ok_or_else(|| {
            anyhow::anyhow!("--speculative-config: acceptance must be an array of numbers")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(f: impl FnOnce(&mut SpeculativeArgs)) -> SpeculativeArgs {
        let mut a = SpeculativeArgs::default();
        f(&mut a);
        a
    }

    #[test]
    fn off_unless_asked() {
        assert!(SpeculativeArgs::default().config().unwrap().is_none());
        let err = args(|a| a.num_speculative_tokens = Some(2))
            .config()
            .unwrap_err();
        assert!(err.to_string().contains("--speculative"), "{err}");
    }

    #[test]
    fn dflash_takes_its_drafter_from_the_flags_or_the_json() {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dflash/drafter");
        let from_flags = args(|a| {
            a.speculative = Some("dflash".into());
            a.draft_model = Some(dir.clone());
        })
        .config()
        .unwrap()
        .unwrap();
        // The fixture drafter's block is 8: 7 drafts unless told otherwise.
        assert_eq!(from_flags.num_speculative_tokens, 7);
        match &from_flags.method {
            SpeculativeMethod::Dflash(o) => {
                assert_eq!((o.draft_model.as_path(), o.window), (dir.as_path(), 8192))
            }
            other => panic!("{other:?}"),
        }
        let json = format!(
            r#"{{"method": "dflash", "model": {}, "num_speculative_tokens": 5, "draft_window": 512}}"#,
            serde_json::to_string(&dir).unwrap()
        );
        let from_json = args(|a| a.speculative_config = Some(json))
            .config()
            .unwrap()
            .unwrap();
        assert_eq!(from_json.num_speculative_tokens, 5);
        match &from_json.method {
            SpeculativeMethod::Dflash(o) => assert_eq!(o.window, 512),
            other => panic!("{other:?}"),
        }
        let err = args(|a| a.speculative = Some("dflash".into()))
            .config()
            .unwrap_err();
        assert!(err.to_string().contains("--draft-model"), "{err}");
        // Without --draft-model: the default drafter, where the model has one.
        let dflash_only = args(|a| a.speculative = Some("dflash".into()));
        let by_default = dflash_only
            .config_with(|| Ok(Some(dir.clone())))
            .unwrap()
            .unwrap();
        assert_eq!(by_default.num_speculative_tokens, 7);
        match &by_default.method {
            SpeculativeMethod::Dflash(o) => assert_eq!(o.draft_model, dir),
            other => panic!("{other:?}"),
        }
        let failing = dflash_only.config_with(|| anyhow::bail!("no bundled drafter"));
        assert!(format!("{:#}", failing.unwrap_err()).contains("no bundled drafter"));
        // A drafter given by flag wins, and the default is not even asked for.
        let flagged = args(|a| {
            a.speculative = Some("dflash".into());
            a.draft_model = Some(dir.clone());
        });
        flagged
            .config_with(|| panic!("the default drafter is not asked for"))
            .unwrap();
        let err = args(|a| a.draft_model = Some(dir.clone()))
            .config()
            .unwrap_err();
        assert!(err.to_string().contains("--speculative dflash"), "{err}");
        let err = args(|a| {
            a.speculative = Some("mtp".into());
            a.draft_window = Some(10);
        })
        .config()
        .unwrap_err();
        assert!(err.to_string().contains("dflash"), "{err}");
    }

    #[test]
    fn vllm_json_is_accepted_as_is() {
        let c = args(|a| {
            a.speculative_config = Some(
                r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 2}"#.into(),
            )
        })
        .config()
        .unwrap()
        .unwrap();
        assert_eq!(c.num_speculative_tokens, 4);
        match c.method {
            SpeculativeMethod::Ngram(n) => assert_eq!((n.min_n, n.max_n, n.max_drafts), (2, 3, 4)),
            other => panic!("{other:?}"),
        }
        let c = args(|a| {
            a.speculative_config =
                Some(r#"{"method": "qwen3_next_mtp", "num_speculative_tokens": 2}"#.into())
        })
        .config()
        .unwrap()
        .unwrap();
        assert!(matches!(
            c.method,
            SpeculativeMethod::Mtp(MtpOptions { draft_vocab: None })
        ));
    }

    #[test]
    fn a_draft_vocabulary_is_read_from_the_flag_or_the_json() {
        let dir = std::env::temp_dir().join(format!("kestrel-draft-vocab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ids.txt");
        std::fs::write(&file, "9\n4\n").unwrap();
        let json = format!(
            r#"{{"method": "mtp", "num_speculative_tokens": 2, "draft_vocab": {}}}"#,
            serde_json::to_string(&file).unwrap()
        );
        let from_json = args(|a| a.speculative_config = Some(json))
            .config()
            .unwrap();
        let from_flag = args(|a| {
            a.speculative = Some("mtp".into());
            a.draft_vocab = Some(file.clone());
        })
        .config()
        .unwrap();
        for c in [from_json, from_flag] {
            match c.unwrap().method {
                SpeculativeMethod::Mtp(o) => assert_eq!(o.draft_vocab.unwrap().ids(), &[4, 9]),
                other => panic!("{other:?}"),
            }
        }
        std::fs::write(&file, "4\n4\n").unwrap();
        let err = args(|a| {
            a.speculative = Some("mtp".into());
            a.draft_vocab = Some(file.clone());
        })
        .config()
        .unwrap_err();
        assert!(format!("{err:#}").contains("listed twice"), "{err:#}");
        let err = args(|a| {
            a.speculative = Some("ngram".into());
            a.draft_vocab = Some(file.clone());
        })
        .config()
        .unwrap_err();
        assert!(err.to_string().contains("MTP or DFlash"), "{err}");
        let err = args(|a| a.draft_vocab = Some(file.clone()))
            .config()
            .unwrap_err();
        assert!(err.to_string().contains("--speculative mtp"), "{err}");
        // DFlash drafts over it too.
        std::fs::write(&file, "[4, 9]").unwrap();
        let drafter =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/dflash/drafter");
        let c = args(|a| {
            a.speculative = Some("dflash".into());
            a.draft_model = Some(drafter.clone());
            a.draft_vocab = Some(file.clone());
        })
        .config()
        .unwrap()
        .unwrap();
        match c.method {
            SpeculativeMethod::Dflash(o) => assert_eq!(o.draft_vocab.unwrap().ids(), &[4, 9]),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replay_takes_k_from_its_profile_and_says_what_it_is() {
        let c = args(|a| {
            a.speculative = Some("replay".into());
            a.acceptance = Some(vec![0.87, 0.74, 0.61]);
        })
        .config()
        .unwrap()
        .unwrap();
        assert_eq!(c.num_speculative_tokens, 3);
        let label = c.method.label();
        assert!(
            label.contains("profile 0.87/0.74/0.61")
                && label.contains("benchmark proposer for dummy weights"),
            "{label}"
        );
        let c = args(|a| {
            a.speculative_config = Some(r#"{"method": "replay", "acceptance": [1.0, 0.5]}"#.into())
        })
        .config()
        .unwrap()
        .unwrap();
        assert_eq!(c.num_speculative_tokens, 2);
        assert!(
            args(|a| a.speculative_config = Some(r#"{"method": "replay"}"#.into())).is_replay()
                && args(|a| a.speculative = Some("replay".into())).is_replay()
                && !args(|a| a.speculative = Some("ngram".into())).is_replay()
        );
        for (f, needle) in [
            (
                args(|a| a.speculative = Some("replay".into())),
                "needs --acceptance",
            ),
            (
                args(|a| {
                    a.speculative = Some("replay".into());
                    a.acceptance = Some(vec![0.5, 0.6]);
                }),
                "must not increase",
            ),
            (
                args(|a| {
                    a.speculative = Some("replay".into());
                    a.acceptance = Some(vec![0.5]);
                    a.num_speculative_tokens = Some(3);
                }),
                "disagrees",
            ),
            (
                args(|a| {
                    a.speculative = Some("ngram".into());
                    a.acceptance = Some(vec![0.5]);
                }),
                "for --speculative replay",
            ),
            (
                args(|a| a.acceptance = Some(vec![0.5])),
                "needs --speculative replay",
            ),
            (
                args(|a| {
                    a.speculative_config =
                        Some(r#"{"method": "replay", "acceptance": "0.5"}"#.into())
                }),
                "array of numbers",
            ),
        ] {
            let err = f.config().unwrap_err();
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        for (json, needle) in [
            ("[1]", "JSON object"),
            ("{", "not JSON"),
            (r#"{"num_speculative_tokens": 2}"#, "method"),
            (r#"{"method": "eagle3"}"#, "eagle3"),
            (
                r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
                "at least 1",
            ),
            (
                r#"{"method": "ngram", "num_speculative_tokens": -1}"#,
                "non-negative",
            ),
            (
                r#"{"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}"#,
                "prompt_lookup_min",
            ),
        ] {
            let err = args(|a| a.speculative_config = Some(json.into()))
                .config()
                .unwrap_err();
            assert!(err.to_string().contains(needle), "{json}: {err}");
        }
    }
}

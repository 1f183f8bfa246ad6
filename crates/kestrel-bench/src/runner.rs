//! Runs a workload against one OpenAI-compatible server: warmup, then rounds of
//! batch-1 requests per mode and the concurrency ladder of the stream curve.
//! Warm-up rounds (`warmup_rounds`) run the same requests first, unrecorded:
//! with `repeat_prompts` they send the measured rounds' prompts, for a server
//! that learns from them (kestrel's replay proposer records each prompt's
//! greedy answer).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::client::{OpenAiClient, RequestRecord};
use crate::metrics::{
    RequestMetrics, WindowThroughput, aggregate_window, request_failure, request_metrics,
};
use crate::server_metrics::{
    SpecSnapshot, acceptance_per_position, parse_spec_snapshot, speculative_method, tokens_per_step,
};
use crate::stats;
use crate::workload::{Mode, PromptParts, Workload, fit_body_to_tokens, random_nonce};

#[derive(Debug, Clone)]
pub struct RunConfig {
    pub base_url: String,
    /// Model id sent in requests; the first id of `/v1/models` when None.
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub workload: Workload,
    /// Folder the workload file lives in (corpus paths are relative to it).
    pub workload_base: PathBuf,
    /// Overrides the workload's round count.
    pub rounds: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModeRun {
    pub mode: Mode,
    pub priming: Option<RequestRecord>,
    pub record: RequestRecord,
    pub metrics: Option<RequestMetrics>,
    pub failure: Option<String>,
    pub tokens_per_step: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamStep {
    pub concurrency: u32,
    pub records: Vec<RequestRecord>,
    pub window: Option<WindowThroughput>,
    pub failures: Vec<String>,
    pub tokens_per_step: Option<f64>,
    /// Achieved acceptance of each draft position over the step.
    #[serde(default)]
    pub per_position_acceptance: Option<Vec<f64>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoundResult {
    pub round: u32,
    pub modes: Vec<ModeRun>,
    pub stream_curve: Vec<StreamStep>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesSummary {
    pub values: Vec<f64>,
    pub median: Option<f64>,
    pub cv: Option<f64>,
}

impl SeriesSummary {
    pub fn of(values: Vec<f64>) -> Self {
        SeriesSummary {
            median: stats::median(&values),
            cv: stats::coefficient_of_variation(&values),
            values,
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ModeSummary {
    pub ttft_s: SeriesSummary,
    pub prefill_tps: SeriesSummary,
    pub uncached_prefill_tps: SeriesSummary,
    pub decode_tps: SeriesSummary,
    pub prompt_tokens: SeriesSummary,
    pub cached_tokens: SeriesSummary,
    pub completion_tokens: SeriesSummary,
    pub tokens_per_step: SeriesSummary,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StreamSummary {
    pub concurrency: u32,
    pub aggregate_tps: SeriesSummary,
    pub ttft_s: SeriesSummary,
    pub tokens_per_step: SeriesSummary,
    /// Per draft position, its achieved acceptance over the rounds.
    #[serde(default)]
    pub per_position_acceptance: Vec<SeriesSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchResult {
    pub workload: String,
    pub model: String,
    pub base_url: String,
    pub prompt_sha256: String,
    pub prompt_chars: usize,
    pub rounds: Vec<RoundResult>,
    pub modes: BTreeMap<String, ModeSummary>,
    pub stream_curve: Vec<StreamSummary>,
    /// The fixed-nonce request of `output_probe` workloads.
    #[serde(default)]
    pub output_probe: Option<RequestRecord>,
    /// The speculative method the server names in its metrics (a benchmark
    /// proposer says so).
    #[serde(default)]
    pub speculative_method: Option<String>,
    pub failures: Vec<String>,
}

/// Nonce of the output probe: fixed, so every run sends the same bytes.
pub const OUTPUT_PROBE_NONCE: &str = "output-probe";

/// SHA-256 (hex) of a request's generated text.
pub fn output_sha256(r: &RequestRecord) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(r.output_text.as_bytes()))
}

fn request_body(w: &Workload, model: &str, prompt: &str, max_tokens: u32) -> Value {
    let mut stream_options = json!({"include_usage": true});
    if w.continuous_usage {
        stream_options["continuous_usage_stats"] = json!(true);
    }
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "temperature": w.temperature,
        "stream": true,
        "stream_options": stream_options,
    });
    match w.api {
        crate::client::ApiKind::Chat => {
            body["messages"] = json!([{"role": "user", "content": prompt}])
        }
        crate::client::ApiKind::Completions => body["prompt"] = json!(prompt),
    }
    if w.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    let obj = body.as_object_mut().expect("object literal");
    for (k, v) in &w.extra_body {
        obj.insert(k.clone(), v.clone());
    }
    body
}

struct Runner {
    client: OpenAiClient,
    model: String,
    w: Workload,
    parts: PromptParts,
}

impl Runner {
    async fn spec_snapshot(&self) -> Option<SpecSnapshot> {
        parse_spec_snapshot(&self.client.metrics_text().await?)
    }

    async fn send(
        &self,
        prompt: &str,
        max_tokens: u32,
        label: &str,
        epoch: Instant,
    ) -> RequestRecord {
        let body = request_body(&self.w, &self.model, prompt, max_tokens);
        self.client.stream(self.w.api, &body, label, epoch).await
    }

    async fn run_mode(&self, mode: Mode, round: u32, nonce: &str) -> ModeRun {
        let epoch = Instant::now();
        let priming = match mode {
            Mode::Cold => None,
            Mode::Primed => {
                let prefix = self
                    .parts
                    .priming_prefix(nonce, self.w.primed_prefix_fraction);
                Some(
                    self.send(&prefix, 1, &format!("round{round}-primed-prime"), epoch)
                        .await,
                )
            }
        };
        let before = self.spec_snapshot().await;
        let label = format!("round{round}-{}", mode.as_str());
        let record = self
            .send(
                &self.parts.with_nonce(nonce),
                self.w.max_tokens,
                &label,
                epoch,
            )
            .await;
        let after = self.spec_snapshot().await;
        let mut failure = priming
            .as_ref()
            .and_then(|p| p.error.clone().map(|e| format!("{}: {e}", p.label)));
        let metrics = match request_metrics(&record) {
            Ok(m) => Some(m),
            Err(e) => {
                failure.get_or_insert(e);
                None
            }
        };
        ModeRun {
            mode,
            priming,
            record,
            metrics,
            failure,
            tokens_per_step: before
                .zip(after)
                .and_then(|(b, a)| tokens_per_step(&b.counters, &a.counters)),
        }
    }

    async fn run_stream_step(&self, c: u32, round: u32) -> StreamStep {
        let epoch = Instant::now();
        let prompts: Vec<(String, String)> = (0..c)
            .map(|i| {
                let nonce = if self.w.repeat_prompts {
                    format!("c{c}-stream-{i}")
                } else {
                    random_nonce()
                };
                (
                    self.parts.with_nonce(&nonce),
                    format!("round{round}-c{c}-s{i}"),
                )
            })
            .collect();
        let before = self.spec_snapshot().await;
        let records = join_all(
            prompts
                .iter()
                .map(|(p, l)| self.send(p, self.w.max_tokens, l, epoch)),
        )
        .await;
        let after = self.spec_snapshot().await;
        let failures: Vec<String> = records.iter().filter_map(request_failure).collect();
        StreamStep {
            concurrency: c,
            window: aggregate_window(&records),
            records,
            failures,
            tokens_per_step: before
                .as_ref()
                .zip(after.as_ref())
                .and_then(|(b, a)| tokens_per_step(&b.counters, &a.counters)),
            per_position_acceptance: before
                .zip(after)
                .and_then(|(b, a)| acceptance_per_position(&b, &a)),
        }
    }
}

async fn build_parts(
    client: &OpenAiClient,
    model: &str,
    w: &Workload,
    base: &std::path::Path,
) -> Result<PromptParts> {
    if !w.exact_tokens {
        return w.build_parts(base);
    }
    let corpus = w.read_corpus(base)?;
    let approx = w.body_chars();
    let count = |n: usize| {
        let text = w.parts_with_body_chars(&corpus, n).base_prompt();
        async move { client.tokenize_count(model, &text).await }
    };
    let (n, got) = fit_body_to_tokens(w.target_prompt_tokens, 1, approx.saturating_mul(2).max(2), count)
        .await
        .context("trimming the prompt with the server's /tokenize (set exact_tokens = false to size by characters)")?;
    if got != w.target_prompt_tokens {
        eprintln!(
            "note: closest prompt has {got} tokens (target {})",
            w.target_prompt_tokens
        );
    }
    Ok(w.parts_with_body_chars(&corpus, n))
}

/// Run the whole workload; failed requests are recorded, never fatal.
pub async fn run_workload(cfg: &RunConfig) -> Result<BenchResult> {
    let client = OpenAiClient::new(&cfg.base_url, cfg.api_key.clone())?;
    let model = match &cfg.model {
        Some(m) => m.clone(),
        None => client
            .models()
            .await?
            .into_iter()
            .next()
            .context("server lists no model in /v1/models; pass the model id")?,
    };
    let w = cfg.workload.clone();
    let parts = build_parts(&client, &model, &w, &cfg.workload_base).await?;
    let runner = Runner {
        client,
        model: model.clone(),
        w: w.clone(),
        parts,
    };
    let rounds = cfg.rounds.unwrap_or(w.rounds);
    if rounds == 0 {
        bail!("rounds must be at least 1");
    }

    for i in 0..w.warmup_requests {
        let nonce = random_nonce();
        let warm = runner.parts.priming_prefix(&nonce, 0.05);
        let rec = runner
            .send(&warm, 8, &format!("warmup{i}"), Instant::now())
            .await;
        if let Some(e) = rec.error {
            bail!("warmup request failed, is the server up and the model id right? {e}");
        }
    }

    let probe = if w.output_probe {
        let prompt = runner.parts.with_nonce(OUTPUT_PROBE_NONCE);
        Some(
            runner
                .send(&prompt, w.max_tokens, "output-probe", Instant::now())
                .await,
        )
    } else {
        None
    };

    let speculative_method = runner
        .client
        .metrics_text()
        .await
        .and_then(|t| speculative_method(&t));
    for round in 1..=w.warmup_rounds {
        for &mode in &w.modes {
            runner.run_mode(mode, 0, &random_nonce()).await;
        }
        for &c in &w.stream_curve {
            let step = runner.run_stream_step(c, 0).await;
            if let Some(f) = step.failures.first() {
                bail!("warm-up round {round} failed: {f}");
            }
        }
    }

    let mut results = Vec::new();
    for round in 1..=rounds {
        // One nonce per round: cold (cache miss) and primed (cache hit) see the
        // same prompt, so at temperature 0 their outputs must be identical.
        let nonce = random_nonce();
        let mut modes = Vec::new();
        for &mode in &w.modes {
            modes.push(runner.run_mode(mode, round, &nonce).await);
        }
        let mut curve = Vec::new();
        for &c in &w.stream_curve {
            curve.push(runner.run_stream_step(c, round).await);
        }
        results.push(RoundResult {
            round,
            modes,
            stream_curve: curve,
        });
    }
    let mut result = summarize(&w, &model, &cfg.base_url, &runner.parts, results);
    if let Some(p) = &probe
        && let Some(f) = request_failure(p)
    {
        result.failures.push(f);
    }
    result.output_probe = probe;
    result.speculative_method = speculative_method;
    Ok(result)
}

pub fn summarize(
    w: &Workload,
    model: &str,
    base_url: &str,
    parts: &PromptParts,
    rounds: Vec<RoundResult>,
) -> BenchResult {
    let mut failures = Vec::new();
    let mut modes = BTreeMap::new();
    for &mode in &w.modes {
        let runs: Vec<&ModeRun> = rounds
            .iter()
            .flat_map(|r| r.modes.iter())
            .filter(|m| m.mode == mode)
            .collect();
        failures.extend(runs.iter().filter_map(|m| m.failure.clone()));
        let ms: Vec<&RequestMetrics> = runs.iter().filter_map(|m| m.metrics.as_ref()).collect();
        let pick = |f: &dyn Fn(&RequestMetrics) -> Option<f64>| {
            SeriesSummary::of(ms.iter().filter_map(|m| f(m)).collect())
        };
        for m in &ms {
            if m.decode_tps.is_none() {
                failures.push(format!(
                    "{} run: decode rate undefined ({} completion tokens)",
                    mode.as_str(),
                    m.completion_tokens
                ));
            }
        }
        modes.insert(
            mode.as_str().to_string(),
            ModeSummary {
                ttft_s: pick(&|m| Some(m.ttft_s)),
                prefill_tps: pick(&|m| Some(m.prefill_tps)),
                uncached_prefill_tps: pick(&|m| m.uncached_prefill_tps),
                decode_tps: pick(&|m| m.decode_tps),
                prompt_tokens: pick(&|m| Some(m.prompt_tokens as f64)),
                cached_tokens: pick(&|m| m.cached_tokens.map(|c| c as f64)),
                completion_tokens: pick(&|m| Some(m.completion_tokens as f64)),
                tokens_per_step: SeriesSummary::of(
                    runs.iter().filter_map(|m| m.tokens_per_step).collect(),
                ),
            },
        );
    }
    if w.require_identical_outputs {
        for r in &rounds {
            let ok: Vec<&ModeRun> = r.modes.iter().filter(|m| m.failure.is_none()).collect();
            if let (Some(a), Some(b)) = (
                ok.iter().find(|m| m.mode == Mode::Cold),
                ok.iter().find(|m| m.mode == Mode::Primed),
            ) && a.record.output_text != b.record.output_text
            {
                failures.push(format!(
                    "round {}: cache-hit output differs from cache-miss output at temperature 0 (first difference at char {})",
                    r.round,
                    first_difference(&a.record.output_text, &b.record.output_text)
                ));
            }
        }
    }
    let mut stream_curve = Vec::new();
    for &c in &w.stream_curve {
        let steps: Vec<&StreamStep> = rounds
            .iter()
            .flat_map(|r| r.stream_curve.iter())
            .filter(|s| s.concurrency == c)
            .collect();
        for s in &steps {
            failures.extend(s.failures.iter().cloned());
            if s.failures.is_empty() && s.window.is_none() {
                failures.push(format!(
                    "c={c}: the streams never decoded together (empty window)"
                ));
            }
        }
        let ttfts: Vec<f64> = steps
            .iter()
            .flat_map(|s| s.records.iter())
            .filter_map(|r| request_metrics(r).ok().map(|m| m.ttft_s))
            .collect();
        stream_curve.push(StreamSummary {
            concurrency: c,
            aggregate_tps: SeriesSummary::of(
                steps
                    .iter()
                    .filter_map(|s| s.window.as_ref().map(|w| w.tokens_per_s))
                    .collect(),
            ),
            ttft_s: SeriesSummary::of(ttfts),
            tokens_per_step: SeriesSummary::of(
                steps.iter().filter_map(|s| s.tokens_per_step).collect(),
            ),
            per_position_acceptance: per_position_series(&steps),
        });
    }
    BenchResult {
        workload: w.name.clone(),
        model: model.to_string(),
        base_url: base_url.to_string(),
        prompt_sha256: parts.sha256(),
        prompt_chars: parts.base_prompt().chars().count(),
        rounds,
        modes,
        stream_curve,
        output_probe: None,
        speculative_method: None,
        failures,
    }
}

/// Each draft position's achieved acceptance over the steps that drafted.
fn per_position_series(steps: &[&StreamStep]) -> Vec<SeriesSummary> {
    let per_round: Vec<&Vec<f64>> = steps
        .iter()
        .filter_map(|s| s.per_position_acceptance.as_ref())
        .collect();
    let positions = per_round.iter().map(|p| p.len()).max().unwrap_or(0);
    (0..positions)
        .map(|i| SeriesSummary::of(per_round.iter().filter_map(|p| p.get(i).copied()).collect()))
        .collect()
}

fn first_difference(a: &str, b: &str) -> usize {
    a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count()
}

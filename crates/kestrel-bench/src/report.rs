//! Evidence written for every run: JSON per round, a JSON result, a Markdown
//! summary and SVG plots.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::env::{EnvReport, PreflightCheck};
use crate::lock::ReleaseLock;
use crate::outcome::{Classification, MetricKind};
use crate::plot;
use crate::runner::{BenchResult, SeriesSummary};

/// Everything about one run, as written to `result.json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub result: BenchResult,
    pub environment: EnvReport,
    pub preflight: Vec<PreflightCheck>,
    pub server_command: Option<String>,
    /// When the run finished, RFC 3339 in UTC.
    pub date_utc: String,
    pub classification: Option<Classification>,
    pub evidence_dir: PathBuf,
}

pub fn now_utc() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn fmt_opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn fmt_cv(s: &SeriesSummary) -> String {
    s.cv.map_or("undef".into(), |c| format!("{:.2}%", c * 100.0))
}

pub fn summary_markdown(r: &Report, lock: Option<&ReleaseLock>) -> String {
    let mut md = String::new();
    let res = &r.result;
    let _ = writeln!(md, "# Benchmark: {}\n", res.workload);
    if let Some(c) = &r.classification {
        let _ = writeln!(md, "**Outcome: {}**\n", c.outcome);
        for reason in &c.reasons {
            let _ = writeln!(md, "- {reason}");
        }
        md.push('\n');
    }
    let _ = writeln!(md, "- date (UTC): {}", r.date_utc);
    let _ = writeln!(md, "- server: {} (model `{}`)", res.base_url, res.model);
    if let Some(cmd) = &r.server_command {
        let _ = writeln!(md, "- command: `{cmd}`");
    }
    let _ = writeln!(
        md,
        "- prompt: {} chars, sha256 `{}`",
        res.prompt_chars, res.prompt_sha256
    );
    let _ = writeln!(md, "- rounds: {}", res.rounds.len());
    let env = &r.environment;
    let gpu = env.gpus.first().map_or("no GPU".to_string(), |g| {
        format!(
            "{} x {} (driver {})",
            env.gpus.len(),
            g.name,
            g.driver_version
        )
    });
    let _ = writeln!(
        md,
        "- environment: {gpu}, CUDA {}, CPU {} ({} threads), {} / kernel {}, machine commitment `{}`",
        env.cuda_version.as_deref().unwrap_or("-"),
        env.cpu_model.as_deref().unwrap_or("-"),
        env.cpu_count,
        env.os.as_deref().unwrap_or("-"),
        env.kernel.as_deref().unwrap_or("-"),
        env.machine_commitment.as_deref().unwrap_or("-")
    );
    if let Some(method) = &res.speculative_method {
        let _ = writeln!(md, "- speculative decoding: {method}");
    }
    if let Some(p) = &res.output_probe {
        let _ = writeln!(
            md,
            "- output probe: {} completion tokens, {} chars, sha256 `{}` (equal hashes: identical greedy output)",
            p.usage.map_or(0, |u| u.completion_tokens),
            p.output_text.chars().count(),
            crate::runner::output_sha256(p)
        );
    }
    md.push('\n');
    md.push_str(
        "| mode | metric | rounds | median | CV | reference |\n|---|---|---|---|---|---|\n",
    );
    for (mode, s) in &res.modes {
        let refs = lock.and_then(|l| l.reference.get(mode));
        for (name, series, digits, reference) in [
            ("TTFT (s)", &s.ttft_s, 3, refs.map(|x| x.ttft_s)),
            (
                "prefill tok/s",
                &s.prefill_tps,
                1,
                refs.map(|x| x.prefill_tps),
            ),
            ("uncached prefill tok/s", &s.uncached_prefill_tps, 1, None),
            ("decode tok/s", &s.decode_tps, 2, refs.map(|x| x.decode_tps)),
            ("prompt tokens", &s.prompt_tokens, 0, None),
            ("cached tokens", &s.cached_tokens, 0, None),
            ("completion tokens", &s.completion_tokens, 0, None),
            ("tokens per step", &s.tokens_per_step, 2, None),
        ] {
            if series.values.is_empty() {
                continue;
            }
            let vals = series
                .values
                .iter()
                .map(|v| format!("{v:.digits$}"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                md,
                "| {mode} | {name} | {vals} | {} | {} | {} |",
                fmt_opt(series.median, digits),
                fmt_cv(series),
                fmt_opt(reference, digits)
            );
        }
    }
    if !res.stream_curve.is_empty() {
        md.push_str("\n## Stream curve\n\n| streams | aggregate tok/s (median) | CV | TTFT median (s) | tokens per step | acceptance per position (median) |\n|---|---|---|---|---|---|\n");
        for s in &res.stream_curve {
            let per_position: Vec<String> = s
                .per_position_acceptance
                .iter()
                .map(|p| fmt_opt(p.median, 2))
                .collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                s.concurrency,
                fmt_opt(s.aggregate_tps.median, 1),
                fmt_cv(&s.aggregate_tps),
                fmt_opt(s.ttft_s.median, 3),
                fmt_opt(s.tokens_per_step.median, 2),
                per_position.join(" / ")
            );
        }
    }
    if !r.preflight.is_empty() {
        md.push_str("\n## Preflight\n\n");
        for c in &r.preflight {
            let _ = writeln!(md, "- {:?} {}: {}", c.level, c.name, c.detail);
        }
    }
    if !res.failures.is_empty() {
        md.push_str("\n## Failures\n\n");
        for f in &res.failures {
            let _ = writeln!(md, "- {f}");
        }
    }
    md.push_str("\nDefinitions: TTFT from request write to the first token-bearing chunk; prefill = prompt_tokens / TTFT; decode = (completion_tokens - 1) / (t_last - t_first); CV = sample std / mean.\n");
    md
}

/// Write all evidence files into `r.evidence_dir`.
pub fn write_evidence(r: &Report, lock: Option<&ReleaseLock>) -> Result<()> {
    let dir = &r.evidence_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let write = |name: &str, text: String| -> Result<()> {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))
    };
    for round in &r.result.rounds {
        write(
            &format!("round-{:02}.json", round.round),
            serde_json::to_string_pretty(round)?,
        )?;
    }
    write("result.json", serde_json::to_string_pretty(r)?)?;
    write("summary.md", summary_markdown(r, lock))?;
    write_plots(r, lock, dir)
}

fn write_plots(r: &Report, lock: Option<&ReleaseLock>, dir: &Path) -> Result<()> {
    let res = &r.result;
    let tol = lock.map_or(0.05, |l| l.tolerances.metric_rel);
    for (mode, s) in &res.modes {
        let refs = lock.and_then(|l| l.reference.get(mode));
        for (metric, series, reference) in [
            (MetricKind::TtftS, &s.ttft_s, refs.map(|x| x.ttft_s)),
            (
                MetricKind::DecodeTps,
                &s.decode_tps,
                refs.map(|x| x.decode_tps),
            ),
            (
                MetricKind::PrefillTps,
                &s.prefill_tps,
                refs.map(|x| x.prefill_tps),
            ),
        ] {
            let file = format!(
                "{mode}-{}.svg",
                serde_json::to_value(metric)?.as_str().unwrap_or("metric")
            );
            plot::rounds_svg(
                &dir.join(file),
                &format!("{} {mode}: {}", res.workload, metric.label()),
                metric.label(),
                &series.values,
                reference,
                tol,
            )?;
        }
    }
    if !res.stream_curve.is_empty() {
        let per_round: Vec<(u32, Vec<f64>)> = res
            .stream_curve
            .iter()
            .map(|s| (s.concurrency, s.aggregate_tps.values.clone()))
            .collect();
        let medians: Vec<(u32, f64)> = res
            .stream_curve
            .iter()
            .filter_map(|s| s.aggregate_tps.median.map(|m| (s.concurrency, m)))
            .collect();
        plot::stream_curve_svg(
            &dir.join("stream-curve.svg"),
            &format!("{}: stream curve", res.workload),
            &per_round,
            &medians,
        )?;
    }
    Ok(())
}

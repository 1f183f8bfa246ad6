//! Outcome classification of a reproduction run against a locked reference.
//!
//! Exactly one outcome per run, decided in this order (first match wins):
//! 1. `NOT_REPRODUCED` when the run failed (request error, empty output, missing
//!    usage, or a metric that could not be computed): a crash is never excused.
//! 2. `COMPATIBILITY_RUN` when the environment fingerprint differs from the lock:
//!    figures from another machine say nothing about the locked target.
//! 3. `INVALID_RUN` when any across-round CV is above the limit or undefined
//!    (fewer than two rounds, non-positive mean): noise is not called a regression.
//! 4. `NOT_REPRODUCED` when any metric is worse than the reference by more than
//!    the tolerance.
//! 5. `PERFORMANCE_PASS_BASELINE_DIVERGENCE` when nothing regressed but at least
//!    one metric is better than the reference by more than the tolerance.
//! 6. `REPRODUCED` otherwise.
//!
//! Boundaries are inclusive: a CV of exactly 3% passes, and a metric exactly 5%
//! better or worse is within tolerance. Comparisons allow a relative slack of
//! 1e-9 so that decimal references (74.6 * 1.05) are not pushed across a
//! boundary by binary rounding.

use serde::{Deserialize, Serialize};

use crate::stats;

/// Slack for float comparisons at the tolerance boundaries.
const BOUNDARY_EPS: f64 = 1e-9;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Outcome {
    Reproduced,
    PerformancePassBaselineDivergence,
    NotReproduced,
    InvalidRun,
    CompatibilityRun,
    /// A run without a reference whose figures are steady across rounds
    /// (see [`crate::spread`]); never the outcome of a locked run.
    Measured,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Reproduced => "REPRODUCED",
            Outcome::PerformancePassBaselineDivergence => "PERFORMANCE_PASS_BASELINE_DIVERGENCE",
            Outcome::NotReproduced => "NOT_REPRODUCED",
            Outcome::InvalidRun => "INVALID_RUN",
            Outcome::CompatibilityRun => "COMPATIBILITY_RUN",
            Outcome::Measured => "MEASURED",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which metric; decides the direction in which "better" lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Time to first token, seconds: lower is better.
    TtftS,
    /// prompt_tokens / TTFT: higher is better.
    PrefillTps,
    /// (completion_tokens - 1) / (t_last - t_first): higher is better.
    DecodeTps,
    /// Aggregate completion tok/s over the all-streams-decoding window.
    AggregateTps,
}

impl MetricKind {
    pub fn higher_is_better(self) -> bool {
        !matches!(self, MetricKind::TtftS)
    }
    pub fn label(self) -> &'static str {
        match self {
            MetricKind::TtftS => "TTFT (s)",
            MetricKind::PrefillTps => "prefill tok/s",
            MetricKind::DecodeTps => "decode tok/s",
            MetricKind::AggregateTps => "aggregate tok/s",
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Tolerances {
    /// Allowed relative deviation from the reference (0.05 = 5%).
    pub metric_rel: f64,
    /// Largest acceptable across-round coefficient of variation (0.03 = 3%).
    pub cv_max: f64,
}

impl Default for Tolerances {
    fn default() -> Self {
        Tolerances {
            metric_rel: 0.05,
            cv_max: 0.03,
        }
    }
}

/// Per-round values of one metric in one mode, with its locked reference.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricSeries {
    pub mode: String,
    pub metric: MetricKind,
    pub reference: f64,
    pub values: Vec<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Within,
    Better,
    Regressed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetricCheck {
    pub mode: String,
    pub metric: MetricKind,
    pub reference: f64,
    pub values: Vec<f64>,
    pub median: Option<f64>,
    pub cv: Option<f64>,
    /// Signed improvement relative to the reference: positive means better,
    /// whatever the metric's direction.
    pub relative_gain: Option<f64>,
    pub verdict: Option<Verdict>,
    pub cv_ok: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClassifyInput {
    /// Reasons the run failed; any entry makes the run NOT_REPRODUCED.
    pub failures: Vec<String>,
    /// Fingerprint fields that differ from the lock.
    pub compatibility_mismatches: Vec<String>,
    pub series: Vec<MetricSeries>,
    pub tolerances: Tolerances,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Classification {
    pub outcome: Outcome,
    pub reasons: Vec<String>,
    pub checks: Vec<MetricCheck>,
}

/// Relative improvement of `measured` over `reference` for a metric direction.
pub fn relative_gain(metric: MetricKind, reference: f64, measured: f64) -> Option<f64> {
    if !(reference.is_finite() && measured.is_finite()) || reference <= 0.0 {
        return None;
    }
    Some(if metric.higher_is_better() {
        (measured - reference) / reference
    } else {
        (reference - measured) / reference
    })
}

pub fn verdict(gain: f64, tolerance: f64) -> Verdict {
    if gain > tolerance + BOUNDARY_EPS {
        Verdict::Better
    } else if gain < -tolerance - BOUNDARY_EPS {
        Verdict::Regressed
    } else {
        Verdict::Within
    }
}

pub fn check_series(series: &MetricSeries, tol: &Tolerances) -> MetricCheck {
    let median = stats::median(&series.values);
    let cv = stats::coefficient_of_variation(&series.values);
    let relative_gain = median.and_then(|m| relative_gain(series.metric, series.reference, m));
    MetricCheck {
        mode: series.mode.clone(),
        metric: series.metric,
        reference: series.reference,
        values: series.values.clone(),
        median,
        cv,
        relative_gain,
        verdict: relative_gain.map(|g| verdict(g, tol.metric_rel)),
        cv_ok: cv.is_some_and(|c| c <= tol.cv_max + BOUNDARY_EPS),
    }
}

/// "mode metric: CV x% > y%" for every check whose CV is above the limit or
/// undefined; empty when the run is steady.
pub fn noisy_reasons(checks: &[MetricCheck], tol: &Tolerances) -> Vec<String> {
    checks
        .iter()
        .filter(|c| !c.cv_ok)
        .map(|c| {
            let name = format!("{} {}", c.mode, c.metric.label());
            match c.cv {
                Some(cv) => format!("{name}: CV {:.2}% > {:.2}%", cv * 100.0, tol.cv_max * 100.0),
                None => format!("{name}: CV undefined over {} round(s)", c.values.len()),
            }
        })
        .collect()
}

pub fn classify(input: &ClassifyInput) -> Classification {
    let tol = &input.tolerances;
    let checks: Vec<MetricCheck> = input.series.iter().map(|s| check_series(s, tol)).collect();
    let name = |c: &MetricCheck| format!("{} {}", c.mode, c.metric.label());

    let mut failures = input.failures.clone();
    if input.series.is_empty() {
        failures.push("no metric was compared against a reference".into());
    }
    for c in &checks {
        if c.median.is_none() || c.relative_gain.is_none() {
            failures.push(format!("{}: no usable value", name(c)));
        }
    }
    if !failures.is_empty() {
        return Classification {
            outcome: Outcome::NotReproduced,
            reasons: failures,
            checks,
        };
    }
    if !input.compatibility_mismatches.is_empty() {
        return Classification {
            outcome: Outcome::CompatibilityRun,
            reasons: input.compatibility_mismatches.clone(),
            checks,
        };
    }
    let noisy = noisy_reasons(&checks, tol);
    if !noisy.is_empty() {
        return Classification {
            outcome: Outcome::InvalidRun,
            reasons: noisy,
            checks,
        };
    }
    let describe = |c: &MetricCheck| {
        format!(
            "{}: median {:.4} vs reference {:.4} ({:+.2}% gain)",
            name(c),
            c.median.unwrap_or(f64::NAN),
            c.reference,
            c.relative_gain.unwrap_or(f64::NAN) * 100.0
        )
    };
    let regressed: Vec<String> = checks
        .iter()
        .filter(|c| c.verdict == Some(Verdict::Regressed))
        .map(describe)
        .collect();
    if !regressed.is_empty() {
        return Classification {
            outcome: Outcome::NotReproduced,
            reasons: regressed,
            checks,
        };
    }
    let better: Vec<String> = checks
        .iter()
        .filter(|c| c.verdict == Some(Verdict::Better))
        .map(describe)
        .collect();
    if !better.is_empty() {
        return Classification {
            outcome: Outcome::PerformancePassBaselineDivergence,
            reasons: better,
            checks,
        };
    }
    Classification {
        outcome: Outcome::Reproduced,
        reasons: vec!["all metrics within tolerance and all CVs within the limit".into()],
        checks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(metric: MetricKind, reference: f64, values: &[f64]) -> MetricSeries {
        MetricSeries {
            mode: "cold".into(),
            metric,
            reference,
            values: values.to_vec(),
        }
    }

    fn run(series: Vec<MetricSeries>) -> Outcome {
        classify(&ClassifyInput {
            series,
            ..Default::default()
        })
        .outcome
    }

    #[test]
    fn reproduced_when_all_within() {
        let o = run(vec![
            series(MetricKind::TtftS, 24.82, &[24.8, 24.9, 24.7]),
            series(MetricKind::PrefillTps, 4263.0, &[4260.0, 4270.0, 4250.0]),
            series(MetricKind::DecodeTps, 74.6, &[74.0, 74.5, 75.0]),
        ]);
        assert_eq!(o, Outcome::Reproduced);
    }

    #[test]
    fn exactly_five_percent_better_is_within() {
        let r = 74.6;
        let v = r * 1.05;
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, r, &[v, v, v])]),
            Outcome::Reproduced
        );
        // TTFT 5% lower is 5% better.
        let t = 24.82 * 0.95;
        assert_eq!(
            run(vec![series(MetricKind::TtftS, 24.82, &[t, t, t])]),
            Outcome::Reproduced
        );
        // Exactly 5% worse is also within.
        let w = r * 0.95;
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, r, &[w, w, w])]),
            Outcome::Reproduced
        );
    }

    #[test]
    fn more_than_five_percent_better_diverges_and_worse_fails() {
        let v = 100.0 * 1.051;
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, 100.0, &[v, v, v])]),
            Outcome::PerformancePassBaselineDivergence
        );
        let t = 10.0 * 1.051; // TTFT longer: worse
        assert_eq!(
            run(vec![series(MetricKind::TtftS, 10.0, &[t, t, t])]),
            Outcome::NotReproduced
        );
    }

    #[test]
    fn regression_beats_divergence() {
        let o = run(vec![
            series(MetricKind::DecodeTps, 100.0, &[120.0, 120.0, 120.0]),
            series(MetricKind::PrefillTps, 100.0, &[80.0, 80.0, 80.0]),
        ]);
        assert_eq!(o, Outcome::NotReproduced);
    }

    #[test]
    fn cv_exactly_three_percent_passes_above_is_invalid() {
        assert_eq!(
            run(vec![series(
                MetricKind::DecodeTps,
                100.0,
                &[97.0, 100.0, 103.0]
            )]),
            Outcome::Reproduced
        );
        assert_eq!(
            run(vec![series(
                MetricKind::DecodeTps,
                100.0,
                &[96.9, 100.0, 103.1]
            )]),
            Outcome::InvalidRun
        );
    }

    #[test]
    fn noise_is_not_called_a_regression() {
        // Median regressed by 20% but the series is noisy: INVALID_RUN.
        let o = run(vec![series(
            MetricKind::DecodeTps,
            100.0,
            &[60.0, 80.0, 100.0],
        )]);
        assert_eq!(o, Outcome::InvalidRun);
    }

    #[test]
    fn single_round_cv_undefined_is_invalid_zero_cv_passes() {
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, 100.0, &[100.0])]),
            Outcome::InvalidRun
        );
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, 100.0, &[100.0, 100.0])]),
            Outcome::Reproduced
        );
    }

    #[test]
    fn failures_and_compatibility_take_precedence() {
        let good = vec![series(MetricKind::DecodeTps, 100.0, &[100.0, 100.0, 100.0])];
        let failed = ClassifyInput {
            failures: vec!["empty output".into()],
            compatibility_mismatches: vec!["gpu".into()],
            series: good.clone(),
            ..Default::default()
        };
        assert_eq!(classify(&failed).outcome, Outcome::NotReproduced);
        let compat = ClassifyInput {
            compatibility_mismatches: vec!["gpu".into()],
            series: vec![series(MetricKind::DecodeTps, 100.0, &[10.0, 50.0, 100.0])],
            ..Default::default()
        };
        assert_eq!(classify(&compat).outcome, Outcome::CompatibilityRun);
        assert_eq!(run(vec![]), Outcome::NotReproduced);
        assert_eq!(
            run(vec![series(MetricKind::DecodeTps, 100.0, &[])]),
            Outcome::NotReproduced
        );
    }
}

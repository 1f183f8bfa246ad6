//! Release lock: everything a reproduction must hold fixed, in one JSON file.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::env::{EnvReport, Fingerprint};
use crate::manifest::{MANIFEST_VERSION, Manifest, ManifestFile};
use crate::outcome::{ClassifyInput, MetricKind, MetricSeries, Tolerances};
use crate::profile::Profile;
use crate::runner::BenchResult;
use crate::workload::Workload;

pub const LOCK_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LockedModel {
    pub repo: String,
    pub revision: String,
    #[serde(default)]
    pub modelscope_repo: Option<String>,
    #[serde(default)]
    pub modelscope_revision: Option<String>,
    pub files: Vec<ManifestFile>,
}

impl LockedModel {
    pub fn manifest(&self) -> Manifest {
        Manifest {
            manifest_version: MANIFEST_VERSION,
            repo: Some(self.repo.clone()),
            revision: Some(self.revision.clone()),
            files: self.files.clone(),
        }
    }
}

/// Three-round medians of one mode.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct ReferenceFigures {
    pub ttft_s: f64,
    pub prefill_tps: f64,
    pub decode_tps: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReleaseLock {
    pub lock_version: u32,
    pub kestrel_commit: String,
    pub model: LockedModel,
    pub profile: Profile,
    /// Workload file path relative to the repository root.
    pub workload_path: String,
    pub workload: Workload,
    pub prompt_sha256: String,
    /// Per mode (`cold`, `primed`).
    pub reference: BTreeMap<String, ReferenceFigures>,
    /// Aggregate tok/s medians per concurrency, informative (not classified).
    #[serde(default)]
    pub reference_stream_curve: BTreeMap<u32, f64>,
    pub tolerances: Tolerances,
    pub environment: Fingerprint,
    pub machine_salt: String,
    pub machine_commitment: Option<String>,
}

impl ReleaseLock {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading lock {}", path.display()))?;
        let lock: ReleaseLock = serde_json::from_str(&text)
            .with_context(|| format!("parsing lock {}", path.display()))?;
        if lock.lock_version != LOCK_VERSION {
            bail!("lock_version {} unsupported", lock.lock_version);
        }
        lock.model.manifest().validate()?;
        if lock.reference.is_empty() {
            bail!("lock has no reference figures");
        }
        Ok(lock)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Lock a finished run: its medians become the reference.
    #[allow(clippy::too_many_arguments)]
    pub fn from_run(
        kestrel_commit: &str,
        model: LockedModel,
        profile: Profile,
        workload_path: &str,
        workload: Workload,
        result: &BenchResult,
        env: &EnvReport,
    ) -> Result<Self> {
        if !result.failures.is_empty() {
            bail!("cannot lock a failed run: {}", result.failures.join("; "));
        }
        let mut reference = BTreeMap::new();
        for (mode, s) in &result.modes {
            let (Some(ttft_s), Some(prefill_tps), Some(decode_tps)) =
                (s.ttft_s.median, s.prefill_tps.median, s.decode_tps.median)
            else {
                bail!("mode {mode} has no complete medians");
            };
            reference.insert(
                mode.clone(),
                ReferenceFigures {
                    ttft_s,
                    prefill_tps,
                    decode_tps,
                },
            );
        }
        let reference_stream_curve = result
            .stream_curve
            .iter()
            .filter_map(|s| s.aggregate_tps.median.map(|m| (s.concurrency, m)))
            .collect();
        Ok(ReleaseLock {
            lock_version: LOCK_VERSION,
            kestrel_commit: kestrel_commit.to_string(),
            model,
            profile,
            workload_path: workload_path.to_string(),
            workload,
            prompt_sha256: result.prompt_sha256.clone(),
            reference,
            reference_stream_curve,
            tolerances: Tolerances::default(),
            environment: env.fingerprint(),
            machine_salt: env.machine_salt.clone(),
            machine_commitment: env.machine_commitment.clone(),
        })
    }

    /// Classification input for a run measured under this lock.
    pub fn classify_input(
        &self,
        result: &BenchResult,
        compatibility_mismatches: Vec<String>,
    ) -> ClassifyInput {
        let mut failures = result.failures.clone();
        if result.prompt_sha256 != self.prompt_sha256 {
            failures.push(format!(
                "prompt bytes differ from the lock (sha256 {} vs {})",
                result.prompt_sha256, self.prompt_sha256
            ));
        }
        let mut series = Vec::new();
        for (mode, r) in &self.reference {
            let Some(s) = result.modes.get(mode) else {
                failures.push(format!("mode {mode} was not measured"));
                continue;
            };
            for (metric, reference, values) in [
                (MetricKind::TtftS, r.ttft_s, &s.ttft_s.values),
                (MetricKind::PrefillTps, r.prefill_tps, &s.prefill_tps.values),
                (MetricKind::DecodeTps, r.decode_tps, &s.decode_tps.values),
            ] {
                series.push(MetricSeries {
                    mode: mode.clone(),
                    metric,
                    reference,
                    values: values.clone(),
                });
            }
        }
        ClassifyInput {
            failures,
            compatibility_mismatches,
            series,
            tolerances: self.tolerances,
        }
    }
}

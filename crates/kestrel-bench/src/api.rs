//! Entry points for the `kestrel` binary: clap argument structs and one
//! function per subcommand. Each async function has a blocking `run_*`
//! wrapper that builds its own tokio runtime (do not call those from inside a
//! runtime; call the async ones there).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use crate::download::{DownloadRequest, DownloadSummary, Endpoints, Source};
use crate::env::{self, CheckLevel, EnvReport, PreflightCheck};
use crate::launcher::{self, ServerProcess};
use crate::lock::{LockedModel, ReleaseLock};
use crate::manifest::{Manifest, VerifyReport, verify_dir};
use crate::outcome::{Outcome, Tolerances, classify};
use crate::profile::Profile;
use crate::report::{Report, write_evidence};
use crate::runner::{RunConfig, run_workload};
use crate::spread::grade_unreferenced;
use crate::workload::Workload;

/// Room kept free for results and logs next to the model.
const RESULTS_RESERVE_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Benchmark an already running server at this URL (e.g. http://127.0.0.1:8000).
    #[arg(long, conflicts_with = "profile")]
    pub url: Option<String>,
    /// Start the server from this profile file instead (bench/profiles/*.toml).
    #[arg(long)]
    pub profile: Option<PathBuf>,
    /// Model id for requests (default: the profile's served_model_name, else /v1/models).
    #[arg(long)]
    pub model_id: Option<String>,
    /// Bearer token for the server, if it wants one (default: $KESTREL_BENCH_API_KEY).
    #[arg(long)]
    pub api_key: Option<String>,
    /// Start this executable instead of the profile's `program` (e.g. a freshly built binary).
    #[arg(long, requires = "profile")]
    pub server_program: Option<PathBuf>,
    /// Port for the started server instead of the profile's; 0 picks a free one.
    #[arg(long, requires = "profile")]
    pub port: Option<u16>,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Workload file (bench/workloads/*.toml).
    #[arg(long)]
    pub workload: PathBuf,
    /// Model folder, substituted for {model_dir} in the profile.
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    /// Rounds (default: the workload's, normally 3).
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Evidence folder (default: bench/results/<workload>-<unix time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ReproduceArgs {
    /// Release lock file.
    #[arg(long)]
    pub lock: PathBuf,
    /// Model folder to verify (and complete with --download).
    #[arg(long)]
    pub model_dir: PathBuf,
    /// Repository root: the lock's workload path and corpus are found from here.
    #[arg(long, default_value = ".")]
    pub repo_root: PathBuf,
    /// Download missing or mismatched model files before running.
    #[arg(long)]
    pub download: bool,
    #[arg(long, value_enum, default_value_t = Source::Auto)]
    pub source: Source,
    /// Use a running server instead of starting the lock's profile.
    #[arg(long)]
    pub url: Option<String>,
    /// Start this executable instead of the locked profile's `program`.
    #[arg(long, conflicts_with = "url")]
    pub server_program: Option<PathBuf>,
    /// Port for the started server instead of the locked profile's; 0 picks a free one.
    #[arg(long, conflicts_with = "url")]
    pub port: Option<u16>,
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct LockArgs {
    #[command(flatten)]
    pub bench: BenchArgs,
    /// Hugging Face repository of the model (owner/name).
    #[arg(long)]
    pub repo: String,
    /// Pinned revision (commit hash).
    #[arg(long)]
    pub revision: String,
    #[arg(long)]
    pub modelscope_repo: Option<String>,
    #[arg(long)]
    pub modelscope_revision: Option<String>,
    /// kestrel commit the reference was measured with.
    #[arg(long)]
    pub commit: String,
    /// Workload path as written into the lock, relative to the repository root
    /// (default: --workload as given).
    #[arg(long)]
    pub workload_path: Option<String>,
    /// Where to write the lock.
    #[arg(long)]
    pub lock_out: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct ManifestCreateArgs {
    pub dir: PathBuf,
    #[arg(long, short)]
    pub output: PathBuf,
    #[arg(long)]
    pub repo: Option<String>,
    #[arg(long)]
    pub revision: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct VerifyArgs {
    pub dir: PathBuf,
    /// manifest.json, or a release lock (its model files are used).
    #[arg(long)]
    pub manifest: PathBuf,
}

#[derive(Debug, Clone, Args)]
pub struct DownloadArgs {
    #[arg(long)]
    pub repo: String,
    #[arg(long, default_value = "main")]
    pub revision: String,
    #[arg(long)]
    pub dest: PathBuf,
    /// Only fetch what this manifest (or lock) says is missing or wrong.
    #[arg(long)]
    pub manifest: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Source::Auto)]
    pub source: Source,
    #[arg(long)]
    pub modelscope_repo: Option<String>,
    #[arg(long)]
    pub modelscope_revision: Option<String>,
    /// Tries per file per source (each resumes the partial file).
    #[arg(long, default_value_t = 5)]
    pub attempts: u32,
    #[arg(long)]
    pub no_progress: bool,
}

#[derive(Debug, Clone, Args)]
pub struct EnvArgs {
    /// Model folder whose filesystem is checked for free space.
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    /// Salt (hex) for the machine commitment, e.g. a lock's machine_salt.
    #[arg(long)]
    pub salt: Option<String>,
}

/// Subcommands, for `#[command(subcommand)]` in the `kestrel` binary.
#[derive(Debug, Clone, Subcommand)]
pub enum BenchCommand {
    /// Measure a workload against a server.
    Run(BenchArgs),
    /// Verify environment and model files against a lock, run, print the outcome.
    Reproduce(ReproduceArgs),
    /// Measure and write a release lock with the results as reference.
    Lock(LockArgs),
    /// Write manifest.json (size + SHA-256 per file) for a model folder.
    Manifest(ManifestCreateArgs),
    /// Verify a model folder against a manifest or lock.
    Verify(VerifyArgs),
    /// Download model files (only what is missing or wrong), resuming partial files.
    Download(DownloadArgs),
    /// Print the environment report and preflight checks.
    Env(EnvArgs),
}

pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// Run a subcommand, print its result, and return the process exit code:
/// 0 success / REPRODUCED / MEASURED, 1 failure / NOT_REPRODUCED, 2 INVALID_RUN,
/// 3 PERFORMANCE_PASS_BASELINE_DIVERGENCE, 4 COMPATIBILITY_RUN.
pub fn run_command(cmd: &BenchCommand) -> Result<i32> {
    match cmd {
        BenchCommand::Run(a) => {
            let r = run_bench(a)?;
            println!("{}", crate::report::summary_markdown(&r, None));
            let outcome = r
                .classification
                .as_ref()
                .map_or(Outcome::NotReproduced, |c| c.outcome);
            println!("OUTCOME: {outcome}\nevidence: {}", r.evidence_dir.display());
            Ok(exit_code(outcome))
        }
        BenchCommand::Reproduce(a) => {
            let r = run_reproduce(a)?;
            let outcome = r
                .classification
                .as_ref()
                .map_or(Outcome::NotReproduced, |c| c.outcome);
            println!(
                "{}",
                std::fs::read_to_string(r.evidence_dir.join("summary.md")).unwrap_or_default()
            );
            println!("OUTCOME: {outcome}\nevidence: {}", r.evidence_dir.display());
            Ok(exit_code(outcome))
        }
        BenchCommand::Lock(a) => {
            let lock = runtime()?.block_on(create_lock(a))?;
            println!(
                "wrote {} ({} reference modes)",
                a.lock_out.display(),
                lock.reference.len()
            );
            Ok(0)
        }
        BenchCommand::Manifest(a) => {
            let m = run_manifest_create(a)?;
            println!(
                "wrote {} ({} files, {} bytes)",
                a.output.display(),
                m.files.len(),
                m.total_size()
            );
            Ok(0)
        }
        BenchCommand::Verify(a) => {
            let r = run_verify(a)?;
            for p in r.problems() {
                println!("{p}");
            }
            println!(
                "{}",
                if r.is_clean() {
                    "verified: all files match"
                } else {
                    "verification FAILED"
                }
            );
            Ok(if r.all_present() { 0 } else { 1 })
        }
        BenchCommand::Download(a) => {
            let s = run_download(a)?;
            println!(
                "fetched {} file(s) ({} resumed, {} renamed back, {} already ok), {} bytes",
                s.fetched.len(),
                s.resumed.len(),
                s.renamed_back.len(),
                s.already_ok,
                s.bytes_downloaded
            );
            Ok(0)
        }
        BenchCommand::Env(a) => {
            let (report, checks) = run_env(a);
            println!("{}", serde_json::to_string_pretty(&report)?);
            for c in &checks {
                println!("{:?} {}: {}", c.level, c.name, c.detail);
            }
            Ok(if checks.iter().any(|c| c.level == CheckLevel::Fail) {
                1
            } else {
                0
            })
        }
    }
}

pub fn exit_code(o: Outcome) -> i32 {
    match o {
        Outcome::Reproduced => 0,
        Outcome::NotReproduced => 1,
        Outcome::InvalidRun => 2,
        Outcome::PerformancePassBaselineDivergence => 3,
        Outcome::CompatibilityRun => 4,
        Outcome::Measured => 0,
    }
}

fn api_key(s: &ServerArgs) -> Option<String> {
    s.api_key.clone().or_else(|| {
        std::env::var("KESTREL_BENCH_API_KEY")
            .ok()
            .filter(|k| !k.is_empty())
    })
}

fn default_out(workload: &str) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    PathBuf::from("bench/results").join(format!("{workload}-{secs}"))
}

/// A server to measure: one we started (stopped on drop/stop) or one given by URL.
struct Target {
    base_url: String,
    process: Option<ServerProcess>,
    command: Option<String>,
    model_id: Option<String>,
}

async fn open_target(
    url: Option<&str>,
    profile: Option<&Profile>,
    model_dir: Option<&Path>,
    out: &Path,
) -> Result<Target> {
    if let Some(u) = url {
        return Ok(Target {
            base_url: u.to_string(),
            process: None,
            command: None,
            model_id: None,
        });
    }
    let p = profile.context("give --url of a running server or --profile to start one")?;
    let command = p.command_line(model_dir)?;
    let process = launcher::start(p, model_dir, &out.join("server.log")).await?;
    Ok(Target {
        base_url: process.base_url.clone(),
        process: Some(process),
        command: Some(command),
        model_id: p.served_model_name.clone(),
    })
}

async fn measure(
    target: &mut Target,
    workload: Workload,
    workload_base: PathBuf,
    rounds: Option<u32>,
    model_id: Option<String>,
    api_key: Option<String>,
) -> Result<crate::runner::BenchResult> {
    let cfg = RunConfig {
        base_url: target.base_url.clone(),
        model: model_id.or_else(|| target.model_id.clone()),
        api_key,
        workload,
        workload_base,
        rounds,
    };
    let result = run_workload(&cfg).await;
    if let Some(p) = target.process.as_mut() {
        p.stop().await.ok();
    }
    result
}

pub async fn bench(a: &BenchArgs) -> Result<Report> {
    let (workload, base) = Workload::load(&a.workload)?;
    let out = a.out.clone().unwrap_or_else(|| default_out(&workload.name));
    std::fs::create_dir_all(&out)?;
    let profile = match a.server.profile.as_deref() {
        Some(path) => Some(
            Profile::load(path)?
                .with_overrides(a.server.server_program.as_deref(), a.server.port)?,
        ),
        None => None,
    };
    let environment = env::collect(None);
    let preflight = match &a.model_dir {
        Some(d) => env::preflight(&environment, d, 0, RESULTS_RESERVE_BYTES),
        None => Vec::new(),
    };
    let mut target = open_target(
        a.server.url.as_deref(),
        profile.as_ref(),
        a.model_dir.as_deref(),
        &out,
    )
    .await?;
    let result = measure(
        &mut target,
        workload,
        base,
        a.rounds,
        a.server.model_id.clone(),
        api_key(&a.server),
    )
    .await?;
    let classification = grade_unreferenced(&result, &Tolerances::default());
    let report = Report {
        result,
        environment,
        preflight,
        server_command: target.command,
        date_utc: crate::report::now_utc(),
        classification: Some(classification),
        evidence_dir: out,
    };
    write_evidence(&report, None)?;
    Ok(report)
}

pub fn run_bench(a: &BenchArgs) -> Result<Report> {
    runtime()?.block_on(bench(a))
}

pub async fn reproduce(a: &ReproduceArgs) -> Result<Report> {
    let lock = ReleaseLock::load(&a.lock)?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| default_out(&format!("reproduce-{}", lock.workload.name)));
    std::fs::create_dir_all(&out)?;
    let environment = env::collect(Some(&lock.machine_salt));
    let mismatches = env::fingerprint_mismatches(&lock.environment, &environment.fingerprint());

    // Model files first: fluent garbage from a corrupt shard is worse than no run.
    let manifest = lock.model.manifest();
    let mut report = verify_dir(&a.model_dir, &manifest)?;
    let missing_bytes: u64 = report
        .to_fetch()
        .iter()
        .filter_map(|p| manifest.get(p))
        .map(|f| f.size)
        .sum();
    let preflight = env::preflight(
        &environment,
        &a.model_dir,
        missing_bytes,
        RESULTS_RESERVE_BYTES,
    );
    if let Some(c) = preflight.iter().find(|c| c.level == CheckLevel::Fail) {
        bail!("preflight failed: {}: {}", c.name, c.detail);
    }
    if !report.all_present() && a.download {
        download(&DownloadArgs {
            repo: lock.model.repo.clone(),
            revision: lock.model.revision.clone(),
            dest: a.model_dir.clone(),
            manifest: Some(a.lock.clone()),
            source: a.source,
            modelscope_repo: lock.model.modelscope_repo.clone(),
            modelscope_revision: lock.model.modelscope_revision.clone(),
            attempts: 5,
            no_progress: false,
        })
        .await?;
        report = verify_dir(&a.model_dir, &manifest)?;
    }
    if !report.all_present() {
        bail!(
            "model files do not match the lock (use --download): {}",
            report.problems().join("; ")
        );
    }

    let workload_file = a.repo_root.join(&lock.workload_path);
    let base = workload_file
        .parent()
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let profile = lock
        .profile
        .clone()
        .with_overrides(a.server_program.as_deref(), a.port)?;
    let mut target =
        open_target(a.url.as_deref(), Some(&profile), Some(&a.model_dir), &out).await?;
    let result = measure(&mut target, lock.workload.clone(), base, None, None, None).await?;
    let classification = classify(&lock.classify_input(&result, mismatches));
    let report = Report {
        result,
        environment,
        preflight,
        server_command: target.command,
        date_utc: crate::report::now_utc(),
        classification: Some(classification),
        evidence_dir: out,
    };
    write_evidence(&report, Some(&lock))?;
    Ok(report)
}

pub fn run_reproduce(a: &ReproduceArgs) -> Result<Report> {
    runtime()?.block_on(reproduce(a))
}

pub async fn create_lock(a: &LockArgs) -> Result<ReleaseLock> {
    let model_dir = a
        .bench
        .model_dir
        .as_deref()
        .context("--model-dir is required to lock the model files")?;
    let profile_path = a
        .bench
        .server
        .profile
        .as_deref()
        .context("--profile is required: the lock records how the server ran")?;
    let profile = Profile::load(profile_path)?;
    let manifest = Manifest::from_dir(model_dir, Some(a.repo.clone()), Some(a.revision.clone()))?;
    let report = bench(&a.bench).await?;
    let (workload, _) = Workload::load(&a.bench.workload)?;
    let model = LockedModel {
        repo: a.repo.clone(),
        revision: a.revision.clone(),
        modelscope_repo: a.modelscope_repo.clone(),
        modelscope_revision: a.modelscope_revision.clone(),
        files: manifest.files,
    };
    let workload_path = a
        .workload_path
        .clone()
        .unwrap_or_else(|| a.bench.workload.display().to_string());
    let lock = ReleaseLock::from_run(
        &a.commit,
        model,
        profile,
        &workload_path,
        workload,
        &report.result,
        &report.environment,
    )?;
    lock.save(&a.lock_out)?;
    Ok(lock)
}

pub fn run_manifest_create(a: &ManifestCreateArgs) -> Result<Manifest> {
    let m = Manifest::from_dir(&a.dir, a.repo.clone(), a.revision.clone())?;
    m.save(&a.output)?;
    Ok(m)
}

/// A manifest from either a manifest.json or a release lock.
pub fn load_manifest_or_lock(path: &Path) -> Result<Manifest> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    if v.get("lock_version").is_some() {
        Ok(ReleaseLock::load(path)?.model.manifest())
    } else {
        Manifest::load(path)
    }
}

pub fn run_verify(a: &VerifyArgs) -> Result<VerifyReport> {
    verify_dir(&a.dir, &load_manifest_or_lock(&a.manifest)?)
}

pub async fn download(a: &DownloadArgs) -> Result<DownloadSummary> {
    let manifest = a
        .manifest
        .as_deref()
        .map(load_manifest_or_lock)
        .transpose()?;
    crate::download::download(&DownloadRequest {
        repo: a.repo.clone(),
        revision: a.revision.clone(),
        modelscope_repo: a.modelscope_repo.clone(),
        modelscope_revision: a.modelscope_revision.clone(),
        dest: a.dest.clone(),
        source: a.source,
        endpoints: Endpoints::from_env(),
        manifest,
        attempts: a.attempts,
        show_progress: !a.no_progress,
    })
    .await
}

pub fn run_download(a: &DownloadArgs) -> Result<DownloadSummary> {
    runtime()?.block_on(download(a))
}

pub fn run_env(a: &EnvArgs) -> (EnvReport, Vec<PreflightCheck>) {
    let report = env::collect(a.salt.as_deref());
    let checks = env::preflight(
        &report,
        a.model_dir.as_deref().unwrap_or(Path::new(".")),
        0,
        RESULTS_RESERVE_BYTES,
    );
    (report, checks)
}

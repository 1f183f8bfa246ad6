//! `kestrel bench ...` and `kestrel pull`: the benchmark and reproduction
//! harness of `kestrel-bench`, wired into the binary.
//!
//! The only logic here is choosing which executable a profile starts: a
//! profile whose `program` is `kestrel` runs this very binary unless
//! `--server-program` says otherwise, so `target/release/kestrel bench run`
//! measures the build it came from, not whatever `kestrel` is in PATH.
//! Everything else is `kestrel_bench::run_command`, which builds its own
//! tokio runtime; `main` calls it outside any runtime.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kestrel_bench::download::Source;
use kestrel_bench::lock::ReleaseLock;
use kestrel_bench::profile::Profile;
use kestrel_bench::{BenchCommand, DownloadArgs};

/// The program name in shipped kestrel profiles.
const KESTREL_PROGRAM: &str = "kestrel";

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    command: BenchCommand,
}

/// `kestrel pull REPO[@REVISION]`: download a model folder (only files that are
/// missing or wrong), from Hugging Face with ModelScope as fallback.
#[derive(clap::Args)]
pub struct PullArgs {
    /// Repository, optionally pinned: `Qwen/Qwen3-0.6B` or `Qwen/Qwen3-0.6B@<commit>`.
    repo: String,
    /// Destination folder (default: models/<name of the repository>).
    #[arg(long)]
    dest: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Source::Auto)]
    source: Source,
    /// Only fetch what this manifest (or release lock) says is missing or wrong.
    #[arg(long)]
    manifest: Option<PathBuf>,
    /// ModelScope repository when its name differs from the Hugging Face one.
    #[arg(long)]
    modelscope_repo: Option<String>,
    #[arg(long)]
    modelscope_revision: Option<String>,
    #[arg(long)]
    no_progress: bool,
}

pub fn run(args: Args) -> Result<()> {
    let mut command = args.command;
    default_to_this_binary(&mut command)?;
    finish(kestrel_bench::run_command(&command)?)
}

/// `kestrel reproduce`: the top-level name for `kestrel bench reproduce`.
pub fn reproduce(args: kestrel_bench::ReproduceArgs) -> Result<()> {
    run(Args {
        command: BenchCommand::Reproduce(args),
    })
}

pub fn pull(args: PullArgs) -> Result<()> {
    let (repo, revision) = split_repo_revision(&args.repo)?;
    let name = repo.rsplit('/').next().unwrap_or(repo);
    let dest = args
        .dest
        .unwrap_or_else(|| PathBuf::from("models").join(name));
    let command = BenchCommand::Download(DownloadArgs {
        repo: repo.to_string(),
        revision: revision.to_string(),
        dest,
        manifest: args.manifest,
        source: args.source,
        modelscope_repo: args.modelscope_repo,
        modelscope_revision: args.modelscope_revision,
        attempts: 5,
        no_progress: args.no_progress,
    });
    finish(kestrel_bench::run_command(&command)?)
}

/// Exit with the harness's code (outcome of `reproduce`, failure of `run`).
fn finish(code: i32) -> Result<()> {
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// `owner/name` or `owner/name@revision` (default revision `main`).
fn split_repo_revision(spec: &str) -> Result<(&str, &str)> {
    let (repo, revision) = match spec.split_once('@') {
        Some((r, rev)) => (r, rev),
        None => (spec, "main"),
    };
    let valid_repo = repo
        .split_once('/')
        .is_some_and(|(owner, name)| !owner.is_empty() && !name.is_empty() && !name.contains('/'));
    if !valid_repo || revision.is_empty() {
        anyhow::bail!("expected REPO or REPO@REVISION with REPO like owner/name, got {spec:?}");
    }
    Ok((repo, revision))
}

/// Point `--server-program` at this executable when the profile (or the
/// lock's profile) starts `kestrel` and no program was given.
fn default_to_this_binary(command: &mut BenchCommand) -> Result<()> {
    let (program, profile_program) = match command {
        BenchCommand::Run(a) => (
            &mut a.server.server_program,
            profile_program(a.server.profile.as_ref())?,
        ),
        BenchCommand::Lock(a) => (
            &mut a.bench.server.server_program,
            profile_program(a.bench.server.profile.as_ref())?,
        ),
        BenchCommand::Reproduce(a) if a.url.is_none() => (
            &mut a.server_program,
            Some(ReleaseLock::load(&a.lock)?.profile.program),
        ),
        _ => return Ok(()),
    };
    if program.is_none() && profile_program.as_deref() == Some(KESTREL_PROGRAM) {
        *program = Some(std::env::current_exe().context("locating the kestrel executable")?);
    }
    Ok(())
}

fn profile_program(path: Option<&PathBuf>) -> Result<Option<String>> {
    path.map(|p| Profile::load(p).map(|p| p.program))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::split_repo_revision;

    #[test]
    fn repo_and_revision() {
        assert_eq!(
            split_repo_revision("Qwen/Qwen3-0.6B").unwrap(),
            ("Qwen/Qwen3-0.6B", "main")
        );
        assert_eq!(
            split_repo_revision("Qwen/Qwen3-0.6B@abc123").unwrap(),
            ("Qwen/Qwen3-0.6B", "abc123")
        );
        for bad in ["Qwen3", "Qwen/", "/x", "a/b/c", "a/b@", ""] {
            assert!(split_repo_revision(bad).is_err(), "{bad}");
        }
    }
}

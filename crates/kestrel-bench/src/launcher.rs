//! Starts a server from a profile, waits for its health endpoint, stops it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::client::OpenAiClient;
use crate::profile::Profile;

/// A running server; stop it with [`ServerProcess::stop`]. Dropping it kills
/// the process (tokio's `kill_on_drop`) so a failed run leaves nothing behind.
pub struct ServerProcess {
    child: Child,
    pub base_url: String,
    pub log_path: PathBuf,
    grace: Duration,
}

/// Spawn the profile's command, logging stdout and stderr to `log_path`, and
/// wait until `GET health_path` answers 200 or the startup timeout passes.
pub async fn start(
    profile: &Profile,
    model_dir: Option<&Path>,
    log_path: &Path,
) -> Result<ServerProcess> {
    let args = profile.render_args(model_dir)?;
    let log = std::fs::File::create(log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let log_err = log.try_clone()?;
    let child = Command::new(&profile.program)
        .args(&args)
        .envs(&profile.env)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", profile.program))?;
    let mut server = ServerProcess {
        child,
        base_url: profile.base_url(),
        log_path: log_path.to_path_buf(),
        grace: Duration::from_secs(profile.stop_grace_s),
    };
    let client = OpenAiClient::new(&server.base_url, None)?;
    let deadline = Instant::now() + Duration::from_secs(profile.startup_timeout_s);
    loop {
        if let Some(status) = server.child.try_wait()? {
            bail!(
                "server exited during startup ({status}); log: {}\n{}",
                log_path.display(),
                log_tail(log_path)
            );
        }
        if client.probe(&profile.health_path).await == Some(200) {
            return Ok(server);
        }
        if Instant::now() >= deadline {
            server.stop().await.ok();
            bail!(
                "server not healthy at {}{} after {} s; log: {}\n{}",
                server.base_url,
                profile.health_path,
                profile.startup_timeout_s,
                log_path.display(),
                log_tail(log_path)
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl ServerProcess {
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// SIGTERM, wait up to the grace period, then SIGKILL.
    pub async fn stop(&mut self) -> Result<std::process::ExitStatus> {
        if let Some(status) = self.child.try_wait()? {
            return Ok(status);
        }
        if let Some(pid) = self.child.id() {
            // The pid is our own child, not yet reaped, so it cannot have been reused.
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
        match tokio::time::timeout(self.grace, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.child.kill().await?;
                Ok(self.child.wait().await?)
            }
        }
    }
}

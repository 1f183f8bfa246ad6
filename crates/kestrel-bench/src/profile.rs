//! Server profiles: the exact command line a benchmark was run with, as a file.
//!
//! `args` may use the placeholders `{model_dir}`, `{host}` and `{port}`; they
//! are replaced at launch. Everything else is passed verbatim, so the file is
//! the audit record of what ran.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

pub const PROFILE_SCHEMA_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    pub schema_version: u32,
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Program to start (looked up in PATH unless it contains a slash).
    pub program: String,
    pub args: Vec<String>,
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    #[serde(default = "default_health")]
    pub health_path: String,
    #[serde(default = "default_startup")]
    pub startup_timeout_s: u64,
    /// Seconds between SIGTERM and SIGKILL when stopping.
    #[serde(default = "default_grace")]
    pub stop_grace_s: u64,
    /// Extra environment variables for the server process.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Model id to send in requests; `/v1/models` decides when absent.
    #[serde(default)]
    pub served_model_name: Option<String>,
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8000
}
fn default_health() -> String {
    "/health".into()
}
fn default_startup() -> u64 {
    900
}
fn default_grace() -> u64 {
    20
}

impl Profile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading profile {}", path.display()))?;
        let p: Profile =
            toml::from_str(&text).with_context(|| format!("parsing profile {}", path.display()))?;
        if p.schema_version != PROFILE_SCHEMA_VERSION {
            bail!(
                "profile {}: schema_version {} unsupported",
                p.name,
                p.schema_version
            );
        }
        if p.program.trim().is_empty() {
            bail!("profile {}: program is empty", p.name);
        }
        if !p.health_path.starts_with('/') {
            bail!("profile {}: health_path must start with '/'", p.name);
        }
        Ok(p)
    }

    /// Arguments with placeholders filled in; an unknown `{name}` is an error.
    pub fn render_args(&self, model_dir: Option<&Path>) -> Result<Vec<String>> {
        self.args
            .iter()
            .map(|a| {
                let mut out = a
                    .replace("{host}", &self.host)
                    .replace("{port}", &self.port.to_string());
                if out.contains("{model_dir}") {
                    let dir = model_dir.with_context(|| {
                        format!("profile {} needs a model folder ({{model_dir}})", self.name)
                    })?;
                    out = out.replace("{model_dir}", &dir.display().to_string());
                }
                if let (Some(s), Some(e)) = (out.find('{'), out.find('}'))
                    && s < e
                {
                    bail!(
                        "profile {}: unknown placeholder in argument {a:?}",
                        self.name
                    );
                }
                Ok(out)
            })
            .collect()
    }

    /// The profile with the program and port replaced where given: a freshly
    /// built binary instead of the one in PATH, or another port. Port 0 picks
    /// a free loopback port now (several servers can run side by side).
    pub fn with_overrides(mut self, program: Option<&Path>, port: Option<u16>) -> Result<Self> {
        if let Some(p) = program {
            if p.as_os_str().is_empty() {
                bail!(
                    "profile {}: the server program override is empty",
                    self.name
                );
            }
            self.program = p.display().to_string();
        }
        match port {
            Some(0) => self.port = free_port(&self.host)?,
            Some(p) => self.port = p,
            None => {}
        }
        Ok(self)
    }

    pub fn base_url(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// The command line as one shell-quoted string, for reports.
    pub fn command_line(&self, model_dir: Option<&Path>) -> Result<String> {
        let mut parts = vec![self.program.clone()];
        parts.extend(self.render_args(model_dir)?);
        Ok(parts
            .iter()
            .map(|p| shell_quote(p))
            .collect::<Vec<_>>()
            .join(" "))
    }
}

/// A port the OS reports free on `host` right now. Another process could take
/// it before the server binds; startup then fails with the server's log.
fn free_port(host: &str) -> Result<u16> {
    let listener = std::net::TcpListener::bind((host, 0))
        .with_context(|| format!("finding a free port on {host}"))?;
    Ok(listener.local_addr()?.port())
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(args: &[&str]) -> Profile {
        toml::from_str(&format!(
            "schema_version = 1\nname = \"t\"\nprogram = \"kestrel\"\nargs = {:?}\nport = 9001\n",
            args
        ))
        .unwrap()
    }

    #[test]
    fn placeholders_are_filled() {
        let p = profile(&[
            "serve",
            "--model",
            "{model_dir}",
            "--port",
            "{port}",
            "--host",
            "{host}",
        ]);
        let a = p.render_args(Some(Path::new("/m/q"))).unwrap();
        assert_eq!(
            a,
            [
                "serve",
                "--model",
                "/m/q",
                "--port",
                "9001",
                "--host",
                "127.0.0.1"
            ]
        );
        assert!(p.render_args(None).is_err());
        assert_eq!(
            p.command_line(Some(Path::new("/m/a b"))).unwrap(),
            "kestrel serve --model '/m/a b' --port 9001 --host 127.0.0.1"
        );
    }

    #[test]
    fn overrides_replace_program_and_port() {
        let p = profile(&["serve", "--port", "{port}"]);
        let same = p.clone().with_overrides(None, None).unwrap();
        assert_eq!(same, p);
        let o = p
            .clone()
            .with_overrides(Some(Path::new("target/release/kestrel")), Some(9100))
            .unwrap();
        assert_eq!(o.program, "target/release/kestrel");
        assert_eq!(o.render_args(None).unwrap(), ["serve", "--port", "9100"]);
        let free = p.clone().with_overrides(None, Some(0)).unwrap();
        assert_ne!(free.port, 0);
        assert!(p.with_overrides(Some(Path::new("")), None).is_err());
    }

    #[test]
    fn unknown_placeholder_is_an_error() {
        assert!(profile(&["--x", "{nope}"]).render_args(None).is_err());
    }
}

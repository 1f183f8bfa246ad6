//! Download model files from Hugging Face, falling back to ModelScope, fetching
//! only what is missing or wrong, resuming partial files with HTTP Range.
//!
//! The protocol is small and implemented here over reqwest rather than with the
//! `hf-hub` crate: the same code path must serve ModelScope, resume into our own
//! partial files, verify against our SHA-256 manifest, and point at a local test
//! server through one base-URL setting.
//!
//! Endpoints (base URLs from `KESTREL_HF_ENDPOINT` / `HF_ENDPOINT` and
//! `KESTREL_MODELSCOPE_ENDPOINT`):
//! - Hugging Face list: `GET {base}/api/models/{repo}/revision/{rev}?blobs=true`
//!   (`siblings[].rfilename`, `size`, `lfs.sha256`); file:
//!   `GET {base}/{repo}/resolve/{rev}/{path}`. `HF_TOKEN` is sent as a bearer
//!   token when set (gated repositories).
//! - ModelScope list: `GET {base}/api/v1/models/{repo}/repo/files?Revision={rev}&Recursive=true`
//!   (`Data.Files[]` with `Path`, `Type`, `Size`, `Sha256`); file:
//!   `GET {base}/models/{repo}/resolve/{rev}/{path}`.
//!
//! Partial data lives in `{dest}/.kestrel-download/{path}.part` (hidden, so
//! verification ignores it) and is moved into place only after its SHA-256
//! (and size) match.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use futures_util::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::manifest::{FileStatus, Manifest, sha256_file, validate_rel_path, verify_dir};

pub const PARTIAL_DIR: &str = ".kestrel-download";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum, Default)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    #[default]
    Auto,
    Huggingface,
    Modelscope,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    pub huggingface: String,
    pub modelscope: String,
}

impl Endpoints {
    pub fn from_env() -> Self {
        let var = |names: &[&str], default: &str| {
            names
                .iter()
                .find_map(|n| std::env::var(n).ok().filter(|v| !v.trim().is_empty()))
                .unwrap_or_else(|| default.to_string())
                .trim_end_matches('/')
                .to_string()
        };
        Endpoints {
            huggingface: var(
                &["KESTREL_HF_ENDPOINT", "HF_ENDPOINT"],
                "https://huggingface.co",
            ),
            modelscope: var(
                &["KESTREL_MODELSCOPE_ENDPOINT"],
                "https://www.modelscope.cn",
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HubKind {
    Huggingface,
    Modelscope,
}

/// One repository at one revision on one hub.
#[derive(Debug, Clone)]
pub struct Hub {
    pub kind: HubKind,
    pub base: String,
    pub repo: String,
    pub revision: String,
    pub token: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFile {
    pub path: String,
    pub size: Option<u64>,
    pub sha256: Option<String>,
}

impl Hub {
    pub fn list_url(&self) -> String {
        match self.kind {
            HubKind::Huggingface => format!(
                "{}/api/models/{}/revision/{}?blobs=true",
                self.base, self.repo, self.revision
            ),
            HubKind::Modelscope => format!(
                "{}/api/v1/models/{}/repo/files?Revision={}&Recursive=true",
                self.base, self.repo, self.revision
            ),
        }
    }

    pub fn file_url(&self, path: &str) -> String {
        match self.kind {
            HubKind::Huggingface => format!(
                "{}/{}/resolve/{}/{}",
                self.base, self.repo, self.revision, path
            ),
            HubKind::Modelscope => format!(
                "{}/models/{}/resolve/{}/{}",
                self.base, self.repo, self.revision, path
            ),
        }
    }

    fn get(&self, http: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let rb = http.get(url);
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    pub async fn list(&self, http: &reqwest::Client) -> Result<Vec<RemoteFile>> {
        let url = self.list_url();
        let v: Value = self
            .get(http, &url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?
            .error_for_status()
            .with_context(|| format!("listing {} on {:?}", self.repo, self.kind))?
            .json()
            .await
            .with_context(|| format!("decoding the file list from {url}"))?;
        parse_listing(self.kind, &v)
    }
}

/// File list from a hub's JSON answer.
pub fn parse_listing(kind: HubKind, v: &Value) -> Result<Vec<RemoteFile>> {
    let mut out = Vec::new();
    match kind {
        HubKind::Huggingface => {
            let siblings = v["siblings"]
                .as_array()
                .ok_or_else(|| anyhow!("Hugging Face answer has no siblings"))?;
            for s in siblings {
                let path = s["rfilename"]
                    .as_str()
                    .ok_or_else(|| anyhow!("sibling without rfilename"))?;
                out.push(RemoteFile {
                    path: path.to_string(),
                    size: s["lfs"]["size"].as_u64().or_else(|| s["size"].as_u64()),
                    sha256: s["lfs"]["sha256"].as_str().map(str::to_lowercase),
                });
            }
        }
        HubKind::Modelscope => {
            if let Some(code) = v["Code"].as_i64().filter(|c| *c != 200) {
                bail!("ModelScope answered Code {code}: {}", v["Message"]);
            }
            let files = v["Data"]["Files"]
                .as_array()
                .ok_or_else(|| anyhow!("ModelScope answer has no Data.Files"))?;
            for f in files.iter().filter(|f| f["Type"].as_str() != Some("tree")) {
                let path = f["Path"]
                    .as_str()
                    .ok_or_else(|| anyhow!("ModelScope file without Path"))?;
                out.push(RemoteFile {
                    path: path.to_string(),
                    size: f["Size"].as_u64(),
                    sha256: f["Sha256"]
                        .as_str()
                        .filter(|s| !s.is_empty())
                        .map(str::to_lowercase),
                });
            }
        }
    }
    for f in &out {
        validate_rel_path(&f.path)?;
    }
    Ok(out)
}

#[derive(Debug, Clone)]
pub struct DownloadRequest {
    pub repo: String,
    pub revision: String,
    /// ModelScope may name the repository or revision differently.
    pub modelscope_repo: Option<String>,
    pub modelscope_revision: Option<String>,
    pub dest: PathBuf,
    pub source: Source,
    pub endpoints: Endpoints,
    /// When given, decides which files are needed and what they must hash to.
    pub manifest: Option<Manifest>,
    /// Tries per file per hub; each retry resumes where the last one stopped.
    pub attempts: u32,
    pub show_progress: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DownloadSummary {
    pub fetched: Vec<String>,
    pub resumed: Vec<String>,
    pub renamed_back: Vec<String>,
    pub already_ok: usize,
    pub bytes_downloaded: u64,
    pub sources: Vec<(String, HubKind)>,
}

impl DownloadRequest {
    pub fn hubs(&self) -> Vec<Hub> {
        let hf = Hub {
            kind: HubKind::Huggingface,
            base: self.endpoints.huggingface.clone(),
            repo: self.repo.clone(),
            revision: self.revision.clone(),
            token: std::env::var("HF_TOKEN").ok().filter(|t| !t.is_empty()),
        };
        let ms = Hub {
            kind: HubKind::Modelscope,
            base: self.endpoints.modelscope.clone(),
            repo: self
                .modelscope_repo
                .clone()
                .unwrap_or_else(|| self.repo.clone()),
            revision: self
                .modelscope_revision
                .clone()
                .unwrap_or_else(|| self.revision.clone()),
            token: None,
        };
        match self.source {
            Source::Auto => vec![hf, ms],
            Source::Huggingface => vec![hf],
            Source::Modelscope => vec![ms],
        }
    }
}

/// Bring `dest` to the wanted state; returns what was done.
pub async fn download(req: &DownloadRequest) -> Result<DownloadSummary> {
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(20))
        .read_timeout(Duration::from_secs(120))
        .build()?;
    let hubs = req.hubs();
    std::fs::create_dir_all(&req.dest)
        .with_context(|| format!("creating {}", req.dest.display()))?;
    let mut summary = DownloadSummary::default();

    // Which files, with which expectations.
    let wanted: Vec<RemoteFile> = match &req.manifest {
        Some(m) => {
            let report = verify_dir(&req.dest, m)?;
            let mut need = Vec::new();
            for c in &report.checks {
                match &c.status {
                    FileStatus::Ok => summary.already_ok += 1,
                    FileStatus::Extra { .. } => {}
                    FileStatus::Renamed { found_at } => {
                        // Same bytes under another name: move them back instead of downloading.
                        let to = req.dest.join(&c.path);
                        if let Some(parent) = to.parent() {
                            std::fs::create_dir_all(parent)?;
                        }
                        std::fs::rename(req.dest.join(found_at), &to)?;
                        summary.renamed_back.push(c.path.clone());
                    }
                    _ => {
                        let e = m.get(&c.path).expect("check from manifest");
                        need.push(RemoteFile {
                            path: e.path.clone(),
                            size: Some(e.size),
                            sha256: Some(e.sha256.clone()),
                        });
                    }
                }
            }
            need
        }
        None => {
            let mut listing = None;
            let mut errors = Vec::new();
            for hub in &hubs {
                match hub.list(&http).await {
                    Ok(l) => {
                        listing = Some(l);
                        break;
                    }
                    Err(e) => errors.push(format!("{:?}: {e:#}", hub.kind)),
                }
            }
            let listing = listing
                .ok_or_else(|| anyhow!("no source could list the files: {}", errors.join("; ")))?;
            let mut need = Vec::new();
            for f in listing {
                if local_matches(&req.dest.join(&f.path), &f)? {
                    summary.already_ok += 1;
                } else {
                    need.push(f);
                }
            }
            need
        }
    };

    let multi = MultiProgress::with_draw_target(if req.show_progress {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    });
    for f in &wanted {
        let mut errors = Vec::new();
        let mut done = false;
        for hub in &hubs {
            match fetch_file(&http, hub, &req.dest, f, req.attempts.max(1), &multi).await {
                Ok(outcome) => {
                    summary.bytes_downloaded += outcome.bytes;
                    if outcome.resumed {
                        summary.resumed.push(f.path.clone());
                    }
                    summary.fetched.push(f.path.clone());
                    summary.sources.push((f.path.clone(), hub.kind));
                    done = true;
                    break;
                }
                Err(e) => errors.push(format!("{:?}: {e:#}", hub.kind)),
            }
        }
        if !done {
            bail!("could not download {}: {}", f.path, errors.join("; "));
        }
    }
    if let Some(m) = &req.manifest {
        let report = verify_dir(&req.dest, m)?;
        if !report.all_present() {
            bail!(
                "after download the folder still fails verification: {}",
                report.problems().join("; ")
            );
        }
    }
    Ok(summary)
}

/// Does the local file already match what the listing says (size and, when
/// known, SHA-256)?
fn local_matches(path: &Path, f: &RemoteFile) -> Result<bool> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(false);
    };
    if f.size.is_some_and(|s| s != meta.len()) {
        return Ok(false);
    }
    match &f.sha256 {
        Some(h) => Ok(sha256_file(path)?.eq_ignore_ascii_case(h)),
        // Without a hash (small git files on HF) the size is all we can check.
        None => Ok(f.size.is_some()),
    }
}

struct FetchOutcome {
    bytes: u64,
    resumed: bool,
}

fn partial_path(dest: &Path, rel: &str) -> PathBuf {
    dest.join(PARTIAL_DIR).join(format!("{rel}.part"))
}

async fn fetch_file(
    http: &reqwest::Client,
    hub: &Hub,
    dest: &Path,
    f: &RemoteFile,
    attempts: u32,
    multi: &MultiProgress,
) -> Result<FetchOutcome> {
    validate_rel_path(&f.path)?;
    let part = partial_path(dest, &f.path);
    if let Some(parent) = part.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    let bar = multi.add(ProgressBar::new(f.size.unwrap_or(0)));
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .expect("static template")
        .progress_chars("=> "),
    );
    bar.set_message(f.path.clone());
    let mut outcome = FetchOutcome {
        bytes: 0,
        resumed: false,
    };
    let mut last_err = None;
    for attempt in 0..attempts {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(200 * attempt as u64)).await;
        }
        match fetch_once(http, hub, &part, f, &bar, &mut outcome).await {
            Ok(()) => {
                last_err = None;
                break;
            }
            Err(e) => last_err = Some(e),
        }
    }
    if let Some(e) = last_err {
        bar.abandon_with_message(format!("{} (failed)", f.path));
        return Err(e);
    }
    // Verify before moving into place.
    let part_c = part.clone();
    let got = tokio::task::spawn_blocking(move || sha256_file(&part_c)).await??;
    let size = tokio::fs::metadata(&part).await?.len();
    if f.size.is_some_and(|s| s != size)
        || f.sha256
            .as_ref()
            .is_some_and(|h| !h.eq_ignore_ascii_case(&got))
    {
        tokio::fs::remove_file(&part).await.ok();
        bail!(
            "{} downloaded with sha256 {got} and {size} bytes, expected {:?} / {:?}",
            f.path,
            f.sha256,
            f.size
        );
    }
    let target = dest.join(&f.path);
    if let Some(parent) = target.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    tokio::fs::rename(&part, &target).await?;
    bar.finish_with_message(format!("{} ok", f.path));
    Ok(outcome)
}

/// One HTTP request: resume from the partial file's length when possible.
async fn fetch_once(
    http: &reqwest::Client,
    hub: &Hub,
    part: &Path,
    f: &RemoteFile,
    bar: &ProgressBar,
    outcome: &mut FetchOutcome,
) -> Result<()> {
    let mut offset = tokio::fs::metadata(part)
        .await
        .map(|m| m.len())
        .unwrap_or(0);
    if f.size.is_some_and(|s| offset > s) {
        tokio::fs::remove_file(part).await?;
        offset = 0;
    }
    if f.size == Some(offset) && offset > 0 {
        return Ok(()); // complete already; the caller verifies the hash
    }
    let url = hub.file_url(&f.path);
    let mut rb = hub.get(http, &url);
    if offset > 0 {
        rb = rb.header(reqwest::header::RANGE, format!("bytes={offset}-"));
    }
    let resp = rb.send().await.with_context(|| format!("GET {url}"))?;
    let status = resp.status();
    let append = match status.as_u16() {
        206 => {
            let start = content_range_start(resp.headers().get(reqwest::header::CONTENT_RANGE))
                .ok_or_else(|| anyhow!("206 without a usable Content-Range"))?;
            if start != offset {
                bail!("server resumed at {start}, asked for {offset}");
            }
            outcome.resumed = true;
            true
        }
        200 => false,
        416 if offset > 0 => return Ok(()), // nothing left to send; hash decides
        _ => bail!("GET {url}: HTTP {status}"),
    };
    if let (None, Some(len)) = (f.size, resp.content_length()) {
        bar.set_length(len + if append { offset } else { 0 });
    }
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(part)
        .await?;
    bar.set_position(if append { offset } else { 0 });
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.with_context(|| format!("reading {url}"))?;
        file.write_all(&chunk).await?;
        outcome.bytes += chunk.len() as u64;
        bar.inc(chunk.len() as u64);
    }
    file.flush().await?;
    Ok(())
}

/// Start offset from `Content-Range: bytes START-END/TOTAL`.
fn content_range_start(h: Option<&reqwest::header::HeaderValue>) -> Option<u64> {
    let s = h?.to_str().ok()?;
    let range = s.strip_prefix("bytes ")?;
    range.split('-').next()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_both_listings() {
        let hf = json!({"siblings": [
            {"rfilename": "config.json", "size": 10},
            {"rfilename": "model.safetensors", "size": 99, "lfs": {"sha256": "AB", "size": 99}}
        ]});
        let l = parse_listing(HubKind::Huggingface, &hf).unwrap();
        assert_eq!(
            l[0],
            RemoteFile {
                path: "config.json".into(),
                size: Some(10),
                sha256: None
            }
        );
        assert_eq!(l[1].sha256.as_deref(), Some("ab"));
        let ms = json!({"Code": 200, "Data": {"Files": [
            {"Path": "sub", "Type": "tree", "Size": 0},
            {"Path": "sub/a.bin", "Type": "blob", "Size": 5, "Sha256": "cd"}
        ]}});
        let l = parse_listing(HubKind::Modelscope, &ms).unwrap();
        assert_eq!(
            l,
            vec![RemoteFile {
                path: "sub/a.bin".into(),
                size: Some(5),
                sha256: Some("cd".into())
            }]
        );
        assert!(
            parse_listing(HubKind::Modelscope, &json!({"Code": 404, "Message": "no"})).is_err()
        );
        assert!(
            parse_listing(
                HubKind::Huggingface,
                &json!({"siblings": [{"rfilename": "../x"}]})
            )
            .is_err()
        );
    }

    #[test]
    fn urls() {
        let hub = Hub {
            kind: HubKind::Huggingface,
            base: "http://h".into(),
            repo: "o/n".into(),
            revision: "r".into(),
            token: None,
        };
        assert_eq!(hub.file_url("a/b.json"), "http://h/o/n/resolve/r/a/b.json");
        assert_eq!(
            hub.list_url(),
            "http://h/api/models/o/n/revision/r?blobs=true"
        );
        let ms = Hub {
            kind: HubKind::Modelscope,
            ..hub
        };
        assert_eq!(ms.file_url("x"), "http://h/models/o/n/resolve/r/x");
    }
}

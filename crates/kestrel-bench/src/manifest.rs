//! Model file manifest (`manifest.json`): per-file size and SHA-256, and the
//! verification of a folder against it.
//!
//! Sizes alone prove nothing (downloaders preallocate), so every file whose
//! size matches is hashed. Each problem is reported distinctly: missing,
//! truncated (shorter), oversized (longer), corrupt (right size, wrong hash),
//! extra (not in the manifest) and renamed (an extra file whose size and hash
//! equal a missing entry). Paths whose any component starts with `.` are
//! ignored (download state, editor and hub caches).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result, bail};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestFile {
    /// Relative path with `/` separators.
    pub path: String,
    pub size: u64,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub manifest_version: u32,
    #[serde(default)]
    pub repo: Option<String>,
    #[serde(default)]
    pub revision: Option<String>,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum FileStatus {
    Ok,
    Missing,
    Truncated {
        expected_size: u64,
        actual_size: u64,
    },
    Oversized {
        expected_size: u64,
        actual_size: u64,
    },
    Corrupt {
        expected_sha256: String,
        actual_sha256: String,
    },
    Extra {
        size: u64,
    },
    /// The manifest entry `path` was found under another name.
    Renamed {
        found_at: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileCheck {
    pub path: String,
    #[serde(flatten)]
    pub status: FileStatus,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub checks: Vec<FileCheck>,
}

impl VerifyReport {
    /// True when every manifest file is present and intact and nothing is extra.
    pub fn is_clean(&self) -> bool {
        self.checks.iter().all(|c| c.status == FileStatus::Ok)
    }

    /// True when every manifest file is intact (extra files are tolerated).
    pub fn all_present(&self) -> bool {
        self.checks
            .iter()
            .all(|c| matches!(c.status, FileStatus::Ok | FileStatus::Extra { .. }))
    }

    /// Manifest paths that must be (re)downloaded.
    pub fn to_fetch(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| !matches!(c.status, FileStatus::Ok | FileStatus::Extra { .. }))
            .map(|c| c.path.clone())
            .collect()
    }

    pub fn problems(&self) -> Vec<String> {
        self.checks
            .iter()
            .filter(|c| c.status != FileStatus::Ok)
            .map(|c| match &c.status {
                FileStatus::Ok => unreachable!(),
                FileStatus::Missing => format!("missing: {}", c.path),
                FileStatus::Truncated {
                    expected_size,
                    actual_size,
                } => {
                    format!(
                        "truncated: {} ({actual_size} of {expected_size} bytes)",
                        c.path
                    )
                }
                FileStatus::Oversized {
                    expected_size,
                    actual_size,
                } => {
                    format!(
                        "oversized: {} ({actual_size} bytes, expected {expected_size})",
                        c.path
                    )
                }
                FileStatus::Corrupt {
                    expected_sha256,
                    actual_sha256,
                } => {
                    format!(
                        "corrupt: {} (sha256 {actual_sha256}, expected {expected_sha256})",
                        c.path
                    )
                }
                FileStatus::Extra { size } => {
                    format!("extra: {} ({size} bytes, not in the manifest)", c.path)
                }
                FileStatus::Renamed { found_at } => {
                    format!("renamed: {} found as {found_at}", c.path)
                }
            })
            .collect()
    }
}

/// Reject absolute paths, `..` and empty components: a manifest must never
/// point outside the model folder.
pub fn validate_rel_path(p: &str) -> Result<()> {
    let path = Path::new(p);
    if p.is_empty() || p.contains('\\') {
        bail!("bad manifest path {p:?}");
    }
    for c in path.components() {
        if !matches!(c, Component::Normal(_)) {
            bail!("manifest path {p:?} must be relative without '.' or '..' components");
        }
    }
    Ok(())
}

impl Manifest {
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let m: Manifest =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        m.validate()?;
        Ok(m)
    }

    pub fn validate(&self) -> Result<()> {
        if self.manifest_version != MANIFEST_VERSION {
            bail!("manifest_version {} unsupported", self.manifest_version);
        }
        let mut seen = std::collections::HashSet::new();
        for f in &self.files {
            validate_rel_path(&f.path)?;
            if f.sha256.len() != 64 || !f.sha256.chars().all(|c| c.is_ascii_hexdigit()) {
                bail!("manifest entry {}: sha256 must be 64 hex digits", f.path);
            }
            if !seen.insert(&f.path) {
                bail!("manifest lists {} twice", f.path);
            }
        }
        Ok(())
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, serde_json::to_string_pretty(self)? + "\n")
            .with_context(|| format!("writing {}", path.display()))
    }

    /// Manifest of every (non-hidden) file under `dir`, hashed in parallel.
    pub fn from_dir(dir: &Path, repo: Option<String>, revision: Option<String>) -> Result<Self> {
        let files = list_files(dir)?;
        let mut entries: Vec<ManifestFile> = files
            .par_iter()
            .map(|(rel, size)| {
                Ok(ManifestFile {
                    path: rel.clone(),
                    size: *size,
                    sha256: sha256_file(&dir.join(rel))?,
                })
            })
            .collect::<Result<_>>()?;
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(Manifest {
            manifest_version: MANIFEST_VERSION,
            repo,
            revision,
            files: entries,
        })
    }

    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }

    pub fn get(&self, path: &str) -> Option<&ManifestFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

fn is_hidden(rel: &Path) -> bool {
    rel.components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
}

/// Regular files under `dir` (relative `/` paths and sizes), hidden ones skipped.
pub fn list_files(dir: &Path) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for entry in
            std::fs::read_dir(&abs).with_context(|| format!("listing {}", abs.display()))?
        {
            let entry = entry?;
            let child = rel.join(entry.file_name());
            if is_hidden(&child) {
                continue;
            }
            let meta = std::fs::metadata(entry.path())?;
            if meta.is_dir() {
                stack.push(child);
            } else if meta.is_file() {
                let key = child
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy())
                    .collect::<Vec<_>>()
                    .join("/");
                out.insert(key, meta.len());
            }
        }
    }
    Ok(out)
}

/// Verify `dir` against `manifest`.
pub fn verify_dir(dir: &Path, manifest: &Manifest) -> Result<VerifyReport> {
    let mut present = if dir.exists() {
        list_files(dir)?
    } else {
        BTreeMap::new()
    };
    // Hash every present file whose size matches its entry, in parallel.
    let statuses: Vec<(String, FileStatus)> = manifest
        .files
        .par_iter()
        .map(|f| {
            let status = match present.get(&f.path) {
                None => FileStatus::Missing,
                Some(&n) if n < f.size => FileStatus::Truncated {
                    expected_size: f.size,
                    actual_size: n,
                },
                Some(&n) if n > f.size => FileStatus::Oversized {
                    expected_size: f.size,
                    actual_size: n,
                },
                Some(_) => {
                    let got = sha256_file(&dir.join(&f.path))?;
                    if got.eq_ignore_ascii_case(&f.sha256) {
                        FileStatus::Ok
                    } else {
                        FileStatus::Corrupt {
                            expected_sha256: f.sha256.to_lowercase(),
                            actual_sha256: got,
                        }
                    }
                }
            };
            Ok((f.path.clone(), status))
        })
        .collect::<Result<_>>()?;
    for f in &manifest.files {
        present.remove(&f.path);
    }
    // What is left is extra; an extra file identical to a missing entry is a rename.
    let mut checks = Vec::new();
    let mut extra_hashes: BTreeMap<String, String> = BTreeMap::new();
    for (path, status) in statuses {
        let status = if status == FileStatus::Missing {
            let entry = manifest.get(&path).expect("status built from the manifest");
            let mut renamed = None;
            for (extra, &size) in &present {
                if size != entry.size {
                    continue;
                }
                let h = match extra_hashes.get(extra) {
                    Some(h) => h.clone(),
                    None => {
                        let h = sha256_file(&dir.join(extra))?;
                        extra_hashes.insert(extra.clone(), h.clone());
                        h
                    }
                };
                if h.eq_ignore_ascii_case(&entry.sha256) {
                    renamed = Some(extra.clone());
                    break;
                }
            }
            match renamed {
                Some(found_at) => {
                    present.remove(&found_at);
                    FileStatus::Renamed { found_at }
                }
                None => FileStatus::Missing,
            }
        } else {
            status
        };
        checks.push(FileCheck { path, status });
    }
    for (path, size) in present {
        checks.push(FileCheck {
            path,
            status: FileStatus::Extra { size },
        });
    }
    Ok(VerifyReport { checks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_validation() {
        assert!(validate_rel_path("model-00001.safetensors").is_ok());
        assert!(validate_rel_path("sub/x.json").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "./a", "a\\b"] {
            assert!(validate_rel_path(bad).is_err(), "{bad}");
        }
    }
}

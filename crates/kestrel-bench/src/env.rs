//! Environment report and preflight checks.
//!
//! GPU facts come from `nvidia-smi` when it exists. On unified-memory machines
//! (GB10 and similar) `nvidia-smi` reports memory as not supported; system
//! memory from `/proc/meminfo` is used then. The machine identity is never
//! written: only SHA-256(salt || contents of /etc/machine-id), with a salt that
//! belongs to a lock (or run), so two runs can be shown to come from different
//! machines without revealing either id.

use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuInfo {
    pub name: String,
    pub driver_version: String,
    pub compute_capability: Option<String>,
    pub memory_total_mib: Option<u64>,
    pub memory_used_mib: Option<u64>,
    /// True when nvidia-smi cannot report memory (unified memory).
    pub unified_memory: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    pub name: String,
    pub used_memory_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MemInfo {
    pub total_kib: u64,
    pub available_kib: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct EnvReport {
    pub gpus: Vec<GpuInfo>,
    pub cuda_version: Option<String>,
    pub gpu_processes: Vec<GpuProcess>,
    pub memory: Option<MemInfo>,
    pub os: Option<String>,
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
    pub cpu_count: usize,
    pub machine_salt: String,
    /// SHA-256(salt || /etc/machine-id) in hex; None when the id is unreadable.
    pub machine_commitment: Option<String>,
}

/// The fields that must match a lock's target environment.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Fingerprint {
    pub gpu_name: Option<String>,
    pub gpu_count: usize,
    pub compute_capability: Option<String>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
}

impl EnvReport {
    pub fn fingerprint(&self) -> Fingerprint {
        let first = self.gpus.first();
        Fingerprint {
            gpu_name: first.map(|g| g.name.clone()),
            gpu_count: self.gpus.len(),
            compute_capability: first.and_then(|g| g.compute_capability.clone()),
            driver_version: first.map(|g| g.driver_version.clone()),
            cuda_version: self.cuda_version.clone(),
        }
    }
}

/// Fields of `actual` that differ from the locked `target`.
pub fn fingerprint_mismatches(target: &Fingerprint, actual: &Fingerprint) -> Vec<String> {
    let mut out = Vec::new();
    let mut cmp = |name: &str, t: &Option<String>, a: &Option<String>| {
        if t != a {
            out.push(format!("{name}: locked {:?}, found {:?}", t, a));
        }
    };
    cmp("gpu_name", &target.gpu_name, &actual.gpu_name);
    cmp(
        "compute_capability",
        &target.compute_capability,
        &actual.compute_capability,
    );
    cmp(
        "driver_version",
        &target.driver_version,
        &actual.driver_version,
    );
    cmp("cuda_version", &target.cuda_version, &actual.cuda_version);
    if target.gpu_count != actual.gpu_count {
        out.push(format!(
            "gpu_count: locked {}, found {}",
            target.gpu_count, actual.gpu_count
        ));
    }
    out
}

pub fn machine_commitment(salt_hex: &str, machine_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(hex::decode(salt_hex).unwrap_or_else(|_| salt_hex.as_bytes().to_vec()));
    h.update(machine_id.as_bytes());
    hex::encode(h.finalize())
}

pub fn new_salt() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

fn na(s: &str) -> bool {
    let s = s.trim();
    s.is_empty() || s.starts_with('[') || s.eq_ignore_ascii_case("n/a")
}

/// Parse `nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,memory.used --format=csv,noheader,nounits`.
pub fn parse_gpu_csv(text: &str) -> Vec<GpuInfo> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() < 5 {
                return None;
            }
            let mem = |s: &str| if na(s) { None } else { s.parse().ok() };
            Some(GpuInfo {
                name: f[0].to_string(),
                driver_version: f[1].to_string(),
                compute_capability: (!na(f[2])).then(|| f[2].to_string()),
                memory_total_mib: mem(f[3]),
                memory_used_mib: mem(f[4]),
                unified_memory: na(f[3]),
            })
        })
        .collect()
}

/// Parse `nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits`.
pub fn parse_gpu_processes(text: &str) -> Vec<GpuProcess> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').map(str::trim).collect();
            if f.len() < 3 {
                return None;
            }
            Some(GpuProcess {
                pid: f[0].parse().ok()?,
                name: f[1].to_string(),
                used_memory_mib: if na(f[2]) { None } else { f[2].parse().ok() },
            })
        })
        .collect()
}

/// "CUDA Version: 13.0" from the plain `nvidia-smi` banner.
pub fn parse_cuda_version(banner: &str) -> Option<String> {
    let i = banner.find("CUDA Version:")?;
    banner[i + "CUDA Version:".len()..]
        .split_whitespace()
        .next()
        .map(|s| s.trim_end_matches('|').to_string())
}

pub fn parse_meminfo(text: &str) -> Option<MemInfo> {
    let field = |name: &str| {
        text.lines().find(|l| l.starts_with(name)).and_then(|l| {
            l[name.len()..]
                .trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
    };
    Some(MemInfo {
        total_kib: field("MemTotal")?,
        available_kib: field("MemAvailable")?,
    })
}

fn run(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn os_pretty_name() -> Option<String> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    let line = text.lines().find(|l| l.starts_with("PRETTY_NAME="))?;
    Some(line["PRETTY_NAME=".len()..].trim_matches('"').to_string())
}

/// Gather the report; `salt` is the lock's salt (a fresh one when None).
pub fn collect(salt: Option<&str>) -> EnvReport {
    let salt = salt.map(str::to_string).unwrap_or_else(new_salt);
    let gpus = run(
        "nvidia-smi",
        &[
            "--query-gpu=name,driver_version,compute_cap,memory.total,memory.used",
            "--format=csv,noheader,nounits",
        ],
    )
    .map(|t| parse_gpu_csv(&t))
    .unwrap_or_default();
    let cuda_version = if gpus.is_empty() {
        None
    } else {
        run("nvidia-smi", &[]).and_then(|t| parse_cuda_version(&t))
    };
    let gpu_processes = if gpus.is_empty() {
        Vec::new()
    } else {
        run(
            "nvidia-smi",
            &[
                "--query-compute-apps=pid,process_name,used_memory",
                "--format=csv,noheader,nounits",
            ],
        )
        .map(|t| parse_gpu_processes(&t))
        .unwrap_or_default()
    };
    let machine_commitment = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|id| id.trim().to_string())
        .filter(|id| !id.is_empty())
        .map(|id| machine_commitment(&salt, &id));
    EnvReport {
        gpus,
        cuda_version,
        gpu_processes,
        memory: std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_meminfo(&t)),
        os: os_pretty_name(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string()),
        cpu_model: std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        }),
        cpu_count: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
        machine_salt: salt,
        machine_commitment,
    }
}

/// Free bytes on the filesystem holding `path` (its nearest existing ancestor).
pub fn free_disk_bytes(path: &Path) -> Option<u64> {
    let mut p = path;
    while !p.exists() {
        p = p.parent()?;
    }
    let st = nix::sys::statvfs::statvfs(p).ok()?;
    Some(st.blocks_available() as u64 * st.fragment_size() as u64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckLevel {
    Pass,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PreflightCheck {
    pub name: String,
    pub level: CheckLevel,
    pub detail: String,
}

/// Preflight: disk for the missing weights + partial files + results, GPU
/// presence, memory, and other processes on the GPU.
pub fn preflight(
    report: &EnvReport,
    model_dir: &Path,
    bytes_to_download: u64,
    results_reserve: u64,
) -> Vec<PreflightCheck> {
    let mut checks = Vec::new();
    // A resumed download needs room for the part file and nothing else: the
    // part is renamed into place, so the weights count once.
    let need = bytes_to_download + results_reserve;
    checks.push(match free_disk_bytes(model_dir) {
        Some(free) if free >= need => PreflightCheck {
            name: "disk".into(),
            level: CheckLevel::Pass,
            detail: format!(
                "{} free, {} needed on {}",
                gib(free),
                gib(need),
                model_dir.display()
            ),
        },
        Some(free) => PreflightCheck {
            name: "disk".into(),
            level: CheckLevel::Fail,
            detail: format!(
                "{} free, {} needed on {}",
                gib(free),
                gib(need),
                model_dir.display()
            ),
        },
        None => PreflightCheck {
            name: "disk".into(),
            level: CheckLevel::Warn,
            detail: "free space unknown".into(),
        },
    });
    checks.push(if report.gpus.is_empty() {
        PreflightCheck {
            name: "gpu".into(),
            level: CheckLevel::Warn,
            detail: "no NVIDIA GPU found (nvidia-smi absent or failing)".into(),
        }
    } else {
        let g = &report.gpus[0];
        PreflightCheck {
            name: "gpu".into(),
            level: CheckLevel::Pass,
            detail: format!(
                "{} x {} (driver {}, CUDA {}, cc {})",
                report.gpus.len(),
                g.name,
                g.driver_version,
                report.cuda_version.as_deref().unwrap_or("?"),
                g.compute_capability.as_deref().unwrap_or("?")
            ),
        }
    });
    if let Some(g) = report.gpus.first() {
        let detail = match (g.unified_memory, g.memory_total_mib, &report.memory) {
            (true, _, Some(m)) => format!(
                "unified memory: {} total, {} available (/proc/meminfo)",
                gib(m.total_kib * 1024),
                gib(m.available_kib * 1024)
            ),
            (_, Some(t), _) => format!(
                "{} MiB total, {} MiB used",
                t,
                g.memory_used_mib.unwrap_or(0)
            ),
            _ => "memory unknown".into(),
        };
        checks.push(PreflightCheck {
            name: "memory".into(),
            level: CheckLevel::Pass,
            detail,
        });
    }
    checks.push(if report.gpu_processes.is_empty() {
        PreflightCheck {
            name: "gpu_processes".into(),
            level: CheckLevel::Pass,
            detail: "no other process on the GPU".into(),
        }
    } else {
        PreflightCheck {
            name: "gpu_processes".into(),
            level: CheckLevel::Warn,
            detail: report
                .gpu_processes
                .iter()
                .map(|p| {
                    format!(
                        "{} (pid {}, {} MiB)",
                        p.name,
                        p.pid,
                        p.used_memory_mib.map_or("?".into(), |m| m.to_string())
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        }
    });
    checks
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_discrete_and_unified_gpus() {
        let g = parse_gpu_csv(
            "NVIDIA H200, 580.65.06, 9.0, 143771, 512\nNVIDIA GB10, 580.95.05, 12.1, [N/A], [N/A]\n",
        );
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].memory_total_mib, Some(143771));
        assert!(!g[0].unified_memory);
        assert_eq!(g[1].compute_capability.as_deref(), Some("12.1"));
        assert!(g[1].unified_memory && g[1].memory_total_mib.is_none());
    }

    #[test]
    fn parses_cuda_meminfo_and_processes() {
        let banner =
            "| NVIDIA-SMI 580.65.06    Driver Version: 580.65.06    CUDA Version: 13.0     |";
        assert_eq!(parse_cuda_version(banner).as_deref(), Some("13.0"));
        let m = parse_meminfo(
            "MemTotal:       131072000 kB\nMemFree: 1 kB\nMemAvailable:   120000000 kB\n",
        )
        .unwrap();
        assert_eq!(
            m,
            MemInfo {
                total_kib: 131072000,
                available_kib: 120000000
            }
        );
        let p = parse_gpu_processes("1234, /usr/bin/python3, 70000\n55, vllm, [N/A]\n");
        assert_eq!(p[0].pid, 1234);
        assert_eq!(p[1].used_memory_mib, None);
    }

    #[test]
    fn commitment_depends_on_salt_and_hides_the_id() {
        let id = "0123456789abcdef0123456789abcdef";
        let a = machine_commitment(&"00".repeat(32), id);
        let b = machine_commitment(&"01".repeat(32), id);
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
        assert!(!a.contains(id));
        assert_eq!(a, machine_commitment(&"00".repeat(32), id));
    }

    #[test]
    fn fingerprint_mismatch_lists_fields() {
        let t = Fingerprint {
            gpu_name: Some("NVIDIA GB10".into()),
            gpu_count: 1,
            ..Default::default()
        };
        let a = Fingerprint {
            gpu_name: Some("NVIDIA H200".into()),
            gpu_count: 1,
            ..Default::default()
        };
        let m = fingerprint_mismatches(&t, &a);
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("gpu_name"));
        assert!(fingerprint_mismatches(&t, &t).is_empty());
    }

    #[test]
    fn preflight_fails_on_impossible_disk_need() {
        let r = EnvReport::default();
        let checks = preflight(&r, Path::new("."), u64::MAX / 2, 0);
        assert_eq!(checks[0].level, CheckLevel::Fail);
        let checks = preflight(&r, Path::new("."), 0, 0);
        assert_eq!(checks[0].level, CheckLevel::Pass);
    }
}

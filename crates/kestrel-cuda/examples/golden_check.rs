//! The golden fixtures on a chosen backend, into one report.
//!
//! On CUDA the fixtures must pass in the reference arithmetic
//! (`Precision::F32`: f32 activations and KV cache); the serving arithmetic
//! (bf16) is run and reported too; and recorded decode must equal eager
//! decode on every architecture. The checks live in `tests/gpu/golden.rs`,
//! where the GPU tests run them too. Usage:
//! `golden_check [--backend cuda|cpu] [--golden DIR] [--json PATH]`.
//! Exit code 1 when a check fails.

#[path = "../tests/gpu/golden.rs"]
mod golden;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use golden::{ARCHS, REL_TOL, arch_line, check_arch, check_dummy, graph_replay, passed};
use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_cuda::{CudaBackend, Precision};
use serde_json::{Value, json};

/// Recorded against eager decode, every architecture.
fn check_graph_replay(root: &Path) -> Value {
    let mut out = serde_json::Map::new();
    let mut ok = true;
    for arch in ARCHS {
        let r = graph_replay(root, arch);
        ok &= passed(&r);
        out.insert(arch.to_string(), r);
    }
    out.insert("pass".into(), json!(ok));
    Value::Object(out)
}

fn run<B: Backend>(b: &B, root: &Path) -> (Value, bool) {
    let dummy = check_dummy(b);
    let mut all_ok = passed(&dummy);
    let mut out = serde_json::Map::new();
    out.insert("dummy_fill".into(), dummy);
    for arch in ARCHS {
        let r = match check_arch(b, &root.join(arch)) {
            Ok(v) => v,
            Err(e) => json!({ "pass": false, "error": e }),
        };
        all_ok &= passed(&r);
        println!("{}", arch_line(arch, &r));
        out.insert(arch.to_string(), r);
    }
    (
        json!({ "backend": b.name(), "rel_l2_tolerance": REL_TOL, "archs": out }),
        all_ok,
    )
}

fn main() -> ExitCode {
    let mut backend = "cuda".to_string();
    let mut root = PathBuf::from("testdata/golden");
    let mut json_path = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match (a.as_str(), it.next()) {
            ("--backend", Some(v)) => backend = v,
            ("--golden", Some(v)) => root = PathBuf::from(v),
            ("--json", Some(v)) => json_path = Some(v),
            _ => {
                eprintln!("usage: golden_check [--backend cuda|cpu] [--golden DIR] [--json PATH]");
                return ExitCode::from(2);
            }
        }
    }
    let (report, ok) = match backend.as_str() {
        "cpu" => run(&CpuBackend::new(), &root),
        "cuda" => match CudaBackend::new(0) {
            Ok(mut b) => {
                // The fixtures' routing and greedy margins are below bf16
                // rounding: the model definitions are held to them in the
                // reference arithmetic; the serving arithmetic is reported.
                println!("-- precision f32 (must pass)");
                b.set_precision(Precision::F32);
                let (f32_report, f32_ok) = run(&b, &root);
                println!("-- precision bf16 (serving default; reported)");
                b.set_precision(Precision::Bf16);
                let (bf16_report, _) = run(&b, &root);
                let graphs = check_graph_replay(&root);
                let graphs_ok = passed(&graphs);
                let report = json!({
                    "precision_f32": f32_report,
                    "precision_bf16_reported": bf16_report,
                    "graph_replay": graphs,
                });
                (report, f32_ok && graphs_ok)
            }
            Err(e) => {
                eprintln!("cannot open the CUDA backend: {e}");
                return ExitCode::FAILURE;
            }
        },
        other => {
            eprintln!("unknown backend {other}");
            return ExitCode::from(2);
        }
    };
    if let Some(p) = json_path
        && let Err(e) = std::fs::write(&p, serde_json::to_string_pretty(&report).unwrap())
    {
        eprintln!("cannot write {p}: {e}");
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

//! Kernel correctness check: every CUDA operation against the CPU reference.
//!
//! Each case draws fresh random inputs (seeded), poisons CUDA outputs with NaN
//! before the kernels run (so unwritten elements fail), and compares every
//! output by `||cuda - cpu|| / ||cpu||` and `max |cuda - cpu| / max |cpu|`
//! against a tolerance that matches the op's precision.
//!
//! Usage: `kernel_check [--seed N] [--device N] [--json PATH] [--require-cuda]
//! [--only GROUP]` (`--only attention`: the case groups whose name contains it).
//! Exit code 1 when a check fails (or, with `--require-cuda`, when no CUDA
//! device can be used); without CUDA it reports why and exits 0.
//!
//! The checks themselves live in `tests/gpu`, where each group is also a
//! `#[test]` (`cargo test -p kestrel-cuda --features gpu-tests`); this binary
//! runs them all on one backend and writes the JSON report device runs keep.

#[path = "../tests/gpu/cases/mod.rs"]
mod cases;
#[path = "../tests/gpu/compare.rs"]
mod compare;
#[path = "../tests/gpu/data.rs"]
mod data;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use compare::Outcome;
use kestrel_core::Backend;
use kestrel_cuda::CudaBackend;
use serde_json::{Value, json};

struct Args {
    seed: u64,
    device: usize,
    json: Option<String>,
    require_cuda: bool,
    /// Run only the case groups whose name contains this (`--only`).
    only: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        seed: cases::DEFAULT_SEED,
        device: 0,
        json: None,
        require_cuda: false,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--seed" => {
                args.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?
            }
            "--device" => {
                args.device = value("--device")?
                    .parse()
                    .map_err(|e| format!("--device: {e}"))?
            }
            "--json" => args.json = Some(value("--json")?),
            "--require-cuda" => args.require_cuda = true,
            "--only" => args.only = Some(value("--only")?),
            "-h" | "--help" => {
                return Err("usage: kernel_check [--seed N] [--device N] [--json PATH] \
                     [--require-cuda] [--only GROUP]"
                    .into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(args)
}

/// One outcome as a record of the JSON report.
fn outcome_json(o: &Outcome) -> Value {
    let num = |v: f64| if v.is_finite() { json!(v) } else { Value::Null };
    json!({
        "case": o.case,
        "output": o.output,
        "len": o.len,
        "rel_l2": num(o.rel_l2),
        "max_rel": num(o.max_rel),
        "non_finite": o.non_finite,
        "tol": o.tol,
        "pass": o.pass,
        "note": o.note,
    })
}

fn write_json(path: &Option<String>, value: &serde_json::Value) {
    if let Some(p) = path
        && let Err(e) = std::fs::write(p, serde_json::to_string_pretty(value).unwrap())
    {
        eprintln!("cannot write {p}: {e}");
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let gpu = match CudaBackend::new(args.device) {
        Ok(g) => g,
        Err(e) => {
            println!("no CUDA: {e}");
            write_json(
                &args.json,
                &json!({ "status": "no_cuda", "reason": e.to_string() }),
            );
            return if args.require_cuda {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    println!("device: {}  seed: {}", gpu.name(), args.seed);

    let mut ctx = cases::Ctx::new(gpu, args.seed);
    for (name, group) in cases::GROUPS {
        if args.only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| ctx.run_group(group))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            // A group that panicked (a failed assertion or a CUDA fault) is
            // a failure; the groups after it still run.
            let mut o = compare::compare(name, "panic", &[], &[0.0], 0.0);
            o.note = Some(msg);
            println!("{}", o.line());
            ctx.outcomes.push(o);
        }
    }

    let failed = ctx.outcomes.iter().filter(|o| !o.pass).count();
    println!("{} checks, {} failed", ctx.outcomes.len(), failed);
    write_json(
        &args.json,
        &json!({
            "status": if failed == 0 { "pass" } else { "fail" },
            "device": ctx.gpu.name(),
            "seed": args.seed,
            "checks": ctx.outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
        }),
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

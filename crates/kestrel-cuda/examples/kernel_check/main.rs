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

mod cases;
mod compare;
mod data;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::ExitCode;

use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_cuda::CudaBackend;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::json;

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
        seed: 0x6b65_7374,
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
    let mut gpu = match CudaBackend::new(args.device) {
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
    gpu.set_poison_outputs(true);
    println!("device: {}  seed: {}", gpu.name(), args.seed);

    let mut ctx = cases::Ctx {
        cpu: CpuBackend::new(),
        gpu,
        data: data::Data {
            rng: ChaCha8Rng::seed_from_u64(args.seed),
        },
        outcomes: Vec::new(),
    };
    type Case = fn(&mut cases::Ctx);
    let all: [(&str, Case); 13] = [
        ("embedding", cases::embedding),
        ("elementwise", cases::elementwise),
        ("norms", cases::norms),
        ("norm_matmul", cases::norm_matmul),
        ("norm_moe", cases::norm_moe),
        ("matmul", cases::matmul),
        ("attention", cases::attention),
        ("moe", cases::moe),
        ("gated_delta_net", cases::gated_delta_net),
        ("argmax_rows", cases::argmax_rows),
        ("top_candidates", cases::top_candidates),
        ("top_candidates_draw", cases::top_candidates_draw),
        ("precision_f32", cases::precision_f32),
    ];
    for (name, case) in all {
        if args.only.as_deref().is_some_and(|o| !name.contains(o)) {
            continue;
        }
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| case(&mut ctx))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panic".into());
            ctx.panicked(name, msg);
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
            "checks": ctx.outcomes.iter().map(|o| o.to_json()).collect::<Vec<_>>(),
        }),
    );
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

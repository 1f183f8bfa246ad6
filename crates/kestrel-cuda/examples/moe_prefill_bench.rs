//! Micro-benchmark of the prefill MoE block (more than 8 tokens) on dummy bf16
//! weights: Qwen3.6-35B-A3B and Qwen3-30B-A3B layers at 1,024 to 8,192
//! tokens.
//!
//! Prints the time per call and the achieved rate of the block's useful
//! products (router, the k routed experts and the shared expert of every
//! token, 2 FLOP per multiply-add) in TFLOP/s. Timing is host wall-clock
//! around the calls, between stream syncs.
//!
//! Usage: `moe_prefill_bench [--device N] [--host | --mma]`; `--host` times
//! the older host-routed path (`KESTREL_MOE_PREFILL=host`), `--mma` the
//! device-routed path with the mma.sync expert GEMMs instead of the wgmma
//! ones on Hopper (`KESTREL_MOE_GEMM=mma`).

use std::time::Instant;

use kestrel_core::{Backend, MoeSpec};

#[path = "common/bench_args.rs"]
mod bench_args;
#[path = "common/moe_layers.rs"]
mod moe_layers;
use moe_layers::{inputs, moe_layer, target_models};

/// Useful FLOPs of one block over `t` tokens.
fn flops(spec: &MoeSpec, h: usize, t: usize) -> f64 {
    let shared = spec.shared_intermediate.map_or(0, |si| 3 * si * h + h);
    let per_token = spec.num_experts * h + spec.top_k * 3 * spec.intermediate * h + shared;
    2.0 * (t * per_token) as f64
}

fn main() {
    let args = bench_args::parse(
        "moe_prefill_bench [--device N] [--host | --mma]",
        &[
            bench_args::Switch {
                flag: "--host",
                var: "KESTREL_MOE_PREFILL",
                value: "host",
            },
            bench_args::Switch {
                flag: "--mma",
                var: "KESTREL_MOE_GEMM",
                value: "mma",
            },
        ],
    );
    let host = args.has("--host");
    let mma = args.has("--mma");
    let Some(gpu) = bench_args::open(args.device) else {
        return;
    };
    println!(
        "device: {}  path: {}",
        gpu.name(),
        if host {
            "host-routed"
        } else if mma {
            "device-routed, mma.sync expert GEMMs"
        } else {
            "device-routed (wgmma expert GEMMs on Hopper)"
        }
    );
    for (name, spec, h) in target_models() {
        // One layer (over 1 GB of experts, far beyond L2).
        let w = moe_layer(&gpu, &spec, h, 1000);
        for t in [1024usize, 2048, 4096, 8192] {
            let x = gpu.from_host(t, h, &inputs(t, h, 50));
            let reps = if t >= 8192 { 10 } else { 30 };
            for _ in 0..3 {
                drop(gpu.moe(&x, &w, &spec));
            }
            gpu.synchronize().expect("warm-up");
            let t0 = Instant::now();
            for _ in 0..reps {
                drop(gpu.moe(&x, &w, &spec));
            }
            gpu.synchronize().expect("timed calls");
            let secs = t0.elapsed().as_secs_f64() / reps as f64;
            println!(
                "moe prefill {name:<16} T={t:<5} {:>8.3} ms {:>7.1} TFLOP/s",
                secs * 1e3,
                flops(&spec, h, t) / secs / 1e12
            );
        }
    }
}

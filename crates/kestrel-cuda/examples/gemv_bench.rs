//! Micro-benchmark of the decode-time kernels: `matmul` at 1..8 rows (the
//! `gemv` kernels) and the MoE block at 1 and 8 tokens, on dummy bf16 weights.
//!
//! Prints the time per call and the achieved weight bandwidth (weight bytes
//! that must be read / time) against the device's copy bandwidth. Each shape
//! rotates over enough weight copies (and, for MoE, layers and inputs) that
//! the working set is several times the L2, so the numbers are HBM numbers.
//! Timing is host wall-clock around 200 calls, between stream syncs: for the
//! smallest products it includes launch overhead, as an eager decode step does.
//!
//! Usage: `gemv_bench [--device N]`.

use std::time::Instant;

use kestrel_core::dummy::dummy_value;
use kestrel_core::{Backend, DType, MoeSpec, MoeWeights};
use kestrel_cuda::{CudaBackend, CudaTensor, CudaWeight};

#[path = "common/moe_layers.rs"]
mod moe_layers;
use moe_layers::{ROUTER_SCALE, inputs, moe_layer, target_models};

const REPS: usize = 200;
/// Bytes of weights to rotate over per shape: several times a 60 MB L2.
const WORKING_SET: usize = 512 << 20;

/// Seconds per call of `f(i)` over `REPS` calls, after a warm-up.
fn time_per_call(gpu: &CudaBackend, mut f: impl FnMut(usize)) -> f64 {
    for i in 0..10 {
        f(i);
    }
    gpu.synchronize().expect("warm-up");
    let t0 = Instant::now();
    for i in 0..REPS {
        f(i);
    }
    gpu.synchronize().expect("timed calls");
    t0.elapsed().as_secs_f64() / REPS as f64
}

/// Deterministic activations in [-1, 1).
fn report(what: &str, secs: f64, bytes: f64, copy_gbs: f64) {
    let gbs = bytes / secs / 1e9;
    println!(
        "{what:<44} {:>9.2} us {:>8.0} GB/s {:>5.1}% of copy",
        secs * 1e6,
        gbs,
        100.0 * gbs / copy_gbs
    );
}

fn bench_gemv(gpu: &CudaBackend, copy_gbs: f64) {
    for (k, n) in [(2048usize, 12352usize), (4096, 2048), (2048, 248320)] {
        let bytes = n * k * 2;
        let copies = WORKING_SET.div_ceil(bytes).clamp(2, 32);
        let ws: Vec<CudaWeight> = (0..copies)
            .map(|c| {
                gpu.dummy_weight(&[n, k], DType::BF16, 100 + c as u64, 0.0, 0.05)
                    .expect("weight")
            })
            .collect();
        for m in [1usize, 2, 4, 8] {
            let x = gpu.from_host(m, k, &inputs(m, k, 7));
            let secs = time_per_call(gpu, |i| drop(gpu.matmul(&x, &ws[i % copies])));
            report(
                &format!("matmul M={m} K={k} N={n}"),
                secs,
                bytes as f64,
                copy_gbs,
            );
        }
    }
}

/// Bytes the MoE block must read for the tokens `x` of one layer: router,
/// shared expert and gate, and each distinct routed expert once. Routing is
/// recomputed on the host from the dummy router (top-k of the logits equals
/// top-k of the softmax).
fn moe_bytes(spec: &MoeSpec, h: usize, router_seed: u64, x: &[f32]) -> usize {
    let (e, k) = (spec.num_experts, spec.top_k);
    let router: Vec<f32> = (0..(e * h) as u64)
        .map(|i| half::bf16::from_f32(dummy_value(router_seed, i, 0.0, ROUTER_SCALE)).to_f32())
        .collect();
    let mut used = vec![false; e];
    for xt in x.chunks_exact(h) {
        let logits: Vec<f32> = router
            .chunks_exact(h)
            .map(|w| w.iter().zip(xt).map(|(a, b)| a * b).sum())
            .collect();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        for &i in &order[..k] {
            used[i] = true;
        }
    }
    let distinct = used.iter().filter(|&&u| u).count();
    let expert = 3 * spec.intermediate * h * 2;
    let shared = spec
        .shared_intermediate
        .map_or(0, |si| 3 * si * h * 2 + h * 2);
    e * h * 2 + distinct * expert + shared
}

fn bench_moe(gpu: &CudaBackend, copy_gbs: f64) {
    // Layers (all experts of each, > 1 GB) and inputs rotate together, so the
    // picked experts differ from call to call and are not served by L2.
    let layers = 4;
    for (name, spec, h) in target_models() {
        let ws: Vec<MoeWeights<CudaWeight>> = (0..layers)
            .map(|l| moe_layer(gpu, &spec, h, 1000 + l as u64))
            .collect();
        for t in [1usize, 8] {
            let xs_host: Vec<Vec<f32>> = (0..layers).map(|l| inputs(t, h, 50 + l as u64)).collect();
            let xs: Vec<CudaTensor> = xs_host.iter().map(|x| gpu.from_host(t, h, x)).collect();
            let bytes: usize = (0..layers)
                .map(|l| moe_bytes(&spec, h, (1000 + l as u64) * 16, &xs_host[l]))
                .sum::<usize>()
                / layers;
            let secs = time_per_call(gpu, |i| {
                drop(gpu.moe(&xs[i % layers], &ws[i % layers], &spec));
            });
            report(&format!("moe {name} T={t}"), secs, bytes as f64, copy_gbs);
        }
    }
}

fn main() {
    let mut device = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match (a.as_str(), args.next()) {
            ("--device", Some(v)) => device = v.parse().expect("--device N"),
            _ => {
                eprintln!("usage: gemv_bench [--device N]");
                std::process::exit(2);
            }
        }
    }
    let gpu = match CudaBackend::new(device) {
        Ok(g) => g,
        Err(e) => {
            println!("no CUDA: {e}");
            return;
        }
    };
    let copy_gbs = gpu.measure_bandwidth_gbs().unwrap_or(f64::NAN);
    println!("device: {}  copy bandwidth {copy_gbs:.0} GB/s", gpu.name());
    bench_gemv(&gpu, copy_gbs);
    bench_moe(&gpu, copy_gbs);
}

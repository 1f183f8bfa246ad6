//! Micro-benchmark of the causal prefill attention (`Backend::attention` on
//! one sequence with an empty cache) at the shapes of Qwen3.6-35B-A3B
//! (Hq 16, Hkv 2, head_dim 256, rotary 64, output gate; 8,192 tokens) and
//! Qwen3-30B-A3B (Hq 32, Hkv 4, head_dim 128; 8,192 and 32,768 tokens).
//!
//! The op is the q/k norm + RoPE + KV-write kernel followed by the flash
//! attention kernel; the first is memory-bound and small (well under 1 % at
//! these lengths). Per case: one warm-up call, then 5 calls each timed alone
//! (host wall-clock between stream syncs); the median is reported as ms per
//! layer and TFLOP/s of causal attention, 4 * T^2 / 2 * D * Hq FLOP. A
//! checksum of the output's bits is printed: the three kernels agree bit for
//! bit on these shapes (the same 64-key tiles and softmax updates; on an H200
//! the wgmma products summed as mma.sync's did).
//!
//! Usage: `attn_prefill_bench [--device N] [--wg | --v2 | --v1]`. With none
//! it runs itself once per kernel (wgmma, the default on compute capability
//! 9.0; v2 and v1 on mma.sync, `KESTREL_ATTN_PREFILL=v2|v1`), since the
//! choice is read once per process.

use std::process::{Command, ExitCode};
use std::time::Instant;

use kestrel_core::dummy::dummy_value;
use kestrel_core::{
    AttentionSpec, AttentionWeights, Backend, CacheSpec, ForwardBatch, HostTensor, RopeSpec,
    SeqChunk,
};
use kestrel_cuda::CudaBackend;

#[path = "common/bench_args.rs"]
mod bench_args;

const BLOCK_SIZE: usize = 16;
const RUNS: usize = 5;

struct Case {
    label: &'static str,
    hq: usize,
    hkv: usize,
    d: usize,
    rot: usize,
    theta: f32,
    gate: bool,
    tokens: usize,
}

const CASES: [Case; 3] = [
    Case {
        label: "Qwen3.6 Hq16 Hkv2 D256 rot64 gate",
        hq: 16,
        hkv: 2,
        d: 256,
        rot: 64,
        theta: 1e7,
        gate: true,
        tokens: 8192,
    },
    Case {
        label: "Qwen3-30B Hq32 Hkv4 D128",
        hq: 32,
        hkv: 4,
        d: 128,
        rot: 128,
        theta: 1e6,
        gate: false,
        tokens: 8192,
    },
    Case {
        label: "Qwen3-30B Hq32 Hkv4 D128",
        hq: 32,
        hkv: 4,
        d: 128,
        rot: 128,
        theta: 1e6,
        gate: false,
        tokens: 32768,
    },
];

const V1: bench_args::Switch = bench_args::Switch {
    flag: "--v1",
    var: "KESTREL_ATTN_PREFILL",
    value: "v1",
};
const V2: bench_args::Switch = bench_args::Switch {
    flag: "--v2",
    var: "KESTREL_ATTN_PREFILL",
    value: "v2",
};
const WG: bench_args::Switch = bench_args::Switch {
    flag: "--wg",
    var: "KESTREL_ATTN_PREFILL",
    value: "wg",
};

fn main() -> ExitCode {
    let args = bench_args::parse(
        "attn_prefill_bench [--device N] [--wg | --v2 | --v1]",
        &[V1, V2, WG],
    );
    let kernel = if args.has("--v1") {
        "v1"
    } else if args.has("--v2") {
        "v2"
    } else if args.has("--wg") {
        "wg"
    } else {
        // One process per kernel: the selection is read once per process.
        let exe = std::env::current_exe().expect("own executable");
        let mut ok = true;
        for flag in [WG.flag, V2.flag, V1.flag] {
            let status = Command::new(&exe)
                .args(["--device", &args.device.to_string(), flag])
                .status()
                .expect("running the benchmark");
            ok &= status.success();
        }
        return if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    };
    let Some(gpu) = bench_args::open(args.device) else {
        return ExitCode::FAILURE;
    };
    println!(
        "device: {}  kernel: {kernel}{}",
        gpu.name(),
        if kernel == "wg" {
            String::new()
        } else {
            format!(" (KESTREL_ATTN_PREFILL={kernel})")
        }
    );
    for case in &CASES {
        run_case(&gpu, kernel, case);
    }
    ExitCode::SUCCESS
}

fn run_case(gpu: &CudaBackend, kernel: &str, c: &Case) {
    let spec = AttentionSpec {
        num_q_heads: c.hq,
        num_kv_heads: c.hkv,
        head_dim: c.d,
        rope: RopeSpec {
            theta: c.theta,
            rotary_dim: c.rot,
        },
        norm_eps: 1e-6,
        output_gate: c.gate,
        scale: (c.d as f32).powf(-0.5),
    };
    let t = c.tokens;
    let pages = t.div_ceil(BLOCK_SIZE);
    let mut cache = gpu
        .new_cache(&CacheSpec {
            attn_layers: 1,
            num_blocks: pages,
            block_size: BLOCK_SIZE,
            num_kv_heads: c.hkv,
            head_dim: c.d,
            gdn_layers: 0,
            num_state_slots: 0,
            gdn: None,
        })
        .expect("cache");
    let ones = HostTensor::from_f32(vec![c.d], &vec![1.0; c.d]);
    let w = AttentionWeights {
        q_norm: gpu.upload(&ones).expect("q_norm"),
        k_norm: gpu.upload(&ones).expect("k_norm"),
    };
    // The projection (q, [gate,] k, v) of every token: dummy values in [-1, 1).
    let width = spec.proj_width();
    let x: Vec<f32> = (0..(t * width) as u64)
        .map(|i| dummy_value(11, i, 0.0, 1.0))
        .collect();
    let proj = gpu.from_host(t, width, &x);
    drop(x);
    let batch = ForwardBatch {
        seqs: vec![SeqChunk {
            prompt: false,
            num_tokens: t,
            cached_len: 0,
            block_table: (0..pages as u32).collect(),
            state_slot: 0,
            state_checkpoints: Vec::new(),
            state_snapshot: None,
        }],
    };

    // Warm-up (module loading, allocator pools), whose output is checksummed.
    let out = gpu.attention(&proj, &w, &spec, &mut cache, 0, &batch);
    gpu.synchronize().expect("warm-up");
    let checksum = bench_args::checksum(&gpu.to_host(&out));
    drop(out);

    let mut ms: Vec<f64> = (0..RUNS)
        .map(|_| {
            gpu.synchronize().expect("sync");
            let t0 = Instant::now();
            drop(gpu.attention(&proj, &w, &spec, &mut cache, 0, &batch));
            gpu.synchronize().expect("timed call");
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let median = ms[RUNS / 2];
    let flops = 4.0 * (t as f64) * (t as f64) / 2.0 * c.d as f64 * c.hq as f64;
    println!(
        "{kernel} {:<34} T={t:<6} {median:>9.3} ms/layer {:>7.1} TFLOP/s  (min {:.3} max {:.3} ms)  checksum {checksum:016x}",
        c.label,
        flops / (median * 1e-3) / 1e12,
        ms[0],
        ms[RUNS - 1],
    );
}

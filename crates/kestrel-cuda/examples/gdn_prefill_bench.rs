//! Micro-benchmark of one Gated DeltaNet layer in prefill at the
//! Qwen3.6-35B-A3B shape (read from `configs/`): 32 value heads, 16 key
//! heads, Dk = Dv = 128, on dummy weights and inputs.
//!
//! Times `Backend::gated_delta_net` (conv, the chunked prep and state
//! kernels, the gated norm) per call, i.e. per layer, for one sequence of
//! 8,192 tokens and for 4 sequences of 2,048, and prints the rate of the
//! chunked form's products (~3.5 M multiply-adds per chunk and value head in
//! the state pass plus ~1 M in the prep, 2 FLOP each; see gdn_chunk.cu).
//! Timing is host wall-clock around the calls, between stream syncs.
//!
//! Usage: `gdn_prefill_bench [--device N] [--3xtf32]`. By default it times
//! the serving precision's kernels (one TF32 pass per product); `--3xtf32`
//! the reference precision's f32-accurate products
//! (`KESTREL_GDN_PREFILL=3xtf32`).

use std::path::Path;
use std::time::Instant;

use kestrel_core::dummy::dummy_value;
use kestrel_core::{Backend, CacheSpec, DType, ForwardBatch, GdnSpec, GdnWeights, SeqChunk};
use kestrel_models::ModelConfig;
use kestrel_models::blocks::gdn::gdn_spec;

/// Useful FLOPs of the chunked form over `chunks` chunk-heads (see above).
fn flops(chunks: usize) -> f64 {
    2.0 * 4.5e6 * chunks as f64
}

#[path = "common/bench_args.rs"]
mod bench_args;

fn main() {
    let args = bench_args::parse(
        "gdn_prefill_bench [--device N] [--3xtf32]",
        &[bench_args::Switch {
            flag: "--3xtf32",
            var: "KESTREL_GDN_PREFILL",
            value: "3xtf32",
        }],
    );
    let path_name = if args.has("--3xtf32") {
        "tensor cores (3xTF32)"
    } else {
        "tensor cores (TF32)"
    };
    let Some(gpu) = bench_args::open(args.device) else {
        return;
    };
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/qwen3.6-35b-a3b/config.json");
    let cfg = ModelConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let spec: GdnSpec = gdn_spec(&cfg).expect("a hybrid model with linear attention");
    println!(
        "device: {}  path: {}  Hk {} Hv {} Dk {} Dv {}",
        gpu.name(),
        path_name,
        spec.num_k_heads,
        spec.num_v_heads,
        spec.head_k_dim,
        spec.head_v_dim
    );
    let hv = spec.num_v_heads;
    let dummy = |shape: &[usize], dtype: DType, seed: u64, offset: f32, scale: f32| {
        gpu.dummy_weight(shape, dtype, seed, offset, scale)
            .expect("weight")
    };
    let w = GdnWeights {
        conv: dummy(
            &[spec.conv_dim(), spec.conv_kernel],
            DType::BF16,
            1,
            0.0,
            0.5,
        ),
        // A = exp(A_log) in (0.37, 2.7): the model's range of decays.
        a_log: dummy(&[hv], DType::F32, 2, 0.0, 1.0),
        dt_bias: dummy(&[hv], DType::F32, 3, 0.0, 1.0),
        norm: dummy(&[spec.head_v_dim], DType::F32, 4, 1.0, 0.1),
    };
    let slots = 4;
    let mut cache = gpu
        .new_cache(&CacheSpec {
            attn_layers: 0,
            num_blocks: 0,
            block_size: 16,
            num_kv_heads: 0,
            head_dim: 0,
            gdn_layers: 1,
            num_state_slots: slots,
            gdn: Some(spec),
        })
        .expect("cache");
    for slot in 0..slots as u32 {
        gpu.zero_state(&mut cache, slot);
    }
    let t = 8192;
    // The projection (q, k, v, z, b, a) of every token: dummy values in [-1, 1).
    let width = spec.proj_width();
    let x: Vec<f32> = (0..(t * width) as u64)
        .map(|i| dummy_value(5, i, 0.0, 1.0))
        .collect();
    let proj = gpu.from_host(t, width, &x);
    drop(x);
    for seqs in [1usize, 4] {
        let batch = ForwardBatch {
            seqs: (0..seqs)
                .map(|i| SeqChunk {
                    prompt: false,
                    num_tokens: t / seqs,
                    cached_len: 0,
                    block_table: vec![],
                    state_slot: i as u32,
                    state_checkpoints: Vec::new(),
                    state_snapshot: None,
                })
                .collect(),
        };
        let chunks = seqs * (t / seqs).div_ceil(64) * hv;
        let reps = 20;
        // From zero states, a checksum of the output's bits, to compare
        // kernel variants.
        for slot in 0..slots as u32 {
            gpu.zero_state(&mut cache, slot);
        }
        let out = gpu.gated_delta_net(&proj, &w, &spec, &mut cache, 0, &batch);
        let checksum = bench_args::checksum(&gpu.to_host(&out));
        drop(out);
        for _ in 0..3 {
            drop(gpu.gated_delta_net(&proj, &w, &spec, &mut cache, 0, &batch));
        }
        gpu.synchronize().expect("warm-up");
        let t0 = Instant::now();
        for _ in 0..reps {
            drop(gpu.gated_delta_net(&proj, &w, &spec, &mut cache, 0, &batch));
        }
        gpu.synchronize().expect("timed calls");
        let secs = t0.elapsed().as_secs_f64() / reps as f64;
        println!(
            "gdn prefill T={t} seqs={seqs:<2} {:>8.3} ms per layer {:>7.1} TFLOP/s (chunked products)  checksum {checksum:016x}",
            secs * 1e3,
            flops(chunks) / secs / 1e12
        );
    }
}

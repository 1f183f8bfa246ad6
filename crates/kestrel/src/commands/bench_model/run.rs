//! The measurements: prefill runs, decode and verify steps driven directly
//! through `Decoder::forward` with hand-built `ForwardBatch`es (no
//! scheduler), so the numbers are the model's and the backend's alone; then,
//! with `--speculative replay`, whole speculative steps through the engine.

use std::time::Instant;

use anyhow::Result;
use kestrel_core::Backend;
use kestrel_models::Model;
use serde_json::{Value, json};

use super::replay_bench;
use super::report::{self, Breakdown, PrefillResult, Stats, VerifyResult};
use super::steps::{self, BLOCK_SIZE, prefill_sequence, prompt_ids};
use super::timing::Timed;
use super::traffic::{self, Storage};
use super::{Args, Source, bandwidth, dflash_draft, mtp_draft};

/// `plan`: the CUDA backend's kernel plan, written into the JSON (`None`
/// for the CPU backend, which has none).
pub fn bench<B: Backend>(
    b: &Timed<B>,
    storage: Storage,
    source: &Source,
    args: &Args,
    plan: Option<Value>,
) -> Result<()> {
    // Only the CUDA backend has a kernel plan.
    let on_cuda = plan.is_some();
    let load_start = Instant::now();
    let (model, load_stats) = if source.dummy {
        let quantization = args.quantization.form();
        (
            Model::load_dummy_as(&source.path, b, args.seed, quantization)?,
            None,
        )
    } else {
        let (model, stats) = Model::load_as(&source.path, b, args.quantization.form())?;
        (model, Some(stats))
    };
    b.synchronize()?;
    let load_s = load_start.elapsed().as_secs_f64();
    let cfg = model.config().clone();
    eprintln!(
        "loaded {} ({} layers) on {} in {load_s:.1} s",
        source.label,
        cfg.num_layers,
        b.name()
    );
    if let Some(stats) = &load_stats {
        eprintln!("  load: {}", stats.summary());
    }

    let (bandwidth_gbs, bandwidth_source) = match args.bandwidth_gbs {
        Some(g) => (g, "given with --bandwidth-gbs".to_string()),
        None => match b.measure_bandwidth_gbs() {
            Some(g) => (
                g,
                "measured: 2 GiB device-to-device copy, (read + write bytes) / time, median of 10"
                    .into(),
            ),
            None => (
                bandwidth::host_read_gbs(512 << 20),
                "measured: multi-threaded streaming read of 512 MiB, median of 5".into(),
            ),
        },
    };
    eprintln!("memory bandwidth {bandwidth_gbs:.1} GB/s ({bandwidth_source})");

    let sampled_vocab = sampled_vocab(source, cfg.vocab_size)?;
    let max_len = cfg.max_position_embeddings;
    let mut skipped = Vec::new();
    let mut prefills = Vec::new();
    for &len in &args.prefill {
        if len > max_len {
            skipped.push(format!(
                "prefill {len}: longer than the model's {max_len} positions"
            ));
            continue;
        }
        eprintln!("prefill {len} tokens ...");
        let p = prefill(b, &model, len, args)?;
        eprintln!("  {}", p.to_json());
        prefills.push(p);
    }
    let mut decodes = Vec::new();
    for &batch in &args.decode_batch {
        let total = args.context + args.warmup + args.steps + args.breakdown_steps;
        if total > max_len {
            skipped.push(format!(
                "decode batch {batch}: {total} positions exceed the model's {max_len}"
            ));
            continue;
        }
        eprintln!("decode batch {batch} ...");
        let (d, breakdown) = steps::decode(
            b,
            &model,
            batch,
            storage,
            bandwidth_gbs,
            sampled_vocab,
            args,
        )?;
        eprintln!("  {}", report::decode_json(&d, &breakdown));
        decodes.push((d, breakdown));
    }
    let hybrid = cfg.arch.is_hybrid();
    let mut verifies = Vec::new();
    if !args.verify_k.is_empty() && hybrid && !b.supports_state_checkpoints() {
        skipped.push(format!(
            "verify steps: a hybrid model needs state checkpoints, which the {} backend does \
             not support yet",
            b.name()
        ));
    } else {
        for &batch in &args.verify_batches {
            for &k in &args.verify_k {
                let total = args.context + k + 1;
                if total > max_len {
                    skipped.push(format!(
                        "verify batch {batch} k {k}: {total} positions exceed the model's {max_len}"
                    ));
                    continue;
                }
                eprintln!("verify batch {batch} k {k} ...");
                let (stats, breakdown) = steps::verify(b, &model, batch, k, args)?;
                let v = VerifyResult {
                    batch,
                    k,
                    context: args.context,
                    stats,
                    bytes: traffic::verify_bytes(&cfg, storage, batch, args.context as f64, k),
                    bandwidth_gbs,
                };
                eprintln!("  {}", v.to_json(&breakdown));
                verifies.push((v, breakdown));
            }
        }
    }

    let drafts = mtp_draft::run_all(
        b,
        &model,
        storage,
        bandwidth_gbs,
        sampled_vocab,
        args,
        &mut skipped,
    )?;

    let dflash = dflash_draft::run_all(b, &model, storage, bandwidth_gbs, source.dummy, args)?;

    // Last: the engine takes the model.
    let replay = match args.replay_settings(sampled_vocab)? {
        None => None,
        Some(settings) => {
            let total = settings.context + settings.max_tokens + settings.profile.len() + 1;
            if let Some(why) = replay_bench::unsupported(b, &model) {
                skipped.push(why);
                None
            } else if total > max_len {
                skipped.push(format!(
                    "speculative replay: {total} positions exceed the model's {max_len}"
                ));
                None
            } else {
                eprintln!("{} through the engine ...", settings.profile.label());
                let results = replay_bench::run(b.clone(), model, &settings)?;
                Some((settings, results))
            }
        }
    };

    let summary = json!({
        "model": {
            "source": source.label,
            "weights": if source.dummy { format!("dummy (seed {})", args.seed) } else { "checkpoint".into() },
            "quantization": format!("{:?}", args.quantization.get()),
            "lm_head_fp8": args.quantization.form().lm_head_fp8,
            "model_type": cfg.model_type,
            "layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "load_seconds": load_s,
            "load": load_stats.as_ref().map(|s| s.to_json()),
        },
        "backend": b.name(),
        "plan": plan,
        "storage_bytes": {
            "matrix_weight": storage.matrix,
            "quantized_weight": storage.quantized,
            "kv_cache": storage.kv,
        },
        "bandwidth_gbs": bandwidth_gbs,
        "bandwidth_source": bandwidth_source,
        "settings": {
            "context": args.context, "steps": args.steps, "warmup": args.warmup,
            "prefill_runs": args.prefill_runs, "breakdown_steps": args.breakdown_steps,
            "max_batched_tokens": args.max_batched_tokens, "block_size": BLOCK_SIZE,
            "replayed_decode_steps": on_cuda && !args.eager,
            "replayed_verify_steps": on_cuda && !args.eager,
            "sampling": format!("{:?}", args.sampling).to_lowercase(),
            "sampled_vocab": sampled_vocab,
            "verify_k": args.verify_k, "verify_batches": args.verify_batches,
            "mtp_draft_k": args.mtp_draft_k, "mtp_draft_batches": args.mtp_draft_batches,
            "dflash_drafter": args.dflash_drafter, "dflash_blocks": args.dflash_blocks, "dflash_batches": args.dflash_batches,
        },
        "prefill": prefills.iter().map(PrefillResult::to_json).collect::<Vec<Value>>(),
        "decode": decodes.iter().map(|(d, b)| report::decode_json(d, b)).collect::<Vec<Value>>(),
        "verify": verifies.iter().map(|(v, b)| v.to_json(b)).collect::<Vec<Value>>(),
        "mtp_draft": drafts.iter().map(|(d, b)| d.to_json(b)).collect::<Vec<Value>>(),
        "dflash_draft": dflash.iter().map(|(d, b)| d.to_json(b)).collect::<Vec<Value>>(),
        "speculative": replay.as_ref().map(|(settings, results)| json!({
            "proposer": settings.profile.label(),
            "profile": settings.profile.rates(),
            "context": settings.context,
            "max_tokens": settings.max_tokens,
            "seed": settings.seed,
            "draft_rows": format!("{:?}", settings.draft_rows),
            "adaptive_drafts": settings.adaptive_drafts,
            "runs": results.iter().map(|r| r.to_json(&settings.profile)).collect::<Vec<Value>>(),
        })),
        "skipped": skipped,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    report::print(&summary, &prefills, &decodes, &verifies);
    mtp_draft::print(&drafts);
    dflash_draft::print(&dflash);
    if let Some((settings, results)) = &replay {
        replay_bench::print(results, &settings.profile, settings);
    }
    report::print_skipped(&skipped);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)? + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Ids the decode steps may choose: the tokenizer's vocabulary when one lies
/// next to the model and the embedding is padded beyond it (as the server
/// masks them); `None` (every id) otherwise.
fn sampled_vocab(source: &Source, model_vocab: usize) -> Result<Option<usize>> {
    let dir = if source.path.is_dir() {
        source.path.clone()
    } else {
        source.path.parent().map(Into::into).unwrap_or_default()
    };
    let path = dir.join("tokenizer.json");
    if !path.exists() {
        return Ok(None);
    }
    let vocab = kestrel_text::Tokenizer::from_file(&path)?.vocab_size();
    Ok((vocab < model_vocab).then_some(vocab))
}

fn prefill<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    len: usize,
    args: &Args,
) -> Result<PrefillResult> {
    let cfg = model.config();
    let ids = prompt_ids(len, cfg.vocab_size, 0);
    let pages: Vec<u32> = (0..len.div_ceil(BLOCK_SIZE) as u32).collect();
    let spec = model.decoder.cache_spec(pages.len(), BLOCK_SIZE, 1);
    let mut cache = b.new_cache(&spec)?;
    let mut run = |record: bool| -> Result<f64> {
        b.zero_state(&mut cache, 0);
        b.synchronize()?;
        b.record(record);
        let start = Instant::now();
        prefill_sequence(
            b,
            model,
            &mut cache,
            &ids,
            &pages,
            0,
            args.max_batched_tokens,
        )?;
        let secs = start.elapsed().as_secs_f64();
        b.record(false);
        Ok(secs)
    };
    run(false)?; // warm-up: module loads, allocator growth, cuBLAS heuristics
    let times = (0..args.prefill_runs)
        .map(|_| run(false))
        .collect::<Result<Vec<f64>>>()?;
    let breakdown = if args.breakdown_steps > 0 && len <= args.breakdown_max_prefill {
        let secs = run(true)?;
        Some(Breakdown::new(&b.breakdown(), 1, secs))
    } else {
        None
    };
    Ok(PrefillResult {
        tokens: len,
        chunks: len.div_ceil(args.max_batched_tokens),
        stats: Stats::of(&times),
        flops: traffic::prefill_flops(cfg, len),
        breakdown,
    })
}

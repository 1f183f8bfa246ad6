//! The measurements: prefill runs and decode steps driven directly through
//! `Decoder::forward` with hand-built `ForwardBatch`es (no scheduler), so
//! the numbers are the model's and the backend's alone.

use std::time::Instant;

use anyhow::{Result, bail};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_models::Model;
use serde_json::{Value, json};

use super::report::{self, Breakdown, DecodeResult, PrefillResult, Stats};
use super::sampling::TokenChooser;
use super::timing::Timed;
use super::traffic::{self, Storage};
use super::{Args, Source, bandwidth};

const BLOCK_SIZE: usize = 16;

/// `plan`: the CUDA backend's kernel plan, written into the JSON (`None`
/// for the CPU backend, which has none).
pub fn bench<B: Backend>(
    b: &Timed<B>,
    storage: Storage,
    source: &Source,
    args: &Args,
    plan: Option<Value>,
) -> Result<()> {
    let load_start = Instant::now();
    let (model, load_stats) = if source.dummy {
        (Model::load_dummy(&source.path, b, args.seed)?, None)
    } else {
        let (model, stats) = Model::load_timed(&source.path, b)?;
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
        let (d, breakdown) = decode(b, &model, batch, storage, bandwidth_gbs, args)?;
        eprintln!("  {}", report::decode_json(&d, &breakdown));
        decodes.push((d, breakdown));
    }

    let summary = json!({
        "model": {
            "source": source.label,
            "weights": if source.dummy { format!("dummy (seed {})", args.seed) } else { "checkpoint".into() },
            "model_type": cfg.model_type,
            "layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "load_seconds": load_s,
            "load": load_stats.as_ref().map(|s| s.to_json()),
        },
        "backend": b.name(),
        "plan": plan,
        "storage_bytes": { "matrix_weight": storage.matrix, "kv_cache": storage.kv },
        "bandwidth_gbs": bandwidth_gbs,
        "bandwidth_source": bandwidth_source,
        "settings": {
            "context": args.context, "steps": args.steps, "warmup": args.warmup,
            "prefill_runs": args.prefill_runs, "breakdown_steps": args.breakdown_steps,
            "max_batched_tokens": args.max_batched_tokens, "block_size": BLOCK_SIZE,
            "replayed_decode_steps": args.backend == super::BackendKind::Cuda && !args.eager,
            "sampling": format!("{:?}", args.sampling).to_lowercase(),
        },
        "prefill": prefills.iter().map(PrefillResult::to_json).collect::<Vec<Value>>(),
        "decode": decodes.iter().map(|(d, b)| report::decode_json(d, b)).collect::<Vec<Value>>(),
        "skipped": skipped,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    report::print(&summary, &prefills, &decodes, &skipped);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&summary)? + "\n")
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Prompt token ids: a fixed pseudo-random sequence inside the vocabulary.
fn prompt_ids(len: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i.wrapping_add(salt * 7919)).wrapping_mul(2_654_435_761) % vocab) as u32)
        .collect()
}

/// Feeds `ids` to one sequence from position `start`, in chunks of at most
/// `budget` tokens, and returns the greedy next token.
#[allow(clippy::too_many_arguments)]
fn prefill_sequence<B: Backend>(
    b: &B,
    model: &Model<B>,
    cache: &mut B::Cache,
    ids: &[u32],
    pages: &[u32],
    slot: u32,
    budget: usize,
) -> Result<u32> {
    let mut done = 0;
    let mut next = 0;
    while done < ids.len() {
        let n = budget.min(ids.len() - done);
        let batch = ForwardBatch {
            seqs: vec![SeqChunk {
                num_tokens: n,
                cached_len: done,
                block_table: pages[..(done + n).div_ceil(BLOCK_SIZE)].to_vec(),
                state_slot: slot,
                state_checkpoints: Vec::new(),
            }],
        };
        let chunk = &ids[done..done + n];
        done += n;
        if done == ids.len() {
            let logits = model.decoder.step_logits(b, chunk, &batch, cache, &[n - 1]);
            next = b.argmax_rows(&logits, model.config().vocab_size)[0];
        } else {
            model.decoder.forward(b, chunk, &batch, cache);
        }
    }
    Ok(next)
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

fn decode<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    batch: usize,
    storage: Storage,
    bandwidth_gbs: f64,
    args: &Args,
) -> Result<(DecodeResult, Option<Breakdown>)> {
    let cfg = model.config();
    let vocab = cfg.vocab_size;
    let total = args.context + args.warmup + args.steps + args.breakdown_steps;
    let per_seq = total.div_ceil(BLOCK_SIZE);
    let spec = model.decoder.cache_spec(per_seq * batch, BLOCK_SIZE, batch);
    let mut cache = b.new_cache(&spec)?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    // Untimed: every sequence holds `context` tokens of its own prompt.
    let mut tokens = Vec::with_capacity(batch);
    let mut histories = Vec::with_capacity(batch);
    for (s, table) in tables.iter().enumerate() {
        b.zero_state(&mut cache, s as u32);
        let mut ids = prompt_ids(args.context, vocab, s + 1);
        let first = prefill_sequence(
            b,
            model,
            &mut cache,
            &ids,
            table,
            s as u32,
            args.max_batched_tokens,
        )?;
        tokens.push(first);
        ids.push(first);
        histories.push(ids);
    }
    let mut chooser = TokenChooser::new(args.sampling, histories)?;
    let mut len = args.context;
    let mut step = |tokens: &mut Vec<u32>| -> Result<f64> {
        let fb = ForwardBatch {
            seqs: tables
                .iter()
                .enumerate()
                .map(|(s, t)| SeqChunk {
                    num_tokens: 1,
                    cached_len: len,
                    block_table: t[..(len + 1).div_ceil(BLOCK_SIZE)].to_vec(),
                    state_slot: s as u32,
                    state_checkpoints: Vec::new(),
                })
                .collect(),
        };
        b.synchronize()?;
        let start = Instant::now();
        let rows: Vec<usize> = (0..tokens.len()).collect();
        let logits = model.decoder.step_logits(b, tokens, &fb, &mut cache, &rows);
        *tokens = chooser.choose(b, &logits)?;
        let secs = start.elapsed().as_secs_f64();
        len += 1;
        if tokens.iter().any(|&t| t as usize >= vocab) {
            bail!("a token outside the vocabulary");
        }
        Ok(secs)
    };
    for _ in 0..args.warmup {
        step(&mut tokens)?;
    }
    let first_timed_context = args.context + args.warmup;
    let times = (0..args.steps)
        .map(|_| step(&mut tokens))
        .collect::<Result<Vec<f64>>>()?;
    let breakdown = if args.breakdown_steps > 0 {
        b.record(true);
        let mut wall = 0.0;
        for _ in 0..args.breakdown_steps {
            wall += step(&mut tokens)?;
        }
        b.record(false);
        Some(Breakdown::new(&b.breakdown(), args.breakdown_steps, wall))
    } else {
        None
    };
    if chooser.sampled > 0 {
        eprintln!(
            "decode batch {batch}, sampling {:?}: {} of {} sampled tokens needed their whole row",
            args.sampling, chooser.full_rows, chooser.sampled
        );
    }
    // The mean cached length over the timed steps.
    let context = first_timed_context as f64 + (args.steps as f64 - 1.0) / 2.0;
    let bytes = traffic::step_bytes(cfg, storage, batch, context, 1);
    let result = DecodeResult {
        batch,
        context: first_timed_context,
        stats: Stats::of(&times),
        bytes,
        bandwidth_gbs,
    };
    Ok((result, breakdown))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ids_stay_in_the_vocabulary_and_differ_per_sequence() {
        let a = prompt_ids(1000, 37, 0);
        assert!(a.iter().all(|&t| t < 37));
        assert_ne!(a, prompt_ids(1000, 37, 1));
    }
}

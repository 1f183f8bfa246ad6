//! DFlash drafter pass timing (`--dflash-drafter`): what the drafting pass
//! of a step costs, by block size and by the number of sequences drafted in
//! it.
//!
//! A pass is what the engine's DFlash proposer runs for a decoding sequence
//! after each step: the block `[anchor, mask x (B-1)]` through every drafter
//! layer (attending to the sequence's context keys and its own), the
//! drafter's norm, the target's lm_head on the B-1 mask rows and their
//! argmax. Every sequence holds `--context` tokens of context (at most the
//! draft window), made from random stand-ins for the target's tapped hidden
//! states; each pass leaves the context as it was. Several sequences share
//! one pass, as the proposer runs them: their blocks are row groups of every
//! product and only the attention runs per sequence.
//! With `--draft-vocab` / `--draft-vocab-size` every pass is also timed
//! scoring only that vocabulary's rows of the lm_head.
//! Its floor: the drafter's layer weights and the lm_head rows scored, read
//! once per step, and every sequence's context keys and values, over the
//! bandwidth.

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kestrel_core::Backend;
use kestrel_models::{DflashDrafter, DraftContext, DraftHead, Model};
use serde_json::{Value, json};

use super::Args;
use super::report::{Breakdown, Stats};
use super::steps::time_steps;
use super::timing::Timed;
use super::traffic::Storage;

/// Bytes of a block pass: the weights, and one sequence's context.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassBytes {
    /// The drafter's layers and norms.
    pub layer_weights: f64,
    pub lm_head: f64,
    /// Context keys and values of every layer (bf16 on CUDA).
    pub context_kv: f64,
    pub total: f64,
}

pub fn pass_bytes<B: Backend>(
    drafter: &DflashDrafter<B>,
    vocab: usize,
    full_head: bool,
    context: usize,
    st: Storage,
) -> PassBytes {
    let c = &drafter.config.layers;
    let (h, d) = (c.hidden_size, c.head_dim);
    let (qw, kvw) = (c.num_heads * d, c.num_kv_heads * d);
    let per_layer = (qw + 2 * kvw) * h + h * qw + 3 * c.dense_intermediate.unwrap_or(0) * h;
    let vectors = (2 * h + 2 * d) * 4;
    let layers = drafter.num_layers() as f64;
    let layer_weights = layers * (per_layer * st.quantized + vectors) as f64 + (h * 4) as f64;
    // The whole head is the target's (FP8 with --lm-head-dtype fp8); a
    // reduced draft vocabulary's is bf16.
    let head = if full_head { st.lm_head } else { st.matrix };
    let lm_head = (vocab * h * head) as f64;
    let context_kv = layers * (context * 2 * kvw * st.kv) as f64;
    PassBytes {
        layer_weights,
        lm_head,
        context_kv,
        total: layer_weights + lm_head + context_kv,
    }
}

pub struct PassResult {
    pub batch: usize,
    pub block: usize,
    pub context: usize,
    /// The reduced draft vocabulary scored (`None`: the whole lm_head).
    pub draft_vocab: Option<String>,
    pub head_rows: usize,
    /// Time of the step's pass (all `batch` sequences).
    pub stats: Stats,
    pub bytes: PassBytes,
    pub bandwidth_gbs: f64,
}

impl PassResult {
    /// Weights once, context of every sequence.
    fn floor_s(&self) -> f64 {
        let b = &self.bytes;
        let bytes = b.layer_weights + b.lm_head + self.batch as f64 * b.context_kv;
        bytes / (self.bandwidth_gbs * 1e9)
    }

    pub fn to_json(&self, breakdown: &Option<Breakdown>) -> Value {
        let b = &self.bytes;
        json!({
            "batch": self.batch,
            "block": self.block,
            "drafts": self.block - 1,
            "context": self.context,
            "draft_vocab": self.draft_vocab,
            "head_rows": self.head_rows,
            "median_ms": self.stats.median * 1e3,
            "per_sequence_ms": self.stats.median * 1e3 / self.batch as f64,
            "times_ms": self.stats.all.iter().map(|t| t * 1e3).collect::<Vec<f64>>(),
            "bytes_per_pass": {
                "layer_weights": b.layer_weights, "lm_head": b.lm_head,
                "context_kv": b.context_kv, "total": b.total,
            },
            "floor_ms": self.floor_s() * 1e3,
            "fraction_of_floor": self.floor_s() / self.stats.median,
            "breakdown": breakdown.as_ref().map(Breakdown::to_json),
        })
    }
}

/// The drafter of `--dflash-drafter`: random weights at its config's shapes
/// when the target is dummy, the folder's weights otherwise.
fn load<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    path: &Path,
    dummy: bool,
    seed: u64,
) -> Result<DflashDrafter<Timed<B>>> {
    if dummy {
        DflashDrafter::dummy(path, b, &model.decoder, seed ^ 0xdf1a5)
    } else {
        DflashDrafter::load(path, b, &model.decoder)
    }
}

/// Every `--dflash-batches` x `--dflash-blocks` pass.
pub fn run_all<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    storage: Storage,
    bandwidth_gbs: f64,
    dummy: bool,
    args: &Args,
) -> Result<Vec<(PassResult, Option<Breakdown>)>> {
    let mut results = Vec::new();
    let Some(path) = &args.dflash_drafter else {
        return Ok(results);
    };
    let drafter = load(b, model, path, dummy, args.seed)?;
    let vocab = model.config().vocab_size;
    let mut heads = vec![(None, DraftHead::full(vocab))];
    if let Some((v, label)) = super::mtp_draft::draft_vocab(args, vocab)? {
        let head = DraftHead::reduced(b, &model.decoder, v.ids())
            .context("cannot build the reduced draft head")?;
        heads.push((Some(label), head));
    }
    let h = model.config().hidden_size;
    let max_batch = args.dflash_batches.iter().copied().max().unwrap_or(1);
    eprintln!(
        "DFlash drafter: {} layers, building {max_batch} contexts of {} tokens ...",
        drafter.num_layers(),
        args.context
    );
    let taps = drafter.config.target_layer_ids.len();
    let mut contexts: Vec<DraftContext<Timed<B>>> = Vec::with_capacity(max_batch);
    let mut anchors = Vec::with_capacity(max_batch);
    let mut drawn = 0u64;
    for s in 0..max_batch {
        let mut ctx = DraftContext::new(args.context);
        let mut done = 0;
        while done < args.context {
            let n = args.max_batched_tokens.min(args.context - done);
            let stand_ins: Vec<_> = (0..taps)
                .map(|_| {
                    let v: Vec<f32> = (0..n * h)
                        .map(|_| {
                            drawn += 1;
                            kestrel_core::dummy::dummy_value(args.seed ^ 0x7a95, drawn, 0.0, 1.0)
                        })
                        .collect();
                    b.from_host(n, h, &v)
                })
                .collect();
            ctx.append(b, &drafter, &stand_ins);
            done += n;
        }
        contexts.push(ctx);
        anchors.push(((s * 7919 + 13) % vocab) as u32);
    }
    for &batch in &args.dflash_batches {
        for (&block, (label, head)) in args
            .dflash_blocks
            .iter()
            .flat_map(|b| heads.iter().map(move |h| (b, h)))
        {
            if block < 2 {
                bail!("--dflash-blocks values must be at least 2 (an anchor and a draft)");
            }
            eprintln!(
                "DFlash pass batch {batch} block {block}, {} lm_head rows ...",
                head.rows()
            );
            let (times, breakdown) = time_steps(b, args, || {
                b.synchronize()?;
                let start = Instant::now();
                let mut seqs: Vec<(&mut DraftContext<Timed<B>>, u32)> = contexts
                    .iter_mut()
                    .zip(anchors.iter().copied())
                    .take(batch)
                    .collect();
                let drafts = drafter.drafts_batch(b, &model.decoder, &mut seqs, block, head);
                if drafts.iter().any(|d| d.len() != block - 1) {
                    bail!("a sequence got fewer than {} drafts", block - 1);
                }
                Ok(start.elapsed().as_secs_f64())
            })?;
            let r = PassResult {
                batch,
                block,
                context: args.context,
                draft_vocab: label.clone(),
                head_rows: head.rows(),
                stats: Stats::of(&times),
                bytes: pass_bytes(
                    &drafter,
                    head.rows(),
                    matches!(head, DraftHead::Full { .. }),
                    args.context,
                    storage,
                ),
                bandwidth_gbs,
            };
            eprintln!("  {}", r.to_json(&breakdown));
            results.push((r, breakdown));
        }
    }
    Ok(results)
}

pub fn print(results: &[(PassResult, Option<Breakdown>)]) {
    let Some((first, _)) = results.first() else {
        return;
    };
    println!(
        "\nDFlash drafter passes (one for all sequences, context {}, median of {} steps)",
        first.context,
        first.stats.all.len()
    );
    println!(
        "  {:>5} {:>5} {:>9} {:>10} {:>10} {:>9} {:>9} {:>8}",
        "batch", "block", "head rows", "ms/step", "ms/seq", "MB/pass", "floor ms", "% floor"
    );
    for (r, _) in results {
        println!(
            "  {:>5} {:>5} {:>9} {:>10.3} {:>10.3} {:>9.1} {:>9.3} {:>7.1}%",
            r.batch,
            r.block,
            r.head_rows,
            r.stats.median * 1e3,
            r.stats.median * 1e3 / r.batch as f64,
            r.bytes.total / 1e6,
            r.floor_s() * 1e3,
            100.0 * r.floor_s() / r.stats.median
        );
    }
    for (r, b) in results {
        if let Some(b) = b {
            b.print(&format!("DFlash pass batch {} block {}", r.batch, r.block));
        }
    }
}

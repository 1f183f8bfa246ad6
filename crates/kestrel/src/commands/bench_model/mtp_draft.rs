//! MTP draft timing (`--mtp-draft-k`): what drafting costs per step, with
//! the whole lm_head and with a reduced draft vocabulary
//! (`--draft-vocab FILE` or, for dummy weights, `--draft-vocab-size N`).
//!
//! One drafting phase is what the engine's MTP drafter runs after a decode
//! step: the target's final norm on each sequence's newest hidden state, the
//! head's catch-up row (which makes the first draft), then `k - 1` chained
//! head steps, each followed by scoring the draft head and its argmax. Every
//! sequence holds `--context` positions of the head's own KV cache; each
//! timed phase rewrites the same positions, as the verify timing does.
//! Its floor is the bytes of the MTP layer the phase reads (the routed
//! experts as the expected union over the batch's tokens) plus the lm_head
//! rows scored and the head's KV, over the bandwidth.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_engine::spec::DraftVocab;
use kestrel_models::blocks::attention::attention_spec;
use kestrel_models::{DraftHead, Model, ModelConfig, MtpHead};
use serde_json::{Value, json};

use super::Args;
use super::report::{Breakdown, Stats};
use super::steps::{BLOCK_SIZE, prompt_ids, time_steps};
use super::timing::Timed;
use super::traffic::Storage;

/// Vectors (norms) are f32 on every backend.
const VECTOR: usize = 4;

/// Bytes one drafting phase reads at least.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftBytes {
    /// `fc`, the norms, the attention projections, router and shared expert.
    pub layer_weights: f64,
    /// Routed experts: `E * (1 - (1 - k/E)^seqs)` per head step.
    pub expert_weights: f64,
    pub expected_experts_per_step: f64,
    /// lm_head rows scored (the draft head's rows, per head step).
    pub lm_head: f64,
    pub kv_cache: f64,
    pub total: f64,
}

/// Bytes of a phase of `k` head steps over `seqs` sequences of `context`
/// positions, scoring `head_rows` lm_head rows per step.
pub fn draft_bytes(
    cfg: &ModelConfig,
    st: Storage,
    seqs: usize,
    context: usize,
    k: usize,
    head_rows: usize,
) -> DraftBytes {
    let h = cfg.hidden_size;
    let mat = |rows: usize, cols: usize| (rows * cols * st.matrix) as f64;
    let qmat = |rows: usize, cols: usize| (rows * cols * st.quantized) as f64;
    let vec = |n: usize| (n * VECTOR) as f64;
    let attn = attention_spec(cfg);
    // Target final norm; embedding rows, the two input norms, fc (bf16 in
    // FP8 checkpoints too), the layer's two norms and attention, the head's
    // output norm.
    let mut per_step = mat(seqs, h)
        + 5.0 * vec(h)
        + mat(h, 2 * h)
        + qmat(attn.proj_width(), h)
        + qmat(h, attn.q_width())
        + 2.0 * vec(attn.head_dim);
    let mut b = DraftBytes::default();
    match &cfg.moe {
        Some(moe) => {
            let (e, top) = (moe.num_experts as f64, moe.top_k as f64);
            b.expected_experts_per_step = e * (1.0 - (1.0 - top / e).powi(seqs as i32));
            per_step += mat(moe.num_experts, h);
            if let Some(si) = moe.shared_intermediate {
                per_step += qmat(3 * si, h) + mat(1, h);
            }
            b.expert_weights =
                k as f64 * b.expected_experts_per_step * qmat(3 * moe.intermediate, h);
        }
        None => per_step += qmat(3 * cfg.dense_intermediate.unwrap_or_default(), h),
    }
    b.layer_weights = vec(h) + k as f64 * per_step;
    let head = if head_rows == cfg.vocab_size {
        st.lm_head
    } else {
        st.matrix
    };
    b.lm_head = (k * head_rows * h * head) as f64;
    // Step d (0-based) attends over `context + d + 1` positions.
    let positions: usize = (0..k).map(|d| context + d + 1).sum();
    b.kv_cache = (seqs * positions * 2 * attn.kv_width() * st.kv) as f64;
    b.total = b.layer_weights + b.expert_weights + b.lm_head + b.kv_cache;
    b
}

pub struct DraftResult {
    pub batch: usize,
    pub k: usize,
    pub context: usize,
    /// `None`: the whole head; otherwise how the subset was chosen.
    pub draft_vocab: Option<String>,
    pub head_rows: usize,
    pub stats: Stats,
    pub bytes: DraftBytes,
    pub bandwidth_gbs: f64,
}

impl DraftResult {
    fn floor_s(&self) -> f64 {
        self.bytes.total / (self.bandwidth_gbs * 1e9)
    }
    /// Per draft token of one sequence: the phase over its `k` drafts.
    fn per_token_ms(&self) -> f64 {
        self.stats.median * 1e3 / self.k as f64
    }

    pub fn to_json(&self, breakdown: &Option<Breakdown>) -> Value {
        let b = &self.bytes;
        json!({
            "batch": self.batch,
            "k": self.k,
            "context": self.context,
            "draft_vocab": self.draft_vocab,
            "lm_head_rows": self.head_rows,
            "phase_time": self.stats.to_json(),
            "ms_per_draft_token": self.per_token_ms(),
            "bytes_per_phase": {
                "layer_weights": b.layer_weights,
                "expert_weights": b.expert_weights,
                "expected_experts_per_step": b.expected_experts_per_step,
                "lm_head": b.lm_head,
                "kv_cache": b.kv_cache,
                "total": b.total,
            },
            "experts": "expected union, uniform routing",
            "achieved_gbs": b.total / self.stats.median / 1e9,
            "floor_ms": self.floor_s() * 1e3,
            "floor_ms_per_draft_token": self.floor_s() * 1e3 / self.k as f64,
            "fraction_of_floor": self.floor_s() / self.stats.median,
            "breakdown": breakdown.as_ref().map(Breakdown::to_json),
        })
    }
}

/// The draft vocabulary asked for, checked against the ids the model drafts.
pub fn draft_vocab(args: &Args, vocab: usize) -> Result<Option<(DraftVocab, String)>> {
    let v = match (&args.draft_vocab, args.draft_vocab_size) {
        (Some(_), Some(_)) => bail!("give --draft-vocab or --draft-vocab-size, not both"),
        (Some(path), None) => (DraftVocab::from_file(path)?, path.display().to_string()),
        (None, Some(n)) => (DraftVocab::first(n)?, format!("ids 0..{n}")),
        (None, None) => return Ok(None),
    };
    v.0.check(vocab).map_err(anyhow::Error::msg)?;
    Ok(Some(v))
}

/// Every `--mtp-draft-batches` x `--mtp-draft-k` phase, with the whole head
/// and, when asked for, the reduced one; why any were skipped goes to `skipped`.
pub fn run_all<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    storage: Storage,
    bandwidth_gbs: f64,
    sampled_vocab: Option<usize>,
    args: &Args,
    skipped: &mut Vec<String>,
) -> Result<Vec<(DraftResult, Option<Breakdown>)>> {
    let mut results = Vec::new();
    if args.mtp_draft_k.is_empty() {
        return Ok(results);
    }
    let Some(mtp) = model.mtp.as_ref() else {
        skipped.push("MTP draft timing: the model has no MTP head".into());
        return Ok(results);
    };
    let cfg = model.config();
    let vocab = sampled_vocab.unwrap_or(cfg.vocab_size);
    let mut heads = vec![(None, DraftHead::full(vocab))];
    if let Some((v, label)) = draft_vocab(args, vocab)? {
        let head = DraftHead::reduced(b, &model.decoder, v.ids())
            .context("cannot build the reduced draft head")?;
        heads.push((Some(label), head));
    }
    for &batch in &args.mtp_draft_batches {
        for &k in &args.mtp_draft_k {
            let total = args.context + k;
            if total > cfg.max_position_embeddings {
                skipped.push(format!(
                    "MTP draft batch {batch} k {k}: {total} positions exceed the model's {}",
                    cfg.max_position_embeddings
                ));
                continue;
            }
            for (label, head) in &heads {
                eprintln!(
                    "MTP draft batch {batch} k {k}, {} lm_head rows ...",
                    head.rows()
                );
                let (stats, breakdown) = time_phase(b, model, mtp, head, batch, k, args)?;
                let r = DraftResult {
                    batch,
                    k,
                    context: args.context,
                    draft_vocab: label.clone(),
                    head_rows: head.rows(),
                    stats,
                    bytes: draft_bytes(cfg, storage, batch, args.context, k, head.rows()),
                    bandwidth_gbs,
                };
                eprintln!("  {}", r.to_json(&breakdown));
                results.push((r, breakdown));
            }
        }
    }
    Ok(results)
}

fn time_phase<B: Backend>(
    b: &Timed<B>,
    model: &Model<Timed<B>>,
    mtp: &MtpHead<Timed<B>>,
    head: &DraftHead<Timed<B>>,
    batch: usize,
    k: usize,
    args: &Args,
) -> Result<(Stats, Option<Breakdown>)> {
    let decoder = &model.decoder;
    let cfg = model.config();
    let per_seq = (args.context + k).div_ceil(BLOCK_SIZE);
    let mut cache = b.new_cache(&MtpHead::cache_spec(decoder, per_seq * batch, BLOCK_SIZE))?;
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|s| ((s * per_seq) as u32..((s + 1) * per_seq) as u32).collect())
        .collect();
    let chunk = |s: usize, start: usize, n: usize| {
        SeqChunk::new(
            n,
            start,
            tables[s][..(start + n).div_ceil(BLOCK_SIZE)].to_vec(),
            0,
        )
    };
    // Stand-ins for the target's hidden states: normalised embeddings.
    let hidden = |ids: &[u32]| {
        b.rms_norm(
            &b.embedding(&decoder.embed, ids),
            &decoder.final_norm,
            cfg.rms_norm_eps,
        )
    };
    // The head's KV of each sequence's context, written as catch-ups write it.
    let mut newest = Vec::with_capacity(batch);
    for s in 0..batch {
        let ids = prompt_ids(args.context + 1, cfg.vocab_size, s + 1);
        let mut done = 0;
        while done < args.context {
            let n = args.max_batched_tokens.min(args.context - done);
            let fb = ForwardBatch {
                seqs: vec![chunk(s, done, n)],
            };
            let h = hidden(&ids[done..done + n]);
            mtp.forward(b, decoder, &h, &ids[done + 1..=done + n], &fb, &mut cache);
            done += n;
        }
        newest.push(ids[args.context]);
    }
    let target_rows = hidden(&newest);
    let catch_up = ForwardBatch {
        seqs: (0..batch).map(|s| chunk(s, args.context, 1)).collect(),
    };
    let chained: Vec<ForwardBatch> = (1..k)
        .map(|d| ForwardBatch {
            seqs: (0..batch).map(|s| chunk(s, args.context + d, 1)).collect(),
        })
        .collect();
    let rows: Vec<usize> = (0..batch).collect();
    time_steps(b, args, || {
        b.synchronize()?;
        let start = Instant::now();
        let h = b.rms_norm(
            &b.gather_rows(&target_rows, &rows),
            &decoder.final_norm,
            cfg.rms_norm_eps,
        );
        let mut state = mtp.forward(b, decoder, &h, &newest, &catch_up, &mut cache);
        let mut drafts = head.argmax(b, decoder, &state);
        for fb in &chained {
            state = mtp.forward(b, decoder, &state, &drafts, fb, &mut cache);
            drafts = head.argmax(b, decoder, &state);
        }
        if drafts.iter().any(|&t| t as usize >= cfg.vocab_size) {
            bail!("a draft outside the vocabulary");
        }
        Ok(start.elapsed().as_secs_f64())
    })
    .map(|(times, breakdown)| (Stats::of(&times), breakdown))
}

pub fn print(results: &[(DraftResult, Option<Breakdown>)]) {
    let Some((first, _)) = results.first() else {
        return;
    };
    println!(
        "\nMTP draft phases (catch-up + k-1 chained head steps, argmax each, context {}, median \
         of {} phases; experts: expected union, uniform routing)",
        first.context,
        first.stats.all.len()
    );
    println!(
        "  {:>5} {:>3} {:>9} {:>10} {:>11} {:>9} {:>9} {:>9} {:>8}",
        "batch", "k", "lm rows", "ms/phase", "ms/draft", "MB/phase", "GB/s", "floor ms", "% floor"
    );
    for (r, _) in results {
        println!(
            "  {:>5} {:>3} {:>9} {:>10.3} {:>11.3} {:>9.1} {:>9.1} {:>9.3} {:>7.1}%",
            r.batch,
            r.k,
            r.head_rows,
            r.stats.median * 1e3,
            r.per_token_ms(),
            r.bytes.total / 1e6,
            r.bytes.total / r.stats.median / 1e9,
            r.floor_s() * 1e3,
            100.0 * r.floor_s() / r.stats.median
        );
    }
    for (r, b) in results {
        if let Some(b) = b {
            b.print(&format!(
                "MTP draft batch {} k {} rows {}",
                r.batch, r.k, r.head_rows
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen3_6() -> ModelConfig {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../configs/qwen3.6-35b-a3b/config.json");
        ModelConfig::from_file(&path).unwrap()
    }

    const BF16: Storage = Storage {
        matrix: 2,
        quantized: 2,
        lm_head: 2,
        kv: 2,
    };

    #[test]
    fn a_qwen3_6_draft_step_reads_the_layer_and_the_lm_head_rows() {
        let cfg = qwen3_6();
        let full = draft_bytes(&cfg, BF16, 1, 0, 1, 248_320);
        // About 1.15 GB: the whole lm_head (1.02 GB) and ~64 M layer parameters.
        assert!((full.lm_head - 248_320.0 * 2048.0 * 2.0).abs() < 1.0);
        assert!((1.10e9..1.20e9).contains(&full.total), "{full:?}");
        assert!((full.expected_experts_per_step - 8.0).abs() < 1e-9);
        let reduced = draft_bytes(&cfg, BF16, 1, 0, 1, 65_536);
        assert!((reduced.lm_head * 3.78 - full.lm_head).abs() < 0.01 * full.lm_head);
        assert_eq!(reduced.layer_weights, full.layer_weights);
        // k steps read k times the layer and the rows.
        let three = draft_bytes(&cfg, BF16, 1, 0, 3, 65_536);
        assert!((three.lm_head - 3.0 * reduced.lm_head).abs() < 1.0);
        let parts = three.layer_weights + three.expert_weights + three.lm_head + three.kv_cache;
        assert!((three.total - parts).abs() < 1.0);
        // The expert union grows with the batch: 8 of 256 per token.
        let eight = draft_bytes(&cfg, BF16, 8, 1024, 1, 65_536);
        assert!((57.3..57.5).contains(&eight.expected_experts_per_step));
        // K and V of 1025 positions for 8 sequences.
        let kv = attention_spec(&cfg).kv_width() as f64 * 2.0 * 2.0;
        assert!((eight.kv_cache - 8.0 * 1025.0 * kv).abs() < 1.0);
    }
}

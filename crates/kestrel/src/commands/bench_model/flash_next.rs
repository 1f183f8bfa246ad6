//! `bench-model` for Qwen3.8-Flash-Next (`qwen4_exp`) with dummy weights:
//! prefill of each `--prefill` length (one sequence, one pass) and decode
//! steps of each `--decode-batch` size after `--context` tokens, on its own
//! layer stack (the shared decoder's instrumented loop does not run it).
//! Figures per step and per layer, next to the floor of the bytes a decode
//! step must read over the measured bandwidth.

use std::path::Path;
use std::time::Instant;

use anyhow::{Result, bail};
use kestrel_core::flash_next::FlashNextOps;
use kestrel_core::{Backend, ForwardBatch, SeqChunk};
use kestrel_models::flash_next::{FlashNext, FlashNextConfig};
use kestrel_models::{Quantization, WeightForm};
use serde_json::json;

use super::report::Breakdown;
use super::timing::Timed;
use super::traffic::Storage;

const BLOCK_SIZE: usize = 16;

/// Matrix elements a decode step reads for `batch` sequences, split by the
/// form they are read in: every dense product, the experts `batch` tokens
/// pick (the expected number of distinct ones under uniform routing), the
/// hyper-connection gates and the PLE projections; then the lm_head's.
/// Norms and vectors are left out (tiny).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodeElems {
    /// The projections and experts `--quantization fp8` quantises.
    pub quantizable: f64,
    /// What stays as stored: hyper-connection gates, routers, the GDN
    /// `a`/`b` rows, the shared-expert gate.
    pub dense: f64,
    pub lm_head: f64,
}

impl DecodeElems {
    pub fn of(c: &FlashNextConfig, batch: usize) -> Self {
        let b = &c.base;
        let h = b.hidden_size as f64;
        let streams = c.hc_count as f64;
        let hc = 2.0 * c.hc_lowrank as f64 * streams * h + streams * streams * h;
        let mut e = DecodeElems {
            lm_head: b.vocab_size as f64 * h,
            // The final mixer's gates.
            dense: 2.0 * c.hc_lowrank as f64 * streams * h,
            quantizable: 0.0,
        };
        for kind in &b.layer_kinds {
            match kind {
                kestrel_models::LayerKind::FullAttention => {
                    let (hq, hkv, d) =
                        (b.num_heads as f64, b.num_kv_heads as f64, b.head_dim as f64);
                    let q = if b.attn_output_gate { 2.0 } else { 1.0 } * hq * d;
                    let index = ((c.qsa.num_heads + 1) * c.qsa.head_dim) as f64;
                    e.quantizable += h * (q + 2.0 * hkv * d + index) + hq * d * h;
                }
                kestrel_models::LayerKind::LinearAttention => {
                    let la = b
                        .linear_attn
                        .as_ref()
                        .expect("GDN layers have their config");
                    let (hk, hv) = (la.num_k_heads as f64, la.num_v_heads as f64);
                    let (dk, dv) = (la.head_k_dim as f64, la.head_v_dim as f64);
                    let conv_dim = 2.0 * hk * dk + hv * dv;
                    e.quantizable += h * (conv_dim + hv * dv) + hv * dv * h;
                    e.dense += h * 2.0 * hv;
                }
            }
            e.dense += 2.0 * hc;
            if let Some(m) = &b.moe {
                let (n, k) = (m.num_experts as f64, m.top_k as f64);
                let distinct = n * (1.0 - (1.0 - k / n).powi(batch as i32));
                e.dense += n * h;
                e.quantizable += distinct * 3.0 * h * m.intermediate as f64;
                if let Some(s) = m.shared_intermediate {
                    e.quantizable += 3.0 * h * s as f64;
                    e.dense += h;
                }
            }
        }
        if let Some(p) = &c.ple {
            let width = p.embed_dim as f64;
            e.quantizable += p.layers.len() as f64 * (streams * h * width + h * width);
        }
        e
    }

    /// Bytes of weights read, each part in the size `storage` gives it.
    pub fn bytes(&self, storage: &Storage) -> f64 {
        self.quantizable * storage.quantized as f64
            + self.dense * storage.matrix as f64
            + self.lm_head * storage.lm_head as f64
    }
}

/// Matrix FLOPs of a prefill of `tokens` tokens (one sequence): two per
/// multiply-add over the weights each token uses (top-k experts only, no
/// lm_head: a prefill takes the logits of its last token), the indexer's
/// block scores of the tokens past the budget, and attention scores and
/// values over what each token attends (all it has seen within the budget,
/// the budget past it).
pub fn prefill_flops(c: &FlashNextConfig, tokens: usize) -> f64 {
    let per_token = DecodeElems::of(c, 1);
    let b = &c.base;
    let attention_layers = b
        .layer_kinds
        .iter()
        .filter(|k| matches!(k, kestrel_models::LayerKind::FullAttention))
        .count() as f64;
    let (q_width, index_width) = (
        (b.num_heads * b.head_dim) as f64,
        (c.qsa.num_heads * c.qsa.head_dim) as f64,
    );
    let per_layer: f64 = (0..tokens)
        .map(|i| {
            let seen = (i + 1) as f64;
            let attended = seen.min(c.qsa.budget as f64);
            let scored = if i + 1 > c.qsa.budget {
                (i + 1) as f64 / c.qsa.compress_ratio as f64
            } else {
                0.0
            };
            2.0 * 2.0 * q_width * attended + 2.0 * index_width * scored
        })
        .sum();
    2.0 * (per_token.quantizable + per_token.dense) * tokens as f64 + attention_layers * per_layer
}

/// A batch of `seqs` sequences bringing `new` tokens each after `cached`,
/// sequence `i` in slot `i` on pages `i * pages ..`.
fn batch(seqs: usize, cached: usize, new: usize, pages: usize) -> ForwardBatch {
    ForwardBatch {
        seqs: (0..seqs)
            .map(|i| {
                let table = (i * pages..(i + 1) * pages).map(|p| p as u32).collect();
                SeqChunk::new(new, cached, table, i as u32)
            })
            .collect(),
    }
}

/// `n` token ids spread over the first `vocab` (at most 150,000: the
/// tokenizer's ids, not the padded rows).
fn ids(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    let vocab = vocab.min(150_000);
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729) % vocab) as u32)
        .collect()
}

/// Prefill `len` tokens of every sequence of `seqs`, `chunk` at a time.
fn prefill<B: FlashNextOps>(
    b: &B,
    model: &FlashNext<B>,
    cache: &mut kestrel_models::flash_next::FlashNextCache<B>,
    seqs: usize,
    len: usize,
    chunk: usize,
    pages: usize,
) -> Result<()> {
    let mut done = 0;
    while done < len {
        let n = chunk.min(len - done);
        let step = batch(seqs, done, n, pages);
        let vocab = model.config.base.vocab_size;
        let tokens: Vec<u32> = (0..seqs).flat_map(|s| ids(n, s + done, vocab)).collect();
        model.forward(b, &tokens, &step, cache)?;
        done += n;
    }
    b.synchronize()?;
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// What to run.
pub struct Settings<'a> {
    pub config: &'a Path,
    pub prefills: &'a [usize],
    pub prefill_runs: usize,
    pub decode_batches: &'a [usize],
    /// Tokens each decoding sequence holds before the timed steps.
    pub context: usize,
    pub steps: usize,
    /// Tokens per sequence in each prefill step of the context.
    pub chunk: usize,
    pub form: WeightForm,
    /// Instrumented runs (a device sync around every operation) after the
    /// timed ones, for a per-operation breakdown; 0 turns it off.
    pub breakdown_steps: usize,
}

/// The figures as JSON; `storage` gives the size of a weight element in
/// each form.
pub fn bench<B: FlashNextOps>(
    b: &Timed<B>,
    s: &Settings,
    storage: Storage,
    plan: Option<serde_json::Value>,
) -> Result<serde_json::Value> {
    let Settings {
        config,
        prefills,
        prefill_runs,
        decode_batches,
        context,
        steps,
        chunk,
        form,
        breakdown_steps,
    } = *s;
    let path = kestrel_models::config_file(config);
    let cfg = FlashNextConfig::from_file(&path)?;
    let dir = kestrel_models::flash_next::dummy::default_dir(&cfg);
    let start = Instant::now();
    let model = FlashNext::load_dummy_as(&path, b, 0, Some(&dir), form)?;
    b.synchronize()?;
    eprintln!(
        "qwen4_exp: {} layers, dummy weights in {:.1} s, n-gram tables mapped from {}",
        cfg.base.num_layers,
        start.elapsed().as_secs_f64(),
        dir.display()
    );
    let layers = cfg.base.num_layers as f64;
    let bandwidth = b.measure_bandwidth_gbs();
    let mut prefill_out = Vec::new();
    for &len in prefills {
        let pages = len.div_ceil(BLOCK_SIZE);
        // One prefill of `len` tokens into a fresh cache: its wall time.
        let once = || -> Result<f64> {
            let mut cache = model.new_cache(b, pages, BLOCK_SIZE, 1)?;
            cache.zero_state(b, 0);
            b.synchronize()?;
            let t = Instant::now();
            prefill(b, &model, &mut cache, 1, len, len, pages)?;
            Ok(t.elapsed().as_secs_f64())
        };
        // The first run warms the kernels and the tables' pages.
        once()?;
        let times = (0..prefill_runs)
            .map(|_| Ok(once()? * 1e3))
            .collect::<Result<Vec<f64>>>()?;
        let ms = median(times);
        let breakdown = if breakdown_steps > 0 {
            b.record(true);
            let wall = once()?;
            b.record(false);
            let bd = Breakdown::new(&b.breakdown(), 1, wall);
            bd.print(&format!("prefill {len}, instrumented"));
            Some(bd.to_json())
        } else {
            None
        };
        eprintln!(
            "prefill {len:>6} tokens: {ms:9.2} ms ({:.0} tok/s, {:.3} ms a layer)",
            len as f64 / ms * 1e3,
            ms / layers
        );
        let flops = prefill_flops(&cfg, len);
        // The weights one pass reads: every expert some token picks, once.
        let bytes = DecodeElems::of(&cfg, len).bytes(&storage);
        let floor_ms = bandwidth.map(|gbs| bytes / (gbs * 1e9) * 1e3);
        eprintln!(
            "                        {:.1} TFLOP, {:.0} TFLOP/s achieved; {:.1} GB of weights{}",
            flops / 1e12,
            flops / ms / 1e9,
            bytes / 1e9,
            floor_ms.map_or(String::new(), |f| format!(", byte floor {f:.2} ms"))
        );
        prefill_out.push(json!({
            "tokens": len,
            "ms": ms,
            "ms_per_layer": ms / layers,
            "matmul_flops": flops,
            "achieved_tflops": flops / ms / 1e9,
            "weight_bytes": bytes,
            "byte_floor_ms": floor_ms,
            "breakdown": breakdown,
        }));
    }
    let mut decode_out = Vec::new();
    for &seqs in decode_batches {
        if seqs == 0 || steps == 0 {
            bail!("decode batches and steps must be at least 1");
        }
        let pages = (context + 2 + steps + breakdown_steps + 2).div_ceil(BLOCK_SIZE);
        let mut cache = model.new_cache(b, seqs * pages, BLOCK_SIZE, seqs)?;
        for s in 0..seqs {
            cache.zero_state(b, s as u32);
        }
        prefill(b, &model, &mut cache, seqs, context, chunk, pages)?;
        let mut pos = context;
        let mut run = |n: usize, pos: &mut usize| -> Result<f64> {
            let t = Instant::now();
            for _ in 0..n {
                let step = batch(seqs, *pos, 1, pages);
                let tokens: Vec<u32> = (0..seqs)
                    .flat_map(|s| ids(1, *pos * 31 + s, cfg.base.vocab_size))
                    .collect();
                let rows: Vec<usize> = (0..seqs).collect();
                let logits = model.step_logits(b, &tokens, &step, &mut cache, &rows)?;
                b.argmax_rows(&logits, cfg.base.vocab_size);
                *pos += 1;
            }
            b.synchronize()?;
            Ok(t.elapsed().as_secs_f64() * 1e3 / n as f64)
        };
        run(2, &mut pos)?;
        let ms = run(steps, &mut pos)?;
        let breakdown = if breakdown_steps > 0 {
            b.record(true);
            let wall_ms = run(breakdown_steps, &mut pos)?;
            b.record(false);
            let bd = Breakdown::new(
                &b.breakdown(),
                breakdown_steps,
                wall_ms * breakdown_steps as f64 / 1e3,
            );
            bd.print(&format!("decode batch {seqs} at {context}, instrumented"));
            Some(bd.to_json())
        } else {
            None
        };
        let bytes = DecodeElems::of(&cfg, seqs).bytes(&storage);
        let floor_ms = bandwidth.map(|gbs| bytes / (gbs * 1e9) * 1e3);
        eprintln!(
            "decode batch {seqs} at {context}: {ms:8.3} ms a step, {:8.1} tok/s, {:.3} ms a layer; \
             {:.2} GB of weights a step{}",
            seqs as f64 / ms * 1e3,
            ms / layers,
            bytes / 1e9,
            floor_ms.map_or(String::new(), |f| format!(
                ", floor {f:.3} ms ({:.1} % of it)",
                f / ms * 100.0
            ))
        );
        decode_out.push(json!({
            "batch": seqs,
            "context": context,
            "ms_per_step": ms,
            "tok_per_s": seqs as f64 / ms * 1e3,
            "ms_per_layer": ms / layers,
            "weight_bytes_per_step": bytes,
            "floor_ms": floor_ms,
            "breakdown": breakdown,
        }));
    }
    Ok(json!({
        "model": path.display().to_string(),
        "arch": "qwen4_exp",
        "backend": b.name(),
        "plan": plan,
        "layers": cfg.base.num_layers,
        "quantization": if form.quantization == Quantization::Fp8 { "fp8" } else { "as stored" },
        "lm_head_fp8": form.lm_head_fp8,
        "bandwidth_gbs": bandwidth,
        "prefill": prefill_out,
        "decode": decode_out,
        "ngram_tables": dir.display().to_string(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn published() -> FlashNextConfig {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/qwen3.8-flash-next");
        FlashNextConfig::from_file(&dir.join("config.json")).unwrap()
    }

    #[test]
    fn decode_elements_split_by_form_and_add_up_to_the_active_parameters() {
        let c = published();
        let e = DecodeElems::of(&c, 1);
        // 5.5 B matrix elements a token besides the lm_head at these shapes
        // (experts 2.4 B, DeltaNet 1.5 B, hyper-connection gates 0.6 B,
        // attention 0.6 B), most in the forms FP8 quantises.
        let active = e.quantizable + e.dense;
        assert!((5.0e9..6.0e9).contains(&active), "{active:e}");
        assert!(e.dense < 0.3 * active, "{e:?}");
        let (fp8, bf16) = (Storage::cuda(true, false), Storage::cuda(false, false));
        assert_eq!(e.bytes(&bf16), 2.0 * (active + e.lm_head));
        assert!(e.bytes(&fp8) < e.bytes(&bf16));
        // More sequences read more distinct experts.
        assert!(DecodeElems::of(&c, 8).quantizable > 4.0 * e.quantizable);
    }

    #[test]
    fn prefill_attention_grows_linearly_past_the_budget() {
        let c = published();
        let params = 2.0 * (DecodeElems::of(&c, 1).quantizable + DecodeElems::of(&c, 1).dense);
        let attention = |t| prefill_flops(&c, t) - params * t as f64;
        let budget = c.qsa.budget;
        // Within the budget each token attends to all it has seen (quadratic).
        let within = attention(budget);
        assert!((attention(budget / 2) / within - 0.25).abs() < 0.01);
        // Past it, a fixed budget plus block scores that grow with the context.
        let (a, b) = (
            attention(4 * budget) - within,
            attention(8 * budget) - within,
        );
        assert!(b > 2.0 * a && b < 3.0 * a, "{a:e} {b:e}");
    }
}

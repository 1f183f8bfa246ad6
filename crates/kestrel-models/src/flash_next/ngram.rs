//! The hashed n-gram ids of PLE and the table they index.
//!
//! Each PLE module hashes, for every token, its 2- to N-gram (the token and
//! up to N-1 predecessors of the same EOS-delimited segment; EOS stands in
//! where there are none) with odd multipliers derived from a seed, XORs the
//! products, and reduces the result modulo one prime per head; each head's
//! rows sit at its own offset of one shared table. The table (tens of
//! billions of parameters in the real model) is never loaded: rows are read
//! from the memory-mapped checkpoint shards as tokens need them.

use std::sync::Arc;

use anyhow::{Result, bail};
use kestrel_core::DType;
use rayon::prelude::*;

use super::config::PleConfig;
use crate::weights::WeightFiles;

const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
const SPLITMIX_M1: u64 = 0xBF58_476D_1CE4_E5B9;
const SPLITMIX_M2: u64 = 0x94D0_49BB_1331_11EB;
/// Spacing of the per-module seeds.
const LAYER_SEED_STRIDE: u64 = 10007;

fn splitmix64(v: u64) -> u64 {
    let v = v.wrapping_add(SPLITMIX_GAMMA);
    let v = (v ^ (v >> 30)).wrapping_mul(SPLITMIX_M1);
    let v = (v ^ (v >> 27)).wrapping_mul(SPLITMIX_M2);
    v ^ (v >> 31)
}

fn is_prime(v: u64) -> bool {
    if v < 2 {
        return false;
    }
    if v.is_multiple_of(2) {
        return v == 2;
    }
    let mut d = 3;
    while d * d <= v {
        if v.is_multiple_of(d) {
            return false;
        }
        d += 2;
    }
    true
}

/// The `count`-th prime greater than `start`.
fn nth_prime_after(start: u64, count: usize) -> u64 {
    let mut p = start;
    for _ in 0..count {
        p += 1;
        while !is_prime(p) {
            p += 1;
        }
    }
    p
}

/// The token history every PLE module hashes: for each new token, itself
/// and its `ngram_size - 1` predecessors within its segment (EOS where the
/// segment or the sequence has none), `[T, ngram_size]` with the token first.
pub fn token_history(context: &mut Vec<u32>, ids: &[u32], ngram_size: usize, eos: u32) -> Vec<u32> {
    let ctx = ngram_size - 1;
    assert_eq!(context.len(), ctx, "n-gram context holds {ctx} tokens");
    let hist: Vec<u32> = context.iter().chain(ids).copied().collect();
    let mut out = Vec::with_capacity(ids.len() * ngram_size);
    for i in ctx..hist.len() {
        out.push(hist[i]);
        let mut broken = false;
        for s in 1..ngram_size {
            // An EOS strictly between the predecessor and the token ends the segment.
            broken |= s > 1 && hist[i - s + 1] == eos;
            out.push(if broken { eos } else { hist[i - s] });
        }
    }
    *context = context_after(context, ids);
    out
}

/// The n-gram context after `ids` follow `context`: its last
/// `context.len()` tokens.
pub fn context_after(context: &[u32], ids: &[u32]) -> Vec<u32> {
    let hist: Vec<u32> = context.iter().chain(ids).copied().collect();
    hist[hist.len() - context.len()..].to_vec()
}

/// The hash of one PLE module (one `ple_layer_index`).
#[derive(Clone, Debug)]
pub struct NgramHasher {
    ngram_size: usize,
    heads_per_ngram: usize,
    multipliers: Vec<u64>,
    vocab_sizes: Vec<u64>,
    offsets: Vec<u64>,
    /// Table rows: the heads' vocabularies, padded to the configured multiple.
    pub rows: u64,
}

impl NgramHasher {
    pub fn new(cfg: &PleConfig, token_vocab: usize, ple_index: usize) -> Self {
        let heads = cfg.num_heads();
        let (mut vocab_sizes, mut offsets, mut total) = (Vec::new(), Vec::new(), 0u64);
        for h in 0..heads {
            let size = nth_prime_after(cfg.vocab_base - 1, ple_index * heads + h + 1);
            vocab_sizes.push(size);
            offsets.push(total);
            total += size;
        }
        let rows = total.div_ceil(cfg.vocab_divisible_by) * cfg.vocab_divisible_by;
        let half_bound = ((i64::MAX as u64) / token_vocab.max(1) as u64 / 2).max(1);
        let base_seed = cfg.seed.wrapping_add(LAYER_SEED_STRIDE * ple_index as u64);
        let multipliers = (0..cfg.ngram_size as u64)
            .map(|i| {
                let v = base_seed.wrapping_add(SPLITMIX_GAMMA.wrapping_mul(i + 1));
                2 * (splitmix64(v) % half_bound) + 1
            })
            .collect();
        NgramHasher {
            ngram_size: cfg.ngram_size,
            heads_per_ngram: cfg.heads_per_ngram,
            multipliers,
            vocab_sizes,
            offsets,
            rows,
        }
    }

    pub fn heads(&self) -> usize {
        self.vocab_sizes.len()
    }

    /// Table rows of every head for each token of a [`token_history`],
    /// `[T, heads]`: 2-gram heads first, then 3-gram heads, and so on.
    pub fn rows_of(&self, history: &[u32]) -> Vec<u64> {
        let n = self.ngram_size;
        let mut out = Vec::with_capacity(history.len() / n * self.vocab_sizes.len());
        for tokens in history.chunks_exact(n) {
            let mut mixed = tokens[0] as u64 * self.multipliers[0];
            for order in 2..=n {
                mixed ^= tokens[order - 1] as u64 * self.multipliers[order - 1];
                for j in 0..self.heads_per_ngram {
                    let h = (order - 2) * self.heads_per_ngram + j;
                    out.push(mixed % self.vocab_sizes[h] + self.offsets[h]);
                }
            }
        }
        out
    }
}

/// One PLE module's n-gram table, read in place from the checkpoint's
/// memory-mapped shards `{prefix}shard_{i}.weight` (or one unsharded
/// `{prefix}weight`). Only the pages of rows that are read become resident.
pub struct NgramTable {
    files: Arc<WeightFiles>,
    shards: Vec<String>,
    rows_per_shard: usize,
    pub dim: usize,
    dtype: DType,
}

impl NgramTable {
    pub fn open(
        files: Arc<WeightFiles>,
        prefix: &str,
        rows: usize,
        dim: usize,
        parts: usize,
    ) -> Result<Self> {
        let whole = format!("{prefix}weight");
        let shards: Vec<String> = if files.contains(&whole) {
            vec![whole]
        } else {
            (0..parts)
                .map(|i| format!("{prefix}shard_{i}.weight"))
                .collect()
        };
        if !rows.is_multiple_of(shards.len()) {
            bail!(
                "{rows} n-gram rows do not split into {} shards",
                shards.len()
            );
        }
        let rows_per_shard = rows / shards.len();
        let mut dtype = None;
        for name in &shards {
            let (dt, _) = files.describe(name, &[rows_per_shard, dim])?;
            // Tokens hash to rows all over the table.
            files.advise_random(name)?;
            if dtype.is_some_and(|d| d != dt) {
                bail!("{name}: n-gram shards differ in dtype");
            }
            dtype = Some(dt);
        }
        Ok(NgramTable {
            files,
            shards,
            rows_per_shard,
            dim,
            dtype: dtype.expect("at least one shard"),
        })
    }

    /// The rows `rows` (as f32, one after another). A prefill reads
    /// thousands of rows scattered over the table, each a page fault when
    /// not resident: they are read on every core.
    pub fn gather(&self, rows: &[u64]) -> Result<Vec<f32>> {
        // Enough rows per task that a decode step's few stay on one thread.
        const MIN_ROWS_PER_TASK: usize = 64;
        let (d, es) = (self.dim, self.dtype.size());
        let views: Vec<_> = self
            .shards
            .iter()
            .map(|n| self.files.get_any(n))
            .collect::<Result<_>>()?;
        let mut out = vec![0.0f32; rows.len() * d];
        out.par_chunks_mut(d)
            .zip(rows.par_iter())
            .with_min_len(MIN_ROWS_PER_TASK)
            .try_for_each(|(dst, &r)| {
                let r = r as usize;
                let (shard, local) = (r / self.rows_per_shard, r % self.rows_per_shard);
                let Some(view) = views.get(shard) else {
                    bail!("n-gram row {r} is past the table");
                };
                let bytes = &view.data[local * d * es..(local + 1) * d * es];
                for (o, b) in dst.iter_mut().zip(bytes.chunks_exact(es)) {
                    *o = match self.dtype {
                        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                        DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                    };
                }
                Ok(())
            })?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes_follow_the_base() {
        assert_eq!(nth_prime_after(999, 1), 1009);
        assert_eq!(nth_prime_after(999, 2), 1013);
        assert_eq!(nth_prime_after(19_999_999, 1), 20_000_003);
    }

    #[test]
    fn history_restarts_after_eos_and_carries_across_chunks() {
        let eos = 2;
        let mut ctx = vec![eos, eos];
        let h = token_history(&mut ctx, &[10, 11, 2, 12, 13], 3, eos);
        assert_eq!(h, vec![10, 2, 2, 11, 10, 2, 2, 11, 10, 12, 2, 2, 13, 12, 2]);
        assert_eq!(ctx, vec![12, 13]);
        let mut ctx2 = vec![eos, eos];
        let mut split = token_history(&mut ctx2, &[10, 11, 2], 3, eos);
        split.extend(token_history(&mut ctx2, &[12, 13], 3, eos));
        assert_eq!(split, h);
    }
}

//! The host's share of QSA block selection for one long prefill: the top
//! blocks of every token past the indexer budget (the reference's tie
//! order), then the cache pages sparse attention reads.
//!
//! `cargo run --release -p kestrel-core --example qsa_selection [TOKENS]`
//! (default 8,192 tokens; Flash-Next's indexer: budget 2,048, blocks of 4).
//! Scores are a fixed pseudo-random draw, a tenth of them 0 as the
//! indexer's ReLU sums often are.

use std::time::Instant;

use kestrel_core::flash_next::QsaSpec;
use kestrel_core::flash_next::selection::ScoreLayout;
use kestrel_core::{ForwardBatch, RopeSpec, SeqChunk};

fn main() {
    let tokens: usize = std::env::args()
        .nth(1)
        .map_or(8192, |a| a.parse().expect("TOKENS: a count of tokens"));
    let spec = QsaSpec {
        num_heads: 4,
        head_dim: 128,
        budget: 2048,
        compress_ratio: 4,
        rope: RopeSpec {
            theta: 1e7,
            rotary_dim: 64,
        },
        eps: 1e-6,
    };
    let page = 16;
    let table = (0..tokens.div_ceil(page) as u32).collect();
    let batch = ForwardBatch {
        seqs: vec![SeqChunk::new(tokens, 0, table, 0)],
    };
    let layout = ScoreLayout::new(&spec, &batch);
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let scores: Vec<f32> = (0..layout.score_len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.1).max(0.0)
        })
        .collect();
    let t0 = Instant::now();
    let selection = layout.selection(&spec, &batch, &scores);
    let t1 = Instant::now();
    let pages = selection.pages(&batch, page);
    let t2 = Instant::now();
    let entries: usize = pages.iter().map(|(p, _)| p.len()).sum();
    println!(
        "{tokens} tokens, {} choose from {} block scores on {} threads",
        layout.scored.len(),
        layout.score_len,
        rayon::current_num_threads()
    );
    println!(
        "top blocks {:.2} ms, pages {:.2} ms ({entries} page entries)",
        (t1 - t0).as_secs_f64() * 1e3,
        (t2 - t1).as_secs_f64() * 1e3
    );
}

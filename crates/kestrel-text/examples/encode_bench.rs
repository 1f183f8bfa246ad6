//! Times encoding a long text in one pass and in parallel pieces
//! (`parallel_encode`), checking that both give the same ids.
//!
//! `cargo run --release -p kestrel-text --example encode_bench -- TOKENIZER_JSON FILE... [--runs N]`
//!
//! Prints one JSON object: bytes, tokens, threads, and the median and
//! minimum milliseconds of each way over the runs.

use std::time::Instant;

use kestrel_text::Tokenizer;

fn main() -> anyhow::Result<()> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 11;
    if let Some(i) = args.iter().position(|a| a == "--runs") {
        runs = args.get(i + 1).and_then(|n| n.parse().ok()).unwrap_or(runs);
        args.drain(i..(i + 2).min(args.len()));
    }
    let (tokenizer, files) = args
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("usage: encode_bench TOKENIZER_JSON FILE... [--runs N]"))?;
    let tok = Tokenizer::from_file(tokenizer)?;
    let mut text = String::new();
    for f in files {
        text.push_str(&std::fs::read_to_string(f)?);
    }
    let time = |f: &dyn Fn() -> anyhow::Result<Vec<u32>>| -> anyhow::Result<(Vec<u32>, f64, f64)> {
        let mut ms = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            ids = f()?;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        Ok((ids, ms[ms.len() / 2], ms[0]))
    };
    let (whole, whole_med, whole_min) = time(&|| tok.encode_one_pass(&text, false))?;
    let (parallel, par_med, par_min) = time(&|| tok.encode(&text, false))?;
    anyhow::ensure!(whole == parallel, "parallel ids differ from one pass");
    println!(
        "{}",
        serde_json::json!({
            "bytes": text.len(),
            "tokens": whole.len(),
            "threads": rayon::current_num_threads(),
            "parallel_path": tok.encodes_in_parallel(),
            "runs": runs,
            "one_pass_ms": {"median": whole_med, "min": whole_min},
            "parallel_ms": {"median": par_med, "min": par_min},
        })
    );
    Ok(())
}

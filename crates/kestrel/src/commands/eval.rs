//! `kestrel eval`: held-out perplexity and top-1 accuracy of a model and of
//! its MTP head over fixed token windows (each window one fresh sequence).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use kestrel_cpu::CpuBackend;
use kestrel_models::{Model, eval::evaluate};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    model: Option<PathBuf>,
    /// Safetensors file holding token windows as an integer tensor `[n, len]`.
    #[arg(long)]
    windows: PathBuf,
    /// Name of the windows tensor in that file.
    #[arg(long, default_value = "heldout.windows")]
    tensor: String,
    /// Evaluate only the first N windows.
    #[arg(long)]
    limit: Option<usize>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let dir = crate::model_dir::resolve(args.model)?;
    let backend = CpuBackend::new();
    let model = Model::load(&dir, &backend)?;
    let windows = read_windows(&args.windows, &args.tensor, args.limit)?;
    let vocab = model.config().vocab_size as u32;
    if let Some(bad) = windows.iter().flatten().find(|&&t| t >= vocab) {
        bail!(
            "{}: token id {bad} is outside the vocabulary ({vocab})",
            args.windows.display()
        );
    }
    let start = std::time::Instant::now();
    let r = evaluate(&backend, &model, &windows)?;
    let secs = start.elapsed().as_secs_f64();
    let summary = serde_json::json!({
        "windows": r.windows,
        "lm_tokens": r.lm_tokens,
        "lm_perplexity": r.lm_perplexity(),
        "lm_top1": r.lm_top1(),
        "mtp_tokens": r.mtp_tokens,
        "mtp_perplexity": (r.mtp_tokens > 0).then(|| r.mtp_perplexity()),
        "mtp_top1": (r.mtp_tokens > 0).then(|| r.mtp_top1()),
        "mtp_one_token_draft_acceptance": (r.mtp_tokens > 0).then(|| r.mtp_acceptance()),
        "seconds": secs,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "windows {} ({} predicted tokens) in {secs:.1} s",
            r.windows, r.lm_tokens
        );
        println!(
            "perplexity {:.4}, top-1 {:.2} %",
            r.lm_perplexity(),
            100.0 * r.lm_top1()
        );
        if r.mtp_tokens > 0 {
            println!(
                "MTP (token t+2): perplexity {:.4}, top-1 {:.2} %, one-token draft acceptance under greedy verification {:.2} %",
                r.mtp_perplexity(),
                100.0 * r.mtp_top1(),
                100.0 * r.mtp_acceptance()
            );
        }
    }
    Ok(())
}

fn read_windows(path: &PathBuf, name: &str, limit: Option<usize>) -> Result<Vec<Vec<u32>>> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow::anyhow!("{}: not a valid safetensors file ({e})", path.display()))?;
    let t = st
        .tensor(name)
        .map_err(|_| anyhow::anyhow!("{}: no tensor {name}", path.display()))?;
    let shape = t.shape();
    if shape.len() != 2 || shape[1] < 3 {
        bail!(
            "{}: tensor {name} must be [windows, length >= 3], got {shape:?}",
            path.display()
        );
    }
    let ids: Vec<i64> = match t.dtype() {
        safetensors::Dtype::I32 => t
            .data()
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
            .collect(),
        safetensors::Dtype::I64 => t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        other => bail!(
            "{}: tensor {name} has dtype {other:?}, expected I32 or I64",
            path.display()
        ),
    };
    if ids.iter().any(|&v| v < 0 || v > u32::MAX as i64) {
        bail!(
            "{}: tensor {name} holds negative or oversized token ids",
            path.display()
        );
    }
    let n = limit.unwrap_or(shape[0]).min(shape[0]);
    Ok(ids
        .chunks_exact(shape[1])
        .take(n)
        .map(|w| w.iter().map(|&v| v as u32).collect())
        .collect())
}

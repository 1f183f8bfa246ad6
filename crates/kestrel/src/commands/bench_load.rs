//! `kestrel bench-load`: how fast a model folder loads, and how much host
//! memory the load holds. The checkpoint is read, packed into the backend's
//! layouts and uploaded exactly as every other command loads it; the report
//! gives the wall time, the checkpoint bytes read and their rate, the time
//! spent packing (summed over the worker threads) and uploading, and the
//! process's peak resident memory. `--pack-only` leaves the upload out, to
//! measure the host side alone (the CPU backend's upload widens every weight
//! to f32, which says nothing about a device upload).

use std::path::PathBuf;

use anyhow::{Context, Result};
use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_models::{LoadStats, Model, WeightForm};
use serde_json::json;

use super::backend::{self, BackendKind, Chosen};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face model folder; the bundled model when not given.
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    #[command(flatten)]
    quantization: super::quantization::QuantizationArgs,
    /// Read and pack every tensor, upload nothing.
    #[arg(long)]
    pack_only: bool,
    /// Write the report as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<()> {
    let dir = crate::model_dir::resolve(args.model.clone())?;
    let (backend, stats) = match backend::open(args.backend, args.device)? {
        Chosen::Cpu { .. } => measure(
            &CpuBackend::new(),
            &dir,
            args.pack_only,
            args.quantization.form(),
        )?,
        Chosen::Cuda(cuda) => measure(&cuda, &dir, args.pack_only, args.quantization.form())?,
    };
    eprintln!("{backend}: {}", stats.summary());
    let report = json!({
        "model": dir.display().to_string(),
        "backend": backend,
        "load": stats.to_json(),
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

fn measure<B: Backend>(
    b: &B,
    dir: &std::path::Path,
    pack_only: bool,
    quantization: WeightForm,
) -> Result<(String, LoadStats)> {
    let stats = if pack_only {
        Model::pack_only_as(dir, b, quantization)?
    } else {
        let (model, stats) = Model::load_as(dir, b, quantization)?;
        drop(model);
        stats
    };
    Ok((b.name(), stats))
}

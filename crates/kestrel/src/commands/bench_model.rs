//! `kestrel bench-model`: in-process model benchmark. Prefill of one
//! sequence at several lengths, decode at several batch sizes and
//! speculative verify steps (`--verify-k`) and MTP draft phases
//! (`--mtp-draft-k`, with and without a reduced draft vocabulary), each step compared with its
//! memory floor (the bytes it must read over the measured bandwidth), plus a
//! per-operation breakdown from an instrumented pass; and with
//! `--speculative replay`, whole speculative steps through the engine at a
//! chosen acceptance profile (see `replay`).
//!
//! Works on real checkpoints or, with `--load-format dummy`, on random
//! weights of a config's real shapes (no download needed).

mod bandwidth;
mod dflash_draft;
mod flash_next;
mod mtp_draft;
mod replay;
mod replay_bench;
mod report;
mod run;
mod sampling;
mod steps;
mod timing;
mod traffic;

use std::path::PathBuf;

use anyhow::{Result, bail};
use kestrel_cpu::CpuBackend;
use kestrel_models::Quantization;
use kestrel_models::fp8::QuantConfig;

use super::backend::{self, BackendKind, Chosen};
use replay::Profile;
use replay_bench::ReplaySettings;
use sampling::SamplingMode;
use timing::Timed;
use traffic::Storage;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    /// Safetensors weights of the model folder.
    Auto,
    /// Random weights with the config's shapes, generated on the backend.
    Dummy,
}

/// `--speculative`: the proposers bench-model can time through the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchProposer {
    /// The target's own recorded greedy continuation, corrupted at the
    /// `--acceptance` profile (for dummy weights, where real drafts mean nothing).
    Replay,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Hugging Face model folder; the bundled model when neither this nor --config is given.
    #[arg(long, conflicts_with = "config")]
    model: Option<PathBuf>,
    /// A config.json to build a random-weight model from (needs --load-format dummy).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    load_format: LoadFormat,
    #[command(flatten)]
    pub quantization: super::quantization::QuantizationArgs,
    /// Seed of the dummy weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Where the model runs: `auto` takes the GPU when one can be opened.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendKind,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Batch-invariant arithmetic on CUDA: a sequence's output does not
    /// depend on what it is batched with (slower; docs/cuda.md).
    #[arg(long)]
    batch_invariant: bool,
    /// Prompt lengths to prefill (one sequence each); longer than the model allows are
    /// skipped. Given without a value, no prefill is measured.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1024,8192,32768")]
    prefill: Vec<usize>,
    /// Numbers of sequences decoding together. Given without a value, no decode is measured.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_value = "1,2,4,8")]
    decode_batch: Vec<usize>,
    /// Tokens each decoding sequence holds before the timed steps.
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Timed decode steps per batch size (the median is reported).
    #[arg(long, default_value_t = 20)]
    steps: usize,
    /// Untimed decode steps before the timed ones.
    #[arg(long, default_value_t = 3)]
    warmup: usize,
    /// Timed prefill runs per length, after one untimed run.
    #[arg(long, default_value_t = 3)]
    prefill_runs: usize,
    /// Instrumented steps (a device sync around every operation) for the breakdown; 0 turns it off.
    #[arg(long, default_value_t = 3)]
    breakdown_steps: usize,
    /// Longest prefill that also gets an instrumented breakdown run.
    #[arg(long, default_value_t = 8192)]
    breakdown_max_prefill: usize,
    /// Tokens per forward pass; longer prompts are prefilled in chunks, as the server does.
    #[arg(long, default_value_t = 32768)]
    max_batched_tokens: usize,
    /// Memory bandwidth in GB/s for the floors, instead of measuring it.
    #[arg(long)]
    bandwidth_gbs: Option<f64>,
    /// How decode steps pick their tokens: the device argmax, or the server's
    /// sampling path (device candidates, then the host), with Qwen's
    /// recommended settings or with temperature 1 and no filter. The step
    /// times include it.
    #[arg(long, value_enum, default_value = "greedy")]
    sampling: SamplingMode,
    /// Draft counts k of the verify steps to time (k + 1 new tokens per
    /// sequence at the decode context); none by default.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    verify_k: Vec<usize>,
    /// Numbers of sequences in the verify steps.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "1,2,4,8")]
    verify_batches: Vec<usize>,
    /// Draft depths k of the MTP draft phases to time (catch-up plus k - 1
    /// chained head steps per sequence); none by default.
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    mtp_draft_k: Vec<usize>,
    /// Numbers of sequences in the MTP draft phases.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "1,2,4,8")]
    mtp_draft_batches: Vec<usize>,
    /// Also time the MTP draft phases and DFlash passes over this reduced draft
    /// vocabulary (one token id per line, or a JSON array).
    #[arg(long, value_name = "FILE", conflicts_with = "draft_vocab_size")]
    draft_vocab: Option<PathBuf>,
    /// Also time the MTP draft phases and DFlash passes over the ids 0..N (for dummy weights).
    #[arg(long, value_name = "N")]
    draft_vocab_size: Option<usize>,
    /// Time DFlash drafter passes with this drafter: a folder, or with
    /// `--load-format dummy` its `config.json` (random weights at its
    /// shapes); none by default.
    #[arg(long, value_name = "PATH")]
    dflash_drafter: Option<PathBuf>,
    /// Block sizes (the anchor and the drafts) of the DFlash passes.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "8,12,16")]
    dflash_blocks: Vec<usize>,
    /// Numbers of sequences drafted in one step in the DFlash passes.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "1,8")]
    dflash_batches: Vec<usize>,
    /// Time whole speculative steps through the engine with this proposer.
    #[arg(long, value_enum)]
    speculative: Option<BenchProposer>,
    /// The replay proposer's per-position acceptance rates (unconditional,
    /// as vLLM's per-position metric reports them; non-increasing, in
    /// [0, 1]); their number is k. The default is the figure published for
    /// Qwen3.5/3.6 MTP at k = 3.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "0.87,0.74,0.61")]
    acceptance: Vec<f64>,
    /// Numbers of requests decoding together in the replay runs.
    #[arg(long, value_delimiter = ',', num_args = 1.., default_value = "1,8")]
    replay_batches: Vec<usize>,
    /// Tokens each request generates in the replay runs.
    #[arg(long, default_value_t = 128)]
    replay_tokens: usize,
    /// Most decode and verify rows a replay step brings (`auto`: the
    /// backend's one pass, `all`, or a number); see `serve --draft-rows`.
    #[arg(long, value_name = "ROWS", default_value = "auto")]
    draft_rows: kestrel_engine::spec::DraftRows,
    /// Adapt each replay request's draft length to its acceptance; see
    /// `serve --adaptive-drafts`.
    #[arg(long)]
    adaptive_drafts: bool,
    /// Run every CUDA step eagerly instead of replaying recorded decode steps
    /// (CUDA graphs).
    #[arg(long)]
    eager: bool,
    /// Write the results as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Args {
    /// The replay runs asked for, with a checked profile.
    fn replay_settings(&self, sampled_vocab: Option<usize>) -> Result<Option<ReplaySettings>> {
        let Some(BenchProposer::Replay) = self.speculative else {
            return Ok(None);
        };
        Ok(Some(ReplaySettings {
            profile: Profile::new(self.acceptance.clone())?,
            batches: self.replay_batches.clone(),
            context: self.context,
            max_tokens: self.replay_tokens,
            max_batched_tokens: self.max_batched_tokens,
            sampling: self.sampling,
            sampled_vocab,
            seed: self.seed,
            draft_rows: self.draft_rows,
            adaptive_drafts: self.adaptive_drafts,
        }))
    }
}

/// What the model was loaded from, for the report.
pub struct Source {
    pub path: PathBuf,
    pub dummy: bool,
    /// How the report names it: the path given, or the bundled model's name
    /// (its cache folder differs per machine).
    pub label: String,
}

pub fn run(args: Args) -> Result<()> {
    if args.steps == 0 || args.prefill_runs == 0 {
        bail!("--steps and --prefill-runs must be at least 1");
    }
    if args.max_batched_tokens == 0 {
        bail!("--max-batched-tokens must be at least 1");
    }
    if args.decode_batch.contains(&0) || args.prefill.contains(&0) {
        bail!("--prefill lengths and --decode-batch sizes must be at least 1");
    }
    if args.verify_k.contains(&0) || args.verify_batches.contains(&0) {
        bail!("--verify-k and --verify-batches values must be at least 1");
    }
    if args.mtp_draft_k.contains(&0) || args.mtp_draft_batches.contains(&0) {
        bail!("--mtp-draft-k and --mtp-draft-batches values must be at least 1");
    }
    if args.dflash_blocks.iter().any(|&b| b < 2) || args.dflash_batches.contains(&0) {
        bail!("--dflash-blocks values must be at least 2 and --dflash-batches at least 1");
    }
    if args.replay_batches.contains(&0) || args.replay_tokens < 2 {
        bail!("--replay-batches must be at least 1 and --replay-tokens at least 2");
    }
    args.replay_settings(None)?;
    if args.context == 0 {
        bail!("--context must be at least 1 (each sequence is prefilled before decoding)");
    }
    let source = match (&args.model, &args.config, args.load_format) {
        (_, Some(_), LoadFormat::Auto) => bail!("--config needs --load-format dummy"),
        (_, Some(c), LoadFormat::Dummy) => {
            if !c.exists() {
                bail!("config {} does not exist", c.display());
            }
            Source {
                path: c.clone(),
                dummy: true,
                label: c.display().to_string(),
            }
        }
        (m, None, format) => {
            let path = crate::model_dir::resolve(m.clone())?;
            let label = match m {
                Some(dir) => dir.display().to_string(),
                None => format!(
                    "bundled model {}",
                    path.file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
                ),
            };
            Source {
                path,
                dummy: format == LoadFormat::Dummy,
                label,
            }
        }
    };
    // Block-FP8 weights (a checkpoint's, or quantised while loading) stay
    // FP8 on CUDA; the CPU reference dequantises them to f32.
    let config = if source.dummy {
        source.path.clone()
    } else {
        source.path.join("config.json")
    };
    let fp8 = args.quantization.get() == Quantization::Fp8
        || matches!(QuantConfig::from_file(&config), Ok(Some(_)));
    if source.dummy
        && kestrel_models::ModelConfig::from_file(&config)
            .is_ok_and(|c| c.arch == kestrel_models::Arch::Qwen4Exp)
    {
        return bench_flash_next(&args, &config);
    }
    match backend::open(args.backend, args.device)? {
        Chosen::Cpu { .. } => {
            let b = Timed::new(CpuBackend::new());
            run::bench(&b, Storage::cpu(), &source, &args, None)
        }
        Chosen::Cuda(mut cuda) => {
            cuda.set_graphs(!args.eager);
            if args.batch_invariant {
                cuda.set_batch_invariant(true);
            }
            eprintln!("{}", cuda.plan());
            let plan = serde_json::to_value(cuda.plan())?;
            let b = Timed::new(cuda);
            let storage = Storage::cuda(fp8, args.quantization.form().lm_head_fp8);
            run::bench(&b, storage, &source, &args, Some(plan))
        }
    }
}

/// Qwen3.8-Flash-Next with dummy weights: its own prefill and decode loop
/// ([`flash_next`]), weights as stored or FP8 (`--quantization fp8`), the
/// lm_head optionally FP8.
fn bench_flash_next(args: &Args, config: &std::path::Path) -> Result<()> {
    let form = args.quantization.form();
    let run = |b: &dyn Fn(&flash_next::Settings) -> Result<serde_json::Value>| -> Result<()> {
        let report = b(&flash_next::Settings {
            config,
            prefills: &args.prefill,
            prefill_runs: args.prefill_runs,
            decode_batches: &args.decode_batch,
            context: args.context,
            steps: args.steps,
            chunk: args.max_batched_tokens,
            form,
            breakdown_steps: args.breakdown_steps,
        })?;
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
        }
        Ok(())
    };
    match backend::open(args.backend, args.device)? {
        Chosen::Cpu { .. } => {
            run(&|s| flash_next::bench(&Timed::new(CpuBackend::new()), s, Storage::cpu(), None))
        }
        Chosen::Cuda(cuda) => {
            eprintln!("{}", cuda.plan());
            let plan = serde_json::to_value(cuda.plan())?;
            let fp8 = form.quantization == Quantization::Fp8;
            let storage = Storage::cuda(fp8, form.lm_head_fp8);
            let cuda = Timed::new(cuda);
            run(&|s| flash_next::bench(&cuda, s, storage, Some(plan.clone())))
        }
    }
}

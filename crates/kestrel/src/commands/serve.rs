//! `kestrel serve`: the OpenAI-compatible HTTP server.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use kestrel_cpu::CpuBackend;
use kestrel_server::ServerConfig;

use super::backend::{self, BackendKind, Chosen};

#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model folder; the bundled model when omitted.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Address to bind. Anything but loopback without --api-key logs a warning.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Name clients use in `model` (repeat for aliases); defaults to the folder name.
    #[arg(long = "served-model-name")]
    served_model_names: Vec<String>,
    /// Required as `Authorization: Bearer KEY` or `x-api-key: KEY` on every route but /health and /api/hello (repeatable).
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// Sequences running at once.
    #[arg(long, default_value_t = 64)]
    max_num_seqs: usize,
    /// Waiting requests before new ones get 429.
    #[arg(long, default_value_t = 256)]
    max_queued_requests: usize,
    /// Tokens per forward step (prefill chunks + decode tokens). One
    /// sequence's prefill chunk is at most 8192 tokens (or this budget less
    /// a decode token per other sequence, if smaller), so a prompt up to
    /// 8192 tokens prefills in one forward pass, as vLLM and SGLang do on
    /// large GPUs; hybrid models add a pass over the prompt's last partial
    /// page, where the prefix cache snapshots their recurrent state.
    #[arg(long, default_value_t = 32768)]
    max_num_batched_tokens: usize,
    /// KV pages in the pool (overrides --kv-cache-tokens).
    #[arg(long)]
    num_blocks: Option<usize>,
    /// KV-cache capacity in tokens (default: on a GPU, what the weights
    /// leave under --gpu-memory-utilization; on the CPU, 65,536 or the
    /// context length).
    #[arg(long)]
    kv_cache_tokens: Option<usize>,
    /// Fraction of the GPU's memory the weights and caches may take; the KV
    /// cache gets the rest of it after the weights.
    #[arg(long, default_value_t = 0.9)]
    gpu_memory_utilization: f64,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    block_size: usize,
    /// Turn prefix caching off.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Largest request body in bytes (larger ones get 413).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Seconds between SSE keep-alive comments while a stream waits.
    #[arg(long, default_value_t = 15.0)]
    sse_ping_interval: f64,
    /// Where the model runs: `auto` takes the GPU when one can be opened.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendKind,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Batch-invariant arithmetic on CUDA: a sequence's output does not
    /// depend on what it is batched with (slower; docs/cuda.md).
    #[arg(long)]
    batch_invariant: bool,
    /// `dummy`: random weights with the real shapes (the folder needs only
    /// config.json and the tokenizer), for benchmarking without downloads.
    #[arg(long, value_enum, default_value = "auto")]
    load_format: LoadFormat,
    #[command(flatten)]
    quantization: super::quantization::QuantizationArgs,
    /// Cap on the context length (prompt + output); the model's own by
    /// default. A value above the model's own is refused unless
    /// --allow-long-max-model-len is given.
    #[arg(long)]
    max_model_len: Option<usize>,
    /// Accept a --max-model-len above the model's max_position_embeddings
    /// (vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); output past the trained
    /// context may be poor.
    #[arg(long)]
    allow_long_max_model_len: bool,
    /// `/v1/messages`: keep Claude Code's per-request
    /// `x-anthropic-billing-header:` system-prompt line (by default it is
    /// dropped so consecutive requests share the cached prompt prefix).
    #[arg(long)]
    keep_billing_header: bool,
    /// Test knob: preempt the newest sequence whenever this many run.
    #[arg(long, hide = true)]
    force_preempt_at: Option<usize>,
    #[command(flatten)]
    speculative: super::speculative::SpeculativeArgs,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum LoadFormat {
    Auto,
    Dummy,
}

pub fn run(args: Args) -> Result<()> {
    kestrel_server::init_logging();
    let dir = crate::model_dir::resolve(args.model.clone())?;
    let mut config = ServerConfig::new(dir);
    config.addr = SocketAddr::new(args.host, args.port);
    config.served_model_names = args.served_model_names;
    config.api_keys = args
        .api_keys
        .into_iter()
        .filter(|k| !k.is_empty())
        .collect();
    config.max_num_seqs = args.max_num_seqs.max(1);
    config.max_queued_requests = args.max_queued_requests;
    config.max_num_batched_tokens = args.max_num_batched_tokens.max(1);
    config.num_blocks = args.num_blocks;
    config.kv_cache_tokens = args.kv_cache_tokens;
    anyhow::ensure!(
        args.gpu_memory_utilization > 0.0 && args.gpu_memory_utilization <= 1.0,
        "--gpu-memory-utilization must be in (0, 1], not {}",
        args.gpu_memory_utilization
    );
    config.gpu_memory_utilization = args.gpu_memory_utilization;
    config.block_size = args.block_size.max(1);
    config.enable_prefix_cache = !args.no_prefix_cache;
    config.max_body_bytes = args.max_body_bytes;
    config.sse_ping_interval = Duration::from_secs_f64(args.sse_ping_interval.clamp(0.1, 3600.0));
    config.force_preempt_at = args.force_preempt_at;
    config.show_progress = true;
    config.dummy_weights = args.load_format == LoadFormat::Dummy;
    config.quantization = args.quantization.form();
    config.max_model_len = args.max_model_len;
    config.allow_long_max_model_len = args.allow_long_max_model_len;
    config.strip_billing_header = !args.keep_billing_header;
    // On the bundled model, `--speculative dflash` defaults to its drafter.
    config.speculative = args
        .speculative
        .config_with(|| crate::model_dir::default_drafter(args.model.as_deref()))?;
    config.draft_rows = args.speculative.draft_rows;
    config.adaptive_drafts = args.speculative.adaptive_drafts;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    match backend::open(args.backend, args.device)? {
        Chosen::Cpu { .. } => runtime.block_on(kestrel_server::run(config, CpuBackend::new())),
        Chosen::Cuda(mut cuda) => {
            if args.batch_invariant {
                cuda.set_batch_invariant(true);
            }
            eprintln!("{}", cuda.plan());
            runtime.block_on(kestrel_server::run(config, cuda))
        }
    }
}

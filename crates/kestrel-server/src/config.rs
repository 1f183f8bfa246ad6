//! Server settings, as the `kestrel serve` flags give them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything the server needs to start; `kestrel serve` fills it from flags.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub model_dir: PathBuf,
    /// Where to listen; port 0 picks a free port (tests).
    pub addr: SocketAddr,
    /// Names clients may use in `model`; the first is reported in responses.
    /// Empty: the model folder's name.
    pub served_model_names: Vec<String>,
    /// Keys accepted on every route except `/health`; empty: no auth.
    pub api_keys: Vec<String>,
    pub max_num_seqs: usize,
    pub max_queued_requests: usize,
    pub max_num_batched_tokens: usize,
    /// KV pages in the pool; `None`: from `kv_cache_tokens`.
    pub num_blocks: Option<usize>,
    /// KV capacity in tokens when `num_blocks` is not given.
    pub kv_cache_tokens: Option<usize>,
    /// With neither of those, on a GPU: the fraction of its memory that
    /// weights and caches may take (vLLM's `--gpu-memory-utilization`); the
    /// KV cache gets what the weights leave.
    pub gpu_memory_utilization: f64,
    pub block_size: usize,
    pub enable_prefix_cache: bool,
    /// Test knob: force preemption whenever this many sequences run.
    pub force_preempt_at: Option<usize>,
    /// Largest request body; larger ones get 413.
    pub max_body_bytes: usize,
    /// SSE keep-alive comment interval while no tokens arrive.
    pub sse_ping_interval: Duration,
    /// Draw a progress bar on stderr while loading.
    pub show_progress: bool,
    /// Random weights with the real shapes (vLLM's `--load-format dummy`):
    /// the folder needs only `config.json` and the tokenizer files.
    pub dummy_weights: bool,
    /// The form weights are loaded in (`--quantization fp8`,
    /// `--lm-head-dtype fp8`).
    pub quantization: kestrel_models::WeightForm,
    /// Cap on the context length (vLLM `--max-model-len`); `None`: the model's.
    pub max_model_len: Option<usize>,
    /// Allow `max_model_len` above the model's `max_position_embeddings`
    /// (vLLM's `VLLM_ALLOW_LONG_MAX_MODEL_LEN`); refused by default.
    pub allow_long_max_model_len: bool,
    /// Speculative decoding (vLLM `--speculative-config`); `None`: off.
    pub speculative: Option<kestrel_engine::spec::SpeculativeConfig>,
    /// The decode and verify rows a speculative step may bring.
    pub draft_rows: kestrel_engine::spec::DraftRows,
    /// Adapt each request's draft length to its acceptance.
    pub adaptive_drafts: bool,
    /// `/v1/messages`: drop Claude Code's per-request
    /// `x-anthropic-billing-header:` system line so the prompt prefix, and
    /// with it the prefix cache, stays the same across requests.
    pub strip_billing_header: bool,
}

impl ServerConfig {
    pub fn new(model_dir: PathBuf) -> Self {
        ServerConfig {
            model_dir,
            addr: SocketAddr::from(([127, 0, 0, 1], 8000)),
            served_model_names: Vec::new(),
            api_keys: Vec::new(),
            max_num_seqs: 64,
            max_queued_requests: 256,
            max_num_batched_tokens: 32768,
            num_blocks: None,
            kv_cache_tokens: None,
            gpu_memory_utilization: 0.9,
            block_size: 16,
            enable_prefix_cache: true,
            force_preempt_at: None,
            max_body_bytes: 64 * 1024 * 1024,
            sse_ping_interval: Duration::from_secs(15),
            show_progress: false,
            dummy_weights: false,
            quantization: kestrel_models::WeightForm::default(),
            speculative: None,
            draft_rows: Default::default(),
            adaptive_drafts: false,
            max_model_len: None,
            allow_long_max_model_len: false,
            strip_billing_header: true,
        }
    }

    /// The served aliases, defaulting to the model folder's name.
    pub fn model_names(&self) -> Vec<String> {
        if !self.served_model_names.is_empty() {
            return self.served_model_names.clone();
        }
        let name = self
            .model_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kestrel".into());
        vec![name]
    }
}

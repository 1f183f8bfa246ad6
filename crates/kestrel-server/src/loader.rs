//! Background model loading: the listener is already up (answering 503 on
//! `/health`) while the tokenizer, template, weights and engine come up here.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kestrel_api::SamplingDefaults;
use kestrel_core::{Backend, FlashNextOps};
use kestrel_engine::spec::SpeculativeMethod;
use kestrel_engine::{Engine, EngineConfig, EngineOptions};
use kestrel_models::{MtpHead, Target};
use kestrel_structured::{GrammarCompiler, ToolCallFormat};
use kestrel_text::{ChatTemplate, Tokenizer};
use serde_json::Value;

use crate::config::ServerConfig;
use crate::state::{AppState, LoadedModel, Phase};

const STAGES: [&str; 4] = ["tokenizer", "chat template", "weights", "engine"];

/// Loads the model on the current (blocking) thread and publishes the
/// result in `state`.
pub fn load_into<B: FlashNextOps>(state: &Arc<AppState>, backend: B) {
    let started = Instant::now();
    let bar = progress_bar(state.config.show_progress);
    let report = |i: usize| {
        state.set_phase(Phase::Loading {
            stage: STAGES[i],
            progress: i as f32 / STAGES.len() as f32,
            started,
        });
        bar.set_position(i as u64);
        bar.set_message(STAGES[i]);
    };
    match load(&state.config, backend, report) {
        Ok(model) => {
            bar.finish_and_clear();
            tracing::info!(
                max_model_len = model.max_model_len,
                "model loaded in {:.2} s; serving as {:?}",
                started.elapsed().as_secs_f64(),
                state.model_names
            );
            state.set_phase(Phase::Ready(Arc::new(model)));
        }
        Err(e) => {
            bar.abandon_with_message("failed");
            tracing::error!("model failed to load: {e:#}");
            state.set_phase(Phase::Failed(format!("{e:#}")));
        }
    }
}

fn progress_bar(visible: bool) -> ProgressBar {
    if !visible {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(STAGES.len() as u64);
    if let Ok(style) =
        ProgressStyle::with_template("loading {msg:14} [{bar:30}] {pos}/{len} {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

fn load<B: FlashNextOps>(
    config: &ServerConfig,
    backend: B,
    report: impl Fn(usize),
) -> Result<LoadedModel> {
    let dir = config.model_dir.as_path();
    report(0);
    let tokenizer = Tokenizer::from_model_dir(dir)?;
    report(1);
    let template = ChatTemplate::from_model_dir(dir)?;
    if template.is_none() {
        tracing::warn!(
            "{} has no chat template: /v1/chat/completions will answer 400",
            dir.display()
        );
    }
    report(2);
    let memory_before = backend.device_memory();
    let model = if config.dummy_weights {
        Target::load_dummy_as(dir, &backend, 0, config.quantization)?
    } else {
        Target::load_as(dir, &backend, config.quantization)?
    };
    let max_model_len =
        crate::context_len::resolve(config, model.config().max_position_embeddings)?;
    report(3);
    let mut engine_config = engine_config(config, max_model_len);
    if let (Some((free_before, _)), Some((free, total))) = (memory_before, backend.device_memory())
    {
        tracing::info!(
            "model: {} of device memory ({} free of {})",
            gib(free_before.saturating_sub(free)),
            gib(free),
            gib(total)
        );
        if config.num_blocks.is_none() && config.kv_cache_tokens.is_none() {
            let kv = KvBudget::of(&backend, &model, config, &engine_config, (free, total));
            engine_config.num_blocks = kv.blocks(max_model_len, engine_config.block_size)?;
            tracing::info!(
                "KV cache: {} of the {} that --gpu-memory-utilization {} leaves after the model \
                 ({} a page of {} tokens; {} for recurrent state, {} kept for a step's buffers)",
                gib(engine_config.num_blocks * kv.page_bytes),
                gib(kv.budget),
                config.gpu_memory_utilization,
                kv.page_bytes,
                engine_config.block_size,
                gib(kv.state_bytes),
                gib(STEP_RESERVE_BYTES)
            );
        }
    }
    // Checkpoints pad the embedding past the tokenizer (Qwen3.6: 248,320
    // rows for 248,077 tokens); the padded ids must never be sampled.
    if tokenizer.vocab_size() < model.config().vocab_size {
        engine_config.sampled_vocab = Some(tokenizer.vocab_size());
    }
    tracing::info!(
        "KV cache: {} tokens ({} blocks of {}); max concurrency for {} tokens: {:.1}x",
        engine_config.num_blocks * engine_config.block_size,
        engine_config.num_blocks,
        engine_config.block_size,
        max_model_len,
        (engine_config.num_blocks * engine_config.block_size) as f64 / max_model_len as f64
    );
    if let Some(spec) = &config.speculative {
        tracing::info!(
            "speculative decoding: {}, up to {} drafts a step",
            spec.method.label(),
            spec.num_speculative_tokens
        );
    }
    let options = EngineOptions {
        speculative: config.speculative.clone(),
        draft_rows: config.draft_rows,
        adaptive_drafts: config.adaptive_drafts,
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(backend, model, engine_config, options)
        .context("cannot start the engine")?;
    // Read again on the first constrained request, not at start-up.
    let grammars =
        GrammarCompiler::from_tokenizer_file(dir.join("tokenizer.json"), engine.eos_token_ids());
    // Forced tool calls are written the way the template renders calls.
    let tool_call_format = template.as_ref().map_or(ToolCallFormat::Json, |t| {
        ToolCallFormat::of_template(|s| t.source_contains(s))
    });
    let late_system_messages = template.as_ref().is_some_and(renders_late_system_messages);
    Ok(LoadedModel {
        engine,
        tokenizer,
        template,
        tool_call_format,
        late_system_messages,
        max_model_len,
        sampling_defaults: sampling_defaults(dir)?,
        grammars,
    })
}

/// Whether the template renders a `system` message that follows a user
/// turn (Qwen3.6's raises an error instead; a template may also drop it).
pub fn renders_late_system_messages(template: &ChatTemplate) -> bool {
    const MARK: &str = "late system message probe";
    let messages = [
        serde_json::json!({"role": "user", "content": "Hello."}),
        serde_json::json!({"role": "system", "content": MARK}),
        serde_json::json!({"role": "user", "content": "Go on."}),
    ];
    template
        .render(&messages, None, true, &serde_json::Map::new())
        .is_ok_and(|prompt| prompt.contains(MARK))
}

/// KV capacity when neither `--num-blocks` nor `--kv-cache-tokens` is given
/// and the backend has no device memory of its own to size it from.
const DEFAULT_KV_CACHE_TOKENS: usize = 65536;

/// Device memory kept out of the KV cache, under the utilization, for what
/// a step allocates as it runs (activations, MoE routing, logits, the
/// graphs of recorded decode steps).
const STEP_RESERVE_BYTES: usize = 2 << 30;

fn gib(bytes: usize) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// The device memory the KV pages may take, and what one page costs.
struct KvBudget {
    /// Bytes for pages: the utilization's share of the device, less what is
    /// in use after loading, the recurrent state and the step reserve.
    budget: usize,
    /// One page in every attention layer (and the MTP head's own cache,
    /// whose pages follow the target's).
    page_bytes: usize,
    state_bytes: usize,
}

impl KvBudget {
    fn of<B: Backend>(
        backend: &B,
        model: &Target<B>,
        config: &ServerConfig,
        engine: &EngineConfig,
        (free, total): (usize, usize),
    ) -> KvBudget {
        let bs = engine.block_size;
        let spec = |blocks, slots| model.cache_spec(blocks, bs, slots);
        let state_bytes = backend.cache_bytes(&spec(0, engine.num_state_slots));
        let mut page_bytes = backend.cache_bytes(&spec(1, 0));
        let mtp = config
            .speculative
            .as_ref()
            .is_some_and(|s| matches!(s.method, SpeculativeMethod::Mtp(_)));
        if let (true, Some(model)) = (mtp, model.decoder_model()) {
            page_bytes += backend.cache_bytes(&MtpHead::cache_spec(&model.decoder, 1, bs));
        }
        Self::new(
            (free, total),
            config.gpu_memory_utilization,
            page_bytes,
            state_bytes,
        )
    }

    fn new(
        (free, total): (usize, usize),
        utilization: f64,
        page_bytes: usize,
        state_bytes: usize,
    ) -> Self {
        let allowed = (total as f64 * utilization) as usize;
        let in_use = total.saturating_sub(free);
        KvBudget {
            budget: allowed.saturating_sub(in_use + state_bytes + STEP_RESERVE_BYTES),
            page_bytes: page_bytes.max(1),
            state_bytes,
        }
    }

    /// Pages that fit: at least those of one sequence of `max_model_len`
    /// tokens, else an error that says what to change.
    fn blocks(&self, max_model_len: usize, block_size: usize) -> Result<usize> {
        let blocks = self.budget / self.page_bytes;
        let needed = max_model_len.div_ceil(block_size.max(1));
        anyhow::ensure!(
            blocks >= needed,
            "the KV cache for one sequence of {max_model_len} tokens needs {}, but \
             --gpu-memory-utilization leaves {} after the model: lower --max-model-len, raise \
             --gpu-memory-utilization or give --kv-cache-tokens",
            gib(needed * self.page_bytes),
            gib(self.budget)
        );
        Ok(blocks)
    }
}

pub fn engine_config(config: &ServerConfig, max_model_len: usize) -> EngineConfig {
    let block_size = config.block_size.max(1);
    let num_blocks = config.num_blocks.unwrap_or_else(|| {
        let tokens = config
            .kv_cache_tokens
            .unwrap_or(DEFAULT_KV_CACHE_TOKENS.max(max_model_len));
        tokens.div_ceil(block_size)
    });
    // Running sequences each need a slot; as many again keep prefix-cache
    // snapshots of hybrid models' recurrent state.
    let mut num_state_slots = if config.enable_prefix_cache {
        config.max_num_seqs * 2
    } else {
        config.max_num_seqs
    };
    // Speculating sequences hold a checkpoint slot per draft for the step.
    if let Some(spec) = &config.speculative {
        num_state_slots += config.max_num_seqs * spec.num_speculative_tokens;
    }
    EngineConfig {
        max_num_seqs: config.max_num_seqs,
        max_queued_requests: config.max_queued_requests,
        max_num_batched_tokens: config.max_num_batched_tokens,
        block_size,
        num_blocks,
        num_state_slots,
        enable_prefix_cache: config.enable_prefix_cache,
        max_model_len,
        force_preempt_at: config.force_preempt_at,
        sampled_vocab: None,
    }
}

/// vLLM's `--generation-config auto`: the model's `generation_config.json`
/// supplies defaults for the sampling fields a request leaves out.
fn sampling_defaults(dir: &Path) -> Result<SamplingDefaults> {
    let mut d = SamplingDefaults::default();
    let path = dir.join("generation_config.json");
    if !path.exists() {
        return Ok(d);
    }
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let json: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not valid JSON", path.display()))?;
    let num = |key: &str| {
        json.get(key)
            .and_then(Value::as_f64)
            .filter(|v| v.is_finite())
    };
    if let Some(v) = num("temperature") {
        d.temperature = v as f32;
    }
    if let Some(v) = num("top_p") {
        d.top_p = v as f32;
    }
    if let Some(v) = num("top_k").filter(|v| *v >= 0.0) {
        d.top_k = v as u32;
    }
    if let Some(v) = num("min_p") {
        d.min_p = v as f32;
    }
    if let Some(v) = num("repetition_penalty") {
        d.repetition_penalty = v as f32;
    }
    if let Some(v) = num("presence_penalty") {
        d.presence_penalty = v as f32;
    }
    if let Some(v) = num("frequency_penalty") {
        d.frequency_penalty = v as f32;
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn repo() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    /// The pages get the utilization's share of the device less what the
    /// model uses, the recurrent state and the step reserve; too little for
    /// one sequence of the context length is an error naming the flags.
    #[test]
    fn the_kv_cache_gets_what_the_weights_leave_under_the_utilization() {
        const G: usize = 1 << 30;
        // 100 GiB device, 60 free after the model, 1 GiB of state, 1 MiB pages.
        let kv = KvBudget::new((60 * G, 100 * G), 0.9, 1 << 20, G);
        assert_eq!(kv.budget, 90 * G - 40 * G - G - STEP_RESERVE_BYTES);
        assert_eq!(kv.blocks(262_144, 16).unwrap(), kv.budget >> 20);
        // A larger model leaves less: the fraction is of the whole device.
        let small = KvBudget::new((20 * G, 100 * G), 0.9, 1 << 20, G);
        assert_eq!(small.budget, 7 * G);
        assert_eq!(small.blocks(16, 16).unwrap(), 7 * 1024);
        // Nothing left, or less than one full-length sequence.
        let none = KvBudget::new((5 * G, 100 * G), 0.9, 1 << 20, G);
        assert_eq!(none.budget, 0);
        let err = none.blocks(16, 16).unwrap_err().to_string();
        assert!(
            err.contains("--gpu-memory-utilization") && err.contains("--max-model-len"),
            "{err}"
        );
        let err = small.blocks(16 * 8 * 1024, 16).unwrap_err().to_string();
        assert!(err.contains("131072 tokens needs 8.00 GiB"), "{err}");
    }

    #[test]
    fn the_probe_tells_which_templates_take_a_late_system_message() {
        let tiny = ChatTemplate::from_model_dir(repo().join("models/kestrel-tiny-qwen35"))
            .unwrap()
            .unwrap();
        assert!(renders_late_system_messages(&tiny));
        // Qwen3.6's template raises "System message must be at the beginning."
        let path = repo().join("testdata/chat_template/qwen3_6.jinja");
        let source = std::fs::read_to_string(&path).unwrap();
        let qwen36 =
            ChatTemplate::from_source(&source, "qwen3_6.jinja", Default::default()).unwrap();
        assert!(!renders_late_system_messages(&qwen36));
    }
}

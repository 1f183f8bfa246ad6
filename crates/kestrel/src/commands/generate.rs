//! `kestrel generate`: one prompt, streamed to the terminal, tokens/s at the
//! end; through the same engine as the server (one sequence), so it runs and
//! measures what serving runs.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kestrel_core::FlashNextOps;
use kestrel_cpu::CpuBackend;
use kestrel_engine::{Engine, EngineConfig, EngineEvent, EngineOptions, GenerateRequest};
use kestrel_models::Target;
use kestrel_sampling::SamplingParams;
use kestrel_text::{ChatTemplate, Detokenizer, Tokenizer};
use serde_json::json;

use super::backend::{self, BackendKind, Chosen};
use super::speculative::SpeculativeArgs;

#[derive(clap::Args)]
pub struct Args {
    /// Hugging Face model folder (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, short)]
    prompt: String,
    /// Treat the prompt as a user message and apply the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Optional system message (with --chat).
    #[arg(long)]
    system: Option<String>,
    /// Turn the model's thinking off in the chat template (with --chat).
    #[arg(long)]
    no_think: bool,
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long)]
    seed: Option<u64>,
    #[command(flatten)]
    quantization: super::quantization::QuantizationArgs,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
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
    #[command(flatten)]
    speculative: SpeculativeArgs,
}

pub fn run(args: Args) -> Result<()> {
    match backend::open(args.backend, args.device)? {
        Chosen::Cpu { .. } => generate(&args, CpuBackend::new()),
        Chosen::Cuda(mut cuda) => {
            if args.batch_invariant {
                cuda.set_batch_invariant(true);
            }
            eprintln!("{}", cuda.plan());
            generate(&args, cuda)
        }
    }
}

fn generate<B: FlashNextOps>(args: &Args, backend: B) -> Result<()> {
    // On the bundled model, `--speculative dflash` defaults to its drafter.
    let speculative = args
        .speculative
        .config_with(|| crate::model_dir::default_drafter(args.model.as_deref()))?;
    let dir = crate::model_dir::resolve(args.model.clone())?;
    let tokenizer = Tokenizer::from_model_dir(&dir)?;
    let prompt = if args.chat {
        let template = ChatTemplate::from_model_dir(&dir)?
            .with_context(|| format!("{} has no chat template", dir.display()))?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(json!({"role": "system", "content": system}));
        }
        messages.push(json!({"role": "user", "content": args.prompt}));
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), json!(!args.no_think));
        template.render(&messages, None, true, &extra)?
    } else {
        args.prompt.clone()
    };
    let prompt_ids = tokenizer.encode(&prompt, false)?;
    if prompt_ids.is_empty() {
        bail!("the prompt encodes to no tokens");
    }

    let load_start = Instant::now();
    let model = Target::load_as(&dir, &backend, args.quantization.form())?;
    let load_s = load_start.elapsed().as_secs_f64();
    let max_len = (prompt_ids.len() + args.max_tokens).min(model.config().max_position_embeddings);
    if prompt_ids.len() >= max_len {
        bail!(
            "the prompt has {} tokens; the model's maximum context length is {}",
            prompt_ids.len(),
            model.config().max_position_embeddings
        );
    }
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        max_tokens: Some(max_len - prompt_ids.len()),
        ..SamplingParams::default()
    };
    params
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid --{}", e.to_string().replace('_', "-")))?;
    let model_type = model.config().model_type.clone();
    let backend_name = backend.name();
    // The same engine the server runs, sized for this one request.
    let block_size = 16;
    let drafts = speculative.as_ref().map_or(0, |s| s.num_speculative_tokens);
    let mut config = EngineConfig {
        max_num_seqs: 1,
        max_queued_requests: 1,
        max_num_batched_tokens: prompt_ids.len().max(block_size) + drafts + 1,
        block_size,
        num_blocks: (max_len + drafts).div_ceil(block_size) + 1,
        num_state_slots: 1 + drafts,
        enable_prefix_cache: false,
        max_model_len: max_len,
        force_preempt_at: None,
        sampled_vocab: None,
    };
    // Padded embedding rows past the tokenizer (Qwen3.6: 248,320 for 248,077
    // tokens) have no text: never sample them.
    if tokenizer.vocab_size() < model.config().vocab_size {
        config.sampled_vocab = Some(tokenizer.vocab_size());
    }
    let options = EngineOptions {
        speculative,
        draft_rows: args.speculative.draft_rows,
        adaptive_drafts: args.speculative.adaptive_drafts,
        ..EngineOptions::default()
    };
    let engine = Engine::spawn_with_options(backend, model, config, options)?;
    let mut steps_before = 0;
    if args.speculative.is_replay() {
        // The replay proposer drafts only for a prompt it has answered:
        // answer it once first, untimed and unprinted.
        let mut recording = engine
            .submit(GenerateRequest {
                request_id: "generate-recording".into(),
                prompt_ids: prompt_ids.clone(),
                params: params.clone(),
                cache_salt: Vec::new(),
                constraint: None,
            })
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        loop {
            match recording.blocking_recv() {
                Some(
                    EngineEvent::Tokens(_)
                    | EngineEvent::Logprobs(_)
                    | EngineEvent::PromptLogprobs(_),
                ) => {}
                Some(EngineEvent::Finished { .. }) => break,
                Some(EngineEvent::Error(e)) => bail!("generation failed: {e}"),
                None => bail!("the engine stopped without finishing the request"),
            }
        }
        // The counters are published after the step that finished it.
        let deadline = Instant::now() + std::time::Duration::from_secs(1);
        while engine.stats().num_running > 0 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        steps_before = engine.stats().engine_steps_total;
    }
    let mut stream = engine
        .submit(GenerateRequest {
            request_id: "generate".into(),
            prompt_ids: prompt_ids.clone(),
            params,
            cache_salt: Vec::new(),
            constraint: None,
        })
        .map_err(|e| anyhow::anyhow!("{e}"))?;

    let mut detok = Detokenizer::new(&tokenizer, true);
    let mut out = std::io::stdout().lock();
    if !args.chat {
        write!(out, "{prompt}")?;
    }
    let start = Instant::now();
    let mut first_token_s = None;
    let mut generated = 0usize;
    let finish = loop {
        match stream.blocking_recv() {
            Some(EngineEvent::Tokens(tokens)) => {
                first_token_s.get_or_insert_with(|| start.elapsed().as_secs_f64());
                for token in tokens {
                    generated += 1;
                    write!(out, "{}", detok.push(token)?)?;
                }
                out.flush()?;
            }
            Some(EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_)) => {}
            Some(EngineEvent::Finished { reason, .. }) => break reason,
            Some(EngineEvent::Error(e)) => bail!("generation failed: {e}"),
            None => bail!("the engine stopped without finishing the request"),
        }
    };
    writeln!(out, "{}", detok.finish())?;
    let prefill_s = first_token_s.unwrap_or_default();
    let decode_s = start.elapsed().as_secs_f64() - prefill_s;
    let stats = engine.stats();
    let spec = if stats.spec_decode_num_drafts_total > 0 {
        format!(
            "; drafts accepted {}/{} ({:.2} tokens a step)",
            stats.spec_decode_num_accepted_tokens_total,
            stats.spec_decode_num_draft_tokens_total,
            generated as f64
                / (stats.engine_steps_total - steps_before)
                    .saturating_sub(1)
                    .max(1) as f64
        )
    } else {
        String::new()
    };
    eprintln!(
        "\n[{model_type} on {backend_name}: load {:.2} s; prompt {} tokens, first token after {:.3} s ({:.1} tok/s); generated {} tokens, {:.1} tok/s after the first{spec}; finish: {}]",
        load_s,
        prompt_ids.len(),
        prefill_s,
        prompt_ids.len() as f64 / prefill_s.max(1e-9),
        generated,
        // The first token comes from the prefill; the rest from decode steps.
        (generated.saturating_sub(1)) as f64 / decode_s.max(1e-9),
        finish.as_str()
    );
    Ok(())
}

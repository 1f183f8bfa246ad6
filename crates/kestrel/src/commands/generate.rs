//! `kestrel generate`: one prompt, streamed to the terminal, tokens/s at the end.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kestrel_core::Backend;
use kestrel_cpu::CpuBackend;
use kestrel_models::{Model, runner::SequenceRunner};
use kestrel_sampling::{Sampler, SamplingParams, StopConditions};
use kestrel_text::{ChatTemplate, Detokenizer, Tokenizer};
use serde_json::json;

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
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Where the model runs.
    #[arg(long, value_enum, default_value = "cpu")]
    backend: BackendKind,
    /// CUDA device ordinal (with --backend cuda).
    #[arg(long, default_value_t = 0)]
    device: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

pub fn run(args: Args) -> Result<()> {
    match args.backend {
        BackendKind::Cpu => generate(&args, &CpuBackend::new()),
        BackendKind::Cuda => {
            let cuda = kestrel_cuda::CudaBackend::new(args.device)
                .context("cannot open the CUDA backend")?;
            eprintln!("{}", cuda.plan());
            generate(&args, &cuda)
        }
    }
}

fn generate<B: Backend>(args: &Args, backend: &B) -> Result<()> {
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
    let model = Model::load(&dir, backend)?;
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
        max_tokens: Some(args.max_tokens),
        ..SamplingParams::default()
    };
    let eos = tokenizer.eos_token_ids().to_vec();
    let mut sampler = Sampler::new(&params, prompt_ids.len(), &eos)
        .map_err(|e| anyhow::anyhow!("invalid --{}", e.to_string().replace('_', "-")))?;
    let stop = StopConditions::new(&params, &eos).with_max_seq_len(max_len);

    let mut runner = SequenceRunner::new(backend, &model, max_len)?;
    // Padded embedding rows past the tokenizer (Qwen3.6: 248,320 for 248,077
    // tokens) have no text: never sample them.
    let sampled_vocab = tokenizer.vocab_size().min(model.config().vocab_size);
    let mask_padding = |logits: &mut Vec<f32>| {
        if let Some(padding) = logits.get_mut(sampled_vocab..) {
            padding.fill(f32::NEG_INFINITY);
        }
    };
    let mut history = prompt_ids.clone();
    let mut detok = Detokenizer::new(&tokenizer, true);
    let mut out = std::io::stdout().lock();
    if !args.chat {
        write!(out, "{prompt}")?;
    }

    let prefill_start = Instant::now();
    let mut logits = runner.feed_last_logits(&prompt_ids)?;
    mask_padding(&mut logits);
    let prefill_s = prefill_start.elapsed().as_secs_f64();
    let decode_start = Instant::now();
    let mut generated = 0;
    let finish = loop {
        let token = sampler.sample(&mut logits, &history)?;
        history.push(token);
        generated += 1;
        write!(out, "{}", detok.push(token)?)?;
        out.flush()?;
        if let Some(finish) = stop.check(token, generated, history.len()) {
            break finish.reason;
        }
        logits = runner.feed_last_logits(&[token])?;
        mask_padding(&mut logits);
    };
    writeln!(out, "{}", detok.finish())?;
    let decode_s = decode_start.elapsed().as_secs_f64();
    eprintln!(
        "\n[{} on {}: load {:.2} s; prompt {} tokens in {:.3} s ({:.1} tok/s); generated {} tokens in {:.3} s ({:.1} tok/s); finish: {}]",
        model.config().model_type,
        backend.name(),
        load_s,
        prompt_ids.len(),
        prefill_s,
        prompt_ids.len() as f64 / prefill_s,
        generated,
        decode_s,
        // The first token comes from the prefill; the rest each cost a step.
        (generated.saturating_sub(1)) as f64 / decode_s.max(1e-9),
        finish.as_str()
    );
    Ok(())
}

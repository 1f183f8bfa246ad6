//! The `kestrel` command line: one binary for generating, serving and
//! benchmarking Qwen3-family models.

mod commands;
mod model_dir;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kestrel",
    version,
    about = "A fast inference server for Qwen3-family models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (or a chat message with --chat), streamed to the terminal.
    Generate(commands::generate::Args),
    /// Held-out perplexity and MTP accuracy over token windows.
    Eval(commands::eval::Args),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(commands::serve::Args),
    /// Benchmark prefill and decode in-process against the memory-bandwidth floor.
    BenchModel(commands::bench_model::Args),
    /// Make a draft-vocabulary file for MTP speculation (`--draft-vocab`):
    /// the N most frequent token ids of a text corpus.
    DraftVocab(commands::draft_vocab::Args),
    /// Measure loading a model folder: time, bytes read, GB/s, peak resident memory.
    BenchLoad(commands::bench_load::Args),
    /// Benchmark an OpenAI-compatible server; lock, reproduce and verify results.
    Bench(commands::bench::Args),
    /// Re-run a release lock: verify the environment and model files against
    /// it, run its rounds, print the outcome (same as `bench reproduce`).
    Reproduce(kestrel_bench::ReproduceArgs),
    /// Download a model (REPO[@REVISION]); only missing or corrupt files are fetched.
    Pull(commands::bench::PullArgs),
}

fn main() {
    let cli = Cli::parse();
    // A misspelt KESTREL_* variable would otherwise change nothing silently.
    kestrel_cuda::switches::warn_unknown_variables();
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Eval(args) => commands::eval::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::BenchModel(args) => commands::bench_model::run(args),
        Command::DraftVocab(args) => commands::draft_vocab::run(args),
        Command::BenchLoad(args) => commands::bench_load::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Reproduce(args) => commands::bench::reproduce(args),
        Command::Pull(args) => commands::bench::pull(args),
    };
    if let Err(e) = result {
        // One line, outermost context first: the file and tensor at fault.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

//! The `kestrel` command line: one binary for generating, serving and
//! benchmarking Qwen3-family models.

mod commands;
mod model_dir;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "kestrel", version, about = "A fast inference server for Qwen3-family models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (or a chat message with --chat), streamed to the terminal.
    Generate(commands::generate::Args),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
    };
    if let Err(e) = result {
        // One line, outermost context first: the file and tensor at fault.
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

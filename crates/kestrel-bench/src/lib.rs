//! kestrel-bench: an engine-independent benchmark and reproduction harness for
//! OpenAI-compatible servers (kestrel, vLLM, SGLang, llama-server).
//!
//! Definitions of every figure are in `bench/README.md` and in the module
//! docs of [`metrics`] and [`outcome`].

pub mod api;
pub mod client;
pub mod download;
pub mod env;
pub mod launcher;
pub mod lock;
pub mod manifest;
pub mod metrics;
pub mod outcome;
pub mod plot;
pub mod profile;
pub mod report;
pub mod runner;
pub mod server_metrics;
pub mod spread;
pub mod stats;
pub mod workload;

pub use api::{
    BenchArgs, BenchCommand, DownloadArgs, EnvArgs, LockArgs, ManifestCreateArgs, ReproduceArgs,
    VerifyArgs, run_bench, run_command, run_download, run_env, run_reproduce, run_verify,
};
pub use outcome::Outcome;
pub use report::Report;

//! kestrel's OpenAI-compatible HTTP server (axum).
//!
//! Routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`,
//! `/v1/messages` and `/v1/messages/count_tokens` (Anthropic), `/tokenize`,
//! `/detokenize`, `/metrics` (Prometheus, vLLM names) and `/health`. The listener comes up first and answers 503 on `/health`
//! while the model loads in the background.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let config = kestrel_server::ServerConfig::new("models/kestrel-tiny-qwen35".into());
//! let server = kestrel_server::start(config, kestrel_cpu::CpuBackend::new()).await?;
//! println!("listening on {}", server.addr());
//! server.wait_ready(std::time::Duration::from_secs(60)).await?;
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod api_keys;
mod app;
mod auth;
mod body;
mod choices;
pub mod config;
mod context_len;
mod echo;
mod error;
mod generation;
mod header_limit;
mod listener;
mod loader;
mod logprobs;
mod metrics;
mod prompt_logprobs;
mod request_id;
mod routes;
pub mod shutdown;
pub mod sse;
mod sse_choices;
mod state;
mod structured;
mod timing;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kestrel_core::FlashNextOps;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::ServerConfig;
pub use generation::Step;
/// The Anthropic Messages and Responses stream assemblers, reachable for
/// tests that drive them with scripted text (no model); not a stable API.
#[doc(hidden)]
pub use routes::{messages::MessagesSse, responses::ResponseOutput};
use state::{AppState, Phase};

/// How long in-flight connections get to finish after shutdown begins.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A started server: listening, with the model loading or loaded.
pub struct RunningServer {
    addr: SocketAddr,
    state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
}

/// Binds the listener, starts loading the model on a blocking thread and
/// serves requests (503 until the model is ready).
pub async fn start<B: FlashNextOps>(config: ServerConfig, backend: B) -> Result<RunningServer> {
    context_len::check_before_start(&config)?;
    let listener = TcpListener::bind(config.addr)
        .await
        .with_context(|| format!("cannot listen on {}", config.addr))?;
    let addr = listener.local_addr()?;
    if !addr.ip().is_loopback() && config.api_keys.is_empty() {
        tracing::warn!(
            "listening on {addr} without --api-key: anyone who can reach this address can use the server"
        );
    }
    let state = Arc::new(AppState::new(config));
    let loading = state.clone();
    tokio::task::spawn_blocking(move || loader::load_into(&loading, backend));

    let (stop, stopped) = oneshot::channel::<()>();
    let app = app::router(state.clone());
    let task = tokio::spawn(listener::serve(listener, app, async {
        let _ = stopped.await;
    }));
    tracing::info!("listening on http://{addr}");
    Ok(RunningServer {
        addr,
        state,
        stop: Some(stop),
        task,
    })
}

impl RunningServer {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until the model is loaded; an error if loading failed.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let failed = self.state.with_phase(|p| match p {
                Phase::Ready(_) => Some(None),
                Phase::Failed(e) => Some(Some(e.clone())),
                Phase::Loading { .. } => None,
            });
            match failed {
                Some(None) => return Ok(()),
                Some(Some(e)) => bail!("the model failed to load: {e}"),
                None if tokio::time::Instant::now() >= deadline => {
                    bail!("the model did not load within {timeout:?}")
                }
                None => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Stops accepting connections, stops the engine (its open streams end
    /// with an error event) and waits a few seconds for connections to close.
    pub async fn shutdown(mut self) {
        self.state.begin_shutdown();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(model) = self.state.loaded() {
            model.engine.shutdown();
        }
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut self.task).await {
            Ok(Ok(Ok(()))) => tracing::info!("server stopped"),
            Ok(Ok(Err(e))) => tracing::warn!("server stopped with an error: {e}"),
            Ok(Err(e)) => tracing::warn!("server task failed: {e}"),
            Err(_) => {
                tracing::warn!("connections still open after {SHUTDOWN_GRACE:?}; closing them");
                self.task.abort();
            }
        }
    }
}

/// Serves until ctrl-c or SIGTERM, then shuts down cleanly.
pub async fn run<B: FlashNextOps>(config: ServerConfig, backend: B) -> Result<()> {
    let server = start(config, backend).await?;
    shutdown::signal().await;
    server.shutdown().await;
    Ok(())
}

/// Logs to stderr; `RUST_LOG` overrides the default level (info).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

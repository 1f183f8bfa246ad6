//! Shared server state: the load phase, the loaded model and engine, the
//! served names, keys and metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kestrel_api::{ApiError, SamplingDefaults};
use kestrel_engine::EngineHandle;
use kestrel_structured::{GrammarCompiler, ToolCallFormat};
use kestrel_text::{ChatTemplate, Tokenizer};

use crate::api_keys::ApiKeys;
use crate::config::ServerConfig;
use crate::error::{ServerError, ServerResult};
use crate::metrics::ServerMetrics;

/// Everything a request needs once the model is loaded.
pub struct LoadedModel {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    /// How the model writes tool calls (from its chat template); forced
    /// calls are constrained to it.
    pub tool_call_format: ToolCallFormat,
    /// The template renders a `system` message after the first turn
    /// (`/v1/messages` folds such messages into the user turn otherwise).
    pub late_system_messages: bool,
    pub max_model_len: usize,
    /// Sampling values for fields a request leaves out (generation_config.json).
    pub sampling_defaults: SamplingDefaults,
    /// Compiles structured-output grammars against the vocabulary.
    pub grammars: GrammarCompiler,
}

/// Where startup is.
pub enum Phase {
    Loading {
        stage: &'static str,
        /// Fraction of the stages done, 0..1.
        progress: f32,
        started: Instant,
    },
    Ready(Arc<LoadedModel>),
    Failed(String),
}

pub struct AppState {
    pub config: ServerConfig,
    pub model_names: Vec<String>,
    pub api_keys: ApiKeys,
    pub metrics: ServerMetrics,
    /// Unix time the server started (`created` of the model cards).
    pub created: u64,
    phase: RwLock<Phase>,
    shutting_down: AtomicBool,
}

impl AppState {
    pub fn new(config: ServerConfig) -> Self {
        let created = unix_now();
        AppState {
            model_names: config.model_names(),
            api_keys: ApiKeys::new(&config.api_keys),
            metrics: ServerMetrics::with_speculative(
                config.speculative.as_ref().map(|s| s.method.label()),
            ),
            config,
            created,
            phase: RwLock::new(Phase::Loading {
                stage: "starting",
                progress: 0.0,
                started: Instant::now(),
            }),
            shutting_down: AtomicBool::new(false),
        }
    }

    pub fn set_phase(&self, phase: Phase) {
        *self.phase.write().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    pub fn with_phase<T>(&self, f: impl FnOnce(&Phase) -> T) -> T {
        f(&self.phase.read().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn loaded(&self) -> Option<Arc<LoadedModel>> {
        self.with_phase(|p| match p {
            Phase::Ready(m) => Some(m.clone()),
            _ => None,
        })
    }

    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// The loaded model, or the 503 to answer with while loading, after a
    /// failed load, after the engine died or during shutdown.
    pub fn ready(&self) -> ServerResult<Arc<LoadedModel>> {
        if self.is_shutting_down() {
            return Err(ApiError::unavailable("The server is shutting down").into());
        }
        let model = self.with_phase(|p| match p {
            Phase::Ready(m) => Ok(m.clone()),
            Phase::Loading { .. } => Err(ApiError::unavailable("Loading model")),
            Phase::Failed(e) => Err(ApiError::unavailable(format!(
                "The model failed to load: {e}"
            ))),
        })?;
        if !model.engine.is_alive() {
            return Err(ApiError::unavailable("The engine has stopped").into());
        }
        Ok(model)
    }

    /// The name reported in responses for a request's `model`, or 404 when
    /// it names no served alias. An omitted `model` means the first alias.
    pub fn resolve_model_name(&self, requested: Option<&str>) -> ServerResult<String> {
        match requested {
            None => Ok(self.model_names[0].clone()),
            Some(name) if self.model_names.iter().any(|n| n == name) => Ok(name.to_string()),
            Some(name) => Err(ServerError::from(ApiError::model_not_found(name))),
        }
    }
}

/// Seconds since the Unix epoch (`created` fields).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

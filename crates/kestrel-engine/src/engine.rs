//! The engine thread: owns the model, the device caches and the scheduler;
//! takes commands, plans and runs steps, publishes statistics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, TryRecvError};

use anyhow::{Context, Result, bail};
use kestrel_core::Backend;
use kestrel_models::{Target, TargetCache};

use crate::client::{Command, EngineHandle, Shared};
use crate::handle::{EngineConfig, EngineEvent};
use crate::scheduler::Scheduler;
use crate::sequence::Sequence;
use crate::spec::{self, DraftLength, DraftRows, Proposer, SpeculativeConfig, SpeculativeMethod};
use crate::step::{self, LogitsObserver};

/// Starts engines; see [`Engine::spawn`].
pub struct Engine;

/// What an engine runs with besides its limits.
pub struct EngineOptions {
    /// Speculative decoding; `None` decodes one token a step.
    pub speculative: Option<SpeculativeConfig>,
    /// See [`LogitsObserver`] (tests and debugging).
    pub observer: Option<LogitsObserver>,
    /// Sample from the backend's best candidates where they decide the
    /// token; `false` copies every sampled row (tests compare the two).
    pub use_candidates: bool,
    /// The decode and verify rows a speculative step may bring.
    pub draft_rows: DraftRows,
    /// Adapt each request's draft length to its acceptance
    /// ([`spec::DraftLength`]); off: every request drafts the configured
    /// length, as the row budget allows.
    pub adaptive_drafts: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            speculative: None,
            observer: None,
            use_candidates: true,
            draft_rows: DraftRows::default(),
            adaptive_drafts: false,
        }
    }
}

impl Engine {
    /// Starts the engine loop on its own thread; returns once the caches are
    /// allocated (or with the reason they could not be).
    pub fn spawn<B: Backend>(
        backend: B,
        model: impl Into<Target<B>>,
        config: EngineConfig,
    ) -> Result<EngineHandle> {
        Self::spawn_with_options(backend, model, config, EngineOptions::default())
    }

    /// [`Engine::spawn`] that copies every sampled row to the host instead of
    /// asking the backend for candidates (tests compare the two paths).
    #[doc(hidden)]
    pub fn spawn_with_full_row_sampling<B: Backend>(
        backend: B,
        model: impl Into<Target<B>>,
        config: EngineConfig,
    ) -> Result<EngineHandle> {
        let options = EngineOptions {
            use_candidates: false,
            ..EngineOptions::default()
        };
        Self::spawn_with_options(backend, model, config, options)
    }

    /// [`Engine::spawn`] with a [`LogitsObserver`] (for tests and debugging).
    #[doc(hidden)]
    pub fn spawn_with_logits_observer<B: Backend>(
        backend: B,
        model: impl Into<Target<B>>,
        config: EngineConfig,
        observer: LogitsObserver,
    ) -> Result<EngineHandle> {
        let options = EngineOptions {
            observer: Some(observer),
            ..EngineOptions::default()
        };
        Self::spawn_with_options(backend, model, config, options)
    }

    /// [`Engine::spawn`] with speculative decoding, an observer, or
    /// full-row sampling.
    pub fn spawn_with_options<B: Backend>(
        backend: B,
        model: impl Into<Target<B>>,
        config: EngineConfig,
        options: EngineOptions,
    ) -> Result<EngineHandle> {
        let EngineOptions {
            speculative,
            observer,
            use_candidates,
            draft_rows,
            adaptive_drafts,
        } = options;
        let model: Target<B> = model.into();
        let model_config = model.config();
        let hybrid = model_config.arch.is_hybrid();
        check_config(&config, hybrid)?;
        if let Some(spec) = &speculative {
            if hybrid && !backend.supports_state_checkpoints() {
                bail!(
                    "speculative decoding on a hybrid model needs state checkpoints, which the \
                     {} backend does not support yet",
                    backend.name()
                );
            }
            let vocab = config.sampled_vocab.unwrap_or(model_config.vocab_size);
            spec::check(spec, &model, vocab).map_err(anyhow::Error::msg)?;
        }
        let vocab_size = model_config.vocab_size;
        let shared = Arc::new(Shared::new(
            config.clone(),
            model_config.vocab_size,
            model_config.eos_token_ids.clone(),
            Default::default(),
        ));
        let mut scheduler = Scheduler::new(
            config.clone(),
            hybrid,
            backend.state_snapshot_alignment(),
            Arc::clone(&shared),
        )
        .map_err(anyhow::Error::msg)
        .context("invalid engine configuration")?;
        if let Some(SpeculativeConfig {
            method: SpeculativeMethod::External(source),
            ..
        }) = &speculative
        {
            scheduler.report_retirements_to(Arc::clone(source));
        }
        shared.publish_stats(scheduler.stats());

        let (commands, receiver) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<()>>(1);
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("kestrel-engine".into())
            .spawn(move || {
                // The caches are made on the engine thread: device contexts
                // may be bound to the thread that uses them.
                let cache = match model.new_cache(
                    &backend,
                    config.num_blocks,
                    config.block_size,
                    config.num_state_slots,
                ) {
                    Ok(cache) => cache,
                    Err(e) => {
                        thread_shared.alive.store(false, Ordering::Release);
                        let _ = ready_tx.send(Err(anyhow::anyhow!(
                            "cannot allocate the engine's caches: {e}"
                        )));
                        return;
                    }
                };
                let rows = draft_rows.resolve(backend.decode_rows_hint());
                let proposer = match speculative
                    .as_ref()
                    .map(|spec| Proposer::new(spec, &backend, &model, &config, rows))
                    .transpose()
                {
                    Ok(proposer) => proposer,
                    Err(e) => {
                        thread_shared.alive.store(false, Ordering::Release);
                        let _ = ready_tx.send(Err(e.context("cannot start speculative decoding")));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                // However the loop ends (even by a panic outside a step),
                // the handle must stop reporting a live engine.
                let _guard = MarkDeadOnExit(Arc::clone(&thread_shared));
                let mut engine = EngineLoop {
                    backend,
                    model,
                    cache,
                    scheduler,
                    shared: thread_shared,
                    commands: receiver,
                    shutting_down: false,
                    observer,
                    use_candidates,
                    proposer,
                    adaptive_drafts,
                    vocab_size,
                };
                engine.run();
            })
            .context("cannot start the engine thread")?;
        ready_rx
            .recv()
            .context("the engine thread exited during start-up")??;
        Ok(EngineHandle { shared, commands })
    }
}

struct MarkDeadOnExit(Arc<Shared>);

impl Drop for MarkDeadOnExit {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::Release);
    }
}

fn check_config(config: &EngineConfig, hybrid: bool) -> Result<()> {
    if config.max_num_seqs == 0 || config.num_blocks == 0 || config.max_model_len == 0 {
        bail!("max_num_seqs, num_blocks and max_model_len must be positive");
    }
    if config.block_size == 0 {
        bail!("block_size must be positive");
    }
    let capacity = config.num_blocks.saturating_mul(config.block_size);
    if capacity < config.max_model_len {
        bail!(
            "the KV cache holds {capacity} tokens ({} pages of {}), less than max_model_len \
             ({}): one request at full length could never run",
            config.num_blocks,
            config.block_size,
            config.max_model_len
        );
    }
    if hybrid && config.num_state_slots == 0 {
        bail!("a hybrid model needs at least one recurrent-state slot");
    }
    if config.force_preempt_at.is_some_and(|n| n < 2) {
        bail!("force_preempt_at must be at least 2 (with 1 no sequence could ever run)");
    }
    Ok(())
}

struct EngineLoop<B: Backend> {
    backend: B,
    model: Target<B>,
    cache: TargetCache<B>,
    scheduler: Scheduler,
    shared: Arc<Shared>,
    commands: Receiver<Command>,
    shutting_down: bool,
    observer: Option<LogitsObserver>,
    /// Sample from the backend's best candidates where they decide the token
    /// (see `choose`); off only in tests.
    use_candidates: bool,
    proposer: Option<Proposer<B>>,
    /// See [`EngineOptions::adaptive_drafts`].
    adaptive_drafts: bool,
    /// Drafts at or beyond this id are dropped (they could not be embedded).
    vocab_size: usize,
}

impl<B: Backend> EngineLoop<B> {
    fn run(&mut self) {
        loop {
            if !self.take_commands() {
                break;
            }
            let result = catch_unwind(AssertUnwindSafe(|| self.step()));
            let failure = match result {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("engine error: {e:#}")),
                Err(panic) => Some(format!("engine panic: {}", panic_message(&*panic))),
            };
            if let Some(message) = failure {
                // The device caches and the pools may be inconsistent now:
                // fail every request and stop, rather than serve wrong tokens.
                self.scheduler.fail_all(&message);
                self.shared.alive.store(false, Ordering::Release);
                self.publish();
                return;
            }
            self.publish();
            if self.shutting_down {
                break;
            }
        }
        if let Err(e) = self.scheduler.abort_all() {
            self.scheduler
                .fail_all(&format!("engine error at shutdown: {e}"));
        }
        self.shared.alive.store(false, Ordering::Release);
        self.publish();
    }

    /// Apply pending commands, blocking while there is nothing to do.
    /// `false` when the loop should end (every handle and stream dropped).
    fn take_commands(&mut self) -> bool {
        if self.scheduler.is_idle() && !self.shutting_down {
            match self.commands.recv() {
                Ok(command) => self.apply(command),
                Err(_) => return false,
            }
        }
        loop {
            match self.commands.try_recv() {
                Ok(command) => self.apply(command),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return !self.scheduler.is_idle(),
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Submit {
                id,
                request,
                events,
            } => {
                let built = Sequence::new(
                    id,
                    *request,
                    events.clone(),
                    self.scheduler.config(),
                    &self.shared.eos_token_ids,
                );
                match built {
                    Ok(mut seq) => {
                        if let (true, Some(proposer)) = (self.adaptive_drafts, &self.proposer) {
                            seq.draft_length = DraftLength::adaptive(proposer.max_drafts());
                        }
                        self.scheduler.enqueue(seq)
                    }
                    Err(message) => {
                        self.shared.dequeued();
                        self.scheduler.record_rejected();
                        let _ = events.send(EngineEvent::Error(message));
                    }
                }
            }
            Command::Abort(id) => {
                // An abort that fails on bookkeeping is caught by the next
                // step's checks; nothing else to do for an unknown id.
                if let Err(e) = self.scheduler.abort(id) {
                    self.scheduler.fail_all(&format!("engine error: {e}"));
                    self.shared.alive.store(false, Ordering::Release);
                    self.shutting_down = true;
                }
            }
            Command::StopString(id) => {
                if let Err(e) = self.scheduler.stop_on_client_request(id) {
                    self.scheduler.fail_all(&format!("engine error: {e}"));
                    self.shared.alive.store(false, Ordering::Release);
                    self.shutting_down = true;
                }
            }
            Command::Shutdown => {
                self.shutting_down = true;
                self.scheduler.stop_admitting();
            }
        }
    }

    fn step(&mut self) -> Result<()> {
        if self.shutting_down {
            return Ok(());
        }
        self.scheduler.abort_disconnected()?;
        if self.scheduler.is_idle() {
            return Ok(());
        }
        self.propose_drafts();
        let plan = self.scheduler.schedule()?;
        if plan.chunks.is_empty() {
            self.scheduler.fail_unrunnable_head();
            return Ok(());
        }
        self.scheduler.record_step();
        step::execute(
            &self.backend,
            &self.model,
            &mut self.cache,
            &mut self.scheduler,
            plan,
            self.observer.as_mut(),
            self.use_candidates,
            self.proposer.as_mut().and_then(Proposer::hidden_reader),
        )
    }

    /// Ask the proposer for the drafts of every decoding sequence; the
    /// scheduler fits what it can into the step.
    fn propose_drafts(&mut self) {
        let Some(proposer) = self.proposer.as_mut() else {
            return;
        };
        let vocab = self.vocab_size;
        let running: std::collections::HashSet<_> =
            self.scheduler.running_mut().map(|seq| seq.id).collect();
        proposer.retain(|id| running.contains(&id));
        let decoding = self
            .scheduler
            .running_mut()
            .filter(|seq| seq.is_decoding())
            .count();
        let allowed = proposer.drafts_allowed(decoding);
        for seq in self.scheduler.running_mut() {
            seq.drafts.clear();
            if !seq.is_decoding() {
                continue;
            }
            // k drafts emit up to k + 1 tokens.
            let limit = seq
                .tokens_left()
                .saturating_sub(1)
                .min(allowed)
                .min(seq.draft_length.limit());
            let mut drafts = proposer.propose(seq, limit);
            if let Some(bad) = drafts.iter().position(|&t| t as usize >= vocab) {
                drafts.truncate(bad);
            }
            // A draft the grammar rejects could never be accepted.
            if let Some(constraint) = seq.constraint.as_mut() {
                drafts.truncate(constraint.valid_prefix(&drafts));
            }
            seq.drafts = drafts;
        }
    }

    fn publish(&self) {
        self.shared.publish_stats(self.scheduler.stats());
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".into()
    }
}

//! The server's side of the engine: a cloneable handle that submits requests
//! and a per-request stream of events whose drop cancels the request.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use crate::handle::{EngineConfig, EngineEvent, EngineStats, GenerateRequest, SubmitError};
use crate::sequence::SeqId;

/// What the handle and the streams tell the engine thread.
pub(crate) enum Command {
    Submit {
        id: SeqId,
        /// Boxed: the other commands are a word or two.
        request: Box<GenerateRequest>,
        events: UnboundedSender<EngineEvent>,
    },
    /// The stream was dropped before the request finished.
    Abort(SeqId),
    /// The server ended the request on a stop string: free it, count a stop.
    StopString(SeqId),
    /// Stop admitting, abort everything, exit the loop.
    Shutdown,
}

/// State shared by the handle clones, the streams and the engine thread.
/// The command sender lives outside it, in the handles and streams only, so
/// the loop sees a disconnect (and exits) once every handle and stream is gone.
pub(crate) struct Shared {
    pub config: EngineConfig,
    pub vocab_size: usize,
    pub eos_token_ids: Vec<u32>,
    pub stats: Mutex<EngineStats>,
    /// False once the loop has exited (shutdown, panic, or every handle gone).
    pub alive: AtomicBool,
    /// Set by `shutdown`: submissions are refused from then on.
    pub stopping: AtomicBool,
    /// Requests submitted and not yet admitted to the running set; bounded
    /// by `max_queued_requests`.
    pub queued: AtomicUsize,
    next_id: AtomicU64,
}

impl Shared {
    pub fn new(
        config: EngineConfig,
        vocab_size: usize,
        eos_token_ids: Vec<u32>,
        stats: EngineStats,
    ) -> Self {
        Self {
            config,
            vocab_size,
            eos_token_ids,
            stats: Mutex::new(stats),
            alive: AtomicBool::new(true),
            stopping: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
        }
    }

    pub fn publish_stats(&self, stats: EngineStats) {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    /// One fewer request waits for admission.
    pub fn dequeued(&self) {
        // Saturating: never wraps even if bookkeeping were off by one.
        let _ = self
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| q.checked_sub(1));
    }
}

/// A cheap, cloneable handle to a running engine.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) shared: Arc<Shared>,
    pub(crate) commands: Sender<Command>,
}

impl EngineHandle {
    /// Queue a request. Answers at once: `Invalid` for a request the engine
    /// can never run, `QueueFull` when `max_queued_requests` already wait,
    /// `Stopped` after shutdown or an engine failure.
    pub fn submit(&self, req: GenerateRequest) -> Result<RequestStream, SubmitError> {
        let shared = &self.shared;
        if shared.stopping.load(Ordering::Acquire) || !shared.alive.load(Ordering::Acquire) {
            return Err(SubmitError::Stopped);
        }
        crate::sequence::validate_request(&req, &shared.config, shared.vocab_size)?;
        let limit = shared.config.max_queued_requests;
        shared
            .queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                (q < limit).then_some(q + 1)
            })
            .map_err(SubmitError::QueueFull)?;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = unbounded_channel();
        let sent = self.commands.send(Command::Submit {
            id,
            request: Box::new(req),
            events,
        });
        if sent.is_err() {
            shared.dequeued();
            return Err(SubmitError::Stopped);
        }
        Ok(RequestStream {
            id,
            events: receiver,
            commands: self.commands.clone(),
            done: false,
        })
    }

    /// The latest snapshot of the engine's counters (updated every step).
    pub fn stats(&self) -> EngineStats {
        self.shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    pub fn vocab_size(&self) -> usize {
        self.shared.vocab_size
    }

    pub fn eos_token_ids(&self) -> &[u32] {
        &self.shared.eos_token_ids
    }

    /// False once the engine loop has exited (after `shutdown`, or after a
    /// failure inside a step); `/health` should answer 503 then.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Stop admitting; running and waiting requests finish with
    /// `FinishReason::Abort`; the engine thread exits. Returns at once.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        let _ = self.commands.send(Command::Shutdown);
    }
}

/// The events of one request, in order: `Tokens`*, then one `Finished` or
/// `Error`, then `None`. Dropping it before the end aborts the request.
pub struct RequestStream {
    id: SeqId,
    events: UnboundedReceiver<EngineEvent>,
    commands: Sender<Command>,
    /// A terminal event was received (or the engine is gone): no abort on drop.
    done: bool,
}

impl RequestStream {
    /// The next event; `None` after the terminal event (or if the engine died
    /// without sending one, which `recv` then reports as an `Error`).
    pub async fn recv(&mut self) -> Option<EngineEvent> {
        let event = self.events.recv().await;
        self.observe(event)
    }

    /// Blocking form of [`RequestStream::recv`] for plain threads. Panics if
    /// called from inside an async runtime (tokio's rule).
    pub fn blocking_recv(&mut self) -> Option<EngineEvent> {
        let event = self.events.blocking_recv();
        self.observe(event)
    }

    /// End the request because the server matched one of its stop strings:
    /// like dropping the stream, but counted as a `stop` finish, not an abort.
    pub fn finish_on_stop_string(mut self) {
        if !self.done {
            self.done = true;
            let _ = self.commands.send(Command::StopString(self.id));
        }
    }

    fn observe(&mut self, event: Option<EngineEvent>) -> Option<EngineEvent> {
        match event {
            Some(e @ (EngineEvent::Finished { .. } | EngineEvent::Error(_))) => {
                self.done = true;
                Some(e)
            }
            Some(e) => Some(e),
            None if !self.done => {
                // The channel closed without a terminal event: the engine
                // thread is gone. Report it once, so no caller hangs or
                // mistakes it for success.
                self.done = true;
                Some(EngineEvent::Error("the engine stopped unexpectedly".into()))
            }
            None => None,
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.done {
            // The engine may already be gone; then there is nothing to free.
            let _ = self.commands.send(Command::Abort(self.id));
        }
    }
}

//! Where a request's time to first token goes inside the engine, as
//! debug-level `tracing` events (target `kestrel_engine::timing`): queued
//! (arrival to admission), the forward passes its prompt took and their
//! time, and the first token. The server logs the other end (tokenising,
//! the first SSE event) under the same request id, so one run with
//! `RUST_LOG=kestrel_engine::timing=debug,kestrel_server::timing=debug`
//! breaks a TTFT down without a profiler.

use std::time::{Duration, Instant};

/// One request's prefill timeline, kept until its first token.
#[derive(Clone, Debug)]
pub(crate) struct FirstTokenTiming {
    arrived: Instant,
    admitted: Option<Instant>,
    passes: u32,
    forward: Duration,
    reported: bool,
}

impl FirstTokenTiming {
    pub fn new() -> Self {
        Self {
            arrived: Instant::now(),
            admitted: None,
            passes: 0,
            forward: Duration::ZERO,
            reported: false,
        }
    }

    /// The request left the queue for the running set (the first time only).
    pub fn admitted(&mut self) {
        self.admitted.get_or_insert_with(Instant::now);
    }

    /// The request took part in a forward pass of `forward` (computing and
    /// sampling) before its first token.
    pub fn add_pass(&mut self, forward: Duration) {
        if !self.reported {
            self.passes += 1;
            self.forward += forward;
        }
    }

    /// The first token was sampled: report the timeline once.
    pub fn first_token(&mut self, request_id: &str, prompt_len: usize, cached: usize) {
        if self.reported {
            return;
        }
        self.reported = true;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let queued = self.admitted.map_or(Duration::ZERO, |a| a - self.arrived);
        tracing::debug!(
            target: "kestrel_engine::timing",
            request_id,
            prompt_tokens = prompt_len,
            cached_tokens = cached,
            queued_ms = ms(queued),
            prefill_passes = self.passes,
            prefill_forward_ms = ms(self.forward),
            since_arrival_ms = ms(self.arrived.elapsed()),
            "first token"
        );
    }
}

/// One step's forward pass: its chunks, tokens and time.
pub(crate) fn report_step(chunks: usize, tokens: usize, forward: Duration) {
    tracing::debug!(
        target: "kestrel_engine::timing",
        chunks,
        tokens,
        forward_ms = forward.as_secs_f64() * 1e3,
        "step"
    );
}

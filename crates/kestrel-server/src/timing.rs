//! The server's half of a request's time to first token, as debug-level
//! `tracing` events (target `kestrel_server::timing`), all measured from the
//! moment the handler got the request: the prompt rendered and tokenised,
//! the first tokens received from the engine, the first token-bearing SSE
//! event handed to the connection. The engine logs the part in between
//! (queue, forward passes) under target `kestrel_engine::timing` with the
//! same request id.

use std::time::Instant;

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// The prompt is rendered and tokenised, about to be submitted.
pub fn prompt_ready(request_id: &str, received: Instant, prompt_tokens: usize) {
    tracing::debug!(
        target: "kestrel_server::timing",
        request_id,
        prompt_tokens,
        since_received_ms = ms_since(received),
        "prompt tokenised"
    );
}

/// The chat prompt's preparation on the blocking pool: when it started
/// there (since the request was received), then how long rendering the
/// template and tokenising took.
pub fn prompt_prepared(request_id: &str, received: Instant, started: Instant, rendered: Instant) {
    tracing::debug!(
        target: "kestrel_server::timing",
        request_id,
        since_received_ms = (started - received).as_secs_f64() * 1e3,
        render_ms = (rendered - started).as_secs_f64() * 1e3,
        tokenise_ms = ms_since(rendered),
        "prompt prepared"
    );
}

/// One request's later milestones, each reported once.
#[derive(Debug)]
pub struct FirstTokenClock {
    received: Instant,
    tokens_seen: bool,
    event_sent: bool,
}

impl FirstTokenClock {
    pub fn new(received: Instant) -> Self {
        Self {
            received,
            tokens_seen: false,
            event_sent: false,
        }
    }

    /// Tokens arrived from the engine.
    pub fn tokens(&mut self, request_id: &str) {
        if !std::mem::replace(&mut self.tokens_seen, true) {
            tracing::debug!(
                target: "kestrel_server::timing",
                request_id,
                since_received_ms = ms_since(self.received),
                "first tokens from the engine"
            );
        }
    }

    /// A token-bearing SSE event is about to be written.
    pub fn event(&mut self, request_id: &str) {
        if !std::mem::replace(&mut self.event_sent, true) {
            tracing::debug!(
                target: "kestrel_server::timing",
                request_id,
                since_received_ms = ms_since(self.received),
                "first token event"
            );
        }
    }
}

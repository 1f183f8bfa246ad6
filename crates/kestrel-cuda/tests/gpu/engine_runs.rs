//! What the engine-level GPU tests share: the sampled logits rows of every
//! request, and a request's tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kestrel_engine::{EngineEvent, LogitsObserver, RequestStream};

/// Every request's sampled logits rows, in order, by request id.
pub(crate) type Rows = Arc<Mutex<HashMap<String, Vec<Vec<f32>>>>>;

/// An engine observer that keeps every sampled logits row, and the rows.
pub(crate) fn row_recorder() -> (Rows, LogitsObserver) {
    let rows: Rows = Arc::default();
    let seen = Arc::clone(&rows);
    let observer: LogitsObserver = Box::new(move |id: &str, row: &[f32]| {
        seen.lock()
            .unwrap()
            .entry(id.to_string())
            .or_default()
            .push(row.to_vec());
    });
    (rows, observer)
}

/// The tokens of request `id` until it finishes; a failure panics.
pub(crate) fn tokens_of(stream: &mut RequestStream, id: &str) -> Vec<u32> {
    let mut tokens = Vec::new();
    loop {
        match stream.blocking_recv() {
            Some(EngineEvent::Tokens(t)) => tokens.extend(t),
            Some(EngineEvent::Logprobs(_) | EngineEvent::PromptLogprobs(_)) => {}
            Some(EngineEvent::Finished { .. }) => return tokens,
            Some(EngineEvent::Error(e)) => panic!("request {id} failed: {e}"),
            None => panic!("request {id}: the stream closed without a terminal event"),
        }
    }
}

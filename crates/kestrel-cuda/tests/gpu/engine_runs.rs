//! What the engine-level GPU tests share: the sampled logits rows of every
//! request, a request's tokens, and how two runs' rows compare.

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

/// Rows of `a` that are not bit-identical to those of `b` (rows one has and
/// the other lacks count too).
pub(crate) fn differing_rows(a: &[Vec<f32>], b: &[Vec<f32>]) -> usize {
    let mismatched = a
        .iter()
        .zip(b)
        .filter(|(x, y)| {
            x.iter()
                .map(|v| v.to_bits())
                .ne(y.iter().map(|v| v.to_bits()))
        })
        .count();
    mismatched + a.len().abs_diff(b.len())
}

/// The largest difference between the rows of `a` and `b`.
pub(crate) fn worst_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0f32, f32::max)
}

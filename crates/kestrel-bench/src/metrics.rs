//! Per-request and per-concurrency-step figures, computed from timed records.
//!
//! Definitions (times from `client`):
//! - TTFT = t_first - t_sent, where t_first is the arrival of the first chunk
//!   carrying a token in `content`, `reasoning_content` or `reasoning`.
//! - prefill tok/s = usage.prompt_tokens / TTFT; the uncached rate uses
//!   (prompt_tokens - cached_tokens) / TTFT.
//! - decode tok/s = (completion_tokens - 1) / (t_last - t_first). Token counts
//!   come from `usage`, never from chunk counts (one speculative chunk may carry
//!   several tokens). Undefined with fewer than two tokens or one arrival time.
//! - aggregate tok/s at concurrency c: see [`aggregate_window`].

use serde::{Deserialize, Serialize};

use crate::client::RequestRecord;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RequestMetrics {
    pub ttft_s: f64,
    pub prompt_tokens: u64,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: u64,
    pub prefill_tps: f64,
    pub uncached_prefill_tps: Option<f64>,
    pub decode_tps: Option<f64>,
    pub decode_s: f64,
}

/// Why a request produced no usable figures; any of these fails the run.
pub fn request_failure(rec: &RequestRecord) -> Option<String> {
    if let Some(e) = &rec.error {
        return Some(format!("{}: {e}", rec.label));
    }
    let Some(usage) = rec.usage else {
        return Some(format!(
            "{}: no usage in the stream (server ignored stream_options.include_usage?)",
            rec.label
        ));
    };
    if usage.completion_tokens == 0 || rec.t_first_s.is_none() {
        return Some(format!(
            "{}: empty output (completion_tokens {}, {} content chars, {} reasoning chars)",
            rec.label, usage.completion_tokens, rec.content_chars, rec.reasoning_chars
        ));
    }
    if usage.prompt_tokens == 0 {
        return Some(format!("{}: usage reports zero prompt tokens", rec.label));
    }
    None
}

pub fn request_metrics(rec: &RequestRecord) -> Result<RequestMetrics, String> {
    if let Some(f) = request_failure(rec) {
        return Err(f);
    }
    let usage = rec.usage.expect("checked by request_failure");
    let t_first = rec.t_first_s.expect("checked by request_failure");
    let t_last = rec.t_last_s.unwrap_or(t_first);
    let ttft_s = t_first - rec.t_sent_s;
    if ttft_s <= 0.0 {
        return Err(format!("{}: non-positive TTFT {ttft_s}", rec.label));
    }
    let decode_s = t_last - t_first;
    let decode_tps = (usage.completion_tokens >= 2 && decode_s > 0.0)
        .then(|| (usage.completion_tokens - 1) as f64 / decode_s);
    let uncached = usage
        .cached_tokens
        .map(|c| usage.prompt_tokens.saturating_sub(c) as f64 / ttft_s);
    Ok(RequestMetrics {
        ttft_s,
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.cached_tokens,
        completion_tokens: usage.completion_tokens,
        prefill_tps: usage.prompt_tokens as f64 / ttft_s,
        uncached_prefill_tps: uncached,
        decode_tps,
        decode_s,
    })
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WindowThroughput {
    pub streams: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub tokens: f64,
    pub tokens_per_s: f64,
}

/// Cumulative completion tokens of `rec` after its i-th token chunk (0-based).
///
/// Exact when the server sent usage on that chunk (vLLM
/// `continuous_usage_stats`); otherwise the final completion count is spread
/// evenly over the token-bearing chunks, which is exact when each chunk is one
/// token and an approximation under speculative decoding.
fn cumulative_tokens(rec: &RequestRecord, i: usize) -> f64 {
    let total = rec.usage.map(|u| u.completion_tokens).unwrap_or(0) as f64;
    match rec.events[i].completion_tokens {
        Some(n) => n as f64,
        None => total * (i + 1) as f64 / rec.events.len() as f64,
    }
}

/// Tokens of `rec` that arrived at or before time `t`.
fn tokens_by(rec: &RequestRecord, t: f64) -> f64 {
    match rec.events.iter().rposition(|e| e.t_s <= t) {
        Some(i) => cumulative_tokens(rec, i),
        None => 0.0,
    }
}

/// Aggregate throughput of concurrent streams over the window in which all of
/// them are decoding.
///
/// The window opens at the latest first-token time over the streams and closes
/// at the earliest last-token time. A stream's tokens in the window are those
/// whose chunks arrived in (start, end]: tokens arriving exactly at the start
/// belong to the stream whose prefill opened the window, not to joint decoding.
/// Aggregate = sum of those tokens / (end - start). None when any stream failed
/// or the streams never decoded together (empty window).
pub fn aggregate_window(records: &[RequestRecord]) -> Option<WindowThroughput> {
    if records.is_empty() || records.iter().any(|r| request_failure(r).is_some()) {
        return None;
    }
    let start = records
        .iter()
        .filter_map(|r| r.t_first_s)
        .fold(f64::NEG_INFINITY, f64::max);
    let end = records
        .iter()
        .filter_map(|r| r.t_last_s)
        .fold(f64::INFINITY, f64::min);
    if end <= start {
        return None;
    }
    let tokens: f64 = records
        .iter()
        .map(|r| tokens_by(r, end) - tokens_by(r, start))
        .sum();
    Some(WindowThroughput {
        streams: records.len(),
        start_s: start,
        end_s: end,
        tokens,
        tokens_per_s: tokens / (end - start),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{TokenEvent, Usage};

    fn rec(sent: f64, times: &[f64], prompt: u64, completion: u64) -> RequestRecord {
        RequestRecord {
            label: "r".into(),
            t_sent_s: sent,
            t_first_s: times.first().copied(),
            t_last_s: times.last().copied(),
            events: times
                .iter()
                .map(|&t| TokenEvent {
                    t_s: t,
                    completion_tokens: None,
                })
                .collect(),
            usage: Some(Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
                cached_tokens: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn request_figures() {
        let times: Vec<f64> = (0..11).map(|i| 2.0 + i as f64 * 0.1).collect();
        let m = request_metrics(&rec(0.0, &times, 1000, 11)).unwrap();
        assert!((m.ttft_s - 2.0).abs() < 1e-12);
        assert!((m.prefill_tps - 500.0).abs() < 1e-9);
        assert!((m.decode_tps.unwrap() - 10.0).abs() < 1e-9);
    }

    #[test]
    fn decode_uses_usage_not_chunk_count() {
        // 3 chunks but 7 tokens (speculative): (7 - 1) / 1.0 s.
        let m = request_metrics(&rec(0.0, &[1.0, 1.5, 2.0], 10, 7)).unwrap();
        assert!((m.decode_tps.unwrap() - 6.0).abs() < 1e-12);
    }

    #[test]
    fn one_token_has_no_decode_rate_and_zero_tokens_fail() {
        let m = request_metrics(&rec(0.0, &[1.0], 10, 1)).unwrap();
        assert_eq!(m.decode_tps, None);
        assert!(
            request_metrics(&rec(0.0, &[], 10, 0))
                .unwrap_err()
                .contains("empty output")
        );
        let mut r = rec(0.0, &[1.0], 10, 1);
        r.usage = None;
        assert!(request_failure(&r).unwrap().contains("no usage"));
    }

    #[test]
    fn cached_tokens_give_uncached_rate() {
        let mut r = rec(0.0, &[2.0, 3.0], 1000, 2);
        r.usage.as_mut().unwrap().cached_tokens = Some(600);
        let m = request_metrics(&r).unwrap();
        assert!((m.uncached_prefill_tps.unwrap() - 200.0).abs() < 1e-9);
    }

    #[test]
    fn window_counts_tokens_in_half_open_interval() {
        // Stream A: tokens every 0.1 s from 1.0 to 3.0 (21 tokens).
        // Stream B: tokens every 0.1 s from 1.5 to 2.5 (11 tokens).
        let a: Vec<f64> = (0..21).map(|i| 1.0 + i as f64 * 0.1).collect();
        let b: Vec<f64> = (0..11).map(|i| 1.5 + i as f64 * 0.1).collect();
        let w = aggregate_window(&[rec(0.0, &a, 10, 21), rec(0.0, &b, 10, 11)]).unwrap();
        assert!((w.start_s - 1.5).abs() < 1e-12 && (w.end_s - 2.5).abs() < 1e-12);
        // In (1.5, 2.5]: A has 10 arrivals, B has 10 arrivals.
        assert!((w.tokens - 20.0).abs() < 1e-9, "{}", w.tokens);
        assert!((w.tokens_per_s - 20.0).abs() < 1e-9);
    }

    #[test]
    fn window_empty_when_streams_do_not_overlap() {
        assert!(
            aggregate_window(&[rec(0.0, &[1.0, 2.0], 5, 2), rec(0.0, &[3.0, 4.0], 5, 2)]).is_none()
        );
        assert!(aggregate_window(&[]).is_none());
    }

    #[test]
    fn window_uses_exact_cumulative_usage_when_present() {
        let mut r = rec(0.0, &[1.0, 2.0, 3.0], 5, 9);
        for (e, n) in r.events.iter_mut().zip([1, 5, 9]) {
            e.completion_tokens = Some(n);
        }
        let w = aggregate_window(&[r]).unwrap();
        assert!((w.tokens - 8.0).abs() < 1e-12 && (w.tokens_per_s - 4.0).abs() < 1e-12);
    }
}

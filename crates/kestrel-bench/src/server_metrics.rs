//! Speculative-decoding counters from a server's Prometheus `/metrics` text.
//!
//! vLLM exposes `vllm:spec_decode_num_drafts_total` and
//! `vllm:spec_decode_num_accepted_tokens_total`; any metric whose name ends in
//! `spec_decode_num_drafts_total` / `spec_decode_num_accepted_tokens_total` is
//! accepted (so a kestrel server can use its own prefix). Values of all label
//! sets are summed. Tokens per step over a window = 1 + d(accepted) / d(drafts).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecCounters {
    pub drafts: f64,
    pub accepted_tokens: f64,
}

/// Sum of the samples whose metric name ends with `suffix`.
fn sum_metric(text: &str, suffix: &str) -> Option<f64> {
    let mut found = false;
    let mut total = 0.0;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if !line[..name_end].ends_with(suffix) {
            continue;
        }
        // The value follows the label set (if any); an optional timestamp may follow it.
        let rest = match line[name_end..].strip_prefix('{') {
            Some(r) => match r.rfind('}') {
                Some(i) => &r[i + 1..],
                None => continue,
            },
            None => &line[name_end..],
        };
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            total += v;
            found = true;
        }
    }
    found.then_some(total)
}

pub fn parse_spec_counters(text: &str) -> Option<SpecCounters> {
    Some(SpecCounters {
        drafts: sum_metric(text, "spec_decode_num_drafts_total")?,
        accepted_tokens: sum_metric(text, "spec_decode_num_accepted_tokens_total")?,
    })
}

/// 1 + accepted / drafts between two snapshots; None without drafts.
pub fn tokens_per_step(before: &SpecCounters, after: &SpecCounters) -> Option<f64> {
    let drafts = after.drafts - before.drafts;
    let accepted = after.accepted_tokens - before.accepted_tokens;
    (drafts > 0.0 && accepted >= 0.0).then(|| 1.0 + accepted / drafts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"# HELP vllm:spec_decode_num_drafts_total Number of drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="q"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="q"} 50
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="q"} 240.0 1700000000000
vllm:num_requests_running{engine="0"} 1
"#;

    #[test]
    fn parses_and_sums_label_sets() {
        let c = parse_spec_counters(SAMPLE).unwrap();
        assert_eq!(
            c,
            SpecCounters {
                drafts: 150.0,
                accepted_tokens: 240.0
            }
        );
        assert!(parse_spec_counters("vllm:num_requests_running 1\n").is_none());
    }

    #[test]
    fn tokens_per_step_over_window() {
        let a = SpecCounters {
            drafts: 100.0,
            accepted_tokens: 200.0,
        };
        let b = SpecCounters {
            drafts: 150.0,
            accepted_tokens: 300.0,
        };
        assert_eq!(tokens_per_step(&a, &b), Some(3.0));
        assert_eq!(tokens_per_step(&a, &a), None);
    }
}

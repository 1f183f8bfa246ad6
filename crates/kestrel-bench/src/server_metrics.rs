//! Speculative-decoding counters from a server's Prometheus `/metrics` text.
//!
//! vLLM exposes `vllm:spec_decode_num_drafts_total` and
//! `vllm:spec_decode_num_accepted_tokens_total`; any metric whose name ends in
//! `spec_decode_num_drafts_total` / `spec_decode_num_accepted_tokens_total` is
//! accepted (so a kestrel server can use its own prefix). Values of all label
//! sets are summed. Tokens per step over a window = 1 + d(accepted) / d(drafts).
//! The per-position counter (`..._accepted_tokens_per_pos_total{position="i"}`)
//! gives the achieved acceptance of draft position i: d(accepted at i) /
//! d(drafts), vLLM's per-position acceptance rate. A kestrel server also
//! names its method (`kestrel:speculative_method_info{method="..."}`), so a
//! report says when the drafts came from a benchmark proposer.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecCounters {
    pub drafts: f64,
    pub accepted_tokens: f64,
}

/// Accepted tokens per draft position (0-based, by the `position` label).
fn per_position(text: &str) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::new();
    for line in text.lines().map(str::trim) {
        let Some(brace) = line.find('{') else {
            continue;
        };
        if !line[..brace].ends_with("spec_decode_num_accepted_tokens_per_pos_total") {
            continue;
        }
        let Some(close) = line.rfind('}') else {
            continue;
        };
        let position = label(&line[brace + 1..close], "position").and_then(|p| p.parse().ok());
        let value = line[close + 1..]
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok());
        if let (Some(p), Some(v)) = (position, value) {
            let p: usize = p;
            if out.len() <= p {
                out.resize(p + 1, 0.0);
            }
            out[p] += v;
        }
    }
    out
}

/// The value of label `name` in a label set `a="x",b="y"` (no escapes).
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let len = labels[start..].find('"')?;
    Some(&labels[start..start + len])
}

/// The speculative method a kestrel server names in its metrics.
pub fn speculative_method(text: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("kestrel:speculative_method_info{"))
        .and_then(|l| {
            let labels = &l[l.find('{')? + 1..l.rfind('}')?];
            let start = labels.find("method=\"")? + "method=\"".len();
            let mut value = String::new();
            let mut chars = labels[start..].chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.push(chars.next()?),
                    '"' => return Some(value),
                    c => value.push(c),
                }
            }
            None
        })
}

/// Drafting counters with the per-position ones.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecSnapshot {
    pub counters: SpecCounters,
    pub accepted_per_position: Vec<f64>,
}

pub fn parse_spec_snapshot(text: &str) -> Option<SpecSnapshot> {
    Some(SpecSnapshot {
        counters: parse_spec_counters(text)?,
        accepted_per_position: per_position(text),
    })
}

/// Achieved acceptance of each draft position between two snapshots (the
/// share of speculative steps whose first i + 1 drafts were accepted); None
/// without drafts.
pub fn acceptance_per_position(before: &SpecSnapshot, after: &SpecSnapshot) -> Option<Vec<f64>> {
    let drafts = after.counters.drafts - before.counters.drafts;
    (drafts > 0.0).then(|| {
        after
            .accepted_per_position
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (a - before.accepted_per_position.get(i).copied().unwrap_or(0.0)) / drafts
            })
            .collect()
    })
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
    fn per_position_acceptance_and_the_method_are_read() {
        let page = |drafts: u32, pos: [u32; 2]| {
            format!(
                "vllm:spec_decode_num_drafts_total{{model_name=\"q\"}} {drafts}\n\
                 vllm:spec_decode_num_accepted_tokens_total{{model_name=\"q\"}} {}\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"q\",position=\"1\"}} {}\n\
                 vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name=\"q\",position=\"0\"}} {}\n\
                 kestrel:speculative_method_info{{model_name=\"q\",method=\"replay \\\"x\\\", dummy\"}} 1\n",
                pos[0] + pos[1],
                pos[1],
                pos[0]
            )
        };
        let a = parse_spec_snapshot(&page(10, [8, 4])).unwrap();
        let b = parse_spec_snapshot(&page(110, [88, 54])).unwrap();
        assert_eq!(a.accepted_per_position, [8.0, 4.0]);
        assert_eq!(acceptance_per_position(&a, &b), Some(vec![0.8, 0.5]));
        assert_eq!(acceptance_per_position(&a, &a), None);
        assert_eq!(
            speculative_method(&page(1, [0, 0])).as_deref(),
            Some("replay \"x\", dummy")
        );
        assert_eq!(speculative_method(SAMPLE), None);
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

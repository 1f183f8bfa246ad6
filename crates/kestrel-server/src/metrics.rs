//! Prometheus text exposition with vLLM's metric names, so dashboards built
//! for vLLM work unchanged. Engine gauges and counters come from a stats
//! snapshot taken at scrape time; latency histograms and finish reasons are
//! recorded here, per request.

use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use kestrel_engine::EngineStats;

/// vLLM's bucket edges (seconds).
const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// The `finished_reason` label values, vLLM's set plus `error`.
pub const FINISH_LABELS: [&str; 4] = ["stop", "length", "abort", "error"];

#[derive(Debug)]
struct Histogram {
    edges: &'static [f64],
    inner: Mutex<HistogramCounts>,
}

#[derive(Debug, Default, Clone)]
struct HistogramCounts {
    /// Per bucket (not cumulative); the last entry is +Inf.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(edges: &'static [f64]) -> Self {
        Histogram {
            edges,
            inner: Mutex::new(HistogramCounts {
                buckets: vec![0; edges.len() + 1],
                ..Default::default()
            }),
        }
    }

    fn observe(&self, value: f64) {
        let i = self
            .edges
            .iter()
            .position(|&e| value <= e)
            .unwrap_or(self.edges.len());
        let mut h = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        h.buckets[i] += 1;
        h.sum += value;
        h.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let h = self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, edge) in self.edges.iter().enumerate() {
            cumulative += h.buckets[i];
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels},le=\"{edge:?}\"}} {cumulative}"
            );
        }
        cumulative += h.buckets[self.edges.len()];
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count);
    }
}

/// Per-request measurements kept by the HTTP layer.
#[derive(Debug)]
pub struct ServerMetrics {
    ttft: Histogram,
    inter_token: Histogram,
    e2e: Histogram,
    finished: Mutex<[u64; 4]>,
    /// How the speculative method names itself (`kestrel:speculative_method_info`).
    speculative: Option<String>,
}

impl Default for ServerMetrics {
    fn default() -> Self {
        ServerMetrics {
            ttft: Histogram::new(TTFT_BUCKETS),
            inter_token: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            finished: Mutex::new([0; 4]),
            speculative: None,
        }
    }
}

impl ServerMetrics {
    /// Metrics of a server decoding with the speculative method labelled
    /// `method` (`None`: without speculation).
    pub fn with_speculative(method: Option<String>) -> Self {
        ServerMetrics {
            speculative: method,
            ..Self::default()
        }
    }

    pub fn observe_ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    pub fn observe_inter_token(&self, d: Duration) {
        self.inter_token.observe(d.as_secs_f64());
    }

    /// A request ended; `reason` is one of [`FINISH_LABELS`].
    pub fn observe_finished(&self, reason: &str, e2e: Duration) {
        self.e2e.observe(e2e.as_secs_f64());
        if let Some(i) = FINISH_LABELS.iter().position(|&l| l == reason) {
            self.finished.lock().unwrap_or_else(|p| p.into_inner())[i] += 1;
        }
    }

    /// The whole `/metrics` page. `stats` is `None` while the model loads.
    pub fn render(&self, model_name: &str, stats: Option<&EngineStats>) -> String {
        let labels = format!("model_name=\"{}\"", escape_label(model_name));
        let stats = stats.cloned().unwrap_or_default();
        let mut out = String::new();
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {v}"
            );
        };
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{labels}}} {v}"
            );
        };
        gauge(
            &mut out,
            "vllm:num_requests_running",
            "Requests in model execution batches.",
            stats.num_running as f64,
        );
        gauge(
            &mut out,
            "vllm:num_requests_waiting",
            "Requests waiting to be processed.",
            stats.num_waiting as f64,
        );
        let held = stats
            .num_total_blocks
            .saturating_sub(stats.num_free_blocks + stats.num_cached_blocks);
        let usage = if stats.num_total_blocks == 0 {
            0.0
        } else {
            held as f64 / stats.num_total_blocks as f64
        };
        gauge(
            &mut out,
            "vllm:kv_cache_usage_perc",
            "KV-cache usage; 1 means 100 percent.",
            usage,
        );
        gauge(
            &mut out,
            "kestrel:num_free_blocks",
            "KV pages neither in use nor cached.",
            stats.num_free_blocks as f64,
        );
        gauge(
            &mut out,
            "kestrel:num_cached_blocks",
            "KV pages held only by the prefix cache (evictable).",
            stats.num_cached_blocks as f64,
        );
        gauge(
            &mut out,
            "kestrel:num_total_blocks",
            "KV pages in the pool.",
            stats.num_total_blocks as f64,
        );
        gauge(
            &mut out,
            "kestrel:num_free_state_slots",
            "Free recurrent-state slots.",
            stats.num_free_state_slots as f64,
        );
        counter(
            &mut out,
            "vllm:prompt_tokens_total",
            "Prefill tokens processed.",
            stats.prompt_tokens_total,
        );
        counter(
            &mut out,
            "vllm:generation_tokens_total",
            "Generation tokens processed.",
            stats.generation_tokens_total,
        );
        counter(
            &mut out,
            "vllm:num_preemptions_total",
            "Cumulative number of preemptions.",
            stats.num_preemptions_total,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_queries_total",
            "Prefix-cache queries, in tokens.",
            stats.prefix_cache_queries_total,
        );
        counter(
            &mut out,
            "vllm:prefix_cache_hits_total",
            "Prefix-cache hits, in tokens.",
            stats.prefix_cache_hits_total,
        );
        counter(
            &mut out,
            "kestrel:engine_steps_split_total",
            "Steps run as two passes, decode and verify rows apart from prefill chunks.",
            stats.engine_steps_split_total,
        );
        counter(
            &mut out,
            "vllm:spec_decode_num_drafts_total",
            "Speculative steps of a sequence that carried drafts.",
            stats.spec_decode_num_drafts_total,
        );
        counter(
            &mut out,
            "vllm:spec_decode_num_draft_tokens_total",
            "Draft tokens verified.",
            stats.spec_decode_num_draft_tokens_total,
        );
        counter(
            &mut out,
            "vllm:spec_decode_num_accepted_tokens_total",
            "Draft tokens accepted.",
            stats.spec_decode_num_accepted_tokens_total,
        );
        let name = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
        let _ = writeln!(
            out,
            "# HELP {name} Draft tokens accepted, by draft position.\n# TYPE {name} counter"
        );
        for (position, v) in stats
            .spec_decode_num_accepted_tokens_per_pos_total
            .iter()
            .enumerate()
        {
            let _ = writeln!(out, "{name}{{{labels},position=\"{position}\"}} {v}");
        }
        if let Some(method) = &self.speculative {
            let name = "kestrel:speculative_method_info";
            let _ = writeln!(
                out,
                "# HELP {name} The speculative method (a benchmark proposer says so).\n\
                 # TYPE {name} gauge\n{name}{{{labels},method=\"{}\"}} 1",
                escape_label(method)
            );
        }

        let finished = *self.finished.lock().unwrap_or_else(|p| p.into_inner());
        let name = "vllm:request_success_total";
        let _ = writeln!(
            out,
            "# HELP {name} Finished requests, by finish reason.\n# TYPE {name} counter"
        );
        for (label, v) in FINISH_LABELS.iter().zip(finished) {
            let _ = writeln!(out, "{name}{{{labels},finished_reason=\"{label}\"}} {v}");
        }
        self.ttft.render(
            &mut out,
            "vllm:time_to_first_token_seconds",
            "Time to first token.",
            &labels,
        );
        self.inter_token.render(
            &mut out,
            "vllm:inter_token_latency_seconds",
            "Time between generated tokens.",
            &labels,
        );
        self.e2e.render(
            &mut out,
            "vllm:e2e_request_latency_seconds",
            "End-to-end request latency.",
            &labels,
        );
        out
    }
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = ServerMetrics::default();
        m.observe_ttft(Duration::from_millis(3));
        m.observe_ttft(Duration::from_secs(5000));
        let page = m.render("m", None);
        assert!(
            page.contains(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.001\"} 0"
            )
        );
        assert!(
            page.contains(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"0.005\"} 1"
            )
        );
        assert!(
            page.contains(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"2560.0\"} 1"
            )
        );
        assert!(
            page.contains(
                "vllm:time_to_first_token_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2"
            )
        );
        assert!(page.contains("vllm:time_to_first_token_seconds_count{model_name=\"m\"} 2"));
    }

    #[test]
    fn the_speculative_method_is_named_when_there_is_one() {
        let page = ServerMetrics::default().render("m", None);
        assert!(!page.contains("speculative_method_info"));
        let m = ServerMetrics::with_speculative(Some("replay proposer, profile 1".into()));
        let page = m.render("m", None);
        assert!(page.contains(
            "kestrel:speculative_method_info{model_name=\"m\",method=\"replay proposer, profile 1\"} 1"
        ));
    }

    #[test]
    fn finish_reasons_are_labelled() {
        let m = ServerMetrics::default();
        m.observe_finished("length", Duration::from_secs(1));
        m.observe_finished("length", Duration::from_secs(1));
        let page = m.render("a\"b", None);
        assert!(page.contains(
            "vllm:request_success_total{model_name=\"a\\\"b\",finished_reason=\"length\"} 2"
        ));
        assert!(page.contains("finished_reason=\"stop\"} 0"));
    }
}

//! Results, their JSON form and the tables printed at the end.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::timing::OpTime;
use super::traffic::StepBytes;

/// Wall times of repeated runs, in seconds.
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub all: Vec<f64>,
}

impl Stats {
    pub fn of(times: &[f64]) -> Stats {
        let mut sorted = times.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        };
        Stats {
            median,
            min: sorted[0],
            max: sorted[n - 1],
            all: times.to_vec(),
        }
    }

    pub fn to_json(&self) -> Value {
        let ms = |s: f64| s * 1e3;
        json!({
            "median_ms": ms(self.median),
            "min_ms": ms(self.min),
            "max_ms": ms(self.max),
            "all_ms": self.all.iter().map(|&s| ms(s)).collect::<Vec<_>>(),
        })
    }
}

/// Time per operation over instrumented steps, largest first.
pub struct Breakdown {
    pub steps: usize,
    /// Wall time of an instrumented step (slower than a plain one: a sync per op).
    pub wall_ms_per_step: f64,
    pub ops: Vec<(String, f64, f64)>, // name, ms per step, calls per step
}

impl Breakdown {
    pub fn new(times: &BTreeMap<String, OpTime>, steps: usize, wall_seconds: f64) -> Breakdown {
        let per = steps.max(1) as f64;
        let mut ops: Vec<(String, f64, f64)> = times
            .iter()
            .map(|(k, t)| (k.clone(), t.seconds * 1e3 / per, t.calls as f64 / per))
            .collect();
        ops.sort_by(|a, b| b.1.total_cmp(&a.1));
        Breakdown {
            steps,
            wall_ms_per_step: wall_seconds * 1e3 / per,
            ops,
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "instrumented_steps": self.steps,
            "instrumented_wall_ms_per_step": self.wall_ms_per_step,
            "ops": self.ops.iter().map(|(name, ms, calls)| json!({
                "op": name, "ms_per_step": ms, "calls_per_step": calls,
                "share": ms / self.wall_ms_per_step,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn print(&self, title: &str) {
        println!(
            "\n{title}: instrumented {:.3} ms/step (a device sync around each op)",
            self.wall_ms_per_step
        );
        println!(
            "  {:<28} {:>10} {:>8} {:>7}",
            "op", "ms/step", "calls", "share"
        );
        let listed: f64 = self.ops.iter().map(|o| o.1).sum();
        for (name, ms, calls) in &self.ops {
            println!(
                "  {name:<28} {ms:>10.3} {calls:>8.0} {:>6.1}%",
                100.0 * ms / self.wall_ms_per_step
            );
        }
        let rest = self.wall_ms_per_step - listed;
        println!(
            "  {:<28} {rest:>10.3} {:>8} {:>6.1}%",
            "(host, outside ops)",
            "",
            100.0 * rest / self.wall_ms_per_step
        );
    }
}

pub struct PrefillResult {
    pub tokens: usize,
    pub chunks: usize,
    pub stats: Stats,
    pub flops: f64,
    pub breakdown: Option<Breakdown>,
}

impl PrefillResult {
    fn tokens_per_s(&self) -> f64 {
        self.tokens as f64 / self.stats.median
    }

    fn tflops(&self) -> f64 {
        self.flops / self.stats.median / 1e12
    }

    pub fn to_json(&self) -> Value {
        json!({
            "tokens": self.tokens,
            "chunks": self.chunks,
            "time": self.stats.to_json(),
            "tokens_per_s": self.tokens_per_s(),
            "matmul_flops": self.flops,
            "achieved_tflops": self.tflops(),
            "breakdown": self.breakdown.as_ref().map(Breakdown::to_json),
        })
    }
}

pub struct DecodeResult {
    pub batch: usize,
    /// Cached tokens per sequence at the first timed step.
    pub context: usize,
    pub stats: Stats,
    pub bytes: StepBytes,
    pub bandwidth_gbs: f64,
}

impl DecodeResult {
    fn tokens_per_s(&self) -> f64 {
        self.batch as f64 / self.stats.median
    }
    fn achieved_gbs(&self) -> f64 {
        self.bytes.total / self.stats.median / 1e9
    }
    fn floor_s(&self) -> f64 {
        self.bytes.total / (self.bandwidth_gbs * 1e9)
    }
    fn fraction_of_floor(&self) -> f64 {
        self.floor_s() / self.stats.median
    }

    pub fn to_json(&self) -> Value {
        json!({
            "batch": self.batch,
            "context_at_first_step": self.context,
            "step_time": self.stats.to_json(),
            "tokens_per_s": self.tokens_per_s(),
            "bytes_per_step": self.bytes.to_json(),
            "achieved_gbs": self.achieved_gbs(),
            "floor_ms": self.floor_s() * 1e3,
            "floor_tokens_per_s": self.batch as f64 / self.floor_s(),
            "fraction_of_floor": self.fraction_of_floor(),
            "breakdown": None::<Value>,
        })
    }
}

/// A verify step: `batch` sequences with `k` drafts each (k + 1 new tokens).
pub struct VerifyResult {
    pub batch: usize,
    pub k: usize,
    /// Cached tokens per sequence at every timed step.
    pub context: usize,
    pub stats: Stats,
    pub bytes: StepBytes,
    pub bandwidth_gbs: f64,
}

impl VerifyResult {
    fn achieved_gbs(&self) -> f64 {
        self.bytes.total / self.stats.median / 1e9
    }
    fn floor_s(&self) -> f64 {
        self.bytes.total / (self.bandwidth_gbs * 1e9)
    }

    pub fn to_json(&self, breakdown: &Option<Breakdown>) -> Value {
        json!({
            "batch": self.batch,
            "k": self.k,
            "tokens_per_sequence": self.k + 1,
            "context": self.context,
            "step_time": self.stats.to_json(),
            "bytes_per_step": self.bytes.to_json(),
            "experts": "expected union, uniform routing",
            "achieved_gbs": self.achieved_gbs(),
            "floor_ms": self.floor_s() * 1e3,
            "fraction_of_floor": self.floor_s() / self.stats.median,
            "breakdown": breakdown.as_ref().map(Breakdown::to_json),
        })
    }
}

fn print_verifies(verifies: &[(VerifyResult, Option<Breakdown>)]) {
    let Some((first, _)) = verifies.first() else {
        return;
    };
    println!(
        "\nverify steps (k drafts + 1 token per sequence, context {}, median of {} steps; \
         experts: expected union, uniform routing; tokens: device argmax)",
        first.context,
        first.stats.all.len()
    );
    println!(
        "  {:>5} {:>3} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}",
        "batch", "k", "ms/step", "MB/step", "experts", "GB/s", "floor ms", "% floor"
    );
    for (v, _) in verifies {
        println!(
            "  {:>5} {:>3} {:>10.3} {:>10.1} {:>9.1} {:>9.1} {:>9.3} {:>7.1}%",
            v.batch,
            v.k,
            v.stats.median * 1e3,
            v.bytes.total / 1e6,
            v.bytes.expected_experts_per_layer,
            v.achieved_gbs(),
            v.floor_s() * 1e3,
            100.0 * v.floor_s() / v.stats.median
        );
    }
    for (v, b) in verifies {
        if let Some(b) = b {
            b.print(&format!("verify batch {} k {}", v.batch, v.k));
        }
    }
}

pub fn print(
    summary: &Value,
    prefills: &[PrefillResult],
    decodes: &[(DecodeResult, Option<Breakdown>)],
    verifies: &[(VerifyResult, Option<Breakdown>)],
) {
    let m = &summary["model"];
    println!(
        "\nmodel {} ({}, {} layers, weights: {}) on {}",
        m["source"].as_str().unwrap_or(""),
        m["model_type"].as_str().unwrap_or(""),
        m["layers"],
        m["weights"].as_str().unwrap_or(""),
        summary["backend"].as_str().unwrap_or("")
    );
    println!(
        "memory bandwidth {:.1} GB/s ({})",
        summary["bandwidth_gbs"].as_f64().unwrap_or(0.0),
        summary["bandwidth_source"].as_str().unwrap_or("")
    );
    if !prefills.is_empty() {
        println!(
            "\nprefill (one sequence, median of {} runs)",
            prefills[0].stats.all.len()
        );
        println!(
            "  {:>8} {:>6} {:>11} {:>11} {:>9}",
            "tokens", "chunks", "ms", "tok/s", "TFLOP/s"
        );
        for p in prefills {
            println!(
                "  {:>8} {:>6} {:>11.2} {:>11.1} {:>9.3}",
                p.tokens,
                p.chunks,
                p.stats.median * 1e3,
                p.tokens_per_s(),
                p.tflops()
            );
        }
    }
    if !decodes.is_empty() {
        println!(
            "\ndecode (median step over {} timed steps; context {} at the first; tokens: {})",
            decodes[0].0.stats.all.len(),
            decodes[0].0.context,
            summary["settings"]["sampling"].as_str().unwrap_or("greedy")
        );
        println!(
            "  {:>5} {:>10} {:>10} {:>10} {:>9} {:>9} {:>9} {:>8}",
            "batch", "ms/step", "tok/s", "MB/step", "experts", "GB/s", "floor ms", "% floor"
        );
        for (d, _) in decodes {
            println!(
                "  {:>5} {:>10.3} {:>10.1} {:>10.1} {:>9.1} {:>9.1} {:>9.3} {:>7.1}%",
                d.batch,
                d.stats.median * 1e3,
                d.tokens_per_s(),
                d.bytes.total / 1e6,
                d.bytes.expected_experts_per_layer,
                d.achieved_gbs(),
                d.floor_s() * 1e3,
                100.0 * d.fraction_of_floor()
            );
        }
    }
    for p in prefills {
        if let Some(b) = &p.breakdown {
            b.print(&format!("prefill {} tokens", p.tokens));
        }
    }
    for (d, b) in decodes {
        if let Some(b) = b {
            b.print(&format!("decode batch {}", d.batch));
        }
    }
    print_verifies(verifies);
}

pub fn print_skipped(skipped: &[String]) {
    for s in skipped {
        println!("skipped: {s}");
    }
}

/// JSON of a decode result with its breakdown.
pub fn decode_json(d: &DecodeResult, b: &Option<Breakdown>) -> Value {
    let mut v = d.to_json();
    v["breakdown"] = b.as_ref().map_or(Value::Null, Breakdown::to_json);
    v
}

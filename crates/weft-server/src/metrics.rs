//! `/metrics`: the server's and the engine's counters in Prometheus' text format, named in
//! vLLM's style under a `weft:` prefix.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Bucket bounds in seconds: latencies from a millisecond to a few minutes.
const BUCKETS: [f64; 18] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 300.0,
];

/// A latency histogram with fixed buckets.
#[derive(Debug, Default)]
pub struct Histogram {
    /// Per bucket (not cumulative), then the sum in seconds and the count.
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if h.0.is_empty() {
            h.0 = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| s <= b) {
            h.0[i] += 1;
        }
        h.1 += s;
        h.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += h.0.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.2);
        let _ = writeln!(out, "{name}_sum {}\n{name}_count {}", h.1, h.2);
    }
}

/// The server's own counters.
#[derive(Debug, Default)]
pub struct ServerMetrics {
    pub prompt_tokens: AtomicU64,
    pub generation_tokens: AtomicU64,
    pub requests_ok: AtomicU64,
    pub requests_failed: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub preemptions: AtomicU64,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
}

/// Everything `/metrics` shows besides [`ServerMetrics`].
#[derive(Debug, Clone, Copy)]
pub struct Gauges {
    pub running: usize,
    pub waiting: usize,
    pub engine: Option<weft::Metrics>,
}

impl ServerMetrics {
    /// The Prometheus text.
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::with_capacity(4096);
        let mut line = |name: &str, kind: &str, help: &str, v: String| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        };
        let c = |a: &AtomicU64| a.load(Ordering::Relaxed).to_string();
        line(
            "weft:num_requests_running",
            "gauge",
            "Requests generating now.",
            g.running.to_string(),
        );
        line(
            "weft:num_requests_waiting",
            "gauge",
            "Requests waiting for admission or preempted.",
            g.waiting.to_string(),
        );
        line(
            "weft:prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            c(&self.prompt_tokens),
        );
        line(
            "weft:generation_tokens_total",
            "counter",
            "Generated tokens.",
            c(&self.generation_tokens),
        );
        line(
            "weft:request_success_total",
            "counter",
            "Requests answered in full.",
            c(&self.requests_ok),
        );
        line(
            "weft:request_failure_total",
            "counter",
            "Requests that failed after admission.",
            c(&self.requests_failed),
        );
        line(
            "weft:request_cancelled_total",
            "counter",
            "Requests whose client went away.",
            c(&self.requests_cancelled),
        );
        line(
            "weft:num_preemptions_total",
            "counter",
            "Times a request gave its KV pages back to be recomputed later.",
            c(&self.preemptions),
        );
        let e = g.engine.unwrap_or_default();
        line(
            "weft:kv_pages_used",
            "gauge",
            "KV pages in use, all layer groups.",
            e.kv_pages_used.to_string(),
        );
        line(
            "weft:kv_pages_free",
            "gauge",
            "KV pages free, all layer groups.",
            e.kv_pages_free.to_string(),
        );
        line(
            "weft:mean_passes_per_model_call",
            "gauge",
            "Mean passes per batched model call (continuous batching at work).",
            format!("{:.3}", e.mean_batch_passes),
        );
        line(
            "weft:prefix_cache_queries_total",
            "counter",
            "Prompt tokens looked up in the prefix cache.",
            e.prefix_queried_tokens.to_string(),
        );
        line(
            "weft:prefix_cache_hits_total",
            "counter",
            "Prompt tokens found in the prefix cache (not computed).",
            e.prefix_hit_tokens.to_string(),
        );
        line(
            "weft:model_calls_total",
            "counter",
            "Batched model calls.",
            e.steps.to_string(),
        );
        self.ttft.render(
            &mut out,
            "weft:time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
        );
        self.itl.render(
            &mut out,
            "weft:inter_token_latency_seconds",
            "Time between two generated tokens of one choice.",
        );
        self.e2e.render(
            &mut out,
            "weft:e2e_request_latency_seconds",
            "Time from arrival to the last token.",
        );
        out
    }
}

//! `--scrape-metrics`: the server's own view of the run, from `/metrics`
//! scraped before and after (counter and histogram deltas) and sampled during
//! it (gauge peaks). Works with the `inferscope:` and `vllm:` namespaces and
//! sums over all label sets (several engines).

use crate::client::get_text;
use crate::promtext::{self, Sample};
use crate::report::{header, line};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// One scrape.
#[derive(Debug, Clone)]
pub struct Snapshot {
    samples: Vec<Sample>,
    at: Instant,
}

/// A cumulative histogram summed over label sets.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// `(upper bound, cumulative count)`, sorted by bound, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

impl Histogram {
    /// Adds up `_bucket` samples of any label sets, bound by bound, into one
    /// histogram with the given `_sum` and `_count`; `None` without buckets.
    pub fn from_buckets<'a>(
        buckets: impl IntoIterator<Item = &'a Sample>,
        sum: f64,
        count: f64,
    ) -> Option<Histogram> {
        let mut by_le: Vec<(f64, f64)> = Vec::new();
        for s in buckets {
            let Some(le) = s.label("le").and_then(promtext::parse_value) else {
                continue;
            };
            match by_le.iter_mut().find(|(l, _)| *l == le) {
                Some(slot) => slot.1 += s.value,
                None => by_le.push((le, s.value)),
            }
        }
        if by_le.is_empty() {
            return None;
        }
        by_le.sort_by(|a, b| a.0.total_cmp(&b.0));
        Some(Histogram {
            buckets: by_le,
            sum,
            count,
        })
    }

    /// This histogram minus an earlier one (missing earlier buckets count as 0).
    pub fn delta(&self, before: Option<&Histogram>) -> Histogram {
        let Some(b) = before else {
            return self.clone();
        };
        let prev = |le: f64| {
            b.buckets
                .iter()
                .find(|(l, _)| *l == le)
                .map_or(0.0, |(_, c)| *c)
        };
        Histogram {
            buckets: self
                .buckets
                .iter()
                .map(|&(le, c)| (le, c - prev(le)))
                .collect(),
            sum: self.sum - b.sum,
            count: self.count - b.count,
        }
    }

    /// Quantile estimate as Prometheus' `histogram_quantile` (linear within a bucket).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        let rank = q * total;
        let mut prev_le = 0.0;
        let mut prev_c = 0.0;
        for &(le, c) in &self.buckets {
            if c >= rank {
                if le.is_infinite() {
                    // Above the highest finite bound: that bound is the best estimate.
                    return Some(prev_le);
                }
                let width = c - prev_c;
                let frac = if width > 0.0 {
                    (rank - prev_c) / width
                } else {
                    1.0
                };
                return Some(prev_le + (le - prev_le) * frac);
            }
            prev_le = le;
            prev_c = c;
        }
        Some(prev_le)
    }

    /// Mean observation, if any.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }
}

impl Snapshot {
    /// Parses an exposition taken now.
    pub fn from_text(text: &str) -> Self {
        Snapshot {
            samples: promtext::parse(text).samples,
            at: Instant::now(),
        }
    }

    /// The namespace present (`inferscope` or `vllm`), preferring the one with more series.
    pub fn namespace(&self) -> Option<&'static str> {
        let count = |p: &str| {
            self.samples
                .iter()
                .filter(|s| s.name.starts_with(p))
                .count()
        };
        let (a, b) = (count("inferscope:"), count("vllm:"));
        match (a, b) {
            (0, 0) => None,
            _ if a >= b => Some("inferscope"),
            _ => Some("vllm"),
        }
    }

    fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Sum of a counter over all label sets (`_total` suffix first, then the bare name).
    pub fn counter(&self, ns: &str, name: &str) -> Option<f64> {
        let with = format!("{ns}:{name}_total");
        let bare = format!("{ns}:{name}");
        self.sum(&with).or_else(|| self.sum(&bare))
    }

    /// Counter sums per value of one label.
    pub fn counter_by(&self, ns: &str, name: &str, label: &str) -> BTreeMap<String, f64> {
        let mut out = BTreeMap::new();
        let full = format!("{ns}:{name}_total");
        for s in self.series(&full) {
            let k = s.label(label).unwrap_or("").to_string();
            *out.entry(k).or_insert(0.0) += s.value;
        }
        out
    }

    /// Sum over label sets of an exact sample name.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut it = self.series(name).peekable();
        it.peek()?;
        Some(it.map(|s| s.value).sum())
    }

    /// Largest value over label sets of an exact sample name.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.series(name).map(|s| s.value).reduce(f64::max)
    }

    /// Number of distinct `engine` labels on a series.
    pub fn engines(&self, name: &str) -> usize {
        self.series(name)
            .filter_map(|s| s.label("engine"))
            .collect::<BTreeSet<_>>()
            .len()
    }

    /// A histogram summed over label sets.
    pub fn histogram(&self, ns: &str, name: &str) -> Option<Histogram> {
        Histogram::from_buckets(
            self.series(&format!("{ns}:{name}_bucket")),
            self.sum(&format!("{ns}:{name}_sum")).unwrap_or(0.0),
            self.sum(&format!("{ns}:{name}_count")).unwrap_or(0.0),
        )
    }
}

/// Fetches and parses `/metrics`.
pub async fn scrape(url: &str) -> Result<Snapshot, crate::error::BenchError> {
    let text = get_text(url, Duration::from_secs(10)).await?;
    Ok(Snapshot::from_text(&text))
}

/// Peaks of the gauges seen while sampling.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GaugePeaks {
    /// Highest KV-cache usage of any engine, fraction 0..1.
    pub kv_cache_usage: Option<f64>,
    /// Highest total of waiting requests.
    pub waiting: Option<f64>,
    /// Highest total of running requests.
    pub running: Option<f64>,
    /// Successful samples taken.
    pub samples: usize,
}

impl GaugePeaks {
    fn observe(&mut self, s: &Snapshot, ns: &str) {
        let up = |slot: &mut Option<f64>, v: Option<f64>| {
            if let Some(v) = v {
                *slot = Some(slot.map_or(v, |p: f64| p.max(v)));
            }
        };
        // vLLM before V1 called the KV-cache gauge `gpu_cache_usage_perc`.
        let kv = s
            .max(&format!("{ns}:kv_cache_usage_perc"))
            .or_else(|| s.max(&format!("{ns}:gpu_cache_usage_perc")));
        up(&mut self.kv_cache_usage, kv);
        up(
            &mut self.waiting,
            s.sum(&format!("{ns}:num_requests_waiting")),
        );
        up(
            &mut self.running,
            s.sum(&format!("{ns}:num_requests_running")),
        );
        self.samples += 1;
    }
}

/// Samples gauges in the background until stopped.
pub struct GaugeSampler {
    task: JoinHandle<()>,
    peaks: Arc<Mutex<GaugePeaks>>,
}

impl GaugeSampler {
    /// Starts sampling `url` every `interval`.
    pub fn start(url: String, ns: &'static str, interval: Duration) -> Self {
        let peaks = Arc::new(Mutex::new(GaugePeaks::default()));
        let p = peaks.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                if let Ok(s) = scrape(&url).await {
                    p.lock().await.observe(&s, ns);
                }
            }
        });
        GaugeSampler { task, peaks }
    }

    /// Stops sampling; folds in a last snapshot.
    pub async fn stop(self, last: Option<&Snapshot>, ns: &str) -> GaugePeaks {
        self.task.abort();
        let mut p = self.peaks.lock().await.clone();
        if let Some(s) = last {
            p.observe(s, ns);
        }
        p
    }
}

/// What the client measured, to set beside the server's counts.
#[derive(Debug, Clone, Default)]
pub struct ClientCounts {
    /// Successful requests.
    pub completed: usize,
    /// Failed requests.
    pub failed: usize,
    /// Output tokens.
    pub output_tokens: usize,
    /// Prompt tokens (estimated without a tokenizer).
    pub input_tokens: usize,
    /// Whether prompt lengths are exact (a tokenizer was given).
    pub input_exact: bool,
}

/// Latency summary from a histogram delta, milliseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct HistSummary {
    /// Mean (sum / count).
    pub mean_ms: f64,
    /// Estimated median.
    pub p50_ms: f64,
    /// Estimated 99th percentile.
    pub p99_ms: f64,
    /// Observations.
    pub count: f64,
}

/// The server-side view of one run.
#[derive(Debug, Clone, Default)]
pub struct ServerView {
    /// Namespace found.
    pub namespace: String,
    /// Finished requests by `finished_reason`.
    pub finished: BTreeMap<String, f64>,
    /// Generated tokens.
    pub generation_tokens: Option<f64>,
    /// Prompt tokens.
    pub prompt_tokens: Option<f64>,
    /// Preemptions.
    pub preemptions: Option<f64>,
    /// Server TTFT.
    pub ttft: Option<HistSummary>,
    /// Server inter-token latency.
    pub itl: Option<HistSummary>,
    /// Server end-to-end latency.
    pub e2e: Option<HistSummary>,
    /// Server queue time.
    pub queue: Option<HistSummary>,
    /// Gauge peaks.
    pub peaks: GaugePeaks,
    /// Mean device utilisation over engines, fraction.
    pub device_utilisation: Option<f64>,
}

fn summarize(after: &Snapshot, before: &Snapshot, ns: &str, name: &str) -> Option<HistSummary> {
    let a = after.histogram(ns, name)?;
    let d = a.delta(before.histogram(ns, name).as_ref());
    Some(HistSummary {
        mean_ms: d.mean()? * 1000.0,
        p50_ms: d.quantile(0.5)? * 1000.0,
        p99_ms: d.quantile(0.99)? * 1000.0,
        count: d.count,
    })
}

/// Builds the view from the two scrapes and the gauge peaks.
pub fn server_view(before: &Snapshot, after: &Snapshot, ns: &str, peaks: GaugePeaks) -> ServerView {
    let delta =
        |name: &str| Some(after.counter(ns, name)? - before.counter(ns, name).unwrap_or(0.0));
    let b = before.counter_by(ns, "request_success", "finished_reason");
    let finished = after
        .counter_by(ns, "request_success", "finished_reason")
        .into_iter()
        .map(|(k, v)| {
            let d = v - b.get(&k).copied().unwrap_or(0.0);
            (k, d)
        })
        .collect();
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let busy_name = format!("{ns}:device_busy_seconds_total");
    let engines = after.engines(&busy_name).max(1);
    let device_utilisation = delta("device_busy_seconds")
        .filter(|_| wall > 0.0)
        .map(|busy| busy / (wall * engines as f64));
    ServerView {
        namespace: ns.to_string(),
        finished,
        generation_tokens: delta("generation_tokens"),
        prompt_tokens: delta("prompt_tokens"),
        preemptions: delta("num_preemptions"),
        ttft: summarize(after, before, ns, "time_to_first_token_seconds"),
        // Older vLLM exports the per-token gap as `time_per_output_token_seconds`.
        itl: summarize(after, before, ns, "inter_token_latency_seconds")
            .or_else(|| summarize(after, before, ns, "time_per_output_token_seconds")),
        e2e: summarize(after, before, ns, "e2e_request_latency_seconds"),
        queue: summarize(after, before, ns, "request_queue_time_seconds"),
        peaks,
        device_utilisation,
    }
}

fn vs(server: f64, client: usize, tolerance: f64) -> String {
    let c = client as f64;
    let off = (server - c).abs() > tolerance * c.max(1.0);
    let flag = if off { "  <-- disagree" } else { "" };
    format!("{server:.0} / {client}{flag}")
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "n/a".to_string(), f)
}

/// Renders the "Server-side view" section.
pub fn render(v: &ServerView, c: &ClientCounts) -> String {
    let mut s = String::new();
    header(&mut s, " Server-side View ", '=');
    line(&mut s, "Metric namespace:", &v.namespace);
    let total: f64 = v.finished.values().sum();
    line(
        &mut s,
        "Requests finished (server / client):",
        vs(total, c.completed + c.failed, 0.0),
    );
    for (reason, n) in &v.finished {
        line(
            &mut s,
            &format!("  finished_reason={reason}:"),
            format!("{n:.0}"),
        );
    }
    line(
        &mut s,
        "Generated tokens (server / client):",
        opt(v.generation_tokens, |x| vs(x, c.output_tokens, 0.0)),
    );
    // Client prompt lengths are estimates without a tokenizer: allow 10%.
    let tol = if c.input_exact { 0.0 } else { 0.10 };
    line(
        &mut s,
        "Prompt tokens (server / client):",
        opt(v.prompt_tokens, |x| vs(x, c.input_tokens, tol)),
    );
    line(
        &mut s,
        "Preemptions:",
        opt(v.preemptions, |x| format!("{x:.0}")),
    );
    for (title, h) in [
        ("Server TTFT", &v.ttft),
        ("Server ITL", &v.itl),
        ("Server E2E latency", &v.e2e),
        ("Server queue time", &v.queue),
    ] {
        header(&mut s, title, '-');
        match h {
            Some(h) => {
                line(&mut s, "Mean (ms):", format!("{:.2}", h.mean_ms));
                line(
                    &mut s,
                    "P50 (ms, from buckets):",
                    format!("{:.2}", h.p50_ms),
                );
                line(
                    &mut s,
                    "P99 (ms, from buckets):",
                    format!("{:.2}", h.p99_ms),
                );
            }
            None => line(&mut s, "No samples:", "n/a"),
        }
    }
    header(&mut s, "Server gauges", '-');
    let pct = |x: f64| format!("{:.1}", x * 100.0);
    line(
        &mut s,
        "Peak KV-cache usage (%):",
        opt(v.peaks.kv_cache_usage, pct),
    );
    line(
        &mut s,
        "Peak waiting requests:",
        opt(v.peaks.waiting, |x| format!("{x:.0}")),
    );
    line(
        &mut s,
        "Peak running requests:",
        opt(v.peaks.running, |x| format!("{x:.0}")),
    );
    line(
        &mut s,
        "Device utilisation (%):",
        opt(v.device_utilisation, pct),
    );
    s.push_str(&"=".repeat(50));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(ns: &str, scale: f64) -> String {
        // Two engines; cumulative buckets 0.1 → 2·scale, 0.2 → 4·scale, +Inf → 5·scale.
        let mut t = String::new();
        for e in ["0", "1"] {
            for (le, c) in [("0.1", 1.0), ("0.2", 2.0), ("+Inf", 2.5)] {
                t.push_str(&format!(
                    "{ns}:time_to_first_token_seconds_bucket{{engine=\"{e}\",le=\"{le}\"}} {}\n",
                    c * scale
                ));
            }
            t.push_str(&format!(
                "{ns}:time_to_first_token_seconds_sum{{engine=\"{e}\"}} {}\n",
                0.5 * scale
            ));
            t.push_str(&format!(
                "{ns}:time_to_first_token_seconds_count{{engine=\"{e}\"}} {}\n",
                2.5 * scale
            ));
            t.push_str(&format!(
                "{ns}:request_success_total{{engine=\"{e}\",finished_reason=\"length\"}} {}\n",
                10.0 * scale
            ));
            t.push_str(&format!(
                "{ns}:generation_tokens_total{{engine=\"{e}\"}} {}\n",
                100.0 * scale
            ));
            t.push_str(&format!(
                "{ns}:kv_cache_usage_perc{{engine=\"{e}\"}} {}\n",
                if e == "0" { 0.3 } else { 0.6 }
            ));
        }
        t
    }

    #[test]
    fn histogram_quantiles_and_deltas() {
        let before = Snapshot::from_text(&hist("vllm", 1.0));
        let after = Snapshot::from_text(&hist("vllm", 3.0));
        assert_eq!(after.namespace(), Some("vllm"));
        let d = after
            .histogram("vllm", "time_to_first_token_seconds")
            .expect("histogram")
            .delta(
                before
                    .histogram("vllm", "time_to_first_token_seconds")
                    .as_ref(),
            );
        // Delta: buckets 0.1 → 4, 0.2 → 8, +Inf → 10 (two engines × (3 − 1) × …).
        assert_eq!(
            d.buckets,
            vec![(0.1, 4.0), (0.2, 8.0), (f64::INFINITY, 10.0)]
        );
        assert_eq!(d.count, 10.0);
        assert!((d.mean().expect("mean") - 0.2).abs() < 1e-12);
        // Rank 5 lies in (0.1, 0.2]: 0.1 + 0.1 · (5 − 4) / 4.
        assert!((d.quantile(0.5).expect("p50") - 0.125).abs() < 1e-12);
        // Rank 9.9 is in +Inf: the highest finite bound.
        assert_eq!(d.quantile(0.99), Some(0.2));
        let v = server_view(&before, &after, "vllm", GaugePeaks::default());
        assert_eq!(v.finished.get("length"), Some(&40.0));
        assert_eq!(v.generation_tokens, Some(400.0));
        assert_eq!(v.preemptions, None);
        let text = render(
            &v,
            &ClientCounts {
                completed: 40,
                output_tokens: 399,
                ..Default::default()
            },
        );
        assert!(text.contains("40 / 40 "), "{text}");
        assert!(text.contains("400 / 399  <-- disagree"), "{text}");
    }

    #[test]
    fn gauges_take_peaks_and_missing_metrics_degrade() {
        let s = Snapshot::from_text(&hist("inferscope", 1.0));
        let mut p = GaugePeaks::default();
        p.observe(&s, "inferscope");
        assert_eq!(p.kv_cache_usage, Some(0.6));
        assert_eq!(p.waiting, None);
        let old = Snapshot::from_text(
            "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.9\nvllm:num_requests_waiting{engine=\"0\"} 3\nvllm:num_requests_waiting{engine=\"1\"} 4\n",
        );
        p.observe(&old, "vllm");
        assert_eq!(p.kv_cache_usage, Some(0.9));
        assert_eq!(p.waiting, Some(7.0));
        assert_eq!(p.samples, 2);
        let empty = Snapshot::from_text("# nothing\n");
        assert_eq!(empty.namespace(), None);
        let v = server_view(&empty, &empty, "inferscope", GaugePeaks::default());
        let text = render(&v, &ClientCounts::default());
        assert!(text.contains("n/a"));
    }
}

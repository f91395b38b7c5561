//! `--scrape-metrics`: the server's own view of the run, from `/metrics`
//! scraped before and after (counter and histogram deltas) and sampled during
//! it (gauge peaks). Works with the `inferscope_` and `vllm:` namespaces (and
//! the older `inferscope:` spelling) and sums over all label sets (several
//! engines). The parsing, deltas and quantiles are the schema crate's
//! ([`inferscope_schema::scrape`]).

use crate::client::get_text;
use crate::report::{header, line};
use inferscope_schema::names;
use inferscope_schema::scrape::{BucketBound, Delta, Scrape, busy_aligned, utilisation};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// One scrape and when it was taken.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The parsed exposition.
    pub scrape: Scrape,
    at: Instant,
}

impl Snapshot {
    /// Parses an exposition taken now.
    pub fn from_text(text: &str) -> Self {
        Snapshot {
            scrape: Scrape::parse(text),
            at: Instant::now(),
        }
    }

    /// The namespace present (`inferscope`, `inferscope:` for the older
    /// spelling, or `vllm`), preferring the one with more series.
    pub fn namespace(&self) -> Option<&'static str> {
        self.scrape.detect_namespace()
    }
}

/// Fetches and parses `/metrics` (`api_key` as a bearer token: a server
/// with keys may keep its metrics behind them).
pub async fn scrape(
    url: &str,
    api_key: Option<&str>,
) -> Result<Snapshot, crate::error::BenchError> {
    let text = get_text(url, Duration::from_secs(10), api_key).await?;
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
    /// Every sample, in order (the report's server time series).
    pub series: Vec<ServerSample>,
}

/// The server's gauges and two counters at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSample {
    /// When the scrape was parsed.
    pub at: Instant,
    /// Running requests, summed over engines.
    pub running: Option<f64>,
    /// Waiting requests, summed over engines.
    pub waiting: Option<f64>,
    /// Highest KV-cache usage of any engine, fraction 0..1.
    pub kv_cache_usage: Option<f64>,
    /// Device busy seconds (counter), summed over engines.
    pub device_busy_s: Option<f64>,
    /// Engines exposing the busy counter (at least 1).
    pub engines: usize,
    /// Preemptions (counter), summed over engines.
    pub preemptions: Option<f64>,
}

/// The server's series on the run's time axis (x: seconds since the run started).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerSeries {
    /// Running requests.
    pub running: Vec<(f64, f64)>,
    /// Waiting requests.
    pub waiting: Vec<(f64, f64)>,
    /// Peak KV-cache usage over engines, percent.
    pub kv_usage_pct: Vec<(f64, f64)>,
    /// Device utilisation between consecutive samples, percent (mean over engines).
    pub device_util_pct: Vec<(f64, f64)>,
    /// Preemptions since the first sample (a counter reset restarts from the new value).
    pub preemptions: Vec<(f64, f64)>,
}

/// Puts the samples on the run's time axis; samples before `run_start` are
/// shown at 0 s.
pub fn server_series(samples: &[ServerSample], run_start: Instant) -> ServerSeries {
    let mut out = ServerSeries::default();
    let t = |s: &ServerSample| s.at.saturating_duration_since(run_start).as_secs_f64();
    let mut preempted = 0.0;
    for (i, s) in samples.iter().enumerate() {
        let x = t(s);
        let push = |v: &mut Vec<(f64, f64)>, y: Option<f64>| {
            if let Some(y) = y.filter(|y| y.is_finite()) {
                v.push((x, y));
            }
        };
        push(&mut out.running, s.running);
        push(&mut out.waiting, s.waiting);
        push(&mut out.kv_usage_pct, s.kv_cache_usage.map(|u| u * 100.0));
        let prev = i.checked_sub(1).and_then(|j| samples.get(j));
        if let Some(p) = prev
            && let (Some(a), Some(b)) = (p.preemptions, s.preemptions)
        {
            // A counter that went down restarted: count from zero.
            preempted += if b >= a { b - a } else { b };
        }
        push(&mut out.preemptions, s.preemptions.map(|_| preempted));
    }
    out.device_util_pct = device_utilisation_pct(samples, run_start);
    out
}

/// Device utilisation between consecutive samples, percent of the engines'
/// time, at each interval's end. The busy counter moves when a step ends, so
/// a step's time past its interval is moved back to the intervals where it
/// ran ([`busy_aligned`]): no interval reads above 100 %. An interval over
/// which the counter went down (a restart) is left out and ends the run of
/// intervals aligned together.
fn device_utilisation_pct(samples: &[ServerSample], run_start: Instant) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    // Runs of intervals with a counter that only grew: (x, busy, capacity).
    let mut run: Vec<(f64, f64, f64)> = Vec::new();
    let flush = |run: &mut Vec<(f64, f64, f64)>, out: &mut Vec<(f64, f64)>| {
        let (busy, cap): (Vec<f64>, Vec<f64>) = run.iter().map(|r| (r.1, r.2)).unzip();
        for ((x, _, c), b) in run.drain(..).zip(busy_aligned(&busy, &cap)) {
            out.push((x, b / c * 100.0));
        }
    };
    for w in samples.windows(2) {
        let (p, s) = (&w[0], &w[1]);
        let dt = s.at.saturating_duration_since(p.at).as_secs_f64();
        match (p.device_busy_s, s.device_busy_s) {
            (Some(a), Some(b)) if b >= a && dt > 0.0 && (b - a).is_finite() => {
                let x = s.at.saturating_duration_since(run_start).as_secs_f64();
                run.push((x, b - a, dt * s.engines.max(1) as f64));
            }
            _ => flush(&mut run, &mut out),
        }
    }
    flush(&mut run, &mut out);
    out
}

impl GaugePeaks {
    fn observe(&mut self, s: &Snapshot, ns: &str) {
        let up = |slot: &mut Option<f64>, v: Option<f64>| {
            if let Some(v) = v {
                *slot = Some(slot.map_or(v, |p: f64| p.max(v)));
            }
        };
        let d = Delta::new(None, &s.scrape, ns);
        up(
            &mut self.kv_cache_usage,
            s.scrape.max(&s.scrape.kv_usage_name(ns), &[]),
        );
        up(
            &mut self.waiting,
            s.scrape.sum(&d.name(names::NUM_REQUESTS_WAITING), &[]),
        );
        up(
            &mut self.running,
            s.scrape.sum(&d.name(names::NUM_REQUESTS_RUNNING), &[]),
        );
        self.samples += 1;
        let busy_name = d.counter_name(names::DEVICE_BUSY_SECONDS);
        self.series.push(ServerSample {
            at: s.at,
            running: s.scrape.sum(&d.name(names::NUM_REQUESTS_RUNNING), &[]),
            waiting: s.scrape.sum(&d.name(names::NUM_REQUESTS_WAITING), &[]),
            kv_cache_usage: s.scrape.max(&s.scrape.kv_usage_name(ns), &[]),
            device_busy_s: s.scrape.sum(&busy_name, &[]),
            engines: s.scrape.label_values(&busy_name, "engine").len().max(1),
            preemptions: s.scrape.sum(&d.counter_name(names::NUM_PREEMPTIONS), &[]),
        });
    }
}

/// Samples gauges in the background until stopped.
pub struct GaugeSampler {
    task: JoinHandle<()>,
    peaks: Arc<Mutex<GaugePeaks>>,
}

impl GaugeSampler {
    /// Starts sampling `url` every `interval`, with `api_key` as a bearer
    /// token when given.
    pub fn start(
        url: String,
        api_key: Option<String>,
        ns: &'static str,
        interval: Duration,
    ) -> Self {
        let peaks = Arc::new(Mutex::new(GaugePeaks::default()));
        let p = peaks.clone();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                if let Ok(s) = scrape(&url, api_key.as_deref()).await {
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
    /// Client TTFT `(p50, p99)` in ms, to place inside the server's buckets.
    pub ttft_ms: Option<(f64, Option<f64>)>,
    /// Client ITL `(p50, p99)` in ms.
    pub itl_ms: Option<(f64, Option<f64>)>,
    /// Client end-to-end latency `(p50, p99)` in ms.
    pub e2e_ms: Option<(f64, Option<f64>)>,
}

/// Latency summary from a histogram delta. Buckets only say where a
/// quantile lies, so quantiles are kept as their bucket, never interpolated.
#[derive(Debug, Clone, PartialEq)]
pub struct HistSummary {
    /// Mean (sum / count), ms: exact.
    pub mean_ms: f64,
    /// The median's bucket, seconds.
    pub p50: BucketBound,
    /// The 99th percentile's bucket, seconds.
    pub p99: BucketBound,
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

fn summarize(h: Option<inferscope_schema::scrape::Histogram>) -> Option<HistSummary> {
    let d = h?;
    Some(HistSummary {
        mean_ms: d.mean()? * 1000.0,
        p50: d.quantile_bucket(0.5)?,
        p99: d.quantile_bucket(0.99)?,
        count: d.count,
    })
}

/// Builds the view from the two scrapes and the gauge peaks. Counters that
/// went down between the scrapes (a server restart) count from zero.
pub fn server_view(before: &Snapshot, after: &Snapshot, ns: &str, peaks: GaugePeaks) -> ServerView {
    let d = Delta::new(Some(&before.scrape), &after.scrape, ns);
    let wall = after.at.duration_since(before.at).as_secs_f64();
    let busy_name = d.counter_name(names::DEVICE_BUSY_SECONDS);
    let engines = after.scrape.label_values(&busy_name, "engine").len().max(1);
    let device_utilisation = d
        .counter(names::DEVICE_BUSY_SECONDS, &[])
        .and_then(|busy| utilisation(busy, wall, engines));
    ServerView {
        namespace: ns.to_string(),
        finished: d.counter_by(names::REQUEST_SUCCESS, "finished_reason"),
        generation_tokens: d.counter(names::GENERATION_TOKENS, &[]),
        prompt_tokens: d.counter(names::PROMPT_TOKENS, &[]),
        preemptions: d.counter(names::NUM_PREEMPTIONS, &[]),
        ttft: summarize(d.histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[])),
        itl: summarize(d.inter_token_latency(&[])),
        e2e: summarize(d.histogram(names::E2E_REQUEST_LATENCY_SECONDS, &[])),
        queue: summarize(d.histogram(names::REQUEST_QUEUE_TIME_SECONDS, &[])),
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

/// The server's bucket and, when the client measured the same quantile,
/// whether the client's value (ms) lies inside it: two numbers that only look
/// equally precise are never compared.
fn in_bucket(b: &BucketBound, client_ms: Option<f64>) -> String {
    let text = b.secs_text_named();
    match client_ms {
        Some(ms) => {
            let verdict = if b.contains(ms / 1000.0) {
                "agree"
            } else {
                "<-- disagree"
            };
            format!("{text}; client {ms:.2} ms: {verdict}")
        }
        None => text,
    }
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
    for (title, h, client) in [
        ("Server TTFT", &v.ttft, c.ttft_ms),
        ("Server ITL", &v.itl, c.itl_ms),
        ("Server E2E latency", &v.e2e, c.e2e_ms),
        ("Server queue time", &v.queue, None),
    ] {
        header(&mut s, title, '-');
        match h {
            Some(h) => {
                line(&mut s, "Mean (ms):", format!("{:.2}", h.mean_ms));
                let (c50, c99) = client.map_or((None, None), |(a, b)| (Some(a), b));
                line(&mut s, "P50 (server bucket):", in_bucket(&h.p50, c50));
                line(&mut s, "P99 (server bucket):", in_bucket(&h.p99, c99));
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
        // Two engines; cumulative buckets 0.1 → 1·scale, 0.2 → 2·scale, +Inf → 2.5·scale.
        let p = inferscope_schema::schema::name_prefix(ns);
        let mut t = String::new();
        for e in ["0", "1"] {
            for (le, c) in [("0.1", 1.0), ("0.2", 2.0), ("+Inf", 2.5)] {
                t.push_str(&format!(
                    "{p}time_to_first_token_seconds_bucket{{engine=\"{e}\",le=\"{le}\"}} {}\n",
                    c * scale
                ));
            }
            t.push_str(&format!(
                "{p}time_to_first_token_seconds_sum{{engine=\"{e}\"}} {}\n",
                0.5 * scale
            ));
            t.push_str(&format!(
                "{p}time_to_first_token_seconds_count{{engine=\"{e}\"}} {}\n",
                2.5 * scale
            ));
            t.push_str(&format!(
                "{p}request_success_total{{engine=\"{e}\",finished_reason=\"length\"}} {}\n",
                10.0 * scale
            ));
            t.push_str(&format!(
                "{p}generation_tokens_total{{engine=\"{e}\"}} {}\n",
                100.0 * scale
            ));
            t.push_str(&format!(
                "{p}kv_cache_usage_perc{{engine=\"{e}\"}} {}\n",
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
        let d = Delta::new(Some(&before.scrape), &after.scrape, "vllm")
            .histogram(names::TIME_TO_FIRST_TOKEN_SECONDS, &[])
            .expect("histogram");
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
    fn report_quantiles_are_buckets_compared_by_containment() {
        // vLLM's first queue bucket is 0–300 ms: a median in it is only
        // known to be ≤ 300 ms; interpolation would print 150 ms.
        let queue = |n: f64| {
            format!(
                "vllm:request_queue_time_seconds_bucket{{le=\"0.3\"}} {n}\n\
                 vllm:request_queue_time_seconds_bucket{{le=\"0.5\"}} {n}\n\
                 vllm:request_queue_time_seconds_bucket{{le=\"+Inf\"}} {n}\n\
                 vllm:request_queue_time_seconds_sum {}\n\
                 vllm:request_queue_time_seconds_count {n}\n",
                n * 0.0065
            )
        };
        let before = Snapshot::from_text(&(hist("vllm", 1.0) + &queue(0.0)));
        let after = Snapshot::from_text(&(hist("vllm", 3.0) + &queue(40.0)));
        let v = server_view(&before, &after, "vllm", GaugePeaks::default());
        let q = v.queue.as_ref().expect("queue");
        assert_eq!((q.p50.lower, q.p50.upper), (0.0, 0.3));
        let text = render(
            &v,
            &ClientCounts {
                completed: 40,
                // TTFT: the server's p50 bucket is 100–200 ms, p99 above 200 ms.
                ttft_ms: Some((150.0, Some(90.0))),
                ..Default::default()
            },
        );
        assert!(text.contains("≤ 300 ms (first bucket)"), "{text}");
        assert!(
            !text.contains("150.00 ms\n") && !text.contains(" 150.00\n"),
            "{text}"
        );
        assert!(
            text.contains("in 100–200 ms; client 150.00 ms: agree"),
            "{text}"
        );
        assert!(
            text.contains("> 200 ms (last bucket); client 90.00 ms: <-- disagree"),
            "{text}"
        );
        // No quantile line prints a bare number as if it were measured.
        for l in text
            .lines()
            .filter(|l| l.starts_with("P50") || l.starts_with("P99"))
        {
            let value = l.split(':').nth(1).unwrap_or("").trim_start();
            assert!(
                value.starts_with('≤') || value.starts_with("in ") || value.starts_with('>'),
                "{l}"
            );
        }
    }

    #[test]
    fn a_restart_between_scrapes_counts_from_zero() {
        // The server restarted during the run: every counter went down, and
        // what it counted since the restart is the delta (never negative).
        let before = Snapshot::from_text(&hist("inferscope", 3.0));
        let after = Snapshot::from_text(&hist("inferscope", 1.0));
        let v = server_view(&before, &after, "inferscope", GaugePeaks::default());
        assert_eq!(v.finished.get("length"), Some(&20.0));
        assert_eq!(v.generation_tokens, Some(200.0));
        assert_eq!(v.ttft.map(|h| h.count), Some(5.0));
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

    #[test]
    fn server_series_share_the_run_time_axis() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let sample = |ms, busy, pre| ServerSample {
            at: at(ms),
            running: Some(2.0),
            waiting: None,
            kv_cache_usage: Some(0.25),
            device_busy_s: Some(busy),
            engines: 2,
            preemptions: Some(pre),
        };
        // Busy 0.5 s of 2 engines × 0.5 s: 50 %; then the server restarts
        // (counters drop) and counts 1 preemption after it.
        let samples = vec![
            sample(1000, 1.0, 3.0),
            sample(1500, 1.5, 5.0),
            sample(2000, 0.2, 1.0),
        ];
        let s = server_series(&samples, at(500));
        assert_eq!(s.running, vec![(0.5, 2.0), (1.0, 2.0), (1.5, 2.0)]);
        assert!(s.waiting.is_empty());
        assert_eq!(s.kv_usage_pct[0], (0.5, 25.0));
        assert_eq!(s.device_util_pct, vec![(1.0, 50.0)]);
        assert_eq!(s.preemptions, vec![(0.5, 0.0), (1.0, 2.0), (1.5, 3.0)]);
        // A sample taken before the run starts sits at 0 s.
        assert_eq!(server_series(&samples, at(1200)).running[0].0, 0.0);
    }

    #[test]
    fn device_utilisation_never_reads_above_100_percent() {
        // One engine sampled every 100 ms, always busy, with 150 ms steps:
        // the counter moves by 0.15 s at each step's end, so raw intervals
        // read 0 %, 150 %, 150 %, 0 % ... The aligned series keeps every
        // interval within 100 % and the busy time whole.
        let t0 = Instant::now();
        let mut samples = Vec::new();
        for i in 0..=12u64 {
            let steps_done = (i * 100 / 150) as f64;
            samples.push(ServerSample {
                at: t0 + Duration::from_millis(100 * i),
                running: None,
                waiting: None,
                kv_cache_usage: None,
                device_busy_s: Some(0.15 * steps_done),
                engines: 1,
                preemptions: None,
            });
        }
        let u = server_series(&samples, t0).device_util_pct;
        assert_eq!(u.len(), 12);
        assert!(
            u.iter().all(|&(_, v)| (0.0..=100.0 + 1e-9).contains(&v)),
            "{u:?}"
        );
        let total: f64 = u.iter().map(|&(_, v)| v / 100.0 * 0.1).sum();
        assert!((total - 1.2).abs() < 1e-9, "busy {total} of 1.2 s counted");
        // A restart (the counter goes down) ends an aligned run.
        samples[6].device_busy_s = Some(0.0);
        let u = server_series(&samples, t0).device_util_pct;
        assert!(u.iter().all(|&(_, v)| v <= 100.0 + 1e-9), "{u:?}");
    }
}

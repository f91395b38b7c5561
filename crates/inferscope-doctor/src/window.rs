//! Scrapes of `/metrics` turned into a window: counter and histogram deltas
//! between the first and the last scrape, rates, gauge means and peaks over
//! every scrape, and quantiles as the bucket they lie in (from bucket deltas) — per engine and
//! in total. Everything the rules and the live view read is in [`Summary`].

use inferscope_schema::scrape::{
    BucketBound, Delta, LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS, counter_delta, full_name, utilisation,
};
use inferscope_schema::{names, schema};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

// The parsing, sums and histogram deltas are the schema crate's.
pub use inferscope_schema::scrape::{Histogram, Scrape};

/// Mean and quantiles of the observations made in the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Dist {
    /// Observations in the window.
    pub count: f64,
    /// Mean (exact: from `_sum` and `_count`); `None` without observations
    /// or when the server does not expose `_sum`.
    pub mean: Option<f64>,
    /// The median's bucket: buckets say no more than that.
    pub p50: Option<Bucket>,
    /// The 99th percentile's bucket.
    pub p99: Option<Bucket>,
}

/// The bucket a quantile lies in. JSON carries the bounds (`hi` is `null`
/// above the highest finite bound), never an interpolated value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bucket {
    /// Lower bound (exclusive; 0 for the first bucket).
    pub lo: f64,
    /// Upper bound (inclusive); `None` for the `+Inf` bucket.
    pub hi: Option<f64>,
    /// The bucket as the schema crate computed it (text, containment).
    #[serde(skip)]
    pub bound: BucketBound,
}

impl Bucket {
    /// Wraps the schema crate's bucket.
    pub fn new(bound: BucketBound) -> Self {
        Bucket {
            lo: bound.lower,
            hi: bound.upper.is_finite().then_some(bound.upper),
            bound,
        }
    }
}

/// Host time spent per phase of the engine step, and device time, in seconds
/// per second of wall time summed over engines.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phases {
    /// Building the batch.
    pub schedule: f64,
    /// The executor call, device time included.
    pub execute: f64,
    /// Appending tokens, stop checks, shipping outputs.
    pub postprocess: f64,
    /// Device time (part of `execute`), when known.
    pub device: Option<f64>,
}

/// Structured-output mask computation in the window (inferscope's
/// `grammar_mask_duration_seconds`), summed over engines.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GrammarMasks {
    /// Steps that computed masks (steps with a constrained sequence).
    pub steps: f64,
    /// Wall seconds spent computing them.
    pub seconds: f64,
    /// All engine steps (`engine_step_duration_seconds{phase="execute"}`),
    /// when exported.
    pub all_steps: Option<f64>,
}

/// What one engine did in the window.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct EngineStats {
    /// The `engine` label (`""` when the server does not label engines).
    pub engine: String,
    /// Mean of the running-requests gauge over the scrapes.
    pub running_mean: Option<f64>,
    /// Largest value of the running-requests gauge.
    pub running_peak: Option<f64>,
    /// Last value of the running-requests gauge.
    pub running_now: Option<f64>,
    /// Mean of the waiting-requests gauge.
    pub waiting_mean: Option<f64>,
    /// Largest value of the waiting-requests gauge.
    pub waiting_peak: Option<f64>,
    /// Last value of the waiting-requests gauge.
    pub waiting_now: Option<f64>,
    /// Mean KV-cache usage, fraction 0..1.
    pub kv_usage_mean: Option<f64>,
    /// Largest KV-cache usage seen.
    pub kv_usage_peak: Option<f64>,
    /// Last KV-cache usage.
    pub kv_usage_now: Option<f64>,
    /// Prompt (prefill) tokens per second.
    pub prompt_tokens_per_s: Option<f64>,
    /// Generated tokens per second.
    pub generation_tokens_per_s: Option<f64>,
    /// Requests finished in the window (all reasons).
    pub finished: Option<f64>,
    /// Preemptions in the window.
    pub preemptions: Option<f64>,
    /// Device busy time per second of wall time, fraction 0..1.
    pub device_utilisation: Option<f64>,
    /// Time the engine loop waited with nothing to run, fraction 0..1.
    pub idle_fraction: Option<f64>,
    /// KV blocks of the engine (`cache_config_info`).
    pub num_gpu_blocks: Option<f64>,
}

/// Everything measured over one window, in total and per engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Metric namespace read (`inferscope`, `vllm`).
    pub namespace: String,
    /// Seconds between the first and the last scrape.
    pub window_s: f64,
    /// Scrapes used for the gauges.
    pub scrapes: usize,
    /// Per engine, sorted by engine label.
    pub engines: Vec<EngineStats>,
    /// Mean over scrapes of running requests summed over engines.
    pub running_mean: Option<f64>,
    /// Peak of running requests summed over engines.
    pub running_peak: Option<f64>,
    /// Mean over scrapes of waiting requests summed over engines.
    pub waiting_mean: Option<f64>,
    /// Peak of waiting requests summed over engines.
    pub waiting_peak: Option<f64>,
    /// Largest KV-cache usage of any engine.
    pub kv_usage_peak: Option<f64>,
    /// Mean KV-cache usage over engines and scrapes.
    pub kv_usage_mean: Option<f64>,
    /// Prompt tokens per second, all engines.
    pub prompt_tokens_per_s: Option<f64>,
    /// Generated tokens per second, all engines.
    pub generation_tokens_per_s: Option<f64>,
    /// Finished requests in the window by `finished_reason`.
    pub finished_by_reason: BTreeMap<String, f64>,
    /// Prompt plus generation tokens in the window by `tenant` label (empty
    /// where the server exposes no tenant label).
    pub tenant_tokens: BTreeMap<String, f64>,
    /// Finished requests per second (all reasons).
    pub requests_per_s: Option<f64>,
    /// Preemptions in the window.
    pub preemptions: Option<f64>,
    /// Requests refused at admission in the window.
    pub admission_rejections: Option<f64>,
    /// HTTP responses in the window by status class.
    pub http_by_status: BTreeMap<String, f64>,
    /// Prompt tokens looked up in the prefix cache in the window.
    pub prefix_cache_queries: Option<f64>,
    /// Of those, tokens found.
    pub prefix_cache_hits: Option<f64>,
    /// Prompt tokens in the window taken from the prefix cache and computed
    /// (`prompt_tokens_by_source`: local_cache_hit, local_compute), each
    /// prompt counted once; `None` where the server does not export it.
    pub prompt_tokens_by_source: Option<(f64, f64)>,
    /// `enable_prefix_caching` from `cache_config_info`.
    pub prefix_caching_enabled: Option<bool>,
    /// Time to first token, seconds.
    pub ttft: Option<Dist>,
    /// Inter-token latency, seconds.
    pub itl: Option<Dist>,
    /// End-to-end request latency, seconds.
    pub e2e: Option<Dist>,
    /// Time spent waiting before the first schedule, seconds.
    pub queue: Option<Dist>,
    /// Time from first schedule to first token, seconds.
    pub prefill: Option<Dist>,
    /// Prompt length per request, tokens.
    pub prompt_len: Option<Dist>,
    /// Tokens per engine step.
    pub iteration_tokens: Option<Dist>,
    /// Mean device utilisation over engines, fraction.
    pub device_utilisation: Option<f64>,
    /// Mean idle fraction of the engine loops.
    pub idle_fraction: Option<f64>,
    /// Host time per phase (seconds per second, summed over engines).
    pub phases: Option<Phases>,
    /// Grammar-mask computation, when the server exports it.
    pub grammar_masks: Option<GrammarMasks>,
    /// Families the rules would read that the server does not expose.
    pub missing: Vec<String>,
}

/// vLLM V1 before 0.11 named the prefix-cache query counter so (deprecated
/// in 0.10 for `prefix_cache_queries`).
pub const LEGACY_GPU_PREFIX_CACHE_QUERIES: &str = "gpu_prefix_cache_queries";
/// The hits counter paired with [`LEGACY_GPU_PREFIX_CACHE_QUERIES`].
pub const LEGACY_GPU_PREFIX_CACHE_HITS: &str = "gpu_prefix_cache_hits";

/// Families only inferscope exposes: the device and host view.
pub const HOST_FAMILIES: [&str; 3] = [
    names::DEVICE_BUSY_SECONDS,
    names::ENGINE_STEP_DURATION_SECONDS,
    names::ENGINE_IDLE_SECONDS,
];

/// A series of scrapes of one server, oldest first, with their times.
#[derive(Debug, Clone)]
pub struct Window {
    /// Namespace the names are read under.
    pub namespace: String,
    /// `(seconds since the first scrape, scrape)`, oldest first; at least one.
    pub scrapes: Vec<(f64, Scrape)>,
}

/// `None` only when the histogram is absent: an empty one has count 0, so
/// rules can tell "no traffic" from "not exported". `has_sum` says whether
/// the exposition carries `_sum` (a partial one may not): without it the
/// mean is unknown, not 0. Without `_count` the highest bucket is the count
/// (buckets are cumulative; with `+Inf` it is exactly the count).
fn dist(h: &Histogram, has_sum: bool) -> Option<Dist> {
    let highest = h.buckets.last().map_or(0.0, |b| b.1);
    let count = if h.count > 0.0 { h.count } else { highest };
    Some(Dist {
        count,
        mean: (has_sum && count > 0.0).then(|| h.sum / count),
        p50: h.quantile_bucket(0.5).map(Bucket::new),
        p99: h.quantile_bucket(0.99).map(Bucket::new),
    })
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

fn peak(v: &[f64]) -> Option<f64> {
    v.iter().copied().reduce(f64::max)
}

impl Window {
    /// A window over `scrapes`; the namespace is `forced` or detected from
    /// the last scrape (`inferscope` when nothing is recognisable).
    pub fn new(scrapes: Vec<(f64, Scrape)>, forced: Option<&str>) -> Self {
        let namespace = forced
            .map(str::to_string)
            .or_else(|| {
                scrapes
                    .last()
                    .and_then(|(_, s)| s.detect_namespace())
                    .map(str::to_string)
            })
            .unwrap_or_else(|| schema::DEFAULT_NAMESPACE.to_string());
        Window { namespace, scrapes }
    }

    fn first(&self) -> Option<&Scrape> {
        self.scrapes.first().map(|(_, s)| s)
    }

    fn last(&self) -> Option<&Scrape> {
        self.scrapes.last().map(|(_, s)| s)
    }

    fn seconds(&self) -> f64 {
        match (self.scrapes.first(), self.scrapes.last()) {
            (Some((a, _)), Some((b, _))) => b - a,
            _ => 0.0,
        }
    }

    fn name(&self, base: &str) -> String {
        full_name(&self.namespace, base)
    }

    /// The change from the first to the last scrape.
    fn pair(&self) -> Option<Delta<'_>> {
        Some(Delta::new(self.first(), self.last()?, &self.namespace))
    }

    /// The exposed name of counter `base`: with `_total`, else bare.
    fn counter_name(&self, base: &str) -> String {
        match self.pair() {
            Some(d) => d.counter_name(base),
            None => self.name(&format!("{base}_total")),
        }
    }

    /// Delta of a counter over the window, for the label sets matching `filter`.
    pub fn delta(&self, full_name: &str, filter: &[(&str, &str)]) -> Option<f64> {
        self.pair()?.counter_exposed(full_name, filter)
    }

    fn ns_delta(&self, base: &str, filter: &[(&str, &str)]) -> Option<f64> {
        self.pair()?.counter(base, filter)
    }

    /// Delta of a counter per value of `label`.
    fn delta_by(&self, full_name: &str, label: &str) -> BTreeMap<String, f64> {
        self.pair()
            .map(|d| d.counter_exposed_by(full_name, label))
            .unwrap_or_default()
    }

    /// Histogram of the observations made in the window.
    pub fn hist(&self, base: &str, filter: &[(&str, &str)]) -> Option<Histogram> {
        self.pair()?.histogram(base, filter)
    }

    fn hist_dist(&self, base: &str, filter: &[(&str, &str)]) -> Option<Dist> {
        let has_sum = self.has_sum(base);
        self.hist(base, filter)
            .as_ref()
            .and_then(|h| dist(h, has_sum))
    }

    /// Whether the last scrape carries `_sum` of histogram `base` (a schema
    /// name): published samples of vLLM's output sometimes lack it.
    pub fn has_sum(&self, base: &str) -> bool {
        self.last()
            .is_some_and(|s| s.has(&format!("{}_sum", self.name(base))))
    }

    /// Prefix-cache queries and hits in the window, as a pair from one
    /// generation of names: vLLM's V1 `prefix_cache_*`, else its deprecated
    /// `gpu_prefix_cache_*` (V1 before 0.11; counted blocks at first, tokens
    /// later, so the two generations are never mixed in one ratio).
    fn prefix_cache(&self, filter: &[(&str, &str)]) -> (Option<f64>, Option<f64>) {
        let pair = |q: &str, h: &str| match (self.ns_delta(q, filter), self.ns_delta(h, filter)) {
            (Some(q), Some(h)) => Some((q, h)),
            _ => None,
        };
        pair(names::PREFIX_CACHE_QUERIES, names::PREFIX_CACHE_HITS)
            .or_else(|| {
                pair(
                    LEGACY_GPU_PREFIX_CACHE_QUERIES,
                    LEGACY_GPU_PREFIX_CACHE_HITS,
                )
            })
            .map_or((None, None), |(q, h)| (Some(q), Some(h)))
    }

    /// Values of a gauge over the scrapes (summed over matching label sets).
    fn gauge_series(&self, full_name: &str, filter: &[(&str, &str)]) -> Vec<f64> {
        self.scrapes
            .iter()
            .filter_map(|(_, s)| s.sum(full_name, filter))
            .collect()
    }

    fn kv_name(&self) -> String {
        match self.last() {
            Some(s) => s.kv_usage_name(&self.namespace),
            None => self.name(names::KV_CACHE_USAGE_PERC),
        }
    }

    fn engine_ids(&self) -> Vec<String> {
        let Some(last) = self.last() else {
            return Vec::new();
        };
        let mut ids = BTreeSet::new();
        for base in [names::NUM_REQUESTS_RUNNING, names::NUM_REQUESTS_WAITING] {
            ids.extend(last.label_values(&self.name(base), "engine"));
        }
        ids.extend(last.label_values(&self.kv_name(), "engine"));
        if ids.is_empty() {
            // No engine gauge (a partial exposition): the engines any of the
            // namespace's series name.
            let prefix = self.name("");
            ids.extend(
                last.samples
                    .iter()
                    .filter(|s| s.name.starts_with(&prefix))
                    .filter_map(|s| s.label("engine").map(str::to_string)),
            );
        }
        if ids.is_empty() && last.has(&self.name(names::NUM_REQUESTS_RUNNING)) {
            // A server without an engine label: one anonymous engine.
            ids.insert(String::new());
        }
        // Numeric ranks sort numerically ("2" before "10").
        let mut ids: Vec<String> = ids.into_iter().collect();
        ids.sort_by_key(|e| (e.parse::<u64>().unwrap_or(u64::MAX), e.clone()));
        ids
    }

    fn engine_stats(&self, engine: &str) -> EngineStats {
        let secs = self.seconds();
        let f: Vec<(&str, &str)> = if engine.is_empty() {
            Vec::new()
        } else {
            vec![("engine", engine)]
        };
        let rate = |d: Option<f64>| d.filter(|_| secs > 0.0).map(|d| d / secs);
        let gauge = |base: &str| self.gauge_series(&self.name(base), &f);
        let (running, waiting) = (
            gauge(names::NUM_REQUESTS_RUNNING),
            gauge(names::NUM_REQUESTS_WAITING),
        );
        let kv_name = self.kv_name();
        let kv: Vec<f64> = self
            .scrapes
            .iter()
            // Per engine the gauge is one series; take the max, not a sum,
            // in case a server repeats it under other labels.
            .filter_map(|(_, s)| s.max(&kv_name, &f))
            .collect();
        let finished = self.ns_delta(names::REQUEST_SUCCESS, &f);
        let num_gpu_blocks = self.last().and_then(|s| {
            s.label_of(&self.name(names::CACHE_CONFIG_INFO), &f, "num_gpu_blocks")
                .and_then(|v| v.parse().ok())
        });
        EngineStats {
            engine: engine.to_string(),
            running_mean: mean(&running),
            running_peak: peak(&running),
            running_now: running.last().copied(),
            waiting_mean: mean(&waiting),
            waiting_peak: peak(&waiting),
            waiting_now: waiting.last().copied(),
            kv_usage_mean: mean(&kv),
            kv_usage_peak: peak(&kv),
            kv_usage_now: kv.last().copied(),
            prompt_tokens_per_s: rate(self.ns_delta(names::PROMPT_TOKENS, &f)),
            generation_tokens_per_s: rate(self.ns_delta(names::GENERATION_TOKENS, &f)),
            finished,
            preemptions: self.ns_delta(names::NUM_PREEMPTIONS, &f),
            device_utilisation: self
                .ns_delta(names::DEVICE_BUSY_SECONDS, &f)
                .and_then(|busy| utilisation(busy, secs, 1)),
            idle_fraction: rate(self.ns_delta(names::ENGINE_IDLE_SECONDS, &f)),
            num_gpu_blocks,
        }
    }

    /// Failed plus refused requests in the window's earlier and later halves
    /// (needs three scrapes or more), to tell a rising failure rate. Failures
    /// are counted as the summary counts them: the larger of errored requests
    /// and 5xx responses (a dead engine answers 503 before a request exists).
    pub fn failure_trend(&self) -> Option<(f64, f64)> {
        if self.scrapes.len() < 3 {
            return None;
        }
        let counts = |s: &Scrape| {
            let errors = s
                .sum(
                    &self.counter_name(names::REQUEST_SUCCESS),
                    &[("finished_reason", "error")],
                )
                .unwrap_or(0.0);
            let http_5xx = s
                .sum(
                    &schema::HTTP_REQUESTS.exposed_name(""),
                    &[("status", "5xx")],
                )
                .unwrap_or(0.0);
            let rejected = s
                .sum(&self.counter_name(names::ADMISSION_REJECTIONS), &[])
                .unwrap_or(0.0);
            [errors, http_5xx, rejected]
        };
        let half = |from: &Scrape, to: &Scrape| {
            let (a, z) = (counts(from), counts(to));
            let d = |i: usize| counter_delta(z[i], Some(a[i]));
            d(0).max(d(1)) + d(2)
        };
        let mid = &self.scrapes[self.scrapes.len() / 2].1;
        let (first, last) = (self.first()?, self.last()?);
        Some((half(first, mid), half(mid, last)))
    }

    /// Computes the summary of the window.
    pub fn summary(&self) -> Summary {
        let secs = self.seconds();
        let rate = |d: Option<f64>| d.filter(|_| secs > 0.0).map(|d| d / secs);
        let engines: Vec<EngineStats> = self
            .engine_ids()
            .iter()
            .map(|e| self.engine_stats(e))
            .collect();
        let running = self.gauge_series(&self.name(names::NUM_REQUESTS_RUNNING), &[]);
        let waiting = self.gauge_series(&self.name(names::NUM_REQUESTS_WAITING), &[]);
        let kv_means: Vec<f64> = engines.iter().filter_map(|e| e.kv_usage_mean).collect();
        let finished_by_reason = self.delta_by(
            &self.counter_name(names::REQUEST_SUCCESS),
            "finished_reason",
        );
        let mut tenant_tokens = self.delta_by(&self.counter_name(names::PROMPT_TOKENS), "tenant");
        for (tenant, n) in self.delta_by(&self.counter_name(names::GENERATION_TOKENS), "tenant") {
            *tenant_tokens.entry(tenant).or_default() += n;
        }
        let finished_total =
            (!finished_by_reason.is_empty()).then(|| finished_by_reason.values().sum::<f64>());
        let prefix_caching_enabled = self.last().and_then(|s| {
            s.label_of(
                &self.name(names::CACHE_CONFIG_INFO),
                &[],
                "enable_prefix_caching",
            )
            .map(|v| v.eq_ignore_ascii_case("true"))
        });
        let (prefix_cache_queries, prefix_cache_hits) = self.prefix_cache(&[]);
        let engines_n = engines.len().max(1) as f64;
        let device_utilisation = self
            .ns_delta(names::DEVICE_BUSY_SECONDS, &[])
            .and_then(|busy| utilisation(busy, secs, engines.len()));
        let idle_fraction =
            rate(self.ns_delta(names::ENGINE_IDLE_SECONDS, &[])).map(|u| u / engines_n);
        let phase = |p: &str| {
            self.hist(names::ENGINE_STEP_DURATION_SECONDS, &[("phase", p)])
                .filter(|_| secs > 0.0)
                .map(|h| h.sum / secs)
        };
        let phases = match (phase("schedule"), phase("execute"), phase("postprocess")) {
            (Some(schedule), Some(execute), Some(postprocess)) => Some(Phases {
                schedule,
                execute,
                postprocess,
                device: rate(self.ns_delta(names::DEVICE_BUSY_SECONDS, &[])),
            }),
            _ => None,
        };
        let grammar_masks = self
            .hist(names::GRAMMAR_MASK_DURATION_SECONDS, &[])
            .map(|h| GrammarMasks {
                steps: h.count,
                seconds: h.sum,
                all_steps: self
                    .hist(names::ENGINE_STEP_DURATION_SECONDS, &[("phase", "execute")])
                    .map(|h| h.count),
            });
        let missing = match self.last() {
            Some(last) => HOST_FAMILIES
                .iter()
                .filter(|b| {
                    let n = self.name(b);
                    !last.has(&format!("{n}_total"))
                        && !last.has(&n)
                        && !last.has(&format!("{n}_count"))
                })
                .map(|b| self.name(b))
                .collect(),
            None => Vec::new(),
        };
        Summary {
            tenant_tokens,
            namespace: self.namespace.clone(),
            window_s: secs,
            scrapes: self.scrapes.len(),
            running_mean: mean(&running),
            running_peak: peak(&running),
            waiting_mean: mean(&waiting),
            waiting_peak: peak(&waiting),
            kv_usage_peak: engines
                .iter()
                .filter_map(|e| e.kv_usage_peak)
                .reduce(f64::max),
            kv_usage_mean: mean(&kv_means),
            prompt_tokens_per_s: rate(self.ns_delta(names::PROMPT_TOKENS, &[])),
            generation_tokens_per_s: rate(self.ns_delta(names::GENERATION_TOKENS, &[])),
            requests_per_s: rate(finished_total),
            finished_by_reason,
            preemptions: self.ns_delta(names::NUM_PREEMPTIONS, &[]),
            admission_rejections: self.ns_delta(names::ADMISSION_REJECTIONS, &[]),
            http_by_status: self.delta_by(&schema::HTTP_REQUESTS.exposed_name(""), "status"),
            prefix_cache_queries,
            prefix_cache_hits,
            prompt_tokens_by_source: {
                let by = |source: &str| {
                    self.ns_delta(names::PROMPT_TOKENS_BY_SOURCE, &[("source", source)])
                };
                by(schema::PROMPT_TOKEN_SOURCES[1]).zip(by(schema::PROMPT_TOKEN_SOURCES[0]))
            },
            prefix_caching_enabled,
            ttft: self.hist_dist(names::TIME_TO_FIRST_TOKEN_SECONDS, &[]),
            // Older vLLM exports the per-token gap as `time_per_output_token_seconds`.
            itl: self
                .hist_dist(names::INTER_TOKEN_LATENCY_SECONDS, &[])
                .or_else(|| self.hist_dist(LEGACY_TIME_PER_OUTPUT_TOKEN_SECONDS, &[])),
            e2e: self.hist_dist(names::E2E_REQUEST_LATENCY_SECONDS, &[]),
            queue: self.hist_dist(names::REQUEST_QUEUE_TIME_SECONDS, &[]),
            prefill: self.hist_dist(names::REQUEST_PREFILL_TIME_SECONDS, &[]),
            prompt_len: self.hist_dist(names::REQUEST_PROMPT_TOKENS, &[]),
            iteration_tokens: self.hist_dist(names::ITERATION_TOKENS, &[]),
            device_utilisation,
            idle_fraction,
            phases,
            grammar_masks,
            missing,
            engines,
        }
    }
}

impl Summary {
    /// Waiting requests at the last scrape, summed over engines.
    pub fn waiting_now_total(&self) -> Option<f64> {
        let v: Vec<f64> = self.engines.iter().filter_map(|e| e.waiting_now).collect();
        (!v.is_empty()).then(|| v.iter().sum())
    }

    /// Finished requests in the window, all reasons.
    pub fn finished_total(&self) -> f64 {
        self.finished_by_reason.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(k: f64, waiting: f64) -> String {
        format!(
            "inferscope_num_requests_running{{engine=\"0\"}} 2\n\
             inferscope_num_requests_running{{engine=\"1\"}} 1\n\
             inferscope_num_requests_waiting{{engine=\"0\"}} {waiting}\n\
             inferscope_num_requests_waiting{{engine=\"1\"}} 0\n\
             inferscope_kv_cache_usage_perc{{engine=\"0\"}} 0.5\n\
             inferscope_kv_cache_usage_perc{{engine=\"1\"}} 0.25\n\
             inferscope_generation_tokens_total{{engine=\"0\"}} {}\n\
             inferscope_generation_tokens_total{{engine=\"1\"}} {}\n\
             inferscope_request_success_total{{engine=\"0\",finished_reason=\"length\"}} {}\n\
             inferscope_device_busy_seconds_total{{engine=\"0\"}} {}\n\
             inferscope_device_busy_seconds_total{{engine=\"1\"}} 0\n\
             inferscope_e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"1\"}} {}\n\
             inferscope_e2e_request_latency_seconds_bucket{{engine=\"0\",le=\"+Inf\"}} {}\n\
             inferscope_e2e_request_latency_seconds_sum{{engine=\"0\"}} {}\n\
             inferscope_e2e_request_latency_seconds_count{{engine=\"0\"}} {}\n",
            100.0 * k,
            10.0 * k,
            5.0 * k,
            0.8 * k,
            4.0 * k,
            5.0 * k,
            2.0 * k,
            5.0 * k
        )
    }

    /// `text` plus a tokens-per-step histogram, spelled as `namespace` spells
    /// names (the helper's text is in the default spelling).
    fn spelled(namespace: &str, k: f64) -> String {
        let base = format!(
            "{}inferscope_iteration_tokens_bucket{{engine=\"0\",le=\"+Inf\"}} {}\n\
             inferscope_iteration_tokens_sum{{engine=\"0\"}} {}\n\
             inferscope_iteration_tokens_count{{engine=\"0\"}} {}\n",
            text(k, 1.0),
            10.0 * k,
            80.0 * k,
            10.0 * k
        );
        let iteration = schema::namespaced_name(namespace, names::ITERATION_TOKENS);
        base.replace("inferscope_iteration_tokens", &iteration)
            .replace("inferscope_", &schema::name_prefix(namespace))
    }

    #[test]
    fn every_spelling_of_the_names_reads_the_same() {
        // Today's names, older inferscope servers' and vLLM's.
        for ns in ["inferscope", "inferscope:", "vllm"] {
            let first = spelled(ns, 1.0);
            assert!(first.starts_with(&schema::name_prefix(ns)), "{first}");
            let w = Window::new(
                vec![
                    (0.0, Scrape::parse(&first)),
                    (2.0, Scrape::parse(&spelled(ns, 2.0))),
                ],
                None,
            );
            let s = w.summary();
            assert_eq!(s.namespace, ns);
            assert_eq!(s.engines.len(), 2, "{ns}");
            assert_eq!(s.generation_tokens_per_s, Some(55.0), "{ns}");
            assert_eq!(s.e2e.as_ref().map(|d| d.count), Some(5.0), "{ns}");
            // 10 steps of 8 tokens: read as `inferscope_iteration_tokens`
            // natively, `…:iteration_tokens_total` in vLLM's spelling.
            let it = s.iteration_tokens.expect("iteration tokens");
            assert_eq!((it.count, it.mean), (10.0, Some(8.0)), "{ns}");
        }
    }

    #[test]
    fn deltas_rates_gauges_and_resets() {
        let w = Window::new(
            vec![
                (0.0, Scrape::parse(&text(1.0, 0.0))),
                (1.0, Scrape::parse(&text(1.5, 4.0))),
                (2.0, Scrape::parse(&text(2.0, 2.0))),
            ],
            None,
        );
        let s = w.summary();
        assert_eq!(s.namespace, "inferscope");
        assert_eq!(s.window_s, 2.0);
        assert_eq!(s.engines.len(), 2);
        assert_eq!(s.generation_tokens_per_s, Some(55.0));
        assert_eq!(s.engines[0].generation_tokens_per_s, Some(50.0));
        assert_eq!(s.engines[0].waiting_mean, Some(2.0));
        assert_eq!(s.engines[0].waiting_peak, Some(4.0));
        assert_eq!(s.waiting_now_total(), Some(2.0));
        assert_eq!(s.engines[0].device_utilisation, Some(0.4));
        assert_eq!(s.device_utilisation, Some(0.2));
        assert_eq!(s.kv_usage_peak, Some(0.5));
        assert_eq!(s.finished_by_reason.get("length"), Some(&5.0));
        let e2e = s.e2e.expect("e2e");
        assert_eq!(e2e.count, 5.0);
        assert!((e2e.mean.expect("mean") - 0.4).abs() < 1e-12);
        // Only the host families the fixture lacks are reported missing.
        assert_eq!(
            s.missing,
            vec![
                "inferscope_engine_step_duration_seconds",
                "inferscope_engine_idle_seconds"
            ]
        );
        // A restart between scrapes: counters go down, the after value is the delta.
        let r = Window::new(
            vec![
                (0.0, Scrape::parse(&text(3.0, 0.0))),
                (1.0, Scrape::parse(&text(1.0, 0.0))),
            ],
            None,
        )
        .summary();
        assert_eq!(r.generation_tokens_per_s, Some(110.0));
        assert_eq!(r.e2e.map(|d| d.count), Some(5.0));
    }

    #[test]
    fn grammar_masks_are_read_beside_the_step_count() {
        let at = |k: f64| {
            Scrape::parse(&format!(
                "{}inferscope_grammar_mask_duration_seconds_bucket{{engine=\"0\",le=\"+Inf\"}} {}\n\
                 inferscope_grammar_mask_duration_seconds_sum{{engine=\"0\"}} {}\n\
                 inferscope_grammar_mask_duration_seconds_count{{engine=\"0\"}} {}\n\
                 inferscope_engine_step_duration_seconds_bucket{{engine=\"0\",phase=\"execute\",le=\"+Inf\"}} {}\n\
                 inferscope_engine_step_duration_seconds_sum{{engine=\"0\",phase=\"execute\"}} {}\n\
                 inferscope_engine_step_duration_seconds_count{{engine=\"0\",phase=\"execute\"}} {}\n\
                 inferscope_engine_step_duration_seconds_count{{engine=\"0\",phase=\"schedule\"}} {}\n",
                text(k, 0.0),
                100.0 * k,
                0.3 * k,
                100.0 * k,
                400.0 * k,
                2.0 * k,
                400.0 * k,
                400.0 * k,
            ))
        };
        let s = Window::new(vec![(0.0, at(1.0)), (2.0, at(3.0))], None).summary();
        let gm = s.grammar_masks.expect("grammar masks");
        assert_eq!((gm.steps, gm.all_steps), (200.0, Some(800.0)));
        assert!((gm.seconds - 0.6).abs() < 1e-9, "{}", gm.seconds);
        let none = Window::new(
            vec![
                (0.0, Scrape::parse(&text(1.0, 0.0))),
                (1.0, Scrape::parse(&text(2.0, 0.0))),
            ],
            None,
        )
        .summary();
        assert_eq!(none.grammar_masks, None);
    }

    #[test]
    fn device_utilisation_is_at_most_one() {
        // A 0.1 s window in which a step of 0.16 s ended (`top` refreshing
        // fast on a busy device): the busy counter moved more than the wall.
        let s = Window::new(
            vec![
                (0.0, Scrape::parse(&text(1.0, 0.0))),
                (0.1, Scrape::parse(&text(1.2, 0.0))),
            ],
            None,
        )
        .summary();
        assert_eq!(s.engines[0].device_utilisation, Some(1.0));
        let whole = s.device_utilisation.expect("utilisation");
        assert!((whole - 0.8).abs() < 1e-9, "{whole}");
    }

    #[test]
    fn failure_trend_counts_errors_or_5xx_and_rejections_per_half() {
        let at = |errors: f64, http_5xx: f64, rejected: f64| {
            Scrape::parse(&format!(
                "inferscope_request_success_total{{engine=\"0\",finished_reason=\"error\"}} {errors}\n\
                 http_requests_total{{handler=\"/v1/completions\",method=\"POST\",status=\"5xx\"}} {http_5xx}\n\
                 inferscope_admission_rejections_total{{reason=\"queue_full\"}} {rejected}\n"
            ))
        };
        let w = Window::new(
            vec![
                (0.0, at(0.0, 0.0, 0.0)),
                (1.0, at(2.0, 1.0, 1.0)),
                // An engine died: the 503s outnumber the errored requests.
                (2.0, at(4.0, 40.0, 1.0)),
            ],
            None,
        );
        assert_eq!(w.failure_trend(), Some((3.0, 39.0)));
        let two = Window::new(
            vec![(0.0, at(0.0, 0.0, 0.0)), (1.0, at(1.0, 1.0, 1.0))],
            None,
        );
        assert_eq!(two.failure_trend(), None, "needs three scrapes");
    }
}

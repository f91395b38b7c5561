//! `StatLoggerManager`: the one object the engine and the server talk to. It
//! owns the process's registry, fans each step out to the Prometheus logger
//! and the per-engine log-line loggers, and renders `/metrics`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use thiserror::Error;

use crate::exposition::{self, Format};
use crate::frontend::FrontendRecorder;
use crate::http::{HttpMetrics, HttpMetricsLayer};
use crate::log_line::{self, LogLineLogger};
use crate::prometheus::{
    CacheConfig, MetricFilter, OptionalMetrics, PrometheusLogger, every_metric,
};
use crate::reading::{EngineReading, Latency};
use crate::tenant_labels::TenantLabels;
use inferscope_schema::schema::{self, BucketOverrides, BucketsError};
use inferscope_schema::stats::{
    EngineFailure, FinishedRequestStats, IterationStats, SchedulerStats, StatsRecorder,
};

/// Everything the metrics system needs to know at start-up.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Namespace of engine metrics (`inferscope`, or `vllm` for compatibility).
    pub namespace: String,
    /// The `model_name` label (the served model name).
    pub model_name: String,
    /// Further `model_name`s with their own series (the proxy, in front of
    /// an upstream serving several models); empty on a server.
    pub more_model_names: Vec<String>,
    /// Global indices of the engines this process runs (`[0, 1]`, `[4, 5]`, …).
    pub engine_indices: Vec<usize>,
    /// Upper end of the 1-2-5 request-token buckets.
    pub max_model_len: usize,
    /// Bucket-group overrides.
    pub buckets: BucketOverrides,
    /// Cache configuration for `cache_config_info`: empty for none, one entry
    /// for every engine, or one entry per engine in `engine_indices` order.
    pub cache_configs: Vec<CacheConfig>,
    /// Register engine metrics for `/metrics`.
    pub enable_prometheus: bool,
    /// Emit the periodic log line.
    pub enable_log_stats: bool,
    /// One `N Engines Aggregated: …` line instead of one line per engine.
    pub aggregate_log_lines: bool,
    /// Which engine and model metrics `/metrics` exposes ([`every_metric`] on
    /// a server; the proxy leaves out the series only an engine knows, so they
    /// are absent rather than zero). HTTP metrics are always exposed.
    pub metric_filter: MetricFilter,
    /// The metrics behind a flag that are on (`--kv-cache-metrics`,
    /// `--enable-mfu-metrics`); off by default, as in vLLM.
    pub optional_metrics: OptionalMetrics,
    /// `--max-tenant-labels`: distinct `tenant` label values before the
    /// rest are counted as `other`.
    pub max_tenant_labels: usize,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            namespace: schema::DEFAULT_NAMESPACE.to_owned(),
            model_name: String::new(),
            more_model_names: Vec::new(),
            engine_indices: vec![0],
            max_model_len: 2048,
            buckets: BucketOverrides::default(),
            cache_configs: Vec::new(),
            enable_prometheus: true,
            enable_log_stats: true,
            aggregate_log_lines: false,
            metric_filter: every_metric,
            optional_metrics: OptionalMetrics::default(),
            max_tenant_labels: schema::DEFAULT_MAX_TENANT_LABELS,
        }
    }
}

/// A configuration the metrics system cannot start with.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ConfigError {
    /// The namespace is not `[a-zA-Z_][a-zA-Z0-9_]*`.
    #[error(
        "invalid metrics namespace {0:?}: expected letters, digits and underscores, not starting with a digit"
    )]
    InvalidNamespace(String),
    /// No engine index given.
    #[error("no engine indices given")]
    NoEngines,
    /// The same engine index twice.
    #[error("engine index {0} given twice")]
    DuplicateEngine(usize),
    /// `cache_configs` has neither 0, 1 nor one entry per engine.
    #[error(
        "{configs} cache configs for {engines} engines: give none, one for all, or one per engine"
    )]
    CacheConfigCount {
        /// Entries given.
        configs: usize,
        /// Engines configured.
        engines: usize,
    },
    /// A bucket override is invalid.
    #[error("invalid bucket override: {0}")]
    Buckets(#[from] BucketsError),
}

fn valid_namespace(ns: &str) -> bool {
    let mut chars = ns.chars();
    match chars.next() {
        None => true,
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        Some(_) => false,
    }
}

/// `trace_spans_dropped` by reason, each series resolved once at start-up
/// (so a drop costs one atomic add, and both series exist from the start).
#[derive(Debug, Clone)]
pub struct TraceSpanDrops {
    /// Spans refused because the export queue was full.
    pub queue_full: Counter,
    /// Spans the collector did not accept (unreachable, error status, timeout).
    pub export_failed: Counter,
}

impl TraceSpanDrops {
    /// The two series, registered in `registry` when given and the filter keeps them.
    fn register(
        registry: Option<(&mut Registry, MetricFilter)>,
        namespace: &str,
        model_name: &str,
    ) -> Self {
        let family: Family<Vec<(String, String)>, Counter> = Family::default();
        let def = &schema::TRACE_SPANS_DROPPED;
        if let Some((registry, keep)) = registry
            && keep(def)
        {
            registry.register(def.registered_name(namespace), def.help, family.clone());
        }
        let series = |reason: &str| {
            family
                .get_or_create(&vec![
                    ("model_name".to_owned(), model_name.to_owned()),
                    ("reason".to_owned(), reason.to_owned()),
                ])
                .clone()
        };
        Self {
            queue_full: series("queue_full"),
            export_failed: series("export_failed"),
        }
    }
}

/// Fans stats out to the Prometheus logger and the log-line loggers.
#[derive(Debug)]
pub struct StatLoggerManager {
    registry: Registry,
    prometheus: PrometheusLogger,
    log_lines: Vec<LogLineLogger>,
    http: Arc<HttpMetrics>,
    trace_span_drops: TraceSpanDrops,
    enable_prometheus: bool,
    aggregate_log_lines: bool,
}

impl StatLoggerManager {
    /// Validates `config`, registers every metric and resolves every engine's handles.
    pub fn new(config: MetricsConfig) -> Result<Self, ConfigError> {
        if !valid_namespace(&config.namespace) {
            return Err(ConfigError::InvalidNamespace(config.namespace));
        }
        if config.engine_indices.is_empty() {
            return Err(ConfigError::NoEngines);
        }
        for (i, idx) in config.engine_indices.iter().enumerate() {
            if config.engine_indices[..i].contains(idx) {
                return Err(ConfigError::DuplicateEngine(*idx));
            }
        }
        config.buckets.validate()?;
        let engines = config.engine_indices.len();
        let cache_configs: Vec<(usize, CacheConfig)> = match config.cache_configs.as_slice() {
            [] => Vec::new(),
            [one] => config
                .engine_indices
                .iter()
                .map(|&i| (i, one.clone()))
                .collect(),
            per_engine if per_engine.len() == engines => config
                .engine_indices
                .iter()
                .copied()
                .zip(per_engine.iter().cloned())
                .collect(),
            other => {
                return Err(ConfigError::CacheConfigCount {
                    configs: other.len(),
                    engines,
                });
            }
        };

        let mut registry = Registry::default();
        let prometheus = PrometheusLogger::new(
            config
                .enable_prometheus
                .then_some((&mut registry, config.metric_filter)),
            &config.namespace,
            &config.model_name,
            &config.more_model_names,
            &config.engine_indices,
            config.max_model_len,
            &config.buckets,
            &cache_configs,
            config.optional_metrics,
            config.max_tenant_labels,
        );
        let trace_span_drops = TraceSpanDrops::register(
            config
                .enable_prometheus
                .then_some((&mut registry, config.metric_filter)),
            &config.namespace,
            &config.model_name,
        );
        let http = Arc::new(HttpMetrics::new(&mut registry));
        let now = Instant::now();
        let log_lines = if config.enable_log_stats {
            config
                .engine_indices
                .iter()
                .map(|&i| LogLineLogger::new(i, now))
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            registry,
            prometheus,
            log_lines,
            http,
            trace_span_drops,
            enable_prometheus: config.enable_prometheus,
            aggregate_log_lines: config.aggregate_log_lines,
        })
    }

    /// The front end's recorder for engine `index` (of `model_name`):
    /// TTFT, ITL, e2e and the rest of [`inferscope_schema::FrontendStats`].
    /// Take it once per request, not per token; `None` for an engine the
    /// metrics do not know. It records even with Prometheus disabled.
    pub fn frontend(&self, index: usize) -> Option<FrontendRecorder> {
        self.prometheus
            .engine(index)
            .map(|e| FrontendRecorder::new(Arc::clone(e)))
    }

    /// The front end's recorder for `model`'s engine `index` (`model_name`
    /// or one of `more_model_names`): the proxy's, one per model.
    pub fn model_frontend(&self, model: &str, index: usize) -> Option<FrontendRecorder> {
        self.prometheus
            .model_engine(model, index)
            .map(|e| FrontendRecorder::new(Arc::clone(e)))
    }

    /// The counters of trace spans the server could not deliver (cheap to clone).
    pub fn trace_span_drops(&self) -> TraceSpanDrops {
        self.trace_span_drops.clone()
    }

    /// Counts one request refused at admission (label `reason`; keep the set of
    /// reasons small and fixed: each value is a new series).
    pub fn record_admission_rejection(&self, reason: &str) {
        if self.enable_prometheus {
            self.prometheus.record_admission_rejection(reason);
        }
    }

    /// Counts one finished request left out of the request log (its queue was full).
    pub fn record_request_log_dropped(&self) {
        self.prometheus.record_request_log_dropped();
    }

    /// Emits the periodic stats line(s) through `tracing` (call it every
    /// interval, 10 s by default): one per engine, or one aggregated line.
    pub fn log(&self) {
        if self.aggregate_log_lines && self.log_lines.len() > 1 {
            let now = Instant::now();
            let lines: Vec<_> = self.log_lines.iter().map(|l| l.take_line(now)).collect();
            let debug = lines.iter().all(|l| l.debug);
            let snapshots: Vec<_> = lines.into_iter().map(|l| l.snapshot).collect();
            log_line::emit(&log_line::format_aggregated_line(&snapshots), debug);
        } else {
            for l in &self.log_lines {
                l.log();
            }
        }
    }

    /// The bounded `tenant` label: resolve a request's slot here once
    /// ([`TenantLabels::slot`]) and carry it in its [`inferscope_schema::RequestRef`].
    pub fn tenant_labels(&self) -> &Arc<TenantLabels> {
        self.prometheus.tenant_labels()
    }

    /// Every engine's current values (of the served model), in
    /// `engine_indices` order: what the console samples once a second.
    pub fn read_engines(&self) -> Vec<EngineReading> {
        self.prometheus
            .first_model_engines()
            .map(|e| e.read())
            .collect()
    }

    /// The finite bucket bounds of `latency`'s histogram (every engine has
    /// the same).
    pub fn latency_bounds(&self, latency: Latency) -> Vec<f64> {
        self.prometheus
            .first_model_engines()
            .next()
            .map(|e| e.latency_bounds(latency))
            .unwrap_or_default()
    }

    /// Renders the registry: `(content type, body)`.
    pub fn render(&self, format: Format) -> (&'static str, String) {
        exposition::render_with_exemplars(&self.registry, format, &self.prometheus.exemplars())
    }

    /// The HTTP metric handles (shared with the HTTP layer).
    pub fn http_metrics(&self) -> Arc<HttpMetrics> {
        Arc::clone(&self.http)
    }

    /// A tower layer for the axum router, with the default exclusions
    /// (`/metrics`, `/health`); apply it with `Router::layer`.
    pub fn http_layer(&self) -> HttpMetricsLayer {
        HttpMetricsLayer::new(self.http_metrics())
    }
}

impl StatsRecorder for StatLoggerManager {
    fn record_step(&self, engine: usize, scheduler: &SchedulerStats, iteration: &IterationStats) {
        // Unknown engine indices are a wiring bug upstream; dropping the step
        // beats panicking on the engine thread.
        if let Some(e) = self.prometheus.engine(engine) {
            e.record_step(scheduler, iteration);
        }
        if let Some(l) = self.log_lines.iter().find(|l| l.engine() == engine) {
            l.record_step(scheduler, iteration);
        }
    }

    fn record_finished(&self, engine: usize, finished: &[FinishedRequestStats]) {
        if let Some(e) = self.prometheus.engine(engine) {
            for req in finished {
                e.record_finished(req);
            }
        }
    }

    fn record_idle(&self, engine: usize, scheduler: &SchedulerStats, idle: Duration) {
        if let Some(e) = self.prometheus.engine(engine) {
            e.record_idle(scheduler, idle);
        }
        if let Some(l) = self.log_lines.iter().find(|l| l.engine() == engine) {
            l.record_idle(scheduler);
        }
    }

    fn record_engine_failure(&self, engine: usize, cause: EngineFailure) {
        if let Some(e) = self.prometheus.engine(engine) {
            e.record_engine_failure(cause);
        }
    }

    fn record_kv_events_dropped(&self, engine: usize, batches: u64) {
        if let Some(e) = self.prometheus.engine(engine) {
            e.record_kv_events_dropped(batches);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let ok = MetricsConfig::default();
        assert!(StatLoggerManager::new(ok.clone()).is_ok());
        let bad = |f: fn(&mut MetricsConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            StatLoggerManager::new(c).unwrap_err()
        };
        assert!(matches!(
            bad(|c| c.namespace = "a-b".into()),
            ConfigError::InvalidNamespace(_)
        ));
        assert!(matches!(
            bad(|c| c.namespace = "1a".into()),
            ConfigError::InvalidNamespace(_)
        ));
        assert_eq!(bad(|c| c.engine_indices.clear()), ConfigError::NoEngines);
        assert_eq!(
            bad(|c| c.engine_indices = vec![1, 2, 1]),
            ConfigError::DuplicateEngine(1)
        );
        assert!(matches!(
            bad(|c| {
                c.engine_indices = vec![0, 1, 2];
                c.cache_configs = vec![cache(), cache()];
            }),
            ConfigError::CacheConfigCount {
                configs: 2,
                engines: 3
            }
        ));
        assert!(matches!(
            bad(|c| c.buckets.request_latency = Some(vec![2.0, 1.0])),
            ConfigError::Buckets(_)
        ));
    }

    pub(crate) fn cache() -> CacheConfig {
        CacheConfig {
            block_size: 16,
            num_gpu_blocks: 1000,
            enable_prefix_caching: true,
            cache_dtype: "auto".into(),
        }
    }
}

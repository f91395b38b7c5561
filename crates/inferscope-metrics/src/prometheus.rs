//! The Prometheus logger: registers the engine metrics of the schema in the
//! process's one `Registry` and resolves every engine's label handles once,
//! at start-up. Observations then touch only atomics.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock, RwLockReadGuard};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::exemplar::{ExemplarIndex, ExemplarSlot};
use crate::exemplar_slot::ExemplarTime;
use crate::histogram::{AtomicHistogram, HistogramBuilder};
use crate::reading::{EngineReading, LATENCIES, Latency};
use crate::tenant_labels::TenantLabels;
use inferscope_schema::schema::{self, BucketOverrides, MetricDef};
use inferscope_schema::stats::{
    EngineFailure, FinishReason, FinishedRequestStats, FrontendRequestStats, FrontendStats,
    IterationStats, ObservedRequest, RequestRef, SchedulerStats, TenantLabel,
};

/// `model_name`, `engine`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EngineLabels {
    model_name: String,
    engine: String,
}

/// `model_name`, `engine`, `tenant`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantLabelSet {
    model_name: String,
    engine: String,
    tenant: String,
}

/// `model_name`, `engine`, `finished_reason`, `tenant`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FinishedTenantLabels {
    model_name: String,
    engine: String,
    finished_reason: String,
    tenant: String,
}

/// `model_name`, `engine`, `cause`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FailureLabels {
    model_name: String,
    engine: String,
    cause: String,
}

/// `model_name`, `engine`, `expert`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ExpertLabels {
    model_name: String,
    engine: String,
    expert: String,
}

/// `model_name`, `engine`, `phase`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PhaseLabels {
    model_name: String,
    engine: String,
    phase: String,
}

/// `model_name`, `engine`, `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct WaitingReasonLabels {
    model_name: String,
    engine: String,
    reason: String,
}

/// `model_name`, `engine`, `source`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SourceLabels {
    model_name: String,
    engine: String,
    source: String,
}

/// `model_name`, `reason`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectionLabels {
    model_name: String,
    reason: String,
}

/// `model_name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ModelLabels {
    model_name: String,
}

/// `cache_config_info` labels, alphabetical as vLLM writes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CacheConfigLabels {
    block_size: String,
    cache_dtype: String,
    enable_prefix_caching: String,
    engine: String,
    num_gpu_blocks: String,
}

/// One engine's cache configuration, exposed as `cache_config_info`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub num_gpu_blocks: usize,
    /// Whether prefix caching is on.
    pub enable_prefix_caching: bool,
    /// KV cache element type (`auto`, `bf16`, `fp8`, …).
    pub cache_dtype: String,
}

type F64Counter = Counter<f64, AtomicU64>;
type F64Gauge = Gauge<f64, AtomicU64>;
type HistFamily<L> = Family<L, AtomicHistogram, HistogramBuilder>;

/// Resolved metric handles of one engine core. Cheap to use from any thread:
/// every method touches only atomics (no lock, no allocation, no lookup).
/// The engine's stats reach them through the manager's `StatsRecorder`, the
/// front end's through a [`crate::FrontendRecorder`].
#[derive(Debug, Clone)]
pub struct EngineMetrics {
    index: usize,
    /// The `model_name` label.
    model: Arc<str>,
    num_running: Gauge,
    num_waiting: Gauge,
    /// `capacity`, `deferred`.
    num_waiting_by_reason: [Gauge; 2],
    kv_usage: F64Gauge,
    num_preemptions: Counter,
    /// The series with a `tenant` label, by tenant label slot: made the
    /// first time a slot is used on this engine, then only indexed.
    tenants: Arc<[OnceLock<TenantMetrics>]>,
    /// What a slot's handles are made from.
    tenant_families: Arc<TenantFamilies>,
    prefix_cache_queries: Counter,
    prefix_cache_hits: Counter,
    /// `local_compute`, `local_cache_hit`.
    prompt_tokens_by_source: [Counter; 2],
    itl: AtomicHistogram,
    tpot: AtomicHistogram,
    queue_time: AtomicHistogram,
    inference_time: AtomicHistogram,
    prefill_time: AtomicHistogram,
    decode_time: AtomicHistogram,
    request_prompt_tokens: AtomicHistogram,
    request_generation_tokens: AtomicHistogram,
    request_params_max_tokens: AtomicHistogram,
    request_max_num_generation_tokens: AtomicHistogram,
    iteration_tokens: AtomicHistogram,
    request_params_n: AtomicHistogram,
    request_prefill_kv_computed_tokens: AtomicHistogram,
    request_num_preemptions: AtomicHistogram,
    engine_steps: Counter,
    device_busy: F64Counter,
    step_duration: [AtomicHistogram; 3],
    idle: F64Counter,
    batch_size: AtomicHistogram,
    grammar_mask: AtomicHistogram,
    core_failures: [Counter; 2],
    kv_block_lifetime: AtomicHistogram,
    kv_block_idle_before_evict: AtomicHistogram,
    kv_block_reuse_gap: AtomicHistogram,
    estimated_flops: Counter,
    estimated_read_bytes: Counter,
    estimated_write_bytes: Counter,
    kv_events_dropped: Counter,
    /// The per-expert token counters, made at the first step that reports
    /// experts (the model's expert count is not known before).
    expert_tokens: OnceLock<Vec<Counter>>,
    expert_family: Family<ExpertLabels, Counter>,
}

/// One tenant's series on one engine: the request-level counters and the
/// TTFT and e2e histograms (each with the tenant's exemplars).
#[derive(Debug)]
struct TenantMetrics {
    request_success: [Counter; 4],
    /// The latest finished request of each reason (the counters' exemplars).
    request_success_exemplars: [Arc<ExemplarSlot>; 4],
    prompt_tokens: Counter,
    generation_tokens: Counter,
    prompt_tokens_cached: Counter,
    ttft: AtomicHistogram,
    e2e: AtomicHistogram,
}

/// The families of the tenant-labelled series, the label bound, and where
/// a new series' exemplars are announced.
#[derive(Debug)]
struct TenantFamilies {
    labels: Arc<TenantLabels>,
    success: Family<FinishedTenantLabels, Counter>,
    prompt_tokens: Family<TenantLabelSet, Counter>,
    generation_tokens: Family<TenantLabelSet, Counter>,
    prompt_tokens_cached: Family<TenantLabelSet, Counter>,
    ttft: HistFamily<TenantLabelSet>,
    e2e: HistFamily<TenantLabelSet>,
    /// Registered names of TTFT, e2e and the success counter (`None`: not exposed).
    exemplar_names: [Option<String>; 3],
    exemplars: Arc<RwLock<ExemplarIndex>>,
}

impl TenantFamilies {
    /// Resolves slot `slot`'s series of `model`'s engine `engine`.
    fn make(&self, model: &str, engine: usize, slot: TenantLabel) -> TenantMetrics {
        let tenant = self.labels.name(slot).to_string();
        let engine = engine.to_string();
        let l = TenantLabelSet {
            model_name: model.to_owned(),
            engine: engine.clone(),
            tenant: tenant.clone(),
        };
        let finished = |reason: FinishReason| {
            self.success.get_or_create_owned(&FinishedTenantLabels {
                model_name: model.to_owned(),
                engine: engine.clone(),
                finished_reason: reason.as_str().to_owned(),
                tenant: tenant.clone(),
            })
        };
        let m = TenantMetrics {
            request_success: FinishReason::ALL.map(finished),
            request_success_exemplars: FinishReason::ALL.map(|_| Arc::new(ExemplarSlot::default())),
            prompt_tokens: self.prompt_tokens.get_or_create_owned(&l),
            generation_tokens: self.generation_tokens.get_or_create_owned(&l),
            prompt_tokens_cached: self.prompt_tokens_cached.get_or_create_owned(&l),
            ttft: self.ttft.get_or_create_owned(&l),
            e2e: self.e2e.get_or_create_owned(&l),
        };
        if self.exemplar_names.iter().any(Option::is_some) {
            let mut index = self.exemplars.write().unwrap_or_else(|e| e.into_inner());
            let labels = [
                ("model_name", model),
                ("engine", engine.as_str()),
                ("tenant", tenant.as_str()),
            ];
            let [ttft, e2e, success] = &self.exemplar_names;
            if let Some(name) = ttft {
                index.add_histogram(name, &labels, &m.ttft);
            }
            if let Some(name) = e2e {
                index.add_histogram(name, &labels, &m.e2e);
            }
            if let Some(name) = success {
                for (reason, slot) in FinishReason::ALL.iter().zip(&m.request_success_exemplars) {
                    let labels = [
                        ("model_name", model),
                        ("engine", engine.as_str()),
                        ("finished_reason", reason.as_str()),
                        ("tenant", tenant.as_str()),
                    ];
                    index.add_counter(name, &labels, slot);
                }
            }
        }
        m
    }
}

impl EngineMetrics {
    /// The series of tenant label slot `slot` (a slot past the bound is
    /// `other`): made on first use, an index afterwards.
    #[inline]
    fn tenant(&self, slot: TenantLabel) -> &TenantMetrics {
        let i = (slot as usize).min(self.tenants.len() - 1);
        self.tenants[i].get_or_init(|| {
            self.tenant_families.make(
                &self.model,
                self.index,
                TenantLabel::try_from(i).unwrap_or(0),
            )
        })
    }

    /// The tenants' series made so far on this engine.
    fn tenants_made(&self) -> impl Iterator<Item = &TenantMetrics> {
        self.tenants.iter().filter_map(OnceLock::get)
    }

    /// The global engine index (the `engine` label).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The `model_name` label of these handles.
    pub fn model_name(&self) -> &str {
        &self.model
    }

    /// The finite bucket bounds of `latency`'s histogram.
    pub(crate) fn latency_bounds(&self, latency: Latency) -> Vec<f64> {
        match latency {
            // Every tenant's series has the same bounds; the anonymous
            // tenant's is made if no request has been seen yet.
            Latency::Ttft => self.tenant(0).ttft.bounds().to_vec(),
            Latency::E2e => self.tenant(0).e2e.bounds().to_vec(),
            Latency::Itl => self.itl.bounds().to_vec(),
            Latency::Queue => self.queue_time.bounds().to_vec(),
        }
    }

    /// `latency`'s bucket counts, over every tenant for the tenant-labelled ones.
    fn latency_counts(&self, latency: Latency) -> Box<[u64]> {
        let sum = |get: fn(&TenantMetrics) -> &AtomicHistogram| {
            let mut total = vec![0; self.latency_bounds(latency).len() + 1].into_boxed_slice();
            for t in self.tenants_made() {
                for (sum, c) in total.iter_mut().zip(get(t).counts()) {
                    *sum += c;
                }
            }
            total
        };
        match latency {
            Latency::Ttft => sum(|t| &t.ttft),
            Latency::E2e => sum(|t| &t.e2e),
            Latency::Itl => self.itl.counts(),
            Latency::Queue => self.queue_time.counts(),
        }
    }

    /// The values the console samples, read now (relaxed loads: each value
    /// is exact, the set is not one atomic instant).
    pub(crate) fn read(&self) -> EngineReading {
        EngineReading {
            engine: self.index,
            running: self.num_running.get(),
            waiting: self.num_waiting.get(),
            kv_cache_usage: self.kv_usage.get(),
            device_busy_seconds: self.device_busy.get(),
            preemptions: self.num_preemptions.get(),
            prompt_tokens: self.tenants_made().map(|t| t.prompt_tokens.get()).sum(),
            generation_tokens: self.tenants_made().map(|t| t.generation_tokens.get()).sum(),
            requests: std::array::from_fn(|i| {
                self.tenants_made()
                    .map(|t| t.request_success[i].get())
                    .sum()
            }),
            latency: LATENCIES.map(|l| self.latency_counts(l)),
        }
    }

    /// One front-end observation ([`FrontendStats`]); `request`, when
    /// given, is the exemplar of the latency series (and the success
    /// counter) it lands in.
    #[inline]
    pub(crate) fn record_frontend(&self, stats: &FrontendStats, request: Option<&RequestRef>) {
        match stats {
            FrontendStats::FirstToken { ttft } => {
                let t = self.tenant(request.map_or(0, |r| r.tenant));
                observe(&t.ttft, ttft.as_secs_f64(), request);
            }
            FrontendStats::NextToken { itl, count } => {
                observe_many(&self.itl, itl.as_secs_f64(), *count, request);
            }
            FrontendStats::Finished(finished) => self.record_frontend_finished(finished, request),
            FrontendStats::Observed(observed) => self.record_observed(observed, request),
            FrontendStats::Started => {
                self.num_running.inc();
            }
            FrontendStats::Ended => {
                self.num_running.dec();
            }
            FrontendStats::GenerationTokens(tokens) => {
                let t = self.tenant(request.map_or(0, |r| r.tenant));
                t.generation_tokens.inc_by(*tokens);
            }
            FrontendStats::ParentFinished {
                n,
                max_generation_tokens,
            } => {
                self.request_params_n.observe(*n as f64);
                if let Some(g) = max_generation_tokens {
                    self.request_max_num_generation_tokens.observe(*g as f64);
                }
            }
        }
    }

    /// A finished request as the front end saw it: e2e latency and TPOT.
    /// TTFT is not observed here (it is recorded when it happens).
    fn record_frontend_finished(&self, stats: &FrontendRequestStats, request: Option<&RequestRef>) {
        let t = self.tenant(request.map_or(0, |r| r.tenant));
        // Two exemplars of one request: one clock read.
        let at = ExemplarTime::default();
        observe_at(&t.e2e, stats.e2e.as_secs_f64(), request, &at);
        observe_at(&self.tpot, time_per_output_token(stats), request, &at);
    }

    /// A request finished as seen from outside an engine (the proxy): the
    /// success counter, e2e, and the token counters, TPOT and request
    /// histograms for the figures that are known; an unknown figure is not
    /// observed, so it never shows up as a zero. TTFT and ITL are observed
    /// as they happen.
    fn record_observed(&self, req: &ObservedRequest, request: Option<&RequestRef>) {
        let reason = req.finish_reason.index();
        let t = self.tenant(request.map_or(0, |r| r.tenant));
        if let Some(c) = t.request_success.get(reason) {
            c.inc();
        }
        if let (Some(slot), Some(r)) = (t.request_success_exemplars.get(reason), request) {
            slot.set(r, 1.0);
        }
        if let Some(p) = req.prompt_tokens {
            t.prompt_tokens.inc_by(p);
            self.request_prompt_tokens.observe(p as f64);
        }
        if let Some(g) = req.generation_tokens {
            t.generation_tokens.inc_by(g);
            self.request_generation_tokens.observe(g as f64);
        }
        if let Some(m) = req.max_tokens {
            self.request_params_max_tokens.observe(m as f64);
        }
        // TPOT needs both the first token's time and the token count; with
        // them the request is recorded as the server's front end records it.
        match (req.ttft, req.generation_tokens) {
            (Some(ttft), Some(g)) => self.record_frontend_finished(
                &FrontendRequestStats {
                    ttft: Some(ttft),
                    e2e: req.e2e,
                    num_generation_tokens: usize::try_from(g).unwrap_or(usize::MAX),
                },
                request,
            ),
            _ => observe(&t.e2e, req.e2e.as_secs_f64(), request),
        }
    }

    /// The engine core died of `cause`.
    pub fn record_engine_failure(&self, cause: EngineFailure) {
        self.core_failures[cause.index()].inc();
    }

    /// `batches` KV-event batches were dropped (full publisher queue).
    pub fn record_kv_events_dropped(&self, batches: u64) {
        self.kv_events_dropped.inc_by(batches);
    }

    /// A request the engine finished: success counter and request histograms,
    /// the latency ones and the counter with the request as exemplar.
    pub fn record_finished(&self, req: &FinishedRequestStats) {
        let reason = req.finish_reason.index();
        let t = self.tenant(req.request.tenant);
        if let Some(c) = t.request_success.get(reason) {
            c.inc();
        }
        // Five exemplars of one request: one clock read.
        let at = ExemplarTime::default();
        if let Some(slot) = t.request_success_exemplars.get(reason) {
            slot.set_at(&req.request, 1.0, &at);
        }
        let r = &req.request;
        self.queue_time
            .observe_for_at(req.queue_time.as_secs_f64(), r, &at);
        self.prefill_time
            .observe_for_at(req.prefill_time.as_secs_f64(), r, &at);
        self.decode_time
            .observe_for_at(req.decode_time.as_secs_f64(), r, &at);
        self.inference_time
            .observe_for_at(req.inference_time.as_secs_f64(), r, &at);
        self.request_prompt_tokens
            .observe(req.num_prompt_tokens as f64);
        self.request_generation_tokens
            .observe(req.num_generation_tokens as f64);
        // Per engine request (choice), as vLLM observes it per finished
        // request; `n` and the max over a prompt's choices are observed once
        // per prompt by the front end (`FrontendStats::ParentFinished`).
        self.request_params_max_tokens
            .observe(req.max_tokens_param as f64);
        self.request_num_preemptions
            .observe(req.num_preemptions as f64);
        self.request_prefill_kv_computed_tokens
            .observe(req.num_prompt_tokens.saturating_sub(req.num_cached_tokens) as f64);
    }

    /// One engine step.
    pub fn record_step(&self, sched: &SchedulerStats, iter: &IterationStats) {
        self.set_scheduler(sched);
        self.prefix_cache_queries.inc_by(sched.prefix_cache_queries);
        self.prefix_cache_hits.inc_by(sched.prefix_cache_hits);
        self.num_preemptions.inc_by(sched.num_preemptions);
        let mut rest = [
            iter.num_prompt_tokens,
            iter.num_generation_tokens,
            iter.num_prompt_tokens_cached,
        ];
        for tokens in &iter.tenant_tokens {
            let t = self.tenant(tokens.tenant);
            t.prompt_tokens.inc_by(tokens.prompt);
            t.generation_tokens.inc_by(tokens.generation);
            t.prompt_tokens_cached.inc_by(tokens.prompt_cached);
            rest[0] = rest[0].saturating_sub(tokens.prompt);
            rest[1] = rest[1].saturating_sub(tokens.generation);
            rest[2] = rest[2].saturating_sub(tokens.prompt_cached);
        }
        // Tokens the step did not split by tenant are anonymous, so the
        // tenants always sum to the step's totals.
        if rest != [0; 3] {
            let t = self.tenant(0);
            t.prompt_tokens.inc_by(rest[0]);
            t.generation_tokens.inc_by(rest[1]);
            t.prompt_tokens_cached.inc_by(rest[2]);
        }
        let [compute, cache_hit] = &self.prompt_tokens_by_source;
        compute.inc_by(
            iter.num_prompt_tokens
                .saturating_sub(iter.num_prompt_tokens_cached),
        );
        cache_hit.inc_by(iter.num_prompt_tokens_cached);
        self.estimated_flops.inc_by(iter.estimated_flops);
        self.estimated_read_bytes.inc_by(iter.estimated_read_bytes);
        self.estimated_write_bytes
            .inc_by(iter.estimated_write_bytes);
        if !iter.expert_tokens.is_empty() {
            // One series per expert of the model, resolved once.
            let counters = self.expert_tokens.get_or_init(|| {
                (0..iter.expert_tokens.len())
                    .map(|e| {
                        self.expert_family.get_or_create_owned(&ExpertLabels {
                            model_name: self.model.to_string(),
                            engine: self.index.to_string(),
                            expert: e.to_string(),
                        })
                    })
                    .collect()
            });
            for (c, &n) in counters.iter().zip(&iter.expert_tokens) {
                c.inc_by(n);
            }
        }
        self.iteration_tokens
            .observe(iter.num_scheduled_tokens as f64);
        self.engine_steps.inc();
        self.batch_size.observe(iter.batch_size as f64);
        if let Some(t) = iter.grammar_mask_time {
            self.grammar_mask.observe(t.as_secs_f64());
        }
        self.device_busy.inc_by(iter.device_time.as_secs_f64());
        let [schedule, execute, postprocess] = &self.step_duration;
        schedule.observe(iter.schedule_time.as_secs_f64());
        execute.observe(iter.execute_time.as_secs_f64());
        postprocess.observe(iter.postprocess_time.as_secs_f64());
        for req in &iter.finished_requests {
            self.record_finished(req);
        }
    }

    /// The loop went idle (`idle` zero) or woke up after waiting `idle`.
    pub fn record_idle(&self, sched: &SchedulerStats, idle: Duration) {
        self.set_scheduler(sched);
        self.prefix_cache_queries.inc_by(sched.prefix_cache_queries);
        self.prefix_cache_hits.inc_by(sched.prefix_cache_hits);
        self.num_preemptions.inc_by(sched.num_preemptions);
        if !idle.is_zero() {
            self.idle.inc_by(idle.as_secs_f64());
        }
    }

    fn set_scheduler(&self, sched: &SchedulerStats) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.num_running.set(gauge(sched.num_running));
        self.num_waiting.set(gauge(sched.num_waiting));
        let deferred = sched.num_waiting_deferred.min(sched.num_waiting);
        let [capacity, deferred_gauge] = &self.num_waiting_by_reason;
        capacity.set(gauge(sched.num_waiting - deferred));
        deferred_gauge.set(gauge(deferred));
        self.kv_usage.set(sched.kv_cache_usage);
        let r = &sched.kv_block_residency;
        for &v in &r.lifetime {
            self.kv_block_lifetime.observe(v);
        }
        for &v in &r.idle_before_evict {
            self.kv_block_idle_before_evict.observe(v);
        }
        for &v in &r.reuse_gap {
            self.kv_block_reuse_gap.observe(v);
        }
    }
}

/// One histogram sample, with `request` as its bucket's exemplar when given.
#[inline]
fn observe(histogram: &AtomicHistogram, value: f64, request: Option<&RequestRef>) {
    observe_many(histogram, value, 1, request);
}

/// [`observe`], the exemplar timed by `at` (shared with the request's
/// other exemplars; no clock read without a request).
#[inline]
fn observe_at(
    histogram: &AtomicHistogram,
    value: f64,
    request: Option<&RequestRef>,
    at: &ExemplarTime,
) {
    match request {
        Some(r) => histogram.observe_for_at(value, r, at),
        None => histogram.observe(value),
    }
}

/// Records `count` samples of `value`, with `request` as the exemplar when given.
#[inline]
fn observe_many(histogram: &AtomicHistogram, value: f64, count: u64, request: Option<&RequestRef>) {
    match request {
        Some(r) => histogram.observe_many_for(value, count, r),
        None => histogram.observe_many(value, count),
    }
}

/// TPOT of a finished request: (e2e − TTFT) / (tokens − 1), 0 for ≤ 1 token.
pub fn time_per_output_token(stats: &FrontendRequestStats) -> f64 {
    match (stats.ttft, stats.num_generation_tokens) {
        (Some(ttft), n) if n > 1 => stats.e2e.saturating_sub(ttft).as_secs_f64() / (n - 1) as f64,
        _ => 0.0,
    }
}

/// The engine and model metrics of one process, registered in its registry.
#[derive(Debug)]
pub struct PrometheusLogger {
    model_name: String,
    // Shared with the front end's recorders: a handle set is dozens of `Arc`s.
    engines: Vec<Arc<EngineMetrics>>,
    rejections: Family<RejectionLabels, Counter>,
    request_log_dropped: Counter,
    tenant_labels: Arc<TenantLabels>,
    // Grows when a tenant's series are first made on an engine.
    exemplars: Arc<RwLock<ExemplarIndex>>,
}

/// Which schema metrics a registry exposes: `true` registers the family.
/// Handles of a family left out still count, they are just not rendered.
pub type MetricFilter = fn(&MetricDef) -> bool;

/// The metrics behind a flag ([`schema::enabling_flag`]) that are on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OptionalMetrics {
    /// `--kv-cache-metrics`: the KV block residency histograms.
    pub kv_cache_metrics: bool,
    /// `--enable-mfu-metrics`: the estimated FLOPs and bytes counters.
    pub mfu_metrics: bool,
    /// `--expert-metrics`: the per-expert token counter.
    pub expert_metrics: bool,
}

impl OptionalMetrics {
    /// Whether `def` is registered: always, or its flag is on.
    pub fn enabled(&self, def: &MetricDef) -> bool {
        match schema::enabling_flag(def) {
            None => true,
            Some(schema::KV_CACHE_METRICS_FLAG) => self.kv_cache_metrics,
            Some(schema::EXPERT_METRICS_FLAG) => self.expert_metrics,
            Some(_) => self.mfu_metrics,
        }
    }
}

/// The default [`MetricFilter`]: every metric of the schema.
pub fn every_metric(_: &MetricDef) -> bool {
    true
}

/// Registers families in the registry (when `register` is set) under the
/// namespaced schema names, skipping those the filter leaves out.
struct Registrar<'a> {
    registry: Option<&'a mut Registry>,
    keep: MetricFilter,
    optional: OptionalMetrics,
    namespace: &'a str,
    overrides: &'a BucketOverrides,
    max_model_len: usize,
}

impl Registrar<'_> {
    /// The name `def` is registered under, if it is registered.
    fn registered_name(&self, def: &MetricDef) -> Option<String> {
        (self.registry.is_some() && (self.keep)(def)).then(|| def.registered_name(self.namespace))
    }

    fn add<M>(&mut self, def: &MetricDef, metric: M) -> M
    where
        M: prometheus_client::registry::Metric + Clone,
    {
        if let Some(registry) = self.registry.as_deref_mut()
            && (self.keep)(def)
            && self.optional.enabled(def)
        {
            registry.register(
                def.registered_name(self.namespace),
                def.help,
                metric.clone(),
            );
        }
        metric
    }

    fn family<L>(&mut self, def: &MetricDef) -> Family<L, Counter>
    where
        L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    {
        self.add(def, Family::default())
    }

    fn hist<L>(&mut self, def: &MetricDef) -> HistFamily<L>
    where
        L: Clone + std::hash::Hash + Eq + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    {
        let bounds = self
            .overrides
            .buckets_for(def, self.namespace, self.max_model_len);
        self.add(
            def,
            Family::new_with_constructor(HistogramBuilder::new(&bounds)),
        )
    }
}

impl PrometheusLogger {
    /// Creates every engine's handles; registers the families `keep` accepts
    /// in the registry when one is given (without one, handles work but
    /// nothing is exposed).
    // Each argument is one independent start-up fact; a builder for the one
    // caller (the manager) would only move them around.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        registry: Option<(&mut Registry, MetricFilter)>,
        namespace: &str,
        model_name: &str,
        more_models: &[String],
        engine_indices: &[usize],
        max_model_len: usize,
        overrides: &BucketOverrides,
        cache_configs: &[(usize, CacheConfig)],
        optional: OptionalMetrics,
        max_tenant_labels: usize,
    ) -> Self {
        use schema as s;
        let (registry, keep) = match registry {
            Some((registry, keep)) => (Some(registry), keep),
            None => (None, every_metric as MetricFilter),
        };
        let mut r = Registrar {
            registry,
            keep,
            optional,
            namespace,
            overrides,
            max_model_len,
        };
        // Registration order = exposition order = schema order.
        let running: Family<EngineLabels, Gauge> =
            r.add(&s::NUM_REQUESTS_RUNNING, Family::default());
        let waiting: Family<EngineLabels, Gauge> =
            r.add(&s::NUM_REQUESTS_WAITING, Family::default());
        let waiting_by_reason: Family<WaitingReasonLabels, Gauge> =
            r.add(&s::NUM_REQUESTS_WAITING_BY_REASON, Family::default());
        let kv: Family<EngineLabels, F64Gauge> = r.add(&s::KV_CACHE_USAGE_PERC, Family::default());
        let cache_info: Family<CacheConfigLabels, Gauge> =
            r.add(&s::CACHE_CONFIG_INFO, Family::default());
        let prompt_tokens = r.family::<TenantLabelSet>(&s::PROMPT_TOKENS);
        let generation_tokens = r.family::<TenantLabelSet>(&s::GENERATION_TOKENS);
        let num_preemptions = r.family::<EngineLabels>(&s::NUM_PREEMPTIONS);
        let success = r.family::<FinishedTenantLabels>(&s::REQUEST_SUCCESS);
        let pc_queries = r.family::<EngineLabels>(&s::PREFIX_CACHE_QUERIES);
        let pc_hits = r.family::<EngineLabels>(&s::PREFIX_CACHE_HITS);
        let cached = r.family::<TenantLabelSet>(&s::PROMPT_TOKENS_CACHED);
        let by_source = r.family::<SourceLabels>(&s::PROMPT_TOKENS_BY_SOURCE);
        let rejections = r.family::<RejectionLabels>(&s::ADMISSION_REJECTIONS);
        let request_log_dropped = r
            .family::<ModelLabels>(&s::REQUEST_LOG_DROPPED)
            .get_or_create_owned(&ModelLabels {
                model_name: model_name.to_owned(),
            });
        let folded: Gauge = r
            .add::<Family<ModelLabels, Gauge>>(&s::TENANT_LABELS_FOLDED, Family::default())
            .get_or_create_owned(&ModelLabels {
                model_name: model_name.to_owned(),
            });
        let tenant_labels = Arc::new(TenantLabels::new(max_tenant_labels, folded));
        let ttft = r.hist::<TenantLabelSet>(&s::TIME_TO_FIRST_TOKEN);
        let itl = r.hist::<EngineLabels>(&s::INTER_TOKEN_LATENCY);
        let tpot = r.hist::<EngineLabels>(&s::TIME_PER_OUTPUT_TOKEN);
        let e2e = r.hist::<TenantLabelSet>(&s::E2E_REQUEST_LATENCY);
        let queue = r.hist::<EngineLabels>(&s::REQUEST_QUEUE_TIME);
        let inference = r.hist::<EngineLabels>(&s::REQUEST_INFERENCE_TIME);
        let prefill = r.hist::<EngineLabels>(&s::REQUEST_PREFILL_TIME);
        let decode = r.hist::<EngineLabels>(&s::REQUEST_DECODE_TIME);
        let req_prompt = r.hist::<EngineLabels>(&s::REQUEST_PROMPT_TOKENS);
        let req_gen = r.hist::<EngineLabels>(&s::REQUEST_GENERATION_TOKENS);
        let max_tokens = r.hist::<EngineLabels>(&s::REQUEST_PARAMS_MAX_TOKENS);
        let max_gen = r.hist::<EngineLabels>(&s::REQUEST_MAX_NUM_GENERATION_TOKENS);
        let iter_tokens = r.hist::<EngineLabels>(&s::ITERATION_TOKENS);
        let params_n = r.hist::<EngineLabels>(&s::REQUEST_PARAMS_N);
        let kv_computed = r.hist::<EngineLabels>(&s::REQUEST_PREFILL_KV_COMPUTED_TOKENS);
        let req_preempt = r.hist::<EngineLabels>(&s::REQUEST_NUM_PREEMPTIONS);
        let steps = r.family::<EngineLabels>(&s::ENGINE_STEPS);
        let busy: Family<EngineLabels, F64Counter> =
            r.add(&s::DEVICE_BUSY_SECONDS, Family::default());
        let step_duration = r.hist::<PhaseLabels>(&s::ENGINE_STEP_DURATION);
        let idle: Family<EngineLabels, F64Counter> =
            r.add(&s::ENGINE_IDLE_SECONDS, Family::default());
        let batch = r.hist::<EngineLabels>(&s::BATCH_SIZE);
        let grammar_mask = r.hist::<EngineLabels>(&s::GRAMMAR_MASK_DURATION);
        let failures = r.family::<FailureLabels>(&s::ENGINE_CORE_FAILURES);
        let lifetime = r.hist::<EngineLabels>(&s::KV_BLOCK_LIFETIME);
        let idle_evict = r.hist::<EngineLabels>(&s::KV_BLOCK_IDLE_BEFORE_EVICT);
        let reuse_gap = r.hist::<EngineLabels>(&s::KV_BLOCK_REUSE_GAP);
        let flops = r.family::<EngineLabels>(&s::ESTIMATED_FLOPS);
        let read_bytes = r.family::<EngineLabels>(&s::ESTIMATED_READ_BYTES);
        let write_bytes = r.family::<EngineLabels>(&s::ESTIMATED_WRITE_BYTES);
        let kv_dropped = r.family::<EngineLabels>(&s::KV_EVENTS_DROPPED_BATCHES);
        let experts = r.family::<ExpertLabels>(&s::MOE_EXPERT_TOKENS);
        let exemplars = Arc::new(RwLock::new(ExemplarIndex::default()));
        let tenant_families = Arc::new(TenantFamilies {
            labels: Arc::clone(&tenant_labels),
            success,
            prompt_tokens,
            generation_tokens,
            prompt_tokens_cached: cached,
            ttft,
            e2e,
            exemplar_names: [
                r.registered_name(&s::TIME_TO_FIRST_TOKEN),
                r.registered_name(&s::E2E_REQUEST_LATENCY),
                r.registered_name(&s::REQUEST_SUCCESS),
            ],
            exemplars: Arc::clone(&exemplars),
        });

        // The first model's handles come first, so `engine(index)` finds them.
        let models: Vec<&str> = std::iter::once(model_name)
            .chain(more_models.iter().map(String::as_str))
            .collect();
        let engines = models
            .iter()
            .flat_map(|&m| engine_indices.iter().map(move |&index| (m, index)))
            .map(|(model_name, index)| {
                let engine = index.to_string();
                let l = EngineLabels {
                    model_name: model_name.to_owned(),
                    engine: engine.clone(),
                };
                // Both causes exist from the start at 0, so an alert on
                // `increase()` sees the first failure.
                let failure = |cause: EngineFailure| {
                    failures.get_or_create_owned(&FailureLabels {
                        model_name: model_name.to_owned(),
                        engine: engine.clone(),
                        cause: cause.as_str().to_owned(),
                    })
                };
                let reason = |i: usize| {
                    waiting_by_reason.get_or_create_owned(&WaitingReasonLabels {
                        model_name: model_name.to_owned(),
                        engine: engine.clone(),
                        reason: s::WAITING_REASONS[i].to_owned(),
                    })
                };
                let source = |i: usize| {
                    by_source.get_or_create_owned(&SourceLabels {
                        model_name: model_name.to_owned(),
                        engine: engine.clone(),
                        source: s::PROMPT_TOKEN_SOURCES[i].to_owned(),
                    })
                };
                let phase = |i: usize| {
                    step_duration.get_or_create_owned(&PhaseLabels {
                        model_name: model_name.to_owned(),
                        engine: engine.clone(),
                        phase: s::STEP_PHASES[i].to_owned(),
                    })
                };
                if let Some((_, cc)) = cache_configs.iter().find(|(i, _)| *i == index) {
                    cache_info
                        .get_or_create(&CacheConfigLabels {
                            block_size: cc.block_size.to_string(),
                            cache_dtype: cc.cache_dtype.clone(),
                            // Python's str(bool), as vLLM exposes it.
                            enable_prefix_caching: if cc.enable_prefix_caching {
                                "True".to_owned()
                            } else {
                                "False".to_owned()
                            },
                            engine: engine.clone(),
                            num_gpu_blocks: cc.num_gpu_blocks.to_string(),
                        })
                        .set(1);
                }
                Arc::new(EngineMetrics {
                    index,
                    model: Arc::from(model_name),
                    num_running: running.get_or_create_owned(&l),
                    num_waiting: waiting.get_or_create_owned(&l),
                    num_waiting_by_reason: [0, 1].map(reason),
                    kv_usage: kv.get_or_create_owned(&l),
                    num_preemptions: num_preemptions.get_or_create_owned(&l),
                    tenants: (0..tenant_labels.num_slots())
                        .map(|_| OnceLock::new())
                        .collect(),
                    tenant_families: Arc::clone(&tenant_families),
                    prefix_cache_queries: pc_queries.get_or_create_owned(&l),
                    prefix_cache_hits: pc_hits.get_or_create_owned(&l),
                    prompt_tokens_by_source: [0, 1].map(source),
                    itl: itl.get_or_create_owned(&l),
                    tpot: tpot.get_or_create_owned(&l),
                    queue_time: queue.get_or_create_owned(&l),
                    inference_time: inference.get_or_create_owned(&l),
                    prefill_time: prefill.get_or_create_owned(&l),
                    decode_time: decode.get_or_create_owned(&l),
                    request_prompt_tokens: req_prompt.get_or_create_owned(&l),
                    request_generation_tokens: req_gen.get_or_create_owned(&l),
                    request_params_max_tokens: max_tokens.get_or_create_owned(&l),
                    request_max_num_generation_tokens: max_gen.get_or_create_owned(&l),
                    iteration_tokens: iter_tokens.get_or_create_owned(&l),
                    request_params_n: params_n.get_or_create_owned(&l),
                    request_prefill_kv_computed_tokens: kv_computed.get_or_create_owned(&l),
                    request_num_preemptions: req_preempt.get_or_create_owned(&l),
                    engine_steps: steps.get_or_create_owned(&l),
                    device_busy: busy.get_or_create_owned(&l),
                    step_duration: [0, 1, 2].map(phase),
                    idle: idle.get_or_create_owned(&l),
                    batch_size: batch.get_or_create_owned(&l),
                    grammar_mask: grammar_mask.get_or_create_owned(&l),
                    core_failures: EngineFailure::ALL.map(failure),
                    kv_block_lifetime: lifetime.get_or_create_owned(&l),
                    kv_block_idle_before_evict: idle_evict.get_or_create_owned(&l),
                    kv_block_reuse_gap: reuse_gap.get_or_create_owned(&l),
                    estimated_flops: flops.get_or_create_owned(&l),
                    estimated_read_bytes: read_bytes.get_or_create_owned(&l),
                    estimated_write_bytes: write_bytes.get_or_create_owned(&l),
                    kv_events_dropped: kv_dropped.get_or_create_owned(&l),
                    expert_tokens: OnceLock::new(),
                    expert_family: experts.clone(),
                })
            })
            .collect::<Vec<Arc<EngineMetrics>>>();
        // The anonymous tenant's series exist from the start, at zero, as
        // vLLM's do: a rate() or an alert sees the first request.
        for e in &engines {
            e.tenant(0);
        }

        // The latency histograms and the finished-request counter carry
        // exemplars (OpenMetrics only); the token-count ones do not: a request
        // id on "prompt length" answers no latency question.
        type Get = fn(&EngineMetrics) -> &AtomicHistogram;
        // (TTFT, e2e and the success counter are per tenant: their
        // exemplars are added as each tenant's series are made.)
        let with_exemplars: [(&MetricDef, Get); 6] = [
            (&s::INTER_TOKEN_LATENCY, |e| &e.itl),
            (&s::TIME_PER_OUTPUT_TOKEN, |e| &e.tpot),
            (&s::REQUEST_QUEUE_TIME, |e| &e.queue_time),
            (&s::REQUEST_INFERENCE_TIME, |e| &e.inference_time),
            (&s::REQUEST_PREFILL_TIME, |e| &e.prefill_time),
            (&s::REQUEST_DECODE_TIME, |e| &e.decode_time),
        ];
        {
            let mut exemplars = exemplars.write().unwrap_or_else(|e| e.into_inner());
            for e in &engines {
                let engine = e.index.to_string();
                let model_name = &*e.model;
                let labels = [("model_name", model_name), ("engine", engine.as_str())];
                for (def, get) in &with_exemplars {
                    if let Some(name) = r.registered_name(def) {
                        exemplars.add_histogram(&name, &labels, get(e));
                    }
                }
            }
        }

        Self {
            model_name: model_name.to_owned(),
            engines,
            rejections,
            request_log_dropped,
            tenant_labels,
            exemplars,
        }
    }

    /// Handles of `model`'s engine `index` (the model name or one of the
    /// further names the logger was built with).
    pub(crate) fn model_engine(&self, model: &str, index: usize) -> Option<&Arc<EngineMetrics>> {
        self.engines
            .iter()
            .find(|e| e.index == index && &*e.model == model)
    }

    /// Handles of the engine with global index `index` (of the first model).
    #[inline]
    pub(crate) fn engine(&self, index: usize) -> Option<&Arc<EngineMetrics>> {
        // A handful of engines: a scan beats hashing.
        self.engines.iter().find(|e| e.index == index)
    }

    /// Handles of the first model's engines, in `engine_indices` order.
    pub(crate) fn first_model_engines(&self) -> impl Iterator<Item = &Arc<EngineMetrics>> {
        self.engines.iter().filter(|e| *e.model == *self.model_name)
    }

    /// Counts one finished request the request log had no room for.
    pub fn record_request_log_dropped(&self) {
        self.request_log_dropped.inc();
    }

    /// The registered series that carry exemplars.
    pub fn exemplars(&self) -> RwLockReadGuard<'_, ExemplarIndex> {
        self.exemplars.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The bounded `tenant` label values.
    pub fn tenant_labels(&self) -> &Arc<TenantLabels> {
        &self.tenant_labels
    }

    /// Counts one request refused at admission.
    pub fn record_admission_rejection(&self, reason: &str) {
        self.rejections
            .get_or_create(&RejectionLabels {
                model_name: self.model_name.clone(),
                reason: reason.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpot_formula() {
        let s = |ttft: Option<f64>, e2e: f64, n| FrontendRequestStats {
            ttft: ttft.map(Duration::from_secs_f64),
            e2e: Duration::from_secs_f64(e2e),
            num_generation_tokens: n,
        };
        assert!((time_per_output_token(&s(Some(1.0), 3.0, 5)) - 0.5).abs() < 1e-9);
        assert_eq!(time_per_output_token(&s(Some(1.0), 3.0, 1)), 0.0);
        assert_eq!(time_per_output_token(&s(Some(1.0), 3.0, 0)), 0.0);
        assert_eq!(time_per_output_token(&s(None, 3.0, 5)), 0.0);
    }

    #[test]
    fn a_filter_leaves_families_out_of_the_registry() {
        let mut registry = Registry::default();
        let keep: MetricFilter = |d| d.name == schema::TIME_TO_FIRST_TOKEN.name;
        let p = PrometheusLogger::new(
            Some((&mut registry, keep)),
            "x",
            "m",
            &[],
            &[0],
            100,
            &Default::default(),
            &[],
            OptionalMetrics::default(),
            2,
        );
        p.engine(0).unwrap().record_frontend(
            &FrontendStats::FirstToken {
                ttft: Duration::from_millis(500),
            },
            None,
        );
        let (_, text) = crate::exposition::render(&registry, crate::Format::Prometheus);
        assert!(
            text.contains("x_time_to_first_token_seconds_count{"),
            "{text}"
        );
        assert!(!text.contains("kv_cache_usage_perc"), "{text}");
        assert!(!text.contains("request_success"), "{text}");
    }

    #[test]
    fn observed_requests_record_only_what_is_known() {
        let p = PrometheusLogger::new(
            None,
            "x",
            "m",
            &[],
            &[0],
            100,
            &Default::default(),
            &[],
            OptionalMetrics::default(),
            2,
        );
        let e = p.engine(0).unwrap();
        let observed =
            |req: &ObservedRequest| e.record_frontend(&FrontendStats::Observed(*req), None);
        let mut req = ObservedRequest {
            finish_reason: FinishReason::Length,
            prompt_tokens: Some(7),
            generation_tokens: Some(5),
            max_tokens: None,
            ttft: Some(Duration::from_secs(1)),
            e2e: Duration::from_secs(3),
        };
        observed(&req);
        let t = e.tenant(0);
        assert_eq!(t.request_success[FinishReason::Length.index()].get(), 1);
        assert_eq!((t.prompt_tokens.get(), t.generation_tokens.get()), (7, 5));
        assert_eq!(
            e.request_params_max_tokens.count(),
            0,
            "unknown: not a zero"
        );
        assert_eq!((t.e2e.count(), e.tpot.count()), (1, 1));
        req.generation_tokens = None;
        req.ttft = None;
        observed(&req);
        assert_eq!(e.request_generation_tokens.count(), 1);
        assert_eq!(e.tpot.count(), 1, "no TPOT without tokens and TTFT");
        e.record_frontend(&FrontendStats::Started, None);
        e.record_frontend(&FrontendStats::Started, None);
        e.record_frontend(&FrontendStats::Ended, None);
        assert_eq!(e.num_running.get(), 1);
        e.record_frontend(&FrontendStats::GenerationTokens(4), None);
        assert_eq!(t.generation_tokens.get(), 5 + 4);
        // `n` once per parent request; an unknown longest choice is not a zero.
        assert_eq!(e.request_params_n.count(), 0, "not per choice");
        e.record_frontend(
            &FrontendStats::ParentFinished {
                n: 3,
                max_generation_tokens: None,
            },
            None,
        );
        assert_eq!(e.request_params_n.count(), 1);
        assert_eq!(e.request_max_num_generation_tokens.count(), 0);
    }

    #[test]
    fn tenants_get_their_own_series_up_to_the_bound() {
        let mut registry = Registry::default();
        let p = PrometheusLogger::new(
            Some((&mut registry, every_metric)),
            "vllm",
            "m",
            &[],
            &[0],
            100,
            &Default::default(),
            &[],
            OptionalMetrics::default(),
            2,
        );
        let labels = p.tenant_labels();
        let a = labels.slot(Some("team-a"));
        let b = labels.slot(Some("team-b"));
        let c = labels.slot(Some("team-c"));
        assert_eq!(
            (a, b, c),
            (1, 2, 2),
            "a bound of 2: anonymous, team-a, then other"
        );
        let e = p.engine(0).unwrap();
        let mut iter = IterationStats {
            num_prompt_tokens: 10,
            num_generation_tokens: 6,
            ..IterationStats::default()
        };
        iter.tenant_entry(a).prompt += 10;
        iter.tenant_entry(a).generation += 1;
        iter.tenant_entry(b).generation += 2;
        iter.tenant_entry(c).generation += 3;
        e.record_step(&SchedulerStats::default(), &iter);
        e.record_frontend(
            &FrontendStats::FirstToken {
                ttft: Duration::from_millis(5),
            },
            Some(&RequestRef::new("r", None).with_tenant(a)),
        );
        let (_, text) = crate::exposition::render(&registry, crate::Format::Prometheus);
        let line = |l: &str| text.lines().any(|x| x == l);
        assert!(
            line(r#"vllm:prompt_tokens_total{model_name="m",engine="0",tenant="team-a"} 10"#),
            "{text}"
        );
        assert!(
            line(r#"vllm:generation_tokens_total{model_name="m",engine="0",tenant="other"} 5"#),
            "{text}"
        );
        assert!(
            text.contains(r#"vllm:time_to_first_token_seconds_count{model_name="m",engine="0",tenant="team-a"} 1"#),
            "{text}"
        );
        assert!(
            line(r#"vllm:tenant_labels_folded{model_name="m"} 2"#),
            "{text}"
        );
        assert!(
            !text.contains("team-b") && !text.contains("team-c"),
            "{text}"
        );
        // The console's reading sums the tenants.
        assert_eq!(e.read().generation_tokens, 6);
    }

    #[test]
    fn unregistered_handles_still_count() {
        let p = PrometheusLogger::new(
            None,
            "x",
            "m",
            &[],
            &[3],
            100,
            &Default::default(),
            &[],
            OptionalMetrics::default(),
            2,
        );
        let e = p.engine(3).unwrap();
        e.record_frontend(
            &FrontendStats::NextToken {
                itl: Duration::from_millis(100),
                count: 1,
            },
            None,
        );
        assert_eq!(e.itl.count(), 1);
        assert!(p.engine(0).is_none());
    }
}

//! The catalogue: every metric's definition (name, vLLM's name where it
//! differs, help, type, unit, scope, labels, buckets), the lists the
//! registries walk, the flags that turn metrics on, and the label values.

use super::buckets::{
    BATCH_SIZE_BUCKETS, BucketGroup, BucketOverrides, Buckets, HTTP_DURATION_BUCKETS,
    HTTP_HIGHR_BUCKETS, HTTP_SIZE_BUCKETS, KV_RESIDENCY_BUCKETS, PARAMS_N_BUCKETS,
    PREEMPTIONS_BUCKETS, STEP_DURATION_BUCKETS,
};
use super::naming::{Style, name_prefix};

/// The name of engine metric `base` (a [`names`] constant; other names pass
/// through unchanged) under `namespace`, without the counter `_total`:
/// `inferscope_iteration_tokens`, `vllm:iteration_tokens_total`.
pub fn namespaced_name(namespace: &str, base: &str) -> String {
    let base = match Style::of(namespace) {
        Style::Vllm => ENGINE_METRICS
            .iter()
            .find(|d| d.name == base)
            .map_or(base, |d| d.vllm_base()),
        Style::Native => base,
    };
    format!("{}{base}", name_prefix(namespace))
}

/// The kind of a metric, as exposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricType {
    /// Monotonic counter; exposed with a `_total` suffix.
    Counter,
    /// Value that goes up and down.
    Gauge,
    /// Bucketed distribution (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl MetricType {
    /// The `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// What a metric's values measure (documentation only: names already carry
/// the unit suffix, so no OpenMetrics `# UNIT` line is emitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    /// Seconds.
    Seconds,
    /// Tokens.
    Tokens,
    /// Requests.
    Requests,
    /// Bytes.
    Bytes,
    /// A fraction in 0..1.
    Ratio,
    /// Engine steps.
    Steps,
    /// Sequences.
    Sequences,
    /// Preemptions.
    Preemptions,
    /// Engine core failures.
    Failures,
    /// A constant 1 whose labels carry information.
    Info,
    /// Trace spans.
    Spans,
    /// Floating-point operations.
    Flops,
    /// Tenants (distinct callers).
    Tenants,
}

impl Unit {
    /// The unit's name in the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Seconds => "seconds",
            Self::Tokens => "tokens",
            Self::Requests => "requests",
            Self::Bytes => "bytes",
            Self::Ratio => "ratio",
            Self::Steps => "steps",
            Self::Sequences => "sequences",
            Self::Preemptions => "preemptions",
            Self::Failures => "failures",
            Self::Info => "info",
            Self::Spans => "spans",
            Self::Flops => "flops",
            Self::Tenants => "tenants",
        }
    }
}

/// Which family of label sets a metric belongs to (and so which namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Per engine core: namespaced, carries `model_name` and `engine`.
    Engine,
    /// Per model (not per engine): namespaced, carries `model_name`.
    Model,
    /// HTTP server: not namespaced.
    Http,
}

/// One metric's facts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricDef {
    /// Name without namespace and without the counter `_total` suffix.
    pub name: &'static str,
    /// vLLM's name where it differs from `name` (used under [`Style::Vllm`]).
    pub vllm_name: Option<&'static str>,
    /// HELP text, without the final period (the encoder adds it).
    pub help: &'static str,
    /// Counter, gauge or histogram.
    pub metric_type: MetricType,
    /// What the values measure.
    pub unit: Unit,
    /// Engine, model or HTTP scope.
    pub scope: Scope,
    /// Every label key of the series, in exposition order.
    pub labels: &'static [&'static str],
    /// Histogram buckets.
    pub buckets: Buckets,
}

impl MetricDef {
    /// The name passed to the registry: namespaced, without `_total`.
    pub fn registered_name(&self, namespace: &str) -> String {
        match self.scope {
            Scope::Http => self.name.to_owned(),
            Scope::Engine | Scope::Model => namespaced_name(namespace, self.name),
        }
    }

    /// The name without namespace under [`Style::Vllm`].
    pub fn vllm_base(&self) -> &'static str {
        self.vllm_name.unwrap_or(self.name)
    }

    /// The family name as it appears in the exposition (`_total` on counters).
    pub fn exposed_name(&self, namespace: &str) -> String {
        let mut name = self.registered_name(namespace);
        if self.metric_type == MetricType::Counter {
            name.push_str("_total");
        }
        name
    }
}

/// The labels an engine-level series starts with.
const ENGINE: &[&str] = &["model_name", "engine"];
/// An engine-level series attributed to a tenant (bounded: [`TENANT_OTHER`]).
const ENGINE_TENANT: &[&str] = &["model_name", "engine", "tenant"];

/// Declares, per entry, a name constant in [`names`] and a `pub const`
/// [`MetricDef`] that uses it; brace-delimited so rustfmt keeps one compact
/// entry per metric.
macro_rules! metrics {
    ($(
        $(#[$meta:meta])*
        $id:ident = $cname:ident: $ty:ident $name:literal $(vllm $vllm:literal)?, unit $unit:ident, scope $scope:ident,
        labels $labels:expr, buckets $buckets:expr, $help:literal;
    )*) => {
        /// Every metric's name as a constant, without namespace and without the
        /// counter `_total` suffix: clients (bench, doctor, top, tests) name
        /// metrics through these, never through string literals.
        pub mod names {
            $(
                #[doc = concat!("`", $name, "`: ", $help, ".")]
                pub const $cname: &str = $name;
            )*
        }

        $(
            $(#[$meta])*
            #[doc = concat!("`", $name, "`: ", $help, ".")]
            pub const $id: MetricDef = MetricDef {
                name: names::$cname,
                vllm_name: [$(Some($vllm),)? None][0],
                help: $help,
                metric_type: MetricType::$ty,
                unit: Unit::$unit,
                scope: Scope::$scope,
                labels: $labels,
                buckets: $buckets,
            };
        )*
    };
}

use Buckets::{Fixed, Group};
const NB: Buckets = Buckets::None;

// Engine gauges.
metrics! {
    NUM_REQUESTS_RUNNING = NUM_REQUESTS_RUNNING: Gauge "num_requests_running", unit Requests, scope Engine, labels ENGINE, buckets NB,
        "Number of requests in model execution batches";
    NUM_REQUESTS_WAITING = NUM_REQUESTS_WAITING: Gauge "num_requests_waiting", unit Requests, scope Engine, labels ENGINE, buckets NB,
        "Number of requests waiting to be processed, preempted ones included";
    NUM_REQUESTS_WAITING_BY_REASON = NUM_REQUESTS_WAITING_BY_REASON: Gauge "num_requests_waiting_by_reason", unit Requests, scope Engine, labels &["model_name", "engine", "reason"], buckets NB,
        "Requests waiting, by reason: capacity (the last scheduling pass found no KV blocks, sequence slot or token budget for them) or deferred (the last step preempted, and the scheduler admits nothing on such a step so as not to refill the batch it just shrank); the reasons sum to num_requests_waiting";
    KV_CACHE_USAGE_PERC = KV_CACHE_USAGE_PERC: Gauge "kv_cache_usage_perc", unit Ratio, scope Engine, labels ENGINE, buckets NB,
        "KV-cache usage; 1 means 100 percent usage";
    CACHE_CONFIG_INFO = CACHE_CONFIG_INFO: Gauge "cache_config_info", unit Info, scope Engine, labels &["block_size", "cache_dtype", "enable_prefix_caching", "engine", "num_gpu_blocks"], buckets NB,
        "Information of the engine's cache configuration; value 1, labels carry the configuration";

    // Engine counters.
    PROMPT_TOKENS = PROMPT_TOKENS: Counter "prompt_tokens", unit Tokens, scope Engine, labels ENGINE_TENANT, buckets NB,
        "Number of prefill tokens processed";
    GENERATION_TOKENS = GENERATION_TOKENS: Counter "generation_tokens", unit Tokens, scope Engine, labels ENGINE_TENANT, buckets NB,
        "Number of generation tokens processed";
    NUM_PREEMPTIONS = NUM_PREEMPTIONS: Counter "num_preemptions", unit Preemptions, scope Engine, labels ENGINE, buckets NB,
        "Cumulative number of preemptions from the engine";
    REQUEST_SUCCESS = REQUEST_SUCCESS: Counter "request_success", unit Requests, scope Engine, labels &["model_name", "engine", "finished_reason", "tenant"], buckets NB,
        "Count of finished requests by finished_reason (stop, length, abort, error)";
    PREFIX_CACHE_QUERIES = PREFIX_CACHE_QUERIES: Counter "prefix_cache_queries", unit Tokens, scope Engine, labels ENGINE, buckets NB,
        "Prefix cache queries, in terms of number of queried tokens";
    PREFIX_CACHE_HITS = PREFIX_CACHE_HITS: Counter "prefix_cache_hits", unit Tokens, scope Engine, labels ENGINE, buckets NB,
        "Prefix cache hits, in terms of number of cached tokens";
    PROMPT_TOKENS_CACHED = PROMPT_TOKENS_CACHED: Counter "prompt_tokens_cached", unit Tokens, scope Engine, labels ENGINE_TENANT, buckets NB,
        "Number of prompt tokens served from the prefix cache, counted when the request gets its first token (prompt_tokens_by_source with source local_cache_hit)";
    PROMPT_TOKENS_BY_SOURCE = PROMPT_TOKENS_BY_SOURCE: Counter "prompt_tokens_by_source", unit Tokens, scope Engine, labels &["model_name", "engine", "source"], buckets NB,
        "Prompt tokens of requests that got their first token, by source: local_compute (run through the model) or local_cache_hit (taken from the prefix cache); the sources sum to prompt_tokens";
    ADMISSION_REJECTIONS = ADMISSION_REJECTIONS: Counter "admission_rejections", unit Requests, scope Model, labels &["model_name", "reason"], buckets NB,
        "Requests refused at admission, by reason";
    REQUEST_LOG_DROPPED = REQUEST_LOG_DROPPED: Counter "request_log_dropped", unit Requests, scope Model, labels &["model_name"], buckets NB,
        "Finished requests left out of the request log (--enable-request-log) because its writer fell behind";
    TENANT_LABELS_FOLDED = TENANT_LABELS_FOLDED: Gauge "tenant_labels_folded", unit Tenants, scope Model, labels &["model_name"], buckets NB,
        "Tenants counted under tenant=\"other\" because --max-tenant-labels distinct tenants already had their own label";

    // Engine histograms (seconds).
    TIME_TO_FIRST_TOKEN = TIME_TO_FIRST_TOKEN_SECONDS: Histogram "time_to_first_token_seconds", unit Seconds, scope Engine, labels ENGINE_TENANT, buckets Group(BucketGroup::TimeToFirstToken),
        "Histogram of time to first token in seconds";
    INTER_TOKEN_LATENCY = INTER_TOKEN_LATENCY_SECONDS: Histogram "inter_token_latency_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::InterTokenLatency),
        "Histogram of inter-token latency in seconds, one sample per output delta";
    TIME_PER_OUTPUT_TOKEN = REQUEST_TIME_PER_OUTPUT_TOKEN_SECONDS: Histogram "request_time_per_output_token_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::InterTokenLatency),
        "Histogram of time per output token in seconds per request: (e2e - TTFT) / (tokens - 1)";
    E2E_REQUEST_LATENCY = E2E_REQUEST_LATENCY_SECONDS: Histogram "e2e_request_latency_seconds", unit Seconds, scope Engine, labels ENGINE_TENANT, buckets Group(BucketGroup::RequestLatency),
        "Histogram of end to end request latency in seconds";
    REQUEST_QUEUE_TIME = REQUEST_QUEUE_TIME_SECONDS: Histogram "request_queue_time_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestLatency),
        "Histogram of time spent in WAITING phase for request";
    REQUEST_INFERENCE_TIME = REQUEST_INFERENCE_TIME_SECONDS: Histogram "request_inference_time_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestLatency),
        "Histogram of time spent in RUNNING phase for request";
    REQUEST_PREFILL_TIME = REQUEST_PREFILL_TIME_SECONDS: Histogram "request_prefill_time_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestLatency),
        "Histogram of time spent in PREFILL phase for request";
    REQUEST_DECODE_TIME = REQUEST_DECODE_TIME_SECONDS: Histogram "request_decode_time_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestLatency),
        "Histogram of time spent in DECODE phase for request";

    // Engine histograms (counts).
    REQUEST_PROMPT_TOKENS = REQUEST_PROMPT_TOKENS: Histogram "request_prompt_tokens", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestTokens),
        "Number of prefill tokens processed per request";
    REQUEST_GENERATION_TOKENS = REQUEST_GENERATION_TOKENS: Histogram "request_generation_tokens", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestTokens),
        "Number of generation tokens processed per request";
    REQUEST_PARAMS_MAX_TOKENS = REQUEST_PARAMS_MAX_TOKENS: Histogram "request_params_max_tokens", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestTokens),
        "Histogram of the max_tokens request parameter";
    REQUEST_MAX_NUM_GENERATION_TOKENS = REQUEST_MAX_NUM_GENERATION_TOKENS: Histogram "request_max_num_generation_tokens", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestTokens),
        "Histogram of maximum number of requested generation tokens";
    ITERATION_TOKENS = ITERATION_TOKENS: Histogram "iteration_tokens" vllm "iteration_tokens_total", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::IterationTokens),
        "Histogram of number of tokens per engine step";
    REQUEST_PARAMS_N = REQUEST_PARAMS_N: Histogram "request_params_n", unit Sequences, scope Engine, labels ENGINE, buckets Fixed(PARAMS_N_BUCKETS),
        "Histogram of the n request parameter";
    REQUEST_PREFILL_KV_COMPUTED_TOKENS = REQUEST_PREFILL_KV_COMPUTED_TOKENS: Histogram "request_prefill_kv_computed_tokens", unit Tokens, scope Engine, labels ENGINE, buckets Group(BucketGroup::RequestTokens),
        "Per finished request: prompt tokens whose keys and values were computed, i.e. prompt tokens minus prefix-cache hits at first scheduling";
    REQUEST_NUM_PREEMPTIONS = REQUEST_NUM_PREEMPTIONS: Histogram "request_num_preemptions", unit Preemptions, scope Engine, labels ENGINE, buckets Fixed(PREEMPTIONS_BUCKETS),
        "Number of preemptions per finished request";

    // Beyond vLLM: device saturation and host overhead.
    ENGINE_STEPS = ENGINE_STEPS: Counter "engine_steps", unit Steps, scope Engine, labels ENGINE, buckets NB,
        "Engine steps executed";
    DEVICE_BUSY_SECONDS = DEVICE_BUSY_SECONDS: Counter "device_busy_seconds", unit Seconds, scope Engine, labels ENGINE, buckets NB,
        "Time the device spent on forward passes, a part of the execute phase (the cpu executor's input preparation and sampling are not in it); its rate is the device utilisation";
    ENGINE_STEP_DURATION = ENGINE_STEP_DURATION_SECONDS: Histogram "engine_step_duration_seconds", unit Seconds, scope Engine, labels &["model_name", "engine", "phase"], buckets Fixed(STEP_DURATION_BUCKETS),
        "Wall time per engine step by phase: schedule (with the host work between steps), execute (the executor call, device time included), postprocess; the phases plus engine_idle_seconds add up to the engine loop's wall time";
    ENGINE_IDLE_SECONDS = ENGINE_IDLE_SECONDS: Counter "engine_idle_seconds", unit Seconds, scope Engine, labels ENGINE, buckets NB,
        "Time the engine loop waited with nothing to run";
    BATCH_SIZE = BATCH_SIZE: Histogram "batch_size", unit Sequences, scope Engine, labels ENGINE, buckets Fixed(BATCH_SIZE_BUCKETS),
        "Sequences per engine step";
    GRAMMAR_MASK_DURATION = GRAMMAR_MASK_DURATION_SECONDS: Histogram "grammar_mask_duration_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Fixed(STEP_DURATION_BUCKETS),
        "Wall time per engine step spent computing the token masks of structured outputs (steps with a constrained sequence only), spread over the grammar threads (--grammar-threads) while the forward pass runs: the step waits for it only where it is longer than the forward pass";
    ENGINE_CORE_FAILURES = ENGINE_CORE_FAILURES: Counter "engine_core_failures", unit Failures, scope Engine, labels &["model_name", "engine", "cause"], buckets NB,
        "Engine cores that stopped serving for good, by cause (panic, executor_error); the log and /health give the message";
    TRACE_SPANS_DROPPED = TRACE_SPANS_DROPPED: Counter "trace_spans_dropped", unit Spans, scope Model, labels &["model_name", "reason"], buckets NB,
        "Request trace spans not delivered to the OTLP collector, by reason (queue_full: the export queue was full; export_failed: the collector did not accept them)";


    // KV block residency (only with --kv-cache-metrics; a sampled fraction of blocks).
    KV_BLOCK_LIFETIME = KV_BLOCK_LIFETIME_SECONDS: Histogram "kv_block_lifetime_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Fixed(KV_RESIDENCY_BUCKETS),
        "Sampled KV blocks (--kv-cache-metrics): time from allocation until the prefix-cached content was evicted";
    KV_BLOCK_IDLE_BEFORE_EVICT = KV_BLOCK_IDLE_BEFORE_EVICT_SECONDS: Histogram "kv_block_idle_before_evict_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Fixed(KV_RESIDENCY_BUCKETS),
        "Sampled KV blocks (--kv-cache-metrics): time from the last use (allocation, prefix hit or release) until eviction";
    KV_BLOCK_REUSE_GAP = KV_BLOCK_REUSE_GAP_SECONDS: Histogram "kv_block_reuse_gap_seconds", unit Seconds, scope Engine, labels ENGINE, buckets Fixed(KV_RESIDENCY_BUCKETS),
        "Sampled KV blocks (--kv-cache-metrics): time from the last use (allocation, prefix hit or release) until a prefix-cache hit takes the block again";

    // Model FLOPs and bytes (only with --enable-mfu-metrics): the executor's cost model.
    ESTIMATED_FLOPS = ESTIMATED_FLOPS_PER_GPU: Counter "estimated_flops_per_gpu", unit Flops, scope Engine, labels ENGINE, buckets NB,
        "Estimate (--enable-mfu-metrics): model FLOPs of the steps run, from the executor's cost model; its rate over the device's peak is the model FLOPs utilisation";
    ESTIMATED_READ_BYTES = ESTIMATED_READ_BYTES_PER_GPU: Counter "estimated_read_bytes_per_gpu", unit Bytes, scope Engine, labels ENGINE, buckets NB,
        "Estimate (--enable-mfu-metrics): bytes read from device memory by the steps run (weights once per step, the KV of every context token), from the executor's cost model";
    ESTIMATED_WRITE_BYTES = ESTIMATED_WRITE_BYTES_PER_GPU: Counter "estimated_write_bytes_per_gpu", unit Bytes, scope Engine, labels ENGINE, buckets NB,
        "Estimate (--enable-mfu-metrics): bytes written to device memory by the steps run (the KV of every new token), from the executor's cost model";
    KV_EVENTS_DROPPED_BATCHES = KV_EVENTS_DROPPED_BATCHES: Counter "kv_events_dropped_batches", unit Steps, scope Engine, labels ENGINE, buckets NB,
        "Engine steps whose KV-cache event batch was dropped because the publisher's queue was full (--kv-events-config); a router fed by these events misses those changes until it replays";

    // Mixture-of-experts routing (only with --expert-metrics; one series per expert).
    MOE_EXPERT_TOKENS = MOE_EXPERT_TOKENS: Counter "moe_expert_tokens", unit Tokens, scope Engine, labels &["model_name", "engine", "expert"], buckets NB,
        "Tokens routed to each expert of a mixture-of-experts model (--expert-metrics), summed over its MoE layers (a token counts once per layer that routes it there); one series per expert index, so at most the model's expert count";

    // HTTP (prometheus-fastapi-instrumentator's names, no namespace).
    HTTP_REQUESTS = HTTP_REQUESTS: Counter "http_requests", unit Requests, scope Http, labels &["handler", "method", "status"], buckets NB,
        "Total number of requests by method, status and handler";
    HTTP_REQUEST_SIZE = HTTP_REQUEST_SIZE_BYTES: Histogram "http_request_size_bytes", unit Bytes, scope Http, labels &["handler"], buckets Fixed(HTTP_SIZE_BUCKETS),
        "Size of incoming request bodies by handler (Content-Length, else counted)";
    HTTP_RESPONSE_SIZE = HTTP_RESPONSE_SIZE_BYTES: Histogram "http_response_size_bytes", unit Bytes, scope Http, labels &["handler"], buckets Fixed(HTTP_SIZE_BUCKETS),
        "Size of outgoing response bodies by handler, counted as the body is sent";
    HTTP_REQUEST_DURATION_HIGHR = HTTP_REQUEST_DURATION_HIGHR_SECONDS: Histogram "http_request_duration_highr_seconds", unit Seconds, scope Http, labels &[], buckets Fixed(HTTP_HIGHR_BUCKETS),
        "Latency with many buckets but no API specific labels, until the last body byte is sent";
    HTTP_REQUEST_DURATION = HTTP_REQUEST_DURATION_SECONDS: Histogram "http_request_duration_seconds", unit Seconds, scope Http, labels &["method", "handler"], buckets Fixed(HTTP_DURATION_BUCKETS),
        "Latency with only few buckets by handler, until the last body byte is sent";
    HTTP_REQUESTS_INPROGRESS = HTTP_REQUESTS_INPROGRESS: Gauge "http_requests_inprogress", unit Requests, scope Http, labels &["method", "handler"], buckets NB,
        "Number of HTTP requests in progress";
}

/// Every engine- and model-level metric, in exposition order.
pub const ENGINE_METRICS: &[MetricDef] = &[
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    NUM_REQUESTS_WAITING_BY_REASON,
    KV_CACHE_USAGE_PERC,
    CACHE_CONFIG_INFO,
    PROMPT_TOKENS,
    GENERATION_TOKENS,
    NUM_PREEMPTIONS,
    REQUEST_SUCCESS,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
    PROMPT_TOKENS_CACHED,
    PROMPT_TOKENS_BY_SOURCE,
    ADMISSION_REJECTIONS,
    REQUEST_LOG_DROPPED,
    TENANT_LABELS_FOLDED,
    TIME_TO_FIRST_TOKEN,
    INTER_TOKEN_LATENCY,
    TIME_PER_OUTPUT_TOKEN,
    E2E_REQUEST_LATENCY,
    REQUEST_QUEUE_TIME,
    REQUEST_INFERENCE_TIME,
    REQUEST_PREFILL_TIME,
    REQUEST_DECODE_TIME,
    REQUEST_PROMPT_TOKENS,
    REQUEST_GENERATION_TOKENS,
    REQUEST_PARAMS_MAX_TOKENS,
    REQUEST_MAX_NUM_GENERATION_TOKENS,
    ITERATION_TOKENS,
    REQUEST_PARAMS_N,
    REQUEST_PREFILL_KV_COMPUTED_TOKENS,
    REQUEST_NUM_PREEMPTIONS,
    ENGINE_STEPS,
    DEVICE_BUSY_SECONDS,
    ENGINE_STEP_DURATION,
    ENGINE_IDLE_SECONDS,
    BATCH_SIZE,
    GRAMMAR_MASK_DURATION,
    ENGINE_CORE_FAILURES,
    TRACE_SPANS_DROPPED,
    KV_BLOCK_LIFETIME,
    KV_BLOCK_IDLE_BEFORE_EVICT,
    KV_BLOCK_REUSE_GAP,
    ESTIMATED_FLOPS,
    ESTIMATED_READ_BYTES,
    ESTIMATED_WRITE_BYTES,
    KV_EVENTS_DROPPED_BATCHES,
    MOE_EXPERT_TOKENS,
];

/// The flag that turns a metric on, for those off by default (vLLM's flag
/// names); `None` for metrics always exposed.
pub fn enabling_flag(def: &MetricDef) -> Option<&'static str> {
    if [
        KV_BLOCK_LIFETIME,
        KV_BLOCK_IDLE_BEFORE_EVICT,
        KV_BLOCK_REUSE_GAP,
    ]
    .iter()
    .any(|d| d.name == def.name)
    {
        Some(KV_CACHE_METRICS_FLAG)
    } else if [ESTIMATED_FLOPS, ESTIMATED_READ_BYTES, ESTIMATED_WRITE_BYTES]
        .iter()
        .any(|d| d.name == def.name)
    {
        Some(MFU_METRICS_FLAG)
    } else if def.name == MOE_EXPERT_TOKENS.name {
        Some(EXPERT_METRICS_FLAG)
    } else {
        None
    }
}

/// The server flag that turns the KV block residency histograms on.
pub const KV_CACHE_METRICS_FLAG: &str = "--kv-cache-metrics";
/// The server flag that turns the estimated FLOPs and bytes counters on.
pub const MFU_METRICS_FLAG: &str = "--enable-mfu-metrics";
/// The server flag that turns the per-expert token counter on.
pub const EXPERT_METRICS_FLAG: &str = "--expert-metrics";

/// The `reason` label values of `num_requests_waiting_by_reason`.
pub const WAITING_REASONS: [&str; 2] = ["capacity", "deferred"];
/// The `source` label values of `prompt_tokens_by_source` (vLLM's third,
/// `external_kv_transfer`, needs a KV connector, which inferscope has not).
pub const PROMPT_TOKEN_SOURCES: [&str; 2] = ["local_compute", "local_cache_hit"];

/// The `tenant` label of requests no key or trusted header named.
pub const TENANT_ANONYMOUS: &str = "anonymous";
/// The `tenant` label of every tenant past the `--max-tenant-labels` bound.
pub const TENANT_OTHER: &str = "other";
/// The default of `--max-tenant-labels`: distinct `tenant` label values
/// (`anonymous` included, `other` not) before the rest fold into `other`.
pub const DEFAULT_MAX_TENANT_LABELS: usize = 32;
/// The server flag that bounds the `tenant` label.
pub const MAX_TENANT_LABELS_FLAG: &str = "--max-tenant-labels";

/// Every HTTP metric, in exposition order.
pub const HTTP_METRICS: &[MetricDef] = &[
    HTTP_REQUESTS,
    HTTP_REQUEST_SIZE,
    HTTP_RESPONSE_SIZE,
    HTTP_REQUEST_DURATION_HIGHR,
    HTTP_REQUEST_DURATION,
    HTTP_REQUESTS_INPROGRESS,
];

/// Every metric of the schema.
pub fn all_metrics() -> impl Iterator<Item = &'static MetricDef> {
    ENGINE_METRICS.iter().chain(HTTP_METRICS)
}

/// The `phase` label values of `engine_step_duration_seconds`, in index order.
pub const STEP_PHASES: [&str; 3] = ["schedule", "execute", "postprocess"];

impl BucketOverrides {
    /// The buckets in force for `def` under `namespace` (an empty list for
    /// non-histograms).
    pub fn buckets_for(&self, def: &MetricDef, namespace: &str, max_model_len: usize) -> Vec<f64> {
        def.buckets.bounds(self, namespace, max_model_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::buckets::{
        REQUEST_LATENCY_BUCKETS, REQUEST_LATENCY_FINE_BUCKETS, one_two_five_buckets,
        validate_buckets,
    };
    use crate::schema::naming::{DEFAULT_NAMESPACE, LEGACY_DEFAULT_NAMESPACE};
    use std::collections::HashSet;

    #[test]
    fn overrides_from_spec() {
        let mut o = BucketOverrides::default();
        o.set_from_str("time_to_first_token=0.1,1").unwrap();
        assert_eq!(
            o.buckets_for(&TIME_TO_FIRST_TOKEN, "vllm", 10),
            vec![0.1, 1.0]
        );
        assert_eq!(
            o.buckets_for(&E2E_REQUEST_LATENCY, "vllm", 10),
            REQUEST_LATENCY_BUCKETS
        );
        assert_eq!(
            o.buckets_for(&E2E_REQUEST_LATENCY, DEFAULT_NAMESPACE, 10),
            REQUEST_LATENCY_FINE_BUCKETS
        );
        assert!(o.set_from_str("ttft=1").is_err());
        assert!(o.set_from_str("request_latency=2,1").is_err());
        assert_eq!(
            o.buckets_for(&REQUEST_PROMPT_TOKENS, "vllm", 100),
            one_two_five_buckets(100)
        );
        // An override wins in the native namespace too.
        o.set_from_str("request_latency=0.5,1").unwrap();
        assert_eq!(
            o.buckets_for(&REQUEST_QUEUE_TIME, DEFAULT_NAMESPACE, 10),
            vec![0.5, 1.0]
        );
    }

    #[test]
    fn schema_is_consistent() {
        let mut names = HashSet::new();
        for def in all_metrics() {
            assert!(names.insert(def.name), "duplicate {}", def.name);
            assert!(
                !def.help.ends_with('.'),
                "{}: encoder appends the period",
                def.name
            );
            assert!(
                !(def.metric_type == MetricType::Counter && def.name.ends_with("_total")),
                "{}: counters are registered without _total",
                def.name
            );
            let is_hist = def.metric_type == MetricType::Histogram;
            assert_eq!(is_hist, def.buckets != Buckets::None, "{}", def.name);
            if let Buckets::Fixed(b) = def.buckets {
                validate_buckets(b).unwrap();
            }
            if def.scope == Scope::Engine && def.name != "cache_config_info" {
                assert_eq!(&def.labels[..2], ENGINE, "{}", def.name);
            }
        }
    }

    #[test]
    fn names_are_namespaced() {
        assert_eq!(
            REQUEST_SUCCESS.exposed_name("vllm"),
            "vllm:request_success_total"
        );
        assert_eq!(
            NUM_REQUESTS_RUNNING.exposed_name("inferscope"),
            "inferscope_num_requests_running"
        );
        assert_eq!(HTTP_REQUESTS.exposed_name("vllm"), "http_requests_total");
        assert_eq!(
            HTTP_REQUESTS.exposed_name("inferscope"),
            "http_requests_total"
        );
        // The histogram of tokens per step: lint-clean natively, vLLM's name under vllm.
        assert_eq!(
            ITERATION_TOKENS.exposed_name("inferscope"),
            "inferscope_iteration_tokens"
        );
        assert_eq!(
            ITERATION_TOKENS.exposed_name("vllm"),
            "vllm:iteration_tokens_total"
        );
        // Any other namespace follows the native rule.
        assert_eq!(ITERATION_TOKENS.exposed_name("x"), "x_iteration_tokens");
        assert_eq!(PROMPT_TOKENS.exposed_name("x"), "x_prompt_tokens_total");
        assert_eq!(PROMPT_TOKENS.exposed_name(""), "prompt_tokens_total");
        // The older spelling, as readers name it.
        assert_eq!(
            ITERATION_TOKENS.exposed_name(LEGACY_DEFAULT_NAMESPACE),
            "inferscope:iteration_tokens_total"
        );
        assert_eq!(
            namespaced_name(LEGACY_DEFAULT_NAMESPACE, names::KV_CACHE_USAGE_PERC),
            "inferscope:kv_cache_usage_perc"
        );
        // Names outside the schema (older vLLM names, `_total` forms) pass through.
        assert_eq!(
            namespaced_name("vllm", "gpu_cache_usage_perc"),
            "vllm:gpu_cache_usage_perc"
        );
        // No name in the native style carries a colon or a `_total` it should not.
        for def in all_metrics() {
            let n = def.exposed_name(DEFAULT_NAMESPACE);
            assert!(!n.contains(':'), "{n}");
            assert_eq!(
                n.ends_with("_total"),
                def.metric_type == MetricType::Counter,
                "{n}"
            );
        }
    }
}

//! The server's state and how it is built: the tokenizer, the executors and
//! engine cores, the metrics, the validation workers and the limits.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::ValueEnum;

use inferscope_engine::{
    Coordinator, EngineConfig, Executor, ExecutorError, GrammarCompiler, KvEventSink,
    SchedulingPolicy, SimExecutor, SimProfile,
    sim::{SimFaults, SimTokens},
};
use inferscope_kv_events::{KvEventPublisher, KvEventsConfig};
use inferscope_metrics::{CacheConfig, MetricsConfig, StatLoggerManager};
use inferscope_model::{
    ByteTokenizer, ChatTemplate, GenerationDefaults, HfTokenizer, KvDtype, LoadedModel, ModelError,
    ModelOptions, PackedCache, Tokenizer, chat_template::load_template_arg,
    tokenizer::WithChatTemplate,
};
use inferscope_schema::{
    BucketOverrides, EngineFailure, FinishedRequestStats, IterationStats, SchedulerStats,
    StatsRecorder,
};

use crate::admission::Admission;
use crate::cli::{ExecutorKind, ServeArgs};
use crate::error::ServerError;
use crate::openai::infer::Infer;
use crate::openai::structured::StartupGrammar;
use crate::openai::tool_parsers::ParserName;
use crate::openai::tools::ToolSettings;
use crate::openai::validation::{Limits, Validator};
use crate::otel::{TraceConfig, Traces};
use crate::request_ids::RequestIds;
use crate::request_log::{Destination, RECENT_CAPACITY, RecentRequests, RequestLog};
use crate::validation_workers::ValidationWorkers;
use inferscope_tenants::{Access, TenantKeys};

/// Everything a handler needs.
pub struct AppState {
    /// The engine cores.
    pub coordinator: Coordinator,
    /// Text to tokens and back.
    pub tokenizer: Arc<dyn Tokenizer>,
    /// Compiles structured-output constraints over the tokenizer's
    /// vocabulary (built in the background from start-up; none when it
    /// cannot be read: such requests get a 400).
    pub grammar: StartupGrammar,
    /// The metrics system.
    pub metrics: Arc<StatLoggerManager>,
    /// Whether request-level metrics are recorded and `/metrics` served.
    pub metrics_enabled: bool,
    /// Names the model answers to; the first is canonical.
    pub served_model_names: Vec<String>,
    /// What `--model` pointed at (`root` in `/v1/models`).
    pub model_root: String,
    /// Validation limits.
    pub limits: Limits,
    /// Who may call /v1/* and as which tenant (`--api-key`,
    /// `--api-key-file`, `--tenant-header`).
    pub access: Access,
    /// Start time, unix seconds (`created` of the model card).
    pub created: u64,
    /// Admission control (waiting requests, queued prompt tokens).
    pub admission: Admission,
    /// Client-facing and engine request ids.
    pub request_ids: RequestIds,
    /// Where requests are parsed, rendered and tokenized, off the runtime.
    pub validation_workers: ValidationWorkers,
    /// Request tracing, when `--otlp-traces-endpoint` is set.
    pub traces: Option<Arc<Traces>>,
    /// `--enable-per-request-metrics`: honour `include_metrics`.
    pub per_request_metrics: bool,
    /// Where finished requests are logged: `--enable-request-log`, and the
    /// console's recent requests unless `--disable-console`.
    pub request_log: Option<RequestLog>,
    /// Whether KV-cache events are published (and their debug routes served).
    pub kv_events: bool,
    /// Tool calling: `--enable-auto-tool-choice`, `--tool-call-parser`.
    pub tool_settings: ToolSettings,
    /// `--profile-dir`, created at start: where `/stop_profile` writes
    /// (`None`: the profile routes are not served).
    pub profile_dir: Option<std::path::PathBuf>,
    /// `GET /tokenizer_info`'s body, built once at start
    /// (`--enable-tokenizer-info-endpoint`; `None`: the route is not served).
    pub tokenizer_info: Option<serde_json::Value>,
}

impl AppState {
    /// What requests are validated against.
    pub fn validator(&self) -> Validator<'_> {
        Validator {
            served_model_names: &self.served_model_names,
            limits: &self.limits,
            tokenizer: self.tokenizer.as_ref(),
            tools: self.tool_settings,
            grammar: &self.grammar,
        }
    }

    /// What requests are generated with.
    pub fn infer(&self) -> Infer<'_> {
        Infer {
            coordinator: &self.coordinator,
            admission: &self.admission,
            tokenizer: &self.tokenizer,
            metrics: &self.metrics,
            record_latency: self.metrics_enabled,
            ids: &self.request_ids,
            request_log: self.request_log.as_ref(),
        }
    }
}

/// `--generation-config` and `--override-generation-config`: the sampling
/// defaults of requests that omit a field.
fn generation_defaults(args: &ServeArgs) -> Result<GenerationDefaults, ServerError> {
    let read = |r: Result<GenerationDefaults, ModelError>| {
        r.map_err(|e| ServerError::Config(format!("--generation-config: {e}")))
    };
    let defaults = match args.generation_config.as_str() {
        "vllm" => GenerationDefaults::NONE,
        "auto" => read(GenerationDefaults::for_model(&args.model))?,
        folder => {
            let dir = Path::new(folder);
            if !dir.join("generation_config.json").is_file() {
                return Err(ServerError::Config(format!(
                    "--generation-config: {folder} has no generation_config.json (give auto, vllm or a folder holding one)"
                )));
            }
            read(GenerationDefaults::from_dir(dir))?
        }
    };
    match &args.override_generation_config {
        None => Ok(defaults),
        Some(text) => serde_json::from_str(text)
            .map_err(|e| e.to_string())
            .and_then(|v| defaults.with_overrides(&v))
            .map_err(|e| ServerError::Config(format!("--override-generation-config: {e}"))),
    }
}

/// `cache_dtype` of the sim executor: its profiles model bf16 KV caches
/// (2 bytes per element, as in the profiles' KV sizes).
pub const SIM_CACHE_DTYPE: &str = "bfloat16";

/// Unix time in seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Builds the state: loads the model, starts the engine cores and metrics.
pub fn build_state(args: &ServeArgs) -> Result<Arc<AppState>, ServerError> {
    let config_err = |m: String| ServerError::Config(m);
    if args.data_parallel_size == 0 {
        return Err(config_err("--data-parallel-size must be at least 1".into()));
    }
    if args.threads == Some(0) {
        return Err(config_err("--threads must be at least 1".into()));
    }
    if args.validation_workers == 0 {
        return Err(config_err("--validation-workers must be at least 1".into()));
    }
    if args.grammar_threads == Some(0) {
        return Err(config_err("--grammar-threads must be at least 1".into()));
    }
    // As vLLM: with fewer tokens per step than running sequences, the first
    // ones would decode every step and the rest wait behind them.
    let budget = args.max_num_batched_tokens();
    if budget < args.max_num_seqs {
        return Err(config_err(format!(
            "--max-num-batched-tokens ({budget}) must be at least --max-num-seqs ({}): \
             every running sequence needs a token in each step",
            args.max_num_seqs
        )));
    }
    if !(args.log_stats_interval.is_finite() && args.log_stats_interval > 0.0) {
        return Err(config_err(
            "--log-stats-interval must be a positive number of seconds".into(),
        ));
    }
    // Checked before anything starts, so a bad tracing setting fails fast.
    let trace_config = args
        .otlp_traces_endpoint
        .as_deref()
        .map(|url| TraceConfig::from_env(url, args.otlp_traces_sample_ratio))
        .transpose()?;
    let kv_events_config = args
        .kv_events_config
        .as_deref()
        .map(KvEventsConfig::parse)
        .transpose()
        .map_err(|e| config_err(e.to_string()))?
        .filter(KvEventsConfig::publishes);
    let mut buckets = BucketOverrides::default();
    for spec in &args.histogram_buckets {
        buckets
            .set_from_str(spec)
            .map_err(|e| config_err(format!("--histogram-buckets {spec}: {e}")))?;
    }

    // The model side: a tokenizer, a length limit and an executor factory.
    type Factory = Box<dyn FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError>>;
    let (tokenizer, model_max_len, mut factory, served_default, cache_dtype): (
        Arc<dyn Tokenizer>,
        usize,
        Factory,
        String,
        &'static str,
    ) = match args.executor {
        ExecutorKind::Sim => {
            let profile: SimProfile = args
                .sim_profile
                .parse()
                .map_err(|e| config_err(format!("--sim-profile: {e}")))?;
            tracing::info!(profile = %profile, "sim executor");
            let faults = SimFaults {
                fail_every_n_steps: args.sim_fail_every_n_steps,
                die_after_steps: args.sim_die_after_steps,
            };
            if faults != SimFaults::default() {
                tracing::warn!(?faults, engine = ?args.sim_fault_engine, "injecting sim executor faults (test only)");
            }
            let fault_engine = args.sim_fault_engine;
            let factory: Factory = Box::new(move |engine| {
                let mut sim = SimExecutor::new(profile.clone(), SimTokens::default());
                if fault_engine.is_none_or(|e| e == engine) {
                    sim = sim.with_faults(faults.clone());
                }
                Ok(Box::new(sim) as Box<dyn Executor>)
            });
            let tokenizer: Arc<dyn Tokenizer> = match &args.tokenizer {
                Some(path) => {
                    Arc::new(load_tokenizer(path).map_err(|source| ServerError::Model {
                        model: path.clone(),
                        source,
                    })?)
                }
                None => Arc::new(ByteTokenizer),
            };
            (
                tokenizer,
                8192,
                factory,
                args.model.clone(),
                SIM_CACHE_DTYPE,
            )
        }
        ExecutorKind::Cpu => {
            // `--kv-cache-dtype` picks the KV pool's type whatever
            // `--dtype` says (that flag picks the weight storage only).
            let kv_cache_dtype = KvDtype::parse(&args.kv_cache_dtype)
                .map_err(|e| config_err(format!("--kv-cache-dtype: {e}")))?;
            let opts = ModelOptions {
                kv_cache_memory: args.kv_cache_memory,
                dtype: args.dtype.clone(),
                num_threads: args.threads,
                packed_cache: (!args.no_packed_weights_cache)
                    .then(|| {
                        args.packed_weights_cache_dir
                            .clone()
                            .or_else(PackedCache::default_dir)
                    })
                    .flatten()
                    .map(|dir| PackedCache {
                        dir,
                        background: true,
                    }),
                kv_cache_dtype,
                logprobs_mode: if args.logprobs_mode == "processed_logprobs" {
                    inferscope_model::LogprobsMode::ProcessedLogprobs
                } else {
                    inferscope_model::LogprobsMode::RawLogprobs
                },
                ..ModelOptions::default()
            };
            let model =
                LoadedModel::load(&args.model, &opts).map_err(|source| ServerError::Model {
                    model: args.model.clone(),
                    source,
                })?;
            if model.is_demo() {
                tracing::warn!(
                    "serving the built-in demo model: a tiny Llama with seeded random weights; its text is not meaningful"
                );
            }
            let name = model.name().to_owned();
            let max_len = model.max_model_len();
            let tokenizer = model.tokenizer();
            let factory: Factory = Box::new(move |_| {
                model
                    .executor()
                    .map_err(|e| ExecutorError::Init(e.to_string()))
            });
            (tokenizer, max_len, factory, name, kv_cache_dtype.name())
        }
    };
    // `--chat-template` replaces the model's template (vLLM's flag).
    let tokenizer: Arc<dyn Tokenizer> = match &args.chat_template {
        Some(arg) => Arc::new(
            load_template_arg(arg)
                .and_then(|source| WithChatTemplate::new(tokenizer, source))
                .map_err(|e| config_err(format!("--chat-template: {e}")))?,
        ),
        None => tokenizer,
    };
    let max_model_len = match args.max_model_len {
        Some(0) => return Err(config_err("--max-model-len must be at least 1".into())),
        Some(l) if l > model_max_len => {
            return Err(config_err(format!(
                "--max-model-len {l} exceeds the model's limit of {model_max_len} tokens"
            )));
        }
        Some(l) => l,
        None => model_max_len,
    };
    let served_model_names = if args.served_model_name.is_empty() {
        vec![served_default]
    } else {
        args.served_model_name.clone()
    };

    let sample = args.kv_cache_metrics_sample;
    if !(sample.is_finite() && sample > 0.0 && sample <= 1.0) {
        return Err(config_err(format!(
            "--kv-cache-metrics-sample must be a fraction in (0, 1], got {sample}"
        )));
    }
    let mfu_metrics = args.enable_mfu_metrics;
    let access = args
        .tenants
        .access(args.api_key.as_deref())
        .map_err(config_err)?;
    let engine_config = EngineConfig {
        max_num_batched_tokens: args.max_num_batched_tokens(),
        max_num_seqs: args.max_num_seqs,
        block_size: args.block_size,
        enable_prefix_caching: args.prefix_caching(),
        max_model_len,
        kv_cache_metrics_sample: args.kv_cache_metrics.then_some(sample),
        enable_mfu_metrics: mfu_metrics,
        enable_expert_metrics: args.expert_metrics,
        scheduling_policy: match args.scheduling_policy.as_str() {
            "fcfs" => SchedulingPolicy::Fcfs,
            _ => SchedulingPolicy::Fair,
        },
        tenant_weights: access.keys().map(TenantKeys::weights).unwrap_or_default(),
        grammar_threads: args.grammar_threads,
    };
    let engine_indices: Vec<usize> =
        (args.data_parallel_rank..args.data_parallel_rank + args.data_parallel_size).collect();
    // The metrics manager needs the block counts, which the executors know
    // only once started; the recorder forwards to it once it exists.
    let forward = Arc::new(ForwardingRecorder::default());
    let kv_sink = match &kv_events_config {
        Some(c) => Some(Arc::new(
            KvEventPublisher::start(c, &engine_indices).map_err(|e| config_err(e.to_string()))?,
        ) as Arc<dyn KvEventSink>),
        None => None,
    };
    let kv_events = kv_sink.is_some();
    let coordinator = Coordinator::start_with_kv_events(
        engine_config.clone(),
        args.data_parallel_size,
        args.data_parallel_rank,
        &mut factory,
        forward.clone(),
        kv_sink,
    )?;
    let cache_configs = coordinator
        .engines()
        .map(|e| CacheConfig {
            block_size: e.block_size,
            num_gpu_blocks: e.num_blocks,
            enable_prefix_caching: engine_config.enable_prefix_caching,
            cache_dtype: cache_dtype.into(),
        })
        .collect();
    let metrics = Arc::new(StatLoggerManager::new(MetricsConfig {
        namespace: args.metrics_namespace.clone(),
        model_name: served_model_names[0].clone(),
        // One label for every served name, as vLLM does.
        more_model_names: Vec::new(),
        engine_indices,
        max_model_len,
        buckets,
        cache_configs,
        enable_prometheus: !args.disable_metrics,
        enable_log_stats: !args.disable_log_stats,
        aggregate_log_lines: false,
        metric_filter: inferscope_metrics::every_metric,
        optional_metrics: inferscope_metrics::OptionalMetrics {
            kv_cache_metrics: args.kv_cache_metrics,
            mfu_metrics,
            expert_metrics: args.expert_metrics,
        },
        max_tenant_labels: args.tenants.max_tenant_labels,
    })?);
    forward.set(metrics.clone());
    // The key file's tenants (by name) and `default` take their labels
    // first, so the ones that fold into `other` are the later header-named.
    let labels = metrics.tenant_labels();
    for name in access.keys().iter().flat_map(|k| k.weights().into_keys()) {
        labels.slot(Some(&name));
    }

    let traces = match &trace_config {
        Some(config) => {
            let traces = Traces::start(config, metrics.trace_span_drops())?;
            tracing::info!(endpoint = %config.endpoint, protocol = ?config.protocol, sampler = ?config.sampler, "exporting request traces over OTLP");
            Some(traces)
        }
        None => None,
    };
    let sampling_defaults = generation_defaults(args)?;
    if !sampling_defaults.is_empty() {
        tracing::warn!(
            defaults = %sampling_defaults,
            "the model's generation config sets the sampling defaults of requests that omit them; \
             start with --generation-config vllm to turn this off"
        );
    }
    let limits = Limits {
        sampling_defaults,
        max_model_len: max_model_len.min(coordinator.max_sequence_tokens()),
        vocab_size: tokenizer.vocab_size(),
        max_n: 128,
        max_choices: 256,
        max_stop_sequences: args.max_stop_sequences,
        max_stop_sequence_bytes: args.max_stop_sequence_bytes,
        max_stop_token_ids: args.max_stop_token_ids,
        max_logprobs: args.max_logprobs,
    };
    // The console's recent requests are the request log kept in memory.
    let recent = (!args.disable_console).then(|| Arc::new(RecentRequests::new(RECENT_CAPACITY)));
    let request_log = match (&args.enable_request_log, recent) {
        (Some(dest), recent) => Some(
            RequestLog::start(&Destination::parse(dest), metrics.clone())
                .map_err(|e| config_err(format!("--enable-request-log: {e}")))?
                .with_recent(recent),
        ),
        (None, Some(recent)) => Some(RequestLog::recent_only(recent)),
        (None, None) => None,
    };
    if let Some(dir) = &args.profile_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            config_err(format!(
                "--profile-dir: cannot create {}: {e}",
                dir.display()
            ))
        })?;
    }
    let grammar = {
        let tokenizer = tokenizer.clone();
        StartupGrammar::spawn(move || grammar_compiler(tokenizer.as_ref()))
    };
    let tokenizer_info = args
        .enable_tokenizer_info_endpoint
        .then(|| tokenizer_info(tokenizer.as_ref(), limits.max_model_len));
    Ok(Arc::new(AppState {
        coordinator,
        tokenizer,
        grammar,
        metrics,
        metrics_enabled: !args.disable_metrics,
        served_model_names,
        model_root: args.model.clone(),
        limits,
        access,
        created: unix_now(),
        admission: Admission::new(args.max_waiting_requests, args.max_queued_tokens),
        request_ids: RequestIds::default(),
        validation_workers: ValidationWorkers::new(
            args.validation_workers,
            args.max_validation_queue_bytes,
        ),
        traces,
        per_request_metrics: args.enable_per_request_metrics,
        request_log,
        kv_events,
        tool_settings: ToolSettings {
            auto_tool_choice: args.enable_auto_tool_choice,
            // clap checked the name against the same list.
            parser: args
                .tool_call_parser
                .as_deref()
                .and_then(|name| ParserName::from_str(name, false).ok()),
            exclude_tools_when_none: args.exclude_tools_when_tool_choice_none,
        },
        tokenizer_info,
        profile_dir: args.profile_dir.clone(),
    }))
}

/// `GET /tokenizer_info`'s body: the `tokenizer_config.json` fields vLLM
/// returns that a client needs to tokenize as the server does. Never a path
/// or a token of the model's source, unlike a raw `tokenizer_config.json`.
pub fn tokenizer_info(tokenizer: &dyn Tokenizer, max_model_len: usize) -> serde_json::Value {
    let text = |id: Option<u32>| id.and_then(|id| tokenizer.decode(&[id], false).ok());
    let bos = tokenizer.bos_token_id();
    // Whether the tokenizer adds BOS itself (a client must not add another).
    let add_bos_token = bos.is_some_and(|b| {
        tokenizer
            .encode("", true)
            .is_ok_and(|ids| ids.first() == Some(&b))
    });
    let mut info = serde_json::json!({
        "tokenizer_class": tokenizer.tokenizer_class(),
        "bos_token": text(bos),
        "eos_token": text(tokenizer.eos_token_ids().first().copied()),
        "add_bos_token": add_bos_token,
        "model_max_length": max_model_len,
    });
    if let Some(template) = tokenizer.chat_template_source() {
        info["chat_template"] = template.into();
    }
    info
}

/// The structured-output compiler over `tokenizer`'s vocabulary, built once
/// from start-up on (a trie of every token: tens of milliseconds for a 128k
/// vocabulary). A vocabulary llguidance cannot read costs only structured
/// outputs, with a warning now and a 400 per request that asks for them.
fn grammar_compiler(tokenizer: &dyn Tokenizer) -> Option<GrammarCompiler> {
    let built = tokenizer
        .token_bytes()
        .map_err(|e| e.to_string())
        .and_then(|words| {
            let eos = tokenizer
                .eos_token_ids()
                .first()
                .copied()
                .ok_or_else(|| "the tokenizer has no EOS token".to_owned())?;
            GrammarCompiler::new(words, eos).map_err(|e| e.to_string())
        });
    match built {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "structured outputs are unavailable for this tokenizer");
            None
        }
    }
}

/// A `tokenizer.json`, or a directory with one (and maybe a chat template in
/// its `chat_template.jinja` or `tokenizer_config.json`).
fn load_tokenizer(path: &str) -> Result<HfTokenizer, inferscope_model::ModelError> {
    let path = std::path::Path::new(path);
    if !path.is_dir() {
        return HfTokenizer::from_file(path, Vec::new(), None);
    }
    let template = ChatTemplate::from_hf_dir(path);
    Ok(
        HfTokenizer::from_file(&path.join("tokenizer.json"), Vec::new(), None)?
            .with_chat_template(template),
    )
}

/// Hands engine stats to the metrics manager once it exists.
#[derive(Default)]
struct ForwardingRecorder(std::sync::OnceLock<Arc<StatLoggerManager>>);

impl ForwardingRecorder {
    fn set(&self, m: Arc<StatLoggerManager>) {
        let _ = self.0.set(m);
    }
}

impl StatsRecorder for ForwardingRecorder {
    fn record_step(&self, engine: usize, s: &SchedulerStats, i: &IterationStats) {
        if let Some(m) = self.0.get() {
            m.record_step(engine, s, i);
        }
    }
    fn record_finished(&self, engine: usize, f: &[FinishedRequestStats]) {
        if let Some(m) = self.0.get() {
            m.record_finished(engine, f);
        }
    }
    fn record_idle(&self, engine: usize, s: &SchedulerStats, idle: Duration) {
        if let Some(m) = self.0.get() {
            m.record_idle(engine, s, idle);
        }
    }
    fn record_engine_failure(&self, engine: usize, cause: EngineFailure) {
        if let Some(m) = self.0.get() {
            m.record_engine_failure(engine, cause);
        }
    }
    fn record_kv_events_dropped(&self, engine: usize, batches: u64) {
        if let Some(m) = self.0.get() {
            m.record_kv_events_dropped(engine, batches);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `cache_dtype` label names the KV pool's element type, whose
    /// size is what the pool holds per element.
    #[test]
    fn cpu_cache_dtype_matches_the_kv_pool() {
        for (flag, name, bytes) in [
            ("auto", "float16", 2),
            ("bfloat16", "bfloat16", 2),
            ("float32", "float32", 4),
        ] {
            let dtype = KvDtype::parse(flag).expect("a dtype");
            assert_eq!(dtype.name(), name);
            let pool = inferscope_model::kv_storage::KvStorage::with_dtype(dtype, 1, 1, 1, 1, 1);
            // One key and one value element.
            assert_eq!(pool.size_bytes() / 2, bytes, "{flag}");
        }
    }
}

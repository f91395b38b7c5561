//! Start-up: executors, engine cores, metrics, the router, the listener, the
//! periodic stats log, and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use inferscope_engine::{
    Coordinator, EngineConfig, Executor, ExecutorError, SimExecutor, SimProfile,
    sim::{SimFaults, SimTokens},
};
use inferscope_metrics::{
    BucketOverrides, CacheConfig, MetricsConfig, StatLoggerManager, StatsRecorder,
};
use inferscope_model::{
    ByteTokenizer, ChatTemplate, HfTokenizer, LoadedModel, ModelOptions, Tokenizer,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admission::Admission;
use crate::cli::{ExecutorKind, ServeArgs};
use crate::routes;
use crate::validation::{Limits, Validator};

/// A server that cannot start, with the reason.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A flag value is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The model could not be loaded.
    #[error("cannot load model `{model}`")]
    Model {
        /// The `--model` value.
        model: String,
        /// Why.
        source: inferscope_model::ModelError,
    },
    /// The engine could not start.
    #[error(transparent)]
    Engine(#[from] inferscope_engine::EngineError),
    /// The metrics system could not start.
    #[error("metrics: {0}")]
    Metrics(#[from] inferscope_metrics::ConfigError),
    /// The listener could not be bound or served.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Everything a handler needs.
pub struct AppState {
    /// The engine cores.
    pub coordinator: Coordinator,
    /// Text to tokens and back.
    pub tokenizer: Arc<dyn Tokenizer>,
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
    /// Bearer token required on /v1/*.
    pub api_key: Option<String>,
    /// Start time, unix seconds (`created` of the model card).
    pub created: u64,
    /// Admission control (waiting requests, queued prompt tokens).
    pub admission: Admission,
    /// Source of request ids.
    pub next_request: AtomicU64,
    /// A per-process prefix that keeps generated ids unique across restarts.
    pub id_prefix: String,
}

impl AppState {
    /// What requests are validated against.
    pub fn validator(&self) -> Validator<'_> {
        Validator {
            served_model_names: &self.served_model_names,
            limits: &self.limits,
            tokenizer: self.tokenizer.as_ref(),
        }
    }
}

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
    if !(args.log_stats_interval.is_finite() && args.log_stats_interval > 0.0) {
        return Err(config_err(
            "--log-stats-interval must be a positive number of seconds".into(),
        ));
    }
    let mut buckets = BucketOverrides::default();
    for spec in &args.histogram_buckets {
        buckets
            .set_from_str(spec)
            .map_err(|e| config_err(format!("--histogram-buckets {spec}: {e}")))?;
    }

    // The model side: a tokenizer, a length limit and an executor factory.
    type Factory = Box<dyn FnMut(usize) -> Result<Box<dyn Executor>, ExecutorError>>;
    let (tokenizer, model_max_len, mut factory, served_default): (
        Arc<dyn Tokenizer>,
        usize,
        Factory,
        String,
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
                Some(path) => Arc::new(load_tokenizer(path).map_err(|source| {
                    ServerError::Model {
                        model: path.clone(),
                        source,
                    }
                })?),
                None => Arc::new(ByteTokenizer),
            };
            (tokenizer, 8192, factory, args.model.clone())
        }
        ExecutorKind::Cpu => {
            let opts = ModelOptions {
                kv_cache_memory: args.kv_cache_memory,
                dtype: args.dtype.clone(),
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
            (tokenizer, max_len, factory, name)
        }
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

    let engine_config = EngineConfig {
        max_num_batched_tokens: args.max_num_batched_tokens,
        max_num_seqs: args.max_num_seqs,
        block_size: args.block_size,
        enable_prefix_caching: args.prefix_caching(),
        max_model_len,
    };
    let engine_indices: Vec<usize> =
        (args.data_parallel_rank..args.data_parallel_rank + args.data_parallel_size).collect();
    // The metrics manager needs the block counts, which the executors know
    // only once started; the recorder forwards to it once it exists.
    let forward = Arc::new(ForwardingRecorder::default());
    let coordinator = Coordinator::start(
        engine_config.clone(),
        args.data_parallel_size,
        args.data_parallel_rank,
        &mut factory,
        forward.clone(),
    )?;
    let cache_configs = coordinator
        .engines()
        .map(|e| CacheConfig {
            block_size: e.block_size,
            num_gpu_blocks: e.num_blocks,
            enable_prefix_caching: engine_config.enable_prefix_caching,
            cache_dtype: "auto".into(),
        })
        .collect();
    let metrics = Arc::new(StatLoggerManager::new(MetricsConfig {
        namespace: args.metrics_namespace.clone(),
        model_name: served_model_names[0].clone(),
        engine_indices,
        max_model_len,
        buckets,
        cache_configs,
        enable_prometheus: !args.disable_metrics,
        enable_log_stats: !args.disable_log_stats,
        aggregate_log_lines: false,
    })?);
    forward.set(metrics.clone());

    let limits = Limits {
        max_model_len: max_model_len.min(coordinator.max_sequence_tokens()),
        vocab_size: tokenizer.vocab_size(),
        max_n: 128,
        max_choices: 256,
    };
    Ok(Arc::new(AppState {
        coordinator,
        tokenizer,
        metrics,
        metrics_enabled: !args.disable_metrics,
        served_model_names,
        model_root: args.model.clone(),
        limits,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        created: unix_now(),
        admission: Admission::new(args.max_waiting_requests, args.max_queued_tokens),
        next_request: AtomicU64::new(0),
        id_prefix: format!("{:x}", unix_now() ^ u64::from(std::process::id()) << 32),
    }))
}

/// A `tokenizer.json`, or a directory with one (and maybe a chat template in
/// its `tokenizer_config.json`).
fn load_tokenizer(path: &str) -> Result<HfTokenizer, inferscope_model::ModelError> {
    let path = std::path::Path::new(path);
    if !path.is_dir() {
        return HfTokenizer::from_file(path, Vec::new(), None);
    }
    let template = std::fs::read_to_string(path.join("tokenizer_config.json"))
        .ok()
        .and_then(|text| ChatTemplate::from_tokenizer_config(&text));
    Ok(HfTokenizer::from_file(&path.join("tokenizer.json"), Vec::new(), None)?
        .with_chat_template(template))
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
    fn record_step(
        &self,
        engine: usize,
        s: &inferscope_metrics::SchedulerStats,
        i: &inferscope_metrics::IterationStats,
    ) {
        if let Some(m) = self.0.get() {
            m.record_step(engine, s, i);
        }
    }
    fn record_finished(&self, engine: usize, f: &[inferscope_metrics::FinishedRequestStats]) {
        if let Some(m) = self.0.get() {
            m.record_finished(engine, f);
        }
    }
    fn record_idle(&self, engine: usize, s: &inferscope_metrics::SchedulerStats, idle: Duration) {
        if let Some(m) = self.0.get() {
            m.record_idle(engine, s, idle);
        }
    }
}

/// The router: OpenAI routes (behind the API key), health, version, and
/// `/metrics` when `serve_metrics` (else it answers 404: it is served on a
/// separate listener), all under the HTTP metrics layer.
pub fn router(state: Arc<AppState>, max_body: usize, serve_metrics: bool) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(routes::models))
        .route("/v1/completions", post(routes::completions))
        .route("/v1/chat/completions", post(routes::chat_completions))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routes::require_api_key,
        ));
    let mut app = Router::new()
        .merge(v1)
        .route("/health", get(routes::health))
        .route("/version", get(routes::version));
    if serve_metrics {
        app = app.route("/metrics", get(routes::metrics));
    }
    app.fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(state.metrics.http_layer())
        .with_state(state)
}

/// The router of the separate metrics listener: `/metrics` alone (plus
/// `/health`, which probes on that network may want), no request bodies.
pub fn metrics_router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/metrics", get(routes::metrics))
        .route("/health", get(routes::health))
        .fallback(routes::not_found)
        .layer(DefaultBodyLimit::max(0))
        .layer(state.metrics.http_layer())
        .with_state(state)
}

/// A server running in the background (tests, embedding).
pub struct RunningServer {
    /// The bound address of the API.
    pub addr: SocketAddr,
    /// The bound address of the separate metrics listener, when configured.
    pub metrics_addr: Option<SocketAddr>,
    /// The shared state.
    pub state: Arc<AppState>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    metrics_task: Option<tokio::task::JoinHandle<()>>,
}

impl RunningServer {
    /// Stops accepting, lets requests finish up to `timeout`, aborts the
    /// rest (their streams end with an explicit abort and error event), and
    /// shuts the engines down. The metrics listener, if separate, stays up
    /// until the API has drained, so the drain can be watched.
    pub async fn shutdown(self, timeout: Duration) {
        let _ = self.stop.send(true);
        let state = self.state.clone();
        let _ = tokio::task::spawn_blocking(move || state.coordinator.shutdown(timeout)).await;
        // The cores are gone, so every stream has its final event; give the
        // connections a moment to deliver it.
        let _ = tokio::time::timeout(timeout + Duration::from_secs(1), self.task).await;
        if let Some(t) = self.metrics_task {
            t.abort();
        }
    }
}

/// Binds `host:port` with TCP_NODELAY on accepted sockets.
async fn bind(
    host: &str,
    port: u16,
) -> Result<(impl axum::serve::Listener<Addr = SocketAddr>, SocketAddr), ServerError> {
    let addr = format!("{host}:{port}");
    let listener = TcpListener::bind(&addr)
        .await
        .map_err(|source| ServerError::Listen {
            addr: addr.clone(),
            source,
        })?;
    let local = listener
        .local_addr()
        .map_err(|source| ServerError::Listen { addr, source })?;
    // Without TCP_NODELAY, SSE chunks meet Nagle's algorithm and delayed ACKs.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    Ok((listener, local))
}

/// Builds everything and serves on `args.host:args.port` in the background
/// (and `/metrics` on `--metrics-host:--metrics-port` when set).
pub async fn start(args: &ServeArgs) -> Result<RunningServer, ServerError> {
    let state = {
        let args = args.clone();
        tokio::task::spawn_blocking(move || build_state(&args))
            .await
            .map_err(|e| ServerError::Config(format!("start-up panicked: {e}")))??
    };
    let (listener, local) = bind(&args.host, args.port).await?;
    let separate_metrics = match args.metrics_port {
        Some(port) => {
            let host = args.metrics_host.as_deref().unwrap_or(&args.host);
            Some(bind(host, port).await?)
        }
        None => None,
    };
    let (stop, mut stopped) = watch::channel(false);
    let app = router(
        state.clone(),
        args.max_request_body_bytes,
        separate_metrics.is_none(),
    );
    let (metrics_addr, metrics_task) = match separate_metrics {
        Some((listener, addr)) => {
            let app = metrics_router(state.clone());
            let task = tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "metrics listener stopped with an error");
                }
            });
            tracing::info!(%addr, "serving /metrics on a separate listener");
            (Some(addr), Some(task))
        }
        None => (None, None),
    };
    let log_task = (!args.disable_log_stats).then(|| {
        let metrics = state.metrics.clone();
        let period = Duration::from_secs_f64(args.log_stats_interval);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            tick.tick().await;
            loop {
                tick.tick().await;
                metrics.log();
            }
        })
    });
    let task = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "server stopped with an error");
        }
        if let Some(t) = log_task {
            t.abort();
        }
    });
    Ok(RunningServer {
        addr: local,
        metrics_addr,
        state,
        stop,
        task,
        metrics_task,
    })
}

/// Caps glibc's malloc arenas at two, unless `MALLOC_ARENA_MAX` is set.
///
/// With one arena per thread by default, a server with many runtime threads
/// keeps growing its resident memory for a long while as each thread's arena
/// fills to its own peak (measured: +35% over a 100k-request soak, flat with
/// two arenas; see docs/reliability.md). Call it before starting threads.
pub fn limit_allocator_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only changes allocator tuning; it is called before
        // the server's threads start.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Serves until SIGINT or SIGTERM, then shuts down gracefully.
pub async fn run(args: ServeArgs) -> Result<(), ServerError> {
    let server = start(&args).await?;
    tracing::info!(
        addr = %server.addr,
        model = %server.state.served_model_names[0],
        engines = server.state.coordinator.engine_indices().len(),
        "inferscope is serving (OpenAI API under /v1, metrics at /metrics)"
    );
    shutdown_signal().await;
    // Listen for a second signal before saying we are draining.
    let second_signal = shutdown_signal();
    tracing::info!(
        timeout_s = args.shutdown_timeout,
        "shutting down: finishing in-flight requests"
    );
    let state = server.state.clone();
    let drain = server.shutdown(Duration::from_secs_f64(args.shutdown_timeout.max(0.0)));
    tokio::pin!(drain);
    tokio::select! {
        _ = &mut drain => return Ok(()),
        _ = second_signal => {}
    }
    // A second signal: the operator will not wait. Abort what is left now —
    // still with an explicit final event per request — and finish the drain.
    tracing::warn!("second signal: aborting the remaining requests now");
    let _ = tokio::task::spawn_blocking(move || state.coordinator.shutdown(Duration::ZERO)).await;
    drain.await;
    Ok(())
}

/// Registers for SIGINT and SIGTERM now (so a signal that arrives before the
/// future is first polled is not lost) and resolves on the next one.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{Signal, SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt()).ok();
        let terminate = signal(SignalKind::terminate()).ok();
        async fn next(s: Option<Signal>) {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending::<()>().await,
            }
        }
        async move {
            tokio::select! {
                _ = next(interrupt) => {},
                _ = next(terminate) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

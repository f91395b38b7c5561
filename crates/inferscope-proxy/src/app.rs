//! The proxy's router and handlers: the generation routes (measured), every
//! other path (passed through, counted by the HTTP layer only), `/metrics`
//! (the proxy's registry, then the upstream's exposition), start and run.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use inferscope_metrics::http::{CountingBody, HttpMetricsService, RequestStart, RouteTemplate};
use inferscope_metrics::{EngineMetrics, Format, MetricsConfig, StatLoggerManager, negotiate};
use inferscope_schema::schema::{self, MetricDef};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tower::Layer;

use crate::observe::{
    BodyKind, ObservedBody, Observer, Outcome, RequestView, with_usage_requested,
};
use crate::relay::{RelayPool, Sent};
use crate::upstream::{
    self, BaseUrl, UpstreamClient, UpstreamFailure, copy_end_to_end, error_response, is_hop_by_hop,
};
use crate::{ProxyArgs, ProxyError};

/// The metrics the proxy can measure from outside an engine; the rest of the
/// schema (queue, prefill and decode time, KV cache, steps, device time,
/// preemptions, waiting requests, admission) is left unregistered, so absent.
/// `num_requests_running` is the number of requests in flight through the proxy.
pub const PROXY_METRICS: &[MetricDef] = &[
    schema::NUM_REQUESTS_RUNNING,
    schema::PROMPT_TOKENS,
    schema::GENERATION_TOKENS,
    schema::REQUEST_SUCCESS,
    schema::TIME_TO_FIRST_TOKEN,
    schema::INTER_TOKEN_LATENCY,
    schema::TIME_PER_OUTPUT_TOKEN,
    schema::E2E_REQUEST_LATENCY,
    schema::REQUEST_PROMPT_TOKENS,
    schema::REQUEST_GENERATION_TOKENS,
    schema::REQUEST_PARAMS_MAX_TOKENS,
    schema::REQUEST_MAX_NUM_GENERATION_TOKENS,
    schema::REQUEST_PARAMS_N,
];

/// The proxy's [`inferscope_metrics::MetricFilter`]: [`PROXY_METRICS`] only.
pub fn measurable_by_proxy(def: &MetricDef) -> bool {
    PROXY_METRICS.iter().any(|d| d.name == def.name)
}

/// How long a scrape of the upstream's `/metrics` may take.
const UPSTREAM_METRICS_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest upstream exposition re-exposed.
const MAX_UPSTREAM_METRICS: usize = 64 * 1024 * 1024;

/// Everything the handlers share.
pub(crate) struct AppState {
    base: BaseUrl,
    upstream_metrics: Option<Uri>,
    client: UpstreamClient,
    /// The measured routes' (and body-less pass-through requests') upstream
    /// connections, read in the client's task.
    relay: RelayPool,
    manager: Arc<StatLoggerManager>,
    models: Arc<ModelSeries>,
    api_key: Option<String>,
    upstream_auth: Option<HeaderValue>,
    upstream_timeout: Duration,
    max_body: usize,
    inject_usage: bool,
    warned_collisions: Arc<AtomicBool>,
}

impl AppState {
    /// A copy for another thread's runtime: the same metrics and settings,
    /// its own upstream connection pool (a connection is driven by the
    /// runtime that opened it, so sharing one would bring back the
    /// cross-thread wake-ups the per-thread runtimes exist to avoid).
    fn for_thread(&self, connect_timeout: Duration) -> Self {
        Self {
            base: self.base.clone(),
            upstream_metrics: self.upstream_metrics.clone(),
            client: upstream::client(connect_timeout),
            relay: RelayPool::new(connect_timeout),
            manager: Arc::clone(&self.manager),
            models: Arc::clone(&self.models),
            api_key: self.api_key.clone(),
            upstream_auth: self.upstream_auth.clone(),
            upstream_timeout: self.upstream_timeout,
            max_body: self.max_body,
            inject_usage: self.inject_usage,
            warned_collisions: Arc::clone(&self.warned_collisions),
        }
    }
}

/// A proxy serving in the background (tests, embedding).
pub struct RunningProxy {
    /// The bound address.
    pub addr: SocketAddr,
    /// The `model_name` label in use.
    pub model_name: String,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), std::io::Error>>,
}

impl RunningProxy {
    /// Stops accepting; open streams get `timeout` to finish, then are cut.
    pub async fn shutdown(self, timeout: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(timeout, &mut task).await.is_err() {
            task.abort();
        }
    }
}

fn seconds(flag: &str, v: f64) -> Result<Duration, ProxyError> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            ProxyError::Flag(format!(
                "--{flag} must be a positive number of seconds, got {v}"
            ))
        })
}

fn metrics_url(url: &str) -> Result<Uri, ProxyError> {
    let bad = |reason: &str| ProxyError::Upstream {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = url
        .parse()
        .map_err(|_| bad("not a URL (expected http://host:port/metrics)"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(bad("expected http://host:port/metrics"));
    }
    Ok(uri)
}

/// Models given their own series at most; more share the `other` series.
pub const MAX_MODELS: usize = 32;
/// The `model_name` of requests for a model outside the known set.
pub const OTHER_MODEL: &str = "other";

/// The models the upstream lists at `/v1/models`, in its order.
async fn discover_models(client: &UpstreamClient, base: &BaseUrl) -> Vec<String> {
    let listed = async {
        let uri = base.join("/v1/models").ok()?;
        let req = http::Request::get(uri).body(Body::empty()).ok()?;
        let resp = upstream::send(client, base, req, Duration::from_secs(10))
            .await
            .ok()?;
        if !resp.status().is_success() {
            return None;
        }
        let body = Limited::new(resp.into_body(), 4 * 1024 * 1024)
            .collect()
            .await
            .ok()?
            .to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).ok()?;
        let ids = v
            .get("data")?
            .as_array()?
            .iter()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
            .collect::<Vec<_>>();
        Some(ids)
    };
    listed.await.unwrap_or_default()
}

/// The series of each model the proxy labels requests with: a fixed set
/// chosen at start-up (`--served-model-name`, else the upstream's
/// `/v1/models`), so a client cannot create series by inventing names.
pub struct ModelSeries {
    // Shared, not cloned per request: a handle set is dozens of `Arc`s.
    known: Vec<Arc<EngineMetrics>>,
    /// The only model (every request is labelled with it, whatever its
    /// `model` says: single-model servers ignore the field), or `other`.
    fallback: Arc<EngineMetrics>,
}

impl ModelSeries {
    /// The series of a request for `model`.
    pub fn for_request(&self, model: Option<&str>) -> &Arc<EngineMetrics> {
        model
            .and_then(|m| self.known.iter().find(|e| e.model_name() == m))
            .unwrap_or(&self.fallback)
    }
}

/// The `model_name`s to keep series for, from the flag or the upstream.
fn model_names(given: &[String], listed: Vec<String>, upstream: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let source = if given.is_empty() {
        listed
    } else {
        given.to_vec()
    };
    for name in source {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    if names.len() > MAX_MODELS {
        tracing::warn!(
            models = names.len(),
            kept = MAX_MODELS,
            "more models than the proxy keeps series for: requests for the rest are labelled model_name=\"other\" (name the ones to keep with --served-model-name)"
        );
        names.truncate(MAX_MODELS);
    }
    if names.is_empty() {
        tracing::warn!(
            upstream,
            "the upstream listed no model at /v1/models: labelling metrics model_name=\"unknown\" (set --served-model-name)"
        );
        names.push("unknown".to_owned());
    }
    names
}

/// Everything a listening thread needs, built once at start-up.
struct Prepared {
    state: AppState,
    model_name: String,
    connect_timeout: Duration,
}

/// Validates the flags, finds the model name and builds the metrics.
async fn prepare(args: &ProxyArgs) -> Result<Prepared, ProxyError> {
    let base = BaseUrl::parse(&args.upstream)?;
    let upstream_metrics = args
        .upstream_metrics
        .as_deref()
        .map(metrics_url)
        .transpose()?;
    let connect_timeout = seconds("connect-timeout", args.connect_timeout)?;
    let upstream_timeout = seconds("upstream-timeout", args.upstream_timeout)?;
    let upstream_auth = args
        .upstream_api_key
        .as_deref()
        .map(|k| HeaderValue::from_str(&format!("Bearer {k}")))
        .transpose()
        .map_err(|_| {
            ProxyError::Flag("--upstream-api-key has characters a header cannot carry".into())
        })?;
    let client = upstream::client(connect_timeout);
    let listed = if args.served_model_name.is_empty() {
        discover_models(&client, &base).await
    } else {
        Vec::new()
    };
    let names = model_names(&args.served_model_name, listed, base.as_str());
    // Several models: unknown names get the `other` series.
    let more: Vec<String> = names[1..]
        .iter()
        .cloned()
        .chain((names.len() > 1).then(|| OTHER_MODEL.to_owned()))
        .collect();
    let manager = Arc::new(StatLoggerManager::new(MetricsConfig {
        namespace: args.metrics_namespace.clone(),
        model_name: names[0].clone(),
        more_model_names: more,
        engine_indices: vec![0],
        max_model_len: args.max_model_len.max(1),
        enable_log_stats: false,
        metric_filter: measurable_by_proxy,
        ..Default::default()
    })?);
    let series = |name: &str| {
        manager
            .model_engine(name, 0)
            .cloned()
            .map(Arc::new)
            .ok_or_else(|| ProxyError::Flag(format!("no series for model {name:?}")))
    };
    let known = names
        .iter()
        .map(|n| series(n))
        .collect::<Result<Vec<_>, _>>()?;
    let fallback = if names.len() == 1 {
        known[0].clone()
    } else {
        series(OTHER_MODEL)?
    };
    let model_name = names.join(",");
    let models = Arc::new(ModelSeries { known, fallback });
    let state = AppState {
        base,
        upstream_metrics,
        client,
        relay: RelayPool::new(connect_timeout),
        manager,
        models,
        api_key: args.api_key.clone(),
        upstream_auth,
        upstream_timeout,
        max_body: args.max_request_body,
        inject_usage: !args.no_usage_injection,
        warned_collisions: Arc::new(AtomicBool::new(false)),
    };
    Ok(Prepared {
        state,
        model_name,
        connect_timeout,
    })
}

/// A listening socket on `addr`; with `reuse_port`, several (one per
/// thread) share the address and the kernel spreads connections over them.
fn bind(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, std::io::Error> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    #[cfg(unix)]
    if reuse_port {
        socket.set_reuseport(true)?;
    }
    #[cfg(not(unix))]
    let _ = reuse_port;
    socket.bind(addr)?;
    socket.listen(1024)
}

async fn resolve(host: &str, port: u16) -> Result<SocketAddr, ProxyError> {
    let addr = format!("{host}:{port}");
    let listen_err = |source| ProxyError::Listen {
        addr: addr.clone(),
        source,
    };
    tokio::net::lookup_host(&addr)
        .await
        .map_err(listen_err)?
        .next()
        .ok_or_else(|| {
            listen_err(std::io::Error::new(
                std::io::ErrorKind::AddrNotAvailable,
                "the host resolves to no address",
            ))
        })
}

/// Builds everything and serves on `args.host:args.port` in the background,
/// on the calling runtime (tests, embedding; `inferscope proxy` uses [`run`]).
pub async fn start(args: &ProxyArgs) -> Result<RunningProxy, ProxyError> {
    let Prepared {
        state, model_name, ..
    } = prepare(args).await?;
    let addr = resolve(&args.host, args.port).await?;
    let listener = bind(addr, false).map_err(|source| ProxyError::Listen {
        addr: addr.to_string(),
        source,
    })?;
    let local = listener.local_addr().map_err(|source| ProxyError::Listen {
        addr: addr.to_string(),
        source,
    })?;
    let (stop, stopped) = watch::channel(false);
    let state = Arc::new(state);
    let task = tokio::spawn(serve_http1(
        listener,
        ProxyService::new(state.clone()),
        stopped,
    ));
    tracing::info!(
        listen = %local,
        upstream = state.base.as_str(),
        model_name,
        "proxying; metrics at /metrics"
    );
    Ok(RunningProxy {
        addr: local,
        model_name,
        stop,
        task,
    })
}

/// Accepts connections and serves each over HTTP/1.1 until `stop`, then lets
/// open connections finish (the caller bounds how long).
///
/// Not `axum::serve`: it speaks HTTP/1 and HTTP/2 and so reads the first 24
/// bytes of every connection on their own to look for the HTTP/2 preface, a
/// syscall and a poll more on the path of every first request; OpenAI
/// clients speak HTTP/1.1, and a proxy's added latency is its whole cost.
async fn serve_http1(
    listener: TcpListener,
    service: ProxyService,
    stop: watch::Receiver<bool>,
) -> Result<(), std::io::Error> {
    // Each connection holds a sender: when all are dropped, all have ended.
    let (open, mut all_closed) = tokio::sync::mpsc::channel::<()>(1);
    let mut stopped = stop.clone();
    let stopping = async move {
        let _ = stopped.wait_for(|s| *s).await;
    };
    tokio::pin!(stopping);
    let app = &service.app;
    let period = timer_floor_period(app.upstream_timeout, app.relay.connect_timeout());
    let floor = tokio::time::sleep(period);
    tokio::pin!(floor);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                // Out of descriptors or a connection reset before accept:
                // the listener itself is fine; pause so a storm does not spin.
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
            },
            () = &mut stopping => break,
            () = &mut floor => {
                floor.as_mut().reset(tokio::time::Instant::now() + period);
                continue;
            }
        };
        // Without TCP_NODELAY, SSE chunks meet Nagle's algorithm and delayed ACKs.
        let _ = stream.set_nodelay(true);
        let conn = crate::inbound::serve_connection(stream, service.clone(), stop.clone());
        let open = open.clone();
        tokio::spawn(async move {
            conn.await;
            drop(open);
        });
    }
    drop(listener);
    drop(open);
    let _ = all_closed.recv().await;
    Ok(())
}

/// The period of the accept loop's timer (the floor), which keeps a timer
/// pending on the runtime that is due sooner than any request's: half the
/// shorter of `--upstream-timeout` and `--connect-timeout`, within
/// 10 ms..5 s (timeouts under 20 ms aside), waking an idle proxy rarely.
///
/// Why: tokio wakes its driver (an `eventfd` write, then an `epoll_wait`
/// that returns at once) whenever a new timer is due before every pending
/// one, and with none pending that was every request's `--upstream-timeout`,
/// registered just after the request leaves: two syscalls a request, while
/// the upstream works for the first token on the same cores. Behind a
/// sooner timer a request's registers without a wake-up.
fn timer_floor_period(upstream: Duration, connect: Duration) -> Duration {
    (upstream.min(connect) / 2).clamp(Duration::from_millis(10), Duration::from_secs(5))
}

/// How long open streams get to finish after SIGINT or SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

fn current_thread_runtime() -> Result<tokio::runtime::Runtime, ProxyError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ProxyError::Serve)
}

/// Serves until `stop`, then gives open connections [`SHUTDOWN_GRACE`].
async fn serve_bounded(
    listener: TcpListener,
    app: ProxyService,
    stop: watch::Receiver<bool>,
) -> Result<(), std::io::Error> {
    let mut stopped = stop.clone();
    let grace = async move {
        let _ = stopped.wait_for(|s| *s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        r = serve_http1(listener, app, stop) => r,
        () = grace => Ok(()),
    }
}

/// `inferscope proxy`: serves until SIGINT or SIGTERM (blocking; call it
/// outside any runtime).
///
/// One current-thread runtime per thread (`--threads`, default one per
/// CPU), each accepting on its own `SO_REUSEPORT` listener and keeping its
/// own upstream connections: a request's client connection, handler,
/// upstream connection and response body all run on one thread, so passing
/// a chunk from the upstream socket to the client socket wakes no other
/// thread (on a multi-thread runtime each such hop is a futex or eventfd
/// wake-up, which `strace` counted at about 11 a request).
pub fn run(args: ProxyArgs) -> Result<(), ProxyError> {
    let threads = match args.threads {
        Some(0) => return Err(ProxyError::Flag("--threads must be at least 1".into())),
        Some(n) => n,
        None => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
    };
    let runtime = current_thread_runtime()?;
    runtime.block_on(async move {
        let Prepared {
            state,
            model_name,
            connect_timeout,
        } = prepare(&args).await?;
        let addr = resolve(&args.host, args.port).await?;
        let listen_err = |source| ProxyError::Listen {
            addr: addr.to_string(),
            source,
        };
        let first = bind(addr, threads > 1).map_err(listen_err)?;
        // With port 0 the others must join the port the first one got.
        let local = first.local_addr().map_err(listen_err)?;
        let (stop, stopped) = watch::channel(false);
        let mut workers = Vec::new();
        for i in 1..threads {
            let listener = bind(local, true)
                .and_then(TcpListener::into_std)
                .map_err(listen_err)?;
            let state = Arc::new(state.for_thread(connect_timeout));
            let stopped = stopped.clone();
            let worker = std::thread::Builder::new()
                .name(format!("proxy-{i}"))
                .spawn(move || -> Result<(), std::io::Error> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    rt.block_on(async move {
                        let listener = TcpListener::from_std(listener)?;
                        serve_bounded(listener, ProxyService::new(state), stopped).await
                    })
                })
                .map_err(ProxyError::Serve)?;
            workers.push(worker);
        }
        let state = Arc::new(state);
        tracing::info!(
            listen = %local,
            upstream = state.base.as_str(),
            model_name,
            threads,
            "proxying; metrics at /metrics"
        );
        let main = tokio::spawn(serve_bounded(first, ProxyService::new(state), stopped));
        shutdown_signal().await;
        tracing::info!("shutting down: open streams get 10 s");
        let _ = stop.send(true);
        let served = main
            .await
            .map_err(|e| ProxyError::Serve(std::io::Error::other(e)))?;
        for w in workers {
            match w.join() {
                Ok(r) => r.map_err(ProxyError::Serve)?,
                Err(_) => {
                    return Err(ProxyError::Serve(std::io::Error::other(
                        "a proxy thread panicked",
                    )));
                }
            }
        }
        served.map_err(ProxyError::Serve)
    })
}

/// Resolves on SIGINT or SIGTERM (what a container runtime sends).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            (Ok(mut int), Ok(mut term)) => {
                tokio::select! {
                    _ = int.recv() => {},
                    _ = term.recv() => {},
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The routes served without axum's router: the generation routes, matched
/// by method and exact path; the `handler` label the router would give.
///
/// Why: they are the requests whose first token the proxy delays, and the
/// router (boxed route services, `MatchedPath`, extractors) was a measurable
/// part of the proxy's added TTFT. Anything else (another method, a
/// trailing slash) goes through the router as before.
pub(crate) fn generation_route(method: &http::Method, path: &str) -> Option<&'static str> {
    if *method != http::Method::POST {
        return None;
    }
    ["/v1/completions", "/v1/chat/completions"]
        .into_iter()
        .find(|r| *r == path)
}

/// A boxed, sendable future (the connection task is spawned).
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One thread's service: the generation routes straight to their handler,
/// inside the same HTTP metrics layer; everything else through the router.
#[derive(Clone)]
pub(crate) struct ProxyService {
    /// Every other request's router (inside the same layer).
    pub(crate) router: Router,
    /// The generation routes' handler inside the HTTP metrics layer (hyper's
    /// requests and the fast path's, [`crate::inbound`], alike).
    pub(crate) generation: HttpMetricsService<GenerationService>,
    /// `--max-request-body`: larger generation posts are hyper's to refuse.
    pub(crate) max_body: usize,
    /// The handlers' state (the fast path sends generation posts early).
    pub(crate) app: Arc<AppState>,
}

impl ProxyService {
    fn new(state: Arc<AppState>) -> Self {
        let generation = state.manager.http_layer().layer(GenerationService {
            app: Arc::clone(&state),
        });
        Self {
            max_body: state.max_body,
            app: Arc::clone(&state),
            router: router(state),
            generation,
        }
    }
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for ProxyService {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response, Infallible>>;

    fn call(&self, mut req: http::Request<hyper::body::Incoming>) -> Self::Future {
        if let Some(route) = generation_route(req.method(), req.uri().path()) {
            req.extensions_mut().insert(RouteTemplate(route));
            let served = tower::Service::call(&mut self.generation.clone(), req);
            return Box::pin(async move { served.await.map(|r| r.map(Body::new)) });
        }
        Box::pin(tower::Service::call(&mut self.router.clone(), req))
    }
}

/// [`generation`] (after the API key check) as a tower service.
#[derive(Clone)]
pub(crate) struct GenerationService {
    app: Arc<AppState>,
}

impl<B> tower::Service<http::Request<CountingBody<B>>> for GenerationService
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<CountingBody<B>>) -> Self::Future {
        let app = Arc::clone(&self.app);
        Box::pin(async move {
            if let Some(refused) = refuse_without_key(&app, req.headers()) {
                return Ok(refused);
            }
            Ok(generation(State(app), req.map(Body::new)).await)
        })
    }
}

fn router(state: Arc<AppState>) -> Router {
    let mut v1 = Router::new()
        .route("/v1/completions", post(generation))
        .route("/v1/chat/completions", post(generation))
        .route("/v1/models", get(pass_through))
        .route("/v1/{*rest}", any(pass_through));
    // Only when there is a key to check: a middleware is a boxed future and
    // a clone of the request's state more on every request's path.
    if state.api_key.is_some() {
        v1 = v1.route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    }
    Router::new()
        .merge(v1)
        .route("/metrics", get(metrics))
        .fallback(pass_through)
        .layer(state.manager.http_layer())
        .with_state(state)
}

/// The 401 for a request without the `--api-key` (none when no key is set
/// or the request has it).
fn refuse_without_key(app: &AppState, headers: &HeaderMap) -> Option<Response> {
    let key = app.api_key.as_ref()?;
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    (!constant_time_eq(given.as_bytes(), key.as_bytes())).then(|| {
        error_response(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Invalid or missing API key: send `Authorization: Bearer <key>`.".into(),
        )
    })
}

async fn require_api_key(State(s): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    match refuse_without_key(&s, req.headers()) {
        Some(refused) => refused,
        None => next.run(req).await,
    }
}

/// Compares without stopping at the first difference (no timing oracle).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= usize::from(x ^ a.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}

/// The upstream request for a client's `parts` and `body`.
fn upstream_request(
    app: &AppState,
    parts: &http::request::Parts,
    body: Body,
) -> Result<http::Request<Body>, String> {
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let uri = app
        .base
        .join(pq)
        .map_err(|_| format!("cannot forward the path {pq:?}"))?;
    let mut req = http::Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    copy_end_to_end(&parts.headers, req.headers_mut());
    if let Some(auth) = &app.upstream_auth {
        req.headers_mut()
            .insert(header::AUTHORIZATION, auth.clone());
    }
    Ok(req)
}

/// The headers a relayed request carries upstream: the client's end-to-end
/// ones, less `expect` (the proxy has read the body already) and, on the
/// measured routes, `accept-encoding` (the response must be readable); the
/// client's `authorization` replaced by `--upstream-api-key`'s. Read from
/// the client's headers as they are written (no copy into another map).
fn relay_headers<'a>(
    app: &'a AppState,
    from: &'a HeaderMap,
    measured: bool,
) -> impl Iterator<Item = (&'a HeaderName, &'a HeaderValue)> {
    let auth = app.upstream_auth.as_ref();
    from.iter()
        .filter(move |(name, _)| {
            !(is_hop_by_hop(name)
                || *name == header::EXPECT
                || (measured && *name == header::ACCEPT_ENCODING)
                || (auth.is_some() && *name == header::AUTHORIZATION))
        })
        .chain(auth.map(|v| (&header::AUTHORIZATION, v)))
}

/// A request for the relay: already sent (by the fast inbound path), or
/// its body, and whether the route is measured (see [`relay_headers`]).
enum Outbound {
    Sent(Sent),
    ToSend { body: Bytes, measured: bool },
}

/// Sends a request over the relay (unless it left already), waiting at most
/// `--upstream-timeout` for the response head.
async fn relay(
    app: &AppState,
    parts: &http::request::Parts,
    outbound: Outbound,
) -> Result<http::Response<crate::relay::RelayBody>, UpstreamFailure> {
    let sent = async {
        match outbound {
            Outbound::Sent(sent) => sent.response().await,
            Outbound::ToSend { body, measured } => {
                let pq = app
                    .base
                    .path(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
                let headers = relay_headers(app, &parts.headers, measured);
                let authority = app.base.authority();
                app.relay
                    .send(&parts.method, authority, &pq, headers, body)
                    .await
            }
        }
    };
    match tokio::time::timeout(app.upstream_timeout, sent).await {
        Err(_) => Err(UpstreamFailure::no_response(
            &app.base,
            app.upstream_timeout,
        )),
        Ok(Err(e)) => Err(UpstreamFailure::from_relay_error(app.base.as_str(), &e)),
        Ok(Ok(resp)) => Ok(resp),
    }
}

/// The client's response: the upstream's status and headers, and `body`.
fn client_response(parts: &http::response::Parts, body: Body, length_changes: bool) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = parts.status;
    copy_end_to_end(&parts.headers, resp.headers_mut());
    if length_changes {
        resp.headers_mut().remove(header::CONTENT_LENGTH);
    }
    resp
}

/// Any path but the generation routes and `/metrics`: forwarded as it is
/// (over the relay when the request has no body, so the upstream connections
/// are the measured routes'; through hyper's client when it streams one).
async fn pass_through(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let no_body = !parts.headers.contains_key(header::TRANSFER_ENCODING)
        && parts
            .headers
            .get(header::CONTENT_LENGTH)
            .is_none_or(|v| v.as_bytes() == b"0");
    if no_body {
        let outbound = Outbound::ToSend {
            body: Bytes::new(),
            measured: false,
        };
        return match relay(&app, &parts, outbound).await {
            Ok(resp) => {
                let (parts, body) = resp.into_parts();
                client_response(&parts, Body::new(body), false)
            }
            Err(failure) => failure.into_response(),
        };
    }
    let req = match upstream_request(&app, &parts, body) {
        Ok(r) => r,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", message);
        }
    };
    match upstream::send(&app.client, &app.base, req, app.upstream_timeout).await {
        Ok(resp) => {
            let (parts, body) = resp.into_parts();
            client_response(&parts, Body::new(body), false)
        }
        Err(failure) => failure.into_response(),
    }
}

/// A generation request's body as it goes upstream: the client's, with the
/// usage chunk asked for when the client streams without it (to count
/// tokens); whether that chunk is to be taken out again; what the metrics
/// read from it.
fn outgoing(app: &AppState, bytes: Bytes) -> (Bytes, bool, RequestView) {
    let view = RequestView::parse(&bytes).unwrap_or_default();
    if app.inject_usage
        && view.stream
        && !view.include_usage
        && let Some(b) = with_usage_requested(&bytes, &view)
    {
        return (Bytes::from(b), true, view);
    }
    (bytes, false, view)
}

/// A generation request the fast inbound path sent upstream before its
/// bookkeeping (a request extension, taken once by [`generation`]; the lock
/// is only there because extensions must be `Clone` and `Sync`).
#[derive(Clone)]
pub(crate) struct SentEarly(Arc<std::sync::Mutex<Option<(Sent, bool, RequestView)>>>);

/// Sends a generation post upstream now, on an idle pooled connection,
/// before the HTTP metrics layer and the handler run (they then take it
/// from [`SentEarly`]); `None` when the handler must do it all (no idle
/// connection, a request the API key check refuses).
///
/// Why: the proxy's added time to first token is mostly the work between
/// reading a request and writing it upstream; done after the write, that
/// work overlaps the upstream's.
pub(crate) fn send_early(
    app: &AppState,
    method: &http::Method,
    path: &str,
    headers: &HeaderMap,
    bytes: Bytes,
) -> Option<SentEarly> {
    if app.api_key.is_some() && refuse_without_key(app, headers).is_some() {
        return None;
    }
    let (body, strip_usage, view) = outgoing(app, bytes);
    let authority = app.base.authority();
    let head = crate::relay::request_head(
        method,
        authority,
        &app.base.path(path),
        relay_headers(app, headers, true),
        body.len(),
    );
    let sent = app.relay.send_on_idle(method, authority, head, body).ok()?;
    Some(SentEarly(Arc::new(std::sync::Mutex::new(Some((
        sent,
        strip_usage,
        view,
    ))))))
}

/// `/v1/completions` and `/v1/chat/completions`: forwarded and measured.
async fn generation(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let start = req
        .extensions()
        .get::<RequestStart>()
        .map_or_else(Instant::now, |s| s.0);
    let (mut parts, body) = req.into_parts();
    let early = parts
        .extensions
        .remove::<SentEarly>()
        .and_then(|e| e.0.lock().ok()?.take());
    let (outbound, strip_usage, view) = match early {
        Some((sent, strip_usage, view)) => (Outbound::Sent(sent), strip_usage, view),
        None => {
            let bytes = match axum::body::to_bytes(body, app.max_body).await {
                Ok(b) => b,
                Err(e) => return unreadable_body(&app, &e),
            };
            let (body, strip_usage, view) = outgoing(&app, bytes);
            let outbound = Outbound::ToSend {
                body,
                measured: true,
            };
            (outbound, strip_usage, view)
        }
    };
    // From here a drop (the client went away) counts as an abort.
    let engine = app.models.for_request(view.model.as_deref()).clone();
    let mut observer = Observer::new(engine, start, view);
    let resp = match relay(&app, &parts, outbound).await {
        Ok(resp) => resp,
        Err(failure) => {
            tracing::warn!(error = ?failure, "upstream failed");
            observer.finish(Outcome::Failed);
            return failure.into_response();
        }
    };
    let (parts, incoming) = resp.into_parts();
    if parts.status.is_client_error() {
        // Refused by the upstream (bad request, 404, 429): it never ran, as
        // `serve` does not count a request it refuses.
        observer.discard();
        return client_response(&parts, Body::new(incoming), false);
    }
    let is_sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with("text/event-stream"));
    let (kind, on_complete) = if parts.status.is_server_error() {
        (BodyKind::Opaque, Outcome::Failed)
    } else if is_sse {
        (BodyKind::Sse { strip_usage }, Outcome::Complete)
    } else {
        (BodyKind::Json, Outcome::Complete)
    };
    let strips = matches!(kind, BodyKind::Sse { strip_usage: true });
    let body = ObservedBody::new(incoming, kind, observer, on_complete);
    client_response(&parts, Body::new(body), strips)
}

/// The 413 or 400 for a generation request body that could not be read.
fn unreadable_body(app: &AppState, e: &axum::Error) -> Response {
    let too_large =
        std::error::Error::source(e).is_some_and(|s| s.is::<http_body_util::LengthLimitError>());
    if too_large {
        error_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!(
                "request body over {} bytes (--max-request-body)",
                app.max_body
            ),
        )
    } else {
        error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("could not read the request body: {e}"),
        )
    }
}

/// `GET /metrics`: the proxy's registry, then (with `--upstream-metrics`) the
/// upstream's exposition as it came, less the families the proxy exposes.
async fn metrics(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let Some(url) = &app.upstream_metrics else {
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        let (content_type, body) = app.manager.render(negotiate(accept));
        return ([(header::CONTENT_TYPE, content_type)], body).into_response();
    };
    // Two expositions concatenate only in the text format (OpenMetrics ends in `# EOF`).
    let (content_type, mut body) = app.manager.render(Format::Prometheus);
    match fetch_upstream_metrics(&app, url).await {
        Ok(text) => {
            let dropped = append_upstream(&mut body, &text);
            // Said once: the set only changes when the upstream changes.
            if !dropped.is_empty() && !app.warned_collisions.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    families = dropped.join(" "),
                    "upstream metric families with the proxy's own names are left out (see --metrics-namespace)"
                );
            }
        }
        // Free-form comments would trip strict parsers: say it in the log.
        Err(why) => tracing::warn!(
            error = why,
            "upstream metrics unavailable; serving the proxy's own"
        ),
    }
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn fetch_upstream_metrics(app: &AppState, url: &Uri) -> Result<String, String> {
    let mut req = http::Request::get(url.clone())
        .body(Body::empty())
        .map_err(|e| e.to_string())?;
    req.headers_mut().insert(
        header::ACCEPT,
        HeaderValue::from_static("text/plain;version=0.0.4"),
    );
    let resp = upstream::send(&app.client, &app.base, req, UPSTREAM_METRICS_TIMEOUT)
        .await
        .map_err(|f| format!("{f:?}"))?;
    if !resp.status().is_success() {
        return Err(format!("{url} answered {}", resp.status()));
    }
    let body = tokio::time::timeout(
        UPSTREAM_METRICS_TIMEOUT,
        Limited::new(resp.into_body(), MAX_UPSTREAM_METRICS).collect(),
    )
    .await
    .map_err(|_| format!("{url} did not finish its body in time"))?
    .map_err(|e| format!("reading {url}: {e}"))?
    .to_bytes();
    String::from_utf8(body.to_vec()).map_err(|_| format!("{url} sent a body that is not UTF-8"))
}

/// The family a sample or metadata line belongs to.
fn line_family(line: &str) -> Option<&str> {
    if let Some(meta) = line
        .strip_prefix("# HELP ")
        .or_else(|| line.strip_prefix("# TYPE "))
        .or_else(|| line.strip_prefix("# UNIT "))
    {
        return meta.split_whitespace().next();
    }
    if line.starts_with('#') {
        return None;
    }
    line.split(['{', ' ', '\t'])
        .next()
        .filter(|n| !n.is_empty())
}

/// Appends the upstream's lines to `own`, leaving out `# EOF` and the
/// families `own` already has (two families of one name break a scrape);
/// returns the names left out.
pub fn append_upstream(own: &mut String, upstream: &str) -> Vec<String> {
    let mine: std::collections::HashSet<String> = own
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let taken = |name: &str| {
        mine.contains(name)
            || ["_bucket", "_sum", "_count", "_total", "_created"]
                .iter()
                .filter_map(|s| name.strip_suffix(s))
                .any(|base| mine.contains(base))
    };
    let mut dropped = std::collections::BTreeSet::new();
    let mut kept = String::with_capacity(upstream.len());
    for line in upstream.lines() {
        if line.trim() == "# EOF" {
            continue;
        }
        match line_family(line) {
            Some(name) if taken(name) => {
                dropped.insert(name.to_owned());
            }
            _ => {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    own.push_str(&kept);
    dropped.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_floor_is_due_before_any_request_timer() {
        let s = Duration::from_secs_f64;
        // The defaults (600 s for the head, 10 s to connect): 5 s.
        assert_eq!(timer_floor_period(s(600.0), s(10.0)), s(5.0));
        for (upstream, connect) in [(600.0, 10.0), (1.0, 10.0), (600.0, 0.3), (0.05, 0.05)] {
            let floor = timer_floor_period(s(upstream), s(connect));
            assert!(
                floor < s(upstream) && floor < s(connect),
                "{upstream} {connect}"
            );
        }
        // Never a busy loop, whatever the flags.
        assert_eq!(timer_floor_period(s(0.001), s(10.0)), s(0.01));
    }

    #[test]
    fn upstream_exposition_appended_without_collisions() {
        let mut own = "# HELP http_requests Total.\n# TYPE http_requests counter\nhttp_requests_total{handler=\"/v1/models\"} 1\n".to_owned();
        let upstream = "# HELP http_requests Total.\n# TYPE http_requests counter\nhttp_requests_total{handler=\"x\"} 9\n# HELP llamacpp:tokens_predicted_total n\n# TYPE llamacpp:tokens_predicted_total counter\nllamacpp:tokens_predicted_total 42\n# EOF\n";
        assert_eq!(
            append_upstream(&mut own, upstream),
            ["http_requests", "http_requests_total"]
        );
        assert_eq!(
            own.matches("# TYPE http_requests counter").count(),
            1,
            "{own}"
        );
        assert!(!own.contains("handler=\"x\""), "{own}");
        assert!(
            own.contains("llamacpp:tokens_predicted_total 42\n"),
            "{own}"
        );
        assert!(!own.contains("# EOF"), "{own}");
    }

    #[test]
    fn only_the_generation_posts_skip_the_router() {
        let post = http::Method::POST;
        assert_eq!(
            generation_route(&post, "/v1/completions"),
            Some("/v1/completions")
        );
        assert_eq!(
            generation_route(&post, "/v1/chat/completions"),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            generation_route(&http::Method::GET, "/v1/completions"),
            None
        );
        assert_eq!(generation_route(&post, "/v1/completions/"), None);
        assert_eq!(generation_route(&post, "/v1/models"), None);
    }

    #[test]
    fn only_measurable_metrics() {
        assert!(measurable_by_proxy(&schema::TIME_TO_FIRST_TOKEN));
        assert!(!measurable_by_proxy(&schema::KV_CACHE_USAGE_PERC));
        assert!(!measurable_by_proxy(&schema::REQUEST_QUEUE_TIME));
        assert!(!measurable_by_proxy(&schema::DEVICE_BUSY_SECONDS));
    }
}

//! The server's life: bind the listeners, build the state, serve in the
//! background (the API's connections through `inferscope_inbound`, which
//! sets TCP_NODELAY; the separate metrics listener through axum), log the
//! periodic stats, and shut down gracefully on SIGINT/SIGTERM (a second
//! signal aborts what is left).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cli::ServeArgs;
use crate::console::{Authorize, Console, Diagnose, Serving};
use crate::error::ServerError;
use crate::router::{Front, metrics_router};
use crate::state::{AppState, build_state};

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
        // The last requests' lines: in the file before the server is gone.
        if let Some(log) = self.state.request_log.clone() {
            let _ = tokio::task::spawn_blocking(move || log.flush(timeout)).await;
        }
        // The last requests' spans: sent before the process goes.
        if let Some(traces) = &self.state.traces {
            traces.shutdown(timeout + Duration::from_secs(1)).await;
        }
        if let Some(t) = self.metrics_task {
            t.abort();
        }
    }
}

/// Binds `host:port`.
async fn bind(host: &str, port: u16) -> Result<(TcpListener, SocketAddr), ServerError> {
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
    Ok((listener, local))
}

/// Builds everything and serves on `args.host:args.port` in the background
/// (and `/metrics` on `--metrics-host:--metrics-port` when set). The console
/// shows no findings: [`start_with_findings`] hands it the doctor's rules.
pub async fn start(args: &ServeArgs) -> Result<RunningServer, ServerError> {
    start_with_findings(args, None).await
}

/// As [`start`], with the console's findings computed by `diagnose` (the
/// binary passes the doctor's rules, which this crate may not link).
pub async fn start_with_findings(
    args: &ServeArgs,
    diagnose: Option<Diagnose>,
) -> Result<RunningServer, ServerError> {
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
    let (stop, stopped) = watch::channel(false);
    // The console reads the request log's ring (absent with --disable-console).
    let console = state
        .request_log
        .as_ref()
        .and_then(|log| log.recent())
        .map(|recent| {
            Console::new(
                state.metrics.clone(),
                recent.clone(),
                console_authorize(&state),
                Serving::Engines,
                state.served_model_names[0].clone(),
                diagnose,
            )
        });
    let console_task = console.as_ref().map(Console::spawn_sampler);
    let app = Front::new(
        state.clone(),
        args.max_request_body_bytes,
        separate_metrics.is_none(),
        console.as_ref(),
    );
    let (metrics_addr, metrics_task) = match separate_metrics {
        Some((listener, addr)) => {
            let app = metrics_router(state.clone(), console.as_ref());
            // Without TCP_NODELAY, a response's last segment may wait for a delayed ACK.
            let listener = listener.tap_io(|tcp: &mut tokio::net::TcpStream| {
                let _ = tcp.set_nodelay(true);
            });
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
        // Each connection's service knows its peer's address: what
        // --trusted-proxy is checked against. Open connections finish their
        // requests after the stop.
        inferscope_inbound::serve(listener, |peer| app.for_peer(peer), stopped).await;
        if let Some(t) = log_task {
            t.abort();
        }
        if let Some(t) = console_task {
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

/// Who may read the console's data: with `--api-key-file`, any tenant's
/// key; with `--api-key`, that key; else anyone.
fn console_authorize(state: &AppState) -> Authorize {
    let access = state.access.clone();
    Arc::new(move |headers| access.authorizes(headers))
}

/// Serves until SIGINT or SIGTERM, then shuts down gracefully; the console's
/// findings are computed by `diagnose` when given ([`start_with_findings`]).
pub async fn run(args: ServeArgs, diagnose: Option<Diagnose>) -> Result<(), ServerError> {
    let server = start_with_findings(&args, diagnose).await?;
    tracing::info!(
        addr = %server.addr,
        model = %server.state.served_model_names[0],
        engines = server.state.coordinator.engine_indices().len(),
        max_num_seqs = args.max_num_seqs,
        max_num_batched_tokens = args.max_num_batched_tokens(),
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

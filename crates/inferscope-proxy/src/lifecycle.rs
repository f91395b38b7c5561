//! Start and run: flags checked, the model names discovered, one
//! current-thread runtime per thread with its own `SO_REUSEPORT` listener,
//! the accept loop (with its timer floor), signals and the graceful drain.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::http::{HeaderValue, Uri};
use inferscope_console::{Authorize, Console, Diagnose, RecentRing, RecentSource, Serving};
use inferscope_metrics::{MetricsConfig, StatLoggerManager};
use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;

use crate::admission::UpstreamGate;
use crate::models::{ModelSeries, OTHER_MODEL, discover_models, model_names};
use crate::observe::measurable_by_proxy;
use crate::relay::RelayPool;
use crate::services::ProxyService;
use crate::state::AppState;
use crate::upstream::{self, BaseUrl};
use crate::{ProxyArgs, ProxyError};

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

/// Everything a listening thread needs, built once at start-up.
struct Prepared {
    state: AppState,
    model_name: String,
    connect_timeout: Duration,
}

/// Validates the flags, finds the model name and builds the metrics and
/// the console (whose findings `diagnose` computes, when given).
async fn prepare(args: &ProxyArgs, diagnose: Option<Diagnose>) -> Result<Prepared, ProxyError> {
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
    let tenant_header_set = args.tenants.tenant_header.is_some();
    let access = Arc::new(
        args.tenants
            .access(args.api_key.as_deref())
            .map_err(ProxyError::Flag)?,
    );
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
        max_tenant_labels: args.tenants.max_tenant_labels,
        ..Default::default()
    })?);
    // The key file's tenants take their labels first, as on `serve`.
    let tenant_labels = Arc::clone(manager.tenant_labels());
    for name in access.keys().iter().flat_map(|k| k.weights().into_keys()) {
        tenant_labels.slot(Some(&name));
    }
    let series = |name: &str| {
        manager
            .model_frontend(name, 0)
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
    let recent = (!args.disable_console).then(|| Arc::new(RecentRing::default()));
    let console = recent.as_ref().map(|recent| {
        let access = Arc::clone(&access);
        let authorize: Authorize = Arc::new(move |headers| access.authorizes(headers));
        Console::new(
            Arc::clone(&manager),
            Arc::clone(recent) as Arc<dyn RecentSource>,
            authorize,
            Serving::Proxy,
            model_name.clone(),
            diagnose,
        )
    });
    let state = AppState {
        base,
        upstream_metrics,
        client,
        relay: RelayPool::new(connect_timeout),
        manager,
        models,
        access,
        tenant_header_set,
        tenant_labels,
        gate: args
            .max_upstream_concurrency
            .map(|n| UpstreamGate::new(n as usize)),
        upstream_auth,
        upstream_timeout,
        max_body: args.max_request_body,
        inject_usage: !args.no_usage_injection,
        warned_collisions: Arc::new(AtomicBool::new(false)),
        recent,
        console,
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
/// The console shows no findings (the doctor's rules come from the binary).
pub async fn start(args: &ProxyArgs) -> Result<RunningProxy, ProxyError> {
    let Prepared {
        state, model_name, ..
    } = prepare(args, None).await?;
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
    let sampler = state.console.as_ref().map(Console::spawn_sampler);
    let service = ProxyService::new(state.clone());
    let task = tokio::spawn(async move {
        let served = serve_http1(listener, service, stopped).await;
        if let Some(s) = sampler {
            s.abort();
        }
        served
    });
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
/// open connections finish (the caller bounds how long), with a timer on
/// the runtime meanwhile (the floor, [`timer_floor_period`]).
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
    let app = &service.app;
    let period = timer_floor_period(app.upstream_timeout, app.relay.connect_timeout());
    let floor = tokio::spawn(async move {
        loop {
            tokio::time::sleep(period).await;
        }
    });
    inferscope_inbound::serve(listener, |peer| service.for_peer(peer), stop).await;
    floor.abort();
    Ok(())
}

/// The period of the floor: a task whose timer, always pending on the
/// runtime, is due sooner than any request's. Half the
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
/// The console's findings are computed by `diagnose` when given (the
/// binary passes the doctor's rules).
pub fn run(args: ProxyArgs, diagnose: Option<Diagnose>) -> Result<(), ProxyError> {
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
        } = prepare(&args, diagnose).await?;
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
        // The console samples on this thread's runtime, once a second.
        let sampler = state.console.as_ref().map(Console::spawn_sampler);
        let main = tokio::spawn(serve_bounded(first, ProxyService::new(state), stopped));
        shutdown_signal().await;
        tracing::info!("shutting down: open streams get 10 s");
        let _ = stop.send(true);
        let served = main
            .await
            .map_err(|e| ProxyError::Serve(std::io::Error::other(e)))?;
        if let Some(s) = sampler {
            s.abort();
        }
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
}

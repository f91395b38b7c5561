//! Helpers the proxy's integration tests share: a proxy and a sim server on
//! ephemeral ports.

use inferscope_proxy::{ProxyArgs, RunningProxy};

/// A proxy in front of `upstream` (a base URL), with `flags` added.
pub async fn proxy(upstream: &str, flags: &[&str]) -> RunningProxy {
    let mut all = vec!["--upstream", upstream, "--host", "127.0.0.1", "--port", "0"];
    all.extend_from_slice(flags);
    let args = ProxyArgs::try_parse_flags(all).expect("flags");
    inferscope_proxy::start(&args).await.expect("proxy starts")
}

/// An `inferscope serve --executor sim` with `flags` added.
pub async fn serve(flags: &[&str]) -> inferscope_server::RunningServer {
    let mut all = vec![
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--executor",
        "sim",
        "--disable-log-stats",
    ];
    all.extend_from_slice(flags);
    let args = inferscope_server::ServeArgs::try_parse_flags(all).expect("flags");
    inferscope_server::start(&args)
        .await
        .expect("server starts")
}

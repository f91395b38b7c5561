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

pub use inferscope_test_support::start_sim as serve;

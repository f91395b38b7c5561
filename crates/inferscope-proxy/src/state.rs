//! What every handler of one serving thread shares: the upstream, its
//! connection pools, the metrics and the settings.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use inferscope_console::{Console, RecentRing};
use inferscope_metrics::StatLoggerManager;
use inferscope_metrics::http::bearer_key_matches;

use crate::models::ModelSeries;
use crate::relay::RelayPool;
use crate::upstream::{self, BaseUrl, UpstreamClient, error_response};

/// Everything the handlers share.
pub(crate) struct AppState {
    pub(crate) base: BaseUrl,
    pub(crate) upstream_metrics: Option<Uri>,
    pub(crate) client: UpstreamClient,
    /// The measured routes' (and body-less pass-through requests') upstream
    /// connections, read in the client's task.
    pub(crate) relay: RelayPool,
    pub(crate) manager: Arc<StatLoggerManager>,
    pub(crate) models: Arc<ModelSeries>,
    pub(crate) api_key: Option<String>,
    pub(crate) upstream_auth: Option<HeaderValue>,
    pub(crate) upstream_timeout: Duration,
    pub(crate) max_body: usize,
    pub(crate) inject_usage: bool,
    pub(crate) warned_collisions: Arc<AtomicBool>,
    /// The console's ring of finished requests (none with `--disable-console`).
    pub(crate) recent: Option<Arc<RecentRing>>,
    /// The console's routes (none with `--disable-console`).
    pub(crate) console: Option<Arc<Console>>,
}

impl AppState {
    /// The 401 for a request without the `--api-key` (none when no key is set
    /// or the request has it).
    pub(crate) fn refuse_without_key(&self, headers: &HeaderMap) -> Option<Response> {
        let key = self.api_key.as_ref()?;
        (!bearer_key_matches(headers, key)).then(|| {
            error_response(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "Invalid or missing API key: send `Authorization: Bearer <key>`.".into(),
            )
        })
    }

    /// A copy for another thread's runtime: the same metrics and settings,
    /// its own upstream connection pool (a connection is driven by the
    /// runtime that opened it, so sharing one would bring back the
    /// cross-thread wake-ups the per-thread runtimes exist to avoid).
    pub(crate) fn for_thread(&self, connect_timeout: Duration) -> Self {
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
            recent: self.recent.clone(),
            console: self.console.clone(),
        }
    }
}

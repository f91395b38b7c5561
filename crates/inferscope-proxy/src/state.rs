//! What every handler of one serving thread shares: the upstream, its
//! connection pools, the metrics and the settings.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use inferscope_console::{Console, RecentRing};
use inferscope_metrics::{StatLoggerManager, TenantLabels};
use inferscope_tenants::{Access, AccessRefusal, Tenant};

use crate::admission::UpstreamGate;
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
    /// Who may call /v1/* and as which tenant (`--api-key`,
    /// `--api-key-file`, `--tenant-header`).
    pub(crate) access: Arc<Access>,
    /// `--tenant-header` is set (the peer's address matters).
    pub(crate) tenant_header_set: bool,
    /// The bounded `tenant` label.
    pub(crate) tenant_labels: Arc<TenantLabels>,
    /// `--max-upstream-concurrency` (shared by every thread).
    pub(crate) gate: Option<Arc<UpstreamGate>>,
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
    /// Whether requests are checked at all (a key or a tenant header is set).
    pub(crate) fn checks_access(&self) -> bool {
        self.access.requires_key() || self.tenant_header_set
    }

    /// The request's tenant (`None`: anonymous), or why it is refused
    /// ([`refusal_response`]).
    pub(crate) fn identify(
        &self,
        peer: Option<Peer>,
        headers: &HeaderMap,
    ) -> Result<Option<Arc<Tenant>>, AccessRefusal> {
        if !self.checks_access() {
            return Ok(None);
        }
        self.access.identify(peer.map(|p| p.0), headers)
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
            access: Arc::clone(&self.access),
            tenant_header_set: self.tenant_header_set,
            tenant_labels: Arc::clone(&self.tenant_labels),
            gate: self.gate.clone(),
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

/// The client's address (a request extension), for `--trusted-proxy`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) std::net::IpAddr);

/// The 401 (no key, or one that names no tenant) or 400 (a trusted peer's
/// bad tenant header) for a refused request.
pub(crate) fn refusal_response(refusal: AccessRefusal) -> Response {
    match refusal {
        AccessRefusal::Unauthorized => error_response(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "Invalid or missing API key: send `Authorization: Bearer <key>`.".into(),
        ),
        AccessRefusal::BadTenantHeader(message) => {
            error_response(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }
}

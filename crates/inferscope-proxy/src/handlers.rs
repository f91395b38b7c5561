//! The handlers: the generation routes (measured, the post sent upstream
//! early when the inbound path allows), every other path passed through
//! (counted by the HTTP layer only), and `/metrics` (the proxy's registry,
//! then the upstream's exposition).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use inferscope_metrics::http::RequestStart;
use inferscope_metrics::{Format, negotiate};

use crate::admission::{Holds, weight_of};
use crate::observe::{
    BodyKind, ObservedBody, Observer, Outcome, RequestView, with_usage_requested,
};
use crate::relay::Sent;
use crate::state::{AppState, Peer, refusal_response};
use crate::upstream::{self, UpstreamFailure, copy_end_to_end, error_response, is_hop_by_hop};
use crate::upstream_metrics::{append_upstream, fetch_upstream_metrics};
use inferscope_schema::schema::TENANT_ANONYMOUS;
use inferscope_schema::stats::RequestRef;
use inferscope_tenants::{REASON_TENANT_LIMIT, Tenant, TenantRejection};

/// The upstream request for a client's `parts` and `body`.
pub(crate) fn upstream_request(
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
pub(crate) fn relay_headers<'a>(
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
pub(crate) enum Outbound {
    Sent(Sent),
    ToSend { body: Bytes, measured: bool },
}

/// Sends a request over the relay (unless it left already), waiting at most
/// `--upstream-timeout` for the response head.
pub(crate) async fn relay(
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
pub(crate) fn client_response(
    parts: &http::response::Parts,
    body: Body,
    length_changes: bool,
) -> Response {
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
pub(crate) async fn pass_through(State(app): State<Arc<AppState>>, req: Request) -> Response {
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
pub(crate) fn outgoing(app: &AppState, bytes: Bytes) -> (Bytes, bool, RequestView) {
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
pub(crate) struct SentEarly(Arc<std::sync::Mutex<Option<Early>>>);

/// What [`send_early`] did: the request sent, with its tenant and holds.
pub(crate) struct Early {
    sent: Sent,
    strip_usage: bool,
    view: RequestView,
    tenant: Option<Arc<Tenant>>,
    holds: Holds,
}

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
    peer: Option<Peer>,
    bytes: Bytes,
) -> Option<SentEarly> {
    let tenant = app.identify(peer, headers).ok()?;
    let (body, strip_usage, view) = outgoing(app, bytes);
    // Only a request that waits for nothing: a refusal, or a wait for an
    // upstream slot, is the handler's to answer.
    let mut holds = admit(tenant.as_ref(), view.n).ok()?;
    if let Some(gate) = &app.gate {
        holds.slot = Some(gate.try_acquire()?);
    }
    holds.started();
    let authority = app.base.authority();
    let head = crate::relay::request_head(
        method,
        authority,
        &app.base.path(path),
        relay_headers(app, headers, true),
        body.len(),
    );
    let sent = app.relay.send_on_idle(method, authority, head, body).ok()?;
    Some(SentEarly(Arc::new(std::sync::Mutex::new(Some(Early {
        sent,
        strip_usage,
        view,
        tenant,
        holds,
    })))))
}

/// A request's holds on its tenant's limits (`n` choices), or the 429.
fn admit(tenant: Option<&Arc<Tenant>>, n: u64) -> Result<Holds, TenantRefusal> {
    let Some(tenant) = tenant else {
        return Ok(Holds::default());
    };
    let choices = usize::try_from(n).unwrap_or(usize::MAX).clamp(1, 128);
    match tenant.admit(choices) {
        Ok(permit) => Ok(Holds {
            choices: permit.into_choices(),
            slot: None,
        }),
        Err(rejection) => Err(TenantRefusal(rejection, Arc::clone(&tenant.name))),
    }
}

/// A tenant's limit refused the request.
struct TenantRefusal(TenantRejection, Arc<str>);

impl TenantRefusal {
    /// The 429 with `Retry-After`, naming the tenant and the limit (as `serve`'s).
    fn into_response(self, app: &AppState) -> Response {
        let TenantRefusal(rejection, tenant) = self;
        app.manager.record_admission_rejection(REASON_TENANT_LIMIT);
        let mut resp = error_response(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            rejection.message(&tenant),
        );
        resp.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(rejection.retry_after().max(1)),
        );
        resp
    }
}

/// The queue key of anonymous requests under `--max-upstream-concurrency`.
static ANONYMOUS: std::sync::LazyLock<Arc<str>> =
    std::sync::LazyLock::new(|| Arc::from(TENANT_ANONYMOUS));

/// The request's id as the console lists it: the client's `x-request-id`
/// (at most 128 bytes), else one made here.
fn request_id(headers: &axum::http::HeaderMap) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .map_or_else(
            || {
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                format!("proxy-{n}")
            },
            str::to_owned,
        )
}

/// `/v1/completions` and `/v1/chat/completions`: forwarded and measured.
pub(crate) async fn generation(State(app): State<Arc<AppState>>, req: Request) -> Response {
    let start = req
        .extensions()
        .get::<RequestStart>()
        .map_or_else(Instant::now, |s| s.0);
    let (mut parts, body) = req.into_parts();
    let early = parts
        .extensions
        .remove::<SentEarly>()
        .and_then(|e| e.0.lock().ok()?.take());
    let (outbound, strip_usage, view, tenant, holds) = match early {
        Some(e) => (
            Outbound::Sent(e.sent),
            e.strip_usage,
            e.view,
            e.tenant,
            Some(e.holds),
        ),
        None => {
            let peer = parts.extensions.get::<Peer>().copied();
            let tenant = match app.identify(peer, &parts.headers) {
                Ok(t) => t,
                Err(refusal) => return refusal_response(refusal),
            };
            let bytes = match axum::body::to_bytes(body, app.max_body).await {
                Ok(b) => b,
                Err(e) => return unreadable_body(&app, &e),
            };
            let (body, strip_usage, view) = outgoing(&app, bytes);
            let outbound = Outbound::ToSend {
                body,
                measured: true,
            };
            (outbound, strip_usage, view, tenant, None)
        }
    };
    // A tenant's limits before anything is counted: a refused request
    // never ran, as on `serve`.
    let holds = match holds {
        Some(h) => h,
        None => match admit(tenant.as_ref(), view.n) {
            Ok(h) => h,
            Err(refusal) => return refusal.into_response(&app),
        },
    };
    // From here a drop (the client went away) counts as an abort.
    let engine = app.models.for_request(view.model.as_deref()).clone();
    let mut observer = Observer::new(engine, start, view);
    let id = (app.recent.is_some() || tenant.is_some()).then(|| request_id(&parts.headers));
    if let Some(t) = &tenant {
        let slot = app.tenant_labels.slot(Some(&t.name));
        let request = RequestRef::new(id.as_deref().unwrap_or_default(), None).with_tenant(slot);
        observer.for_tenant(Arc::clone(&t.name), request);
    }
    if let (Some(ring), Some(id)) = (&app.recent, id) {
        observer.list_in(Arc::clone(ring), id);
    }
    let mut holds = holds;
    if holds.slot.is_none()
        && let Some(gate) = &app.gate
    {
        // Waits in its tenant's queue; a client that goes away drops this
        // future, and the wait with it (it leaves the queue).
        let lane = tenant.as_ref().map_or(&*ANONYMOUS, |t| &t.name);
        holds.slot = Some(gate.acquire(lane, weight_of(tenant.as_ref())).await);
    }
    holds.started();
    observer.hold(holds);
    let resp = match relay(&app, &parts, outbound).await {
        Ok(resp) => resp,
        Err(failure) => {
            let tenant = tenant.as_ref().map_or(TENANT_ANONYMOUS, |t| &*t.name);
            tracing::warn!(error = ?failure, tenant, "upstream failed");
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
pub(crate) fn unreadable_body(app: &AppState, e: &axum::Error) -> Response {
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
pub(crate) async fn metrics(State(app): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    let Some(url) = &app.upstream_metrics else {
        let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
        let (content_type, body) = app.manager.render(negotiate(accept));
        return ([(header::CONTENT_TYPE, content_type)], body).into_response();
    };
    // Two expositions concatenate only in the text format (OpenMetrics ends in `# EOF`).
    let (content_type, mut body) = app.manager.render(Format::Prometheus);
    match fetch_upstream_metrics(&app.client, &app.base, url).await {
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

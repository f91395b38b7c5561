//! HTTP instrumentation: a tower layer for the axum router that records the
//! prometheus-fastapi-instrumentator metrics (`http_requests_total`, sizes,
//! durations until the last body byte, requests in progress).
//!
//! Apply it with `Router::layer` so that axum's `MatchedPath` is set (or, on
//! a service routed by hand, set [`RouteTemplate`] or call
//! [`HttpMetricsService::call_route`]): series
//! are labelled by route template, never by raw path, and requests that match
//! no route share `handler="none"`, so scanning random paths cannot grow the
//! number of series.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use axum::extract::MatchedPath;
use bytes::Buf;
use http::{Method, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use parking_lot::RwLock;
use pin_project_lite::pin_project;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

use crate::histogram::{AtomicHistogram, HistogramBuilder};
use inferscope_schema::schema::{self, Buckets, MetricDef};

/// Paths not instrumented by default.
pub const DEFAULT_EXCLUDED: &[&str] = &["/metrics", "/health"];

/// The `handler` value of requests that matched no route.
pub const UNMATCHED_HANDLER: &str = "none";

/// The route template of a request served without an axum router (a
/// request extension the layer reads when `MatchedPath` is absent), so a
/// hand-routed service is labelled as the router would label it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTemplate(pub &'static str);

/// The generation posts, which the server and the proxy serve without axum's
/// router, matched by method and exact path: their route template (the
/// `handler` label the router would give). Anything else (another method, a
/// trailing slash) is the router's.
pub fn generation_route(method: &Method, path: &str) -> Option<&'static str> {
    if *method != Method::POST {
        return None;
    }
    ["/v1/completions", "/v1/chat/completions"]
        .into_iter()
        .find(|r| *r == path)
}

/// When a request's head was read (a request extension, set by a server
/// that reads requests itself and does work before the layer sees them):
/// the layer times the request from there instead of from its own call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestStart(pub Instant);

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    handler: String,
    method: &'static str,
    status: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HandlerLabels {
    handler: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MethodHandlerLabels {
    method: &'static str,
    handler: String,
}

type HistFamily<L> = Family<L, AtomicHistogram, HistogramBuilder>;

/// The HTTP metric families, registered in the process's registry.
#[derive(Debug)]
pub struct HttpMetrics {
    requests: Family<RequestLabels, Counter>,
    request_size: HistFamily<HandlerLabels>,
    response_size: HistFamily<HandlerLabels>,
    duration_highr: AtomicHistogram,
    duration: HistFamily<MethodHandlerLabels>,
    inprogress: Family<MethodHandlerLabels, Gauge>,
    /// Each (handler, method)'s series, resolved on its first request:
    /// later requests take one read lock and allocate nothing (the families
    /// would hash and clone the labels five times per request).
    routes: RwLock<RouteMap>,
}

/// Each handler's series, one per method seen.
type RouteMap = HashMap<Box<str>, Vec<Arc<RouteSeries>>, foldhash::fast::RandomState>;

/// The series of one (handler, method). Each is created when first
/// recorded, as the families would create it.
#[derive(Debug)]
struct RouteSeries {
    handler: Box<str>,
    method: &'static str,
    inprogress: Gauge,
    /// `http_requests_total`, by status class (`1xx` … `5xx`).
    requests: [OnceLock<Counter>; 5],
    request_size: OnceLock<AtomicHistogram>,
    response_size: OnceLock<AtomicHistogram>,
    duration: OnceLock<AtomicHistogram>,
}

fn fixed(def: &MetricDef) -> &'static [f64] {
    match def.buckets {
        Buckets::Fixed(b) => b,
        Buckets::None | Buckets::Group(_) => &[],
    }
}

impl HttpMetrics {
    /// Registers the HTTP families (names from the schema, no namespace).
    pub fn new(registry: &mut Registry) -> Self {
        let requests = Family::default();
        let request_size =
            Family::new_with_constructor(HistogramBuilder::new(fixed(&schema::HTTP_REQUEST_SIZE)));
        let response_size =
            Family::new_with_constructor(HistogramBuilder::new(fixed(&schema::HTTP_RESPONSE_SIZE)));
        let duration_highr = AtomicHistogram::new(fixed(&schema::HTTP_REQUEST_DURATION_HIGHR));
        let duration = Family::new_with_constructor(HistogramBuilder::new(fixed(
            &schema::HTTP_REQUEST_DURATION,
        )));
        let inprogress = Family::default();
        let name = |def: &MetricDef| def.registered_name("");
        let defs = [
            &schema::HTTP_REQUESTS,
            &schema::HTTP_REQUEST_SIZE,
            &schema::HTTP_RESPONSE_SIZE,
            &schema::HTTP_REQUEST_DURATION_HIGHR,
            &schema::HTTP_REQUEST_DURATION,
            &schema::HTTP_REQUESTS_INPROGRESS,
        ];
        let [d_req, d_reqsize, d_respsize, d_highr, d_dur, d_inprog] = defs;
        registry.register(name(d_req), d_req.help, requests.clone());
        registry.register(name(d_reqsize), d_reqsize.help, request_size.clone());
        registry.register(name(d_respsize), d_respsize.help, response_size.clone());
        registry.register(name(d_highr), d_highr.help, duration_highr.clone());
        registry.register(name(d_dur), d_dur.help, duration.clone());
        registry.register(name(d_inprog), d_inprog.help, inprogress.clone());
        Self {
            requests,
            request_size,
            response_size,
            duration_highr,
            duration,
            inprogress,
            routes: RwLock::default(),
        }
    }

    /// The series of `handler` and `method`, created on their first request.
    fn route(&self, handler: &str, method: &'static str) -> Arc<RouteSeries> {
        let found = |routes: &RouteMap| {
            routes
                .get(handler)
                .and_then(|by_method| by_method.iter().find(|r| r.method == method))
                .cloned()
        };
        if let Some(series) = found(&self.routes.read()) {
            return series;
        }
        let mut routes = self.routes.write();
        if let Some(series) = found(&routes) {
            return series;
        }
        let series = Arc::new(RouteSeries {
            handler: handler.into(),
            method,
            inprogress: self.inprogress.get_or_create_owned(&MethodHandlerLabels {
                method,
                handler: handler.to_owned(),
            }),
            requests: Default::default(),
            request_size: OnceLock::new(),
            response_size: OnceLock::new(),
            duration: OnceLock::new(),
        });
        routes
            .entry(handler.into())
            .or_default()
            .push(Arc::clone(&series));
        series
    }

    fn start(
        self: &Arc<Self>,
        handler: &str,
        method: &'static str,
        size: RequestSize,
        start: Instant,
    ) -> InFlight {
        let series = self.route(handler, method);
        series.inprogress.inc();
        InFlight {
            metrics: Arc::clone(self),
            series,
            start,
            request_size: size,
        }
    }
}

/// The `status` label values, by [`status_class_index`].
const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The `status` label: the status class.
pub fn status_class(status: StatusCode) -> &'static str {
    STATUS_CLASSES[status_class_index(status)]
}

/// The status class as an index into [`STATUS_CLASSES`] (0 for `1xx`).
fn status_class_index(status: StatusCode) -> usize {
    match status.as_u16() {
        100..=199 => 0,
        200..=299 => 1,
        300..=399 => 2,
        400..=499 => 3,
        _ => 4,
    }
}

/// The `method` label: standard methods by name, anything else `other` (a
/// client must not be able to create series by inventing methods).
pub fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "other",
    }
}

#[derive(Debug)]
enum RequestSize {
    /// From `Content-Length`.
    Known(u64),
    /// Counted as the handler reads the body.
    Counted(Arc<AtomicU64>),
}

impl RequestSize {
    fn get(&self) -> u64 {
        match self {
            Self::Known(n) => *n,
            Self::Counted(c) => c.load(Ordering::Relaxed),
        }
    }
}

/// One request being served: holds its in-progress slot until dropped.
#[derive(Debug)]
struct InFlight {
    metrics: Arc<HttpMetrics>,
    series: Arc<RouteSeries>,
    start: Instant,
    request_size: RequestSize,
}

impl InFlight {
    /// The response is complete (or abandoned): record everything but the gauge.
    fn record(&self, status: StatusCode, response_bytes: u64) {
        let m = &*self.metrics;
        let r = &*self.series;
        let secs = self.start.elapsed().as_secs_f64();
        let class = status_class_index(status);
        r.requests[class]
            .get_or_init(|| {
                m.requests.get_or_create_owned(&RequestLabels {
                    handler: r.handler.to_string(),
                    method: r.method,
                    status: STATUS_CLASSES[class],
                })
            })
            .inc();
        let handler = || HandlerLabels {
            handler: r.handler.to_string(),
        };
        r.request_size
            .get_or_init(|| m.request_size.get_or_create_owned(&handler()))
            .observe(self.request_size.get() as f64);
        r.response_size
            .get_or_init(|| m.response_size.get_or_create_owned(&handler()))
            .observe(response_bytes as f64);
        m.duration_highr.observe(secs);
        r.duration
            .get_or_init(|| {
                m.duration.get_or_create_owned(&MethodHandlerLabels {
                    method: r.method,
                    handler: r.handler.to_string(),
                })
            })
            .observe(secs);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.series.inprogress.dec();
    }
}

/// Tower layer recording the HTTP metrics; see the module docs.
#[derive(Debug, Clone)]
pub struct HttpMetricsLayer {
    metrics: Arc<HttpMetrics>,
    excluded: Arc<[String]>,
}

impl HttpMetricsLayer {
    /// A layer with the default exclusions (`/metrics`, `/health`).
    pub fn new(metrics: Arc<HttpMetrics>) -> Self {
        Self {
            metrics,
            excluded: DEFAULT_EXCLUDED.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    /// Replaces the excluded paths (route templates or raw paths).
    pub fn with_excluded<I, P>(mut self, paths: I) -> Self
    where
        I: IntoIterator<Item = P>,
        P: Into<String>,
    {
        self.excluded = paths.into_iter().map(Into::into).collect();
        self
    }
}

impl<S> Layer<S> for HttpMetricsLayer {
    type Service = HttpMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        HttpMetricsService {
            inner,
            metrics: Arc::clone(&self.metrics),
            excluded: Arc::clone(&self.excluded),
        }
    }
}

/// The service [`HttpMetricsLayer`] wraps around each route.
#[derive(Debug, Clone)]
pub struct HttpMetricsService<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
    excluded: Arc<[String]>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for HttpMetricsService<S>
where
    S: Service<Request<CountingBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body,
    ResB: Body,
{
    type Response = Response<MeteredBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let matched = req
            .extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str)
            .or_else(|| req.extensions().get::<RouteTemplate>().map(|r| r.0));
        let start = req.extensions().get::<RequestStart>().map(|s| s.0);
        let (in_flight, counter) = self.begin(&req, matched, start);
        ResponseFuture {
            inner: self.inner.call(counted(req, counter)),
            in_flight,
        }
    }
}

/// `req` with its body's bytes counted into `counter` (when there is one).
fn counted<B>(req: Request<B>, counter: Option<Arc<AtomicU64>>) -> Request<CountingBody<B>> {
    req.map(|body| CountingBody {
        inner: body,
        counter,
    })
}

/// What [`HttpMetricsService::begin`] starts for a request: its in-flight
/// record (none when its path is excluded) and the counter of its body's
/// bytes (when it has no `Content-Length`).
type Begun = (Option<InFlight>, Option<Arc<AtomicU64>>);

impl<S> HttpMetricsService<S> {
    /// As `call`, for a request whose route template and start the caller
    /// knows: nothing is looked up in (or needs to be put into) its
    /// extensions. Used on the request path, where the inbound path read
    /// the request and knows its route.
    pub fn call_route<ReqB, ResB>(
        &mut self,
        req: Request<ReqB>,
        route: &'static str,
        start: Instant,
    ) -> ResponseFuture<S::Future>
    where
        S: Service<Request<CountingBody<ReqB>>, Response = Response<ResB>>,
        ReqB: Body,
        ResB: Body,
    {
        self.call_route_with(req, route, start, S::call)
    }

    /// As `call_route`, with `call` standing for the inner service's
    /// `call`: a caller whose inner future has a type a `Service` cannot
    /// name (an `async` block) gets it wrapped here as it is, not boxed.
    pub fn call_route_with<ReqB, F>(
        &mut self,
        req: Request<ReqB>,
        route: &'static str,
        start: Instant,
        call: impl FnOnce(&mut S, Request<CountingBody<ReqB>>) -> F,
    ) -> ResponseFuture<F> {
        let (in_flight, counter) = self.begin(&req, Some(route), Some(start));
        ResponseFuture {
            inner: call(&mut self.inner, counted(req, counter)),
            in_flight,
        }
    }

    /// Starts recording `req`, routed to `matched`, started at `start`
    /// (else now).
    fn begin<B>(&self, req: &Request<B>, matched: Option<&str>, start: Option<Instant>) -> Begun {
        let excluded = self
            .excluded
            .iter()
            .any(|p| Some(p.as_str()) == matched || p == req.uri().path());
        if excluded {
            return (None, None);
        }
        let handler = matched.unwrap_or(UNMATCHED_HANDLER);
        let method = method_label(req.method());
        let content_length = req
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let (size, counter) = match content_length {
            Some(n) => (RequestSize::Known(n), None),
            None => {
                let c = Arc::new(AtomicU64::new(0));
                (RequestSize::Counted(Arc::clone(&c)), Some(c))
            }
        };
        let start = start.unwrap_or_else(Instant::now);
        (
            Some(self.metrics.start(handler, method, size, start)),
            counter,
        )
    }
}

pin_project! {
    /// Response future of [`HttpMetricsService`].
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        in_flight: Option<InFlight>,
    }
}

impl<F, ResB, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<ResB>, E>>,
{
    type Output = Result<Response<MeteredBody<ResB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        // On error the in-flight guard drops here: no status was sent, so only
        // the in-progress gauge is updated.
        let in_flight = this.in_flight.take();
        Poll::Ready(result.map(|resp| {
            let status = resp.status();
            resp.map(|body| MeteredBody {
                inner: body,
                state: in_flight.map(|g| (g, status)),
                bytes: 0,
            })
        }))
    }
}

pin_project! {
    /// Request body that counts the bytes the handler reads (when the request
    /// had no `Content-Length`).
    pub struct CountingBody<B> {
        #[pin]
        inner: B,
        counter: Option<Arc<AtomicU64>>,
    }
}

impl<B: Body> Body for CountingBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if let (Some(Ok(f)), Some(c)) = (&frame, this.counter.as_ref())
            && let Some(data) = f.data_ref()
        {
            c.fetch_add(data.remaining() as u64, Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// Response body that counts bytes and records the request when its last
    /// frame is sent, on error, or when dropped early (client disconnect).
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        state: Option<(InFlight, StatusCode)>,
        bytes: u64,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some((in_flight, status)) = this.state.take() {
                in_flight.record(status, *this.bytes);
            }
        }
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.inner.as_mut().poll_frame(cx));
        if let Some(Ok(f)) = &frame
            && let Some(data) = f.data_ref()
        {
            *this.bytes += data.remaining() as u64;
        }
        // The end: no more frames, an error, or the body says it is done
        // (hyper stops polling then, so don't wait for the drop).
        let done = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.inner.is_end_stream(),
        };
        if done && let Some((in_flight, status)) = this.state.take() {
            in_flight.record(status, *this.bytes);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `headers` carry `Authorization: Bearer KEY` with `key`: the
/// `--api-key` check of `serve` and `proxy` alike.
pub fn bearer_key_matches(headers: &http::HeaderMap, key: &str) -> bool {
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    constant_time_eq(given.as_bytes(), key.as_bytes())
}

/// Compares without an early exit, so the time taken does not reveal how
/// much of a key matched.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for (i, &x) in b.iter().enumerate() {
        diff |= usize::from(x ^ a.get(i).copied().unwrap_or(!x));
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(status_class(StatusCode::OK), "2xx");
        assert_eq!(status_class(StatusCode::NOT_FOUND), "4xx");
        assert_eq!(status_class(StatusCode::SERVICE_UNAVAILABLE), "5xx");
        assert_eq!(status_class(StatusCode::SWITCHING_PROTOCOLS), "1xx");
        assert_eq!(status_class(StatusCode::FOUND), "3xx");
        assert_eq!(method_label(&Method::POST), "POST");
        let odd = Method::from_bytes(b"BREW").unwrap();
        assert_eq!(method_label(&odd), "other");
    }

    #[test]
    fn only_the_generation_posts_are_generation_routes() {
        let post = Method::POST;
        for route in ["/v1/completions", "/v1/chat/completions"] {
            assert_eq!(generation_route(&post, route), Some(route));
        }
        assert_eq!(generation_route(&Method::GET, "/v1/completions"), None);
        assert_eq!(generation_route(&post, "/v1/completions/"), None);
        assert_eq!(generation_route(&post, "/v1/models"), None);
    }

    #[test]
    fn key_comparison() {
        let mut h = http::HeaderMap::new();
        assert!(!bearer_key_matches(&h, "secret"));
        h.insert(
            http::header::AUTHORIZATION,
            "Bearer secret".parse().unwrap(),
        );
        assert!(bearer_key_matches(&h, "secret"));
        assert!(!bearer_key_matches(&h, "secre"));
        h.insert(http::header::AUTHORIZATION, "secret".parse().unwrap());
        assert!(!bearer_key_matches(&h, "secret"));
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret-longer", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        assert!(constant_time_eq(b"", b""));
    }
}

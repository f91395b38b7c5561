//! The services a connection is served by: the generation posts straight
//! to their handler inside the HTTP metrics layer, everything else through
//! the router.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use hyper::body::Incoming;
use inferscope_inbound::{Connection, ReadBody};
use inferscope_metrics::http::{CountingBody, HttpMetricsService, RequestStart, generation_route};
use tower::Layer;

use crate::handlers::{generation, send_early};
use crate::router::router;
use crate::state::{AppState, Peer};

/// A boxed, sendable future (the connection task is spawned).
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// One thread's service: the generation routes straight to their handler,
/// inside the same HTTP metrics layer; everything else through the router.
///
/// Why: they are the requests whose first token the proxy delays, and the
/// router (boxed route services, `MatchedPath`, extractors) was a
/// measurable part of the proxy's added TTFT.
#[derive(Clone)]
pub(crate) struct ProxyService {
    /// Every other request's router (inside the same layer).
    pub(crate) router: Router,
    /// The generation routes' handler inside the HTTP metrics layer (hyper's
    /// requests and the inbound path's alike).
    pub(crate) generation: HttpMetricsService<GenerationService>,
    /// `--max-request-body`: larger posts are hyper's to refuse.
    pub(crate) max_body: usize,
    /// The handlers' state (the fast path sends generation posts early).
    pub(crate) app: Arc<AppState>,
    /// The connection's client, when `--trusted-proxy` needs it.
    pub(crate) peer: Option<Peer>,
}

impl ProxyService {
    pub(crate) fn new(state: Arc<AppState>) -> Self {
        let generation = state.manager.http_layer().layer(GenerationService {
            app: Arc::clone(&state),
        });
        Self {
            max_body: state.max_body,
            app: Arc::clone(&state),
            router: router(state),
            generation,
            peer: None,
        }
    }
}

impl ProxyService {
    /// The service for one connection, whose client is `peer` (kept only
    /// when `--trusted-proxy` needs it).
    pub(crate) fn for_peer(&self, peer: std::net::SocketAddr) -> Self {
        Self {
            peer: self.app.tenant_header_set.then_some(Peer(peer.ip())),
            ..self.clone()
        }
    }

    /// `req` (its peer set) to the generation handler when `route` names
    /// one of its routes (the metrics layer handed the route and `start`),
    /// else through the router.
    fn route<B>(
        &mut self,
        mut req: http::Request<B>,
        route: Option<&'static str>,
        start: Instant,
    ) -> BoxFuture<Result<Response, Infallible>>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        if let Some(peer) = self.peer {
            req.extensions_mut().insert(peer);
        }
        match route {
            Some(route) => {
                let served = self.generation.call_route(req, route, start);
                Box::pin(async move { served.await.map(|r| r.map(Body::new)) })
            }
            None => Box::pin(tower::Service::call(&mut self.router, req)),
        }
    }
}

/// A request hyper read (after the inbound path handed the connection over).
impl tower::Service<http::Request<Incoming>> for ProxyService {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Incoming>) -> Self::Future {
        let route = generation_route(req.method(), req.uri().path());
        self.route(req, route, Instant::now())
    }
}

impl Connection for ProxyService {
    fn max_body(&self) -> usize {
        self.max_body
    }

    /// A request the inbound path read: timed from its head's read (handed
    /// to the metrics layer, and to the handler as `RequestStart`); a
    /// generation post goes upstream at once when it can ([`send_early`]),
    /// before the metrics layer and the handler run.
    fn serve_read(
        &mut self,
        mut req: http::Request<ReadBody>,
    ) -> impl Future<Output = Response> + Send {
        let read_at = req.body().read_at();
        req.extensions_mut().insert(RequestStart(read_at));
        let route = generation_route(req.method(), req.uri().path());
        if !req.body().is_truncated()
            && route.is_some()
            && let Some(bytes) = req.body().bytes()
            && let Some(early) = send_early(
                &self.app,
                req.method(),
                req.uri().path_and_query().map_or("/", |p| p.as_str()),
                req.headers(),
                self.peer,
                bytes.clone(),
            )
        {
            req.extensions_mut().insert(early);
        }
        let served = self.route(req, route, read_at);
        async move {
            match served.await {
                Ok(response) => response,
                Err(never) => match never {},
            }
        }
    }
}

/// [`generation`] as a tower service.
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
        Box::pin(async move { Ok(generation(State(app), req.map(Body::new)).await) })
    }
}

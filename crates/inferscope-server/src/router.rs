//! The router: which path goes to which handler, the API-key check in front
//! of `/v1/*` and the tokenizer routes, the console on whichever listener
//! serves `/metrics`, the body limit and the HTTP metrics layer around
//! everything; and [`Front`], which serves the two generation routes without
//! the router.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::{BoxFuture, Either, FutureExt, Map};
use http_body::Body as HttpBody;
use hyper::body::Incoming;
use inferscope_inbound::{Connection, ReadBody};
use inferscope_metrics::http::{
    CountingBody, HttpMetricsService, MeteredBody, RequestStart, generation_route,
};
use tower::{Layer, Service};

use crate::console::{Console, steps};
use crate::error::ApiError;
use crate::handlers;
use crate::kv_debug;
use crate::openai::response::Api;
use crate::profile;
use crate::state::AppState;
use inferscope_tenants::{AccessRefusal, Tenant};

/// The router: OpenAI and tokenizer routes (behind the API key), health, version, and
/// `/metrics` and the console's routes when `serve_metrics` (else they answer 404:
/// they are served on a separate listener), all under the HTTP metrics layer.
pub fn router(
    state: Arc<AppState>,
    max_body: usize,
    serve_metrics: bool,
    console: Option<&Arc<Console>>,
) -> Router {
    let v1 = Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat_completions))
        // vLLM serves these at the root, not under /v1; same key as /v1/*.
        .route("/tokenize", post(handlers::tokenize))
        .route("/detokenize", post(handlers::detokenize));
    let mut app = Router::new().merge(behind_key(v1, &state));
    if state.tokenizer_info.is_some() {
        // vLLM registers it only with --enable-tokenizer-info-endpoint; same key as /tokenize.
        app = app.merge(behind_key(
            Router::new().route("/tokenizer_info", get(handlers::tokenizer_info)),
            &state,
        ));
    }
    if state.kv_events {
        app = app.merge(behind_key(
            Router::new()
                .route("/debug/kv_cache_blocks", get(kv_debug::kv_cache_blocks))
                .route("/reset_prefix_cache", post(kv_debug::reset_prefix_cache)),
            &state,
        ));
    }
    if let Some(profile) = profile::routes(state.clone()) {
        // vLLM registers them only with its profiler dir; same key as /tokenize.
        app = app.merge(behind_key(profile, &state));
    }
    let mut app = app
        .route("/health", get(handlers::health))
        .route("/version", get(handlers::version));
    if serve_metrics {
        app = app.route("/metrics", get(handlers::metrics));
        if let Some(console) = console {
            app = app
                .merge(console.routes())
                .merge(steps::routes(console, state.clone()));
        }
    }
    around_routes(app, &state, max_body).with_state(state)
}

/// `app` with its fallback, under the HTTP metrics and a body limit of
/// `max_body`, as one layer: each `layer` call wraps every route in
/// another boxed service, cloned and boxed again on every request.
fn around_routes(
    app: Router<Arc<AppState>>,
    state: &AppState,
    max_body: usize,
) -> Router<Arc<AppState>> {
    app.fallback(handlers::not_found).layer(
        tower::ServiceBuilder::new()
            .layer(state.metrics.http_layer())
            .layer(DefaultBodyLimit::max(max_body)),
    )
}

/// The router of the separate metrics listener: `/metrics` (plus
/// `/health`, which probes on that network may want) and the console, no
/// request bodies.
pub fn metrics_router(state: Arc<AppState>, console: Option<&Arc<Console>>) -> Router {
    let mut app = Router::new()
        .route("/metrics", get(handlers::metrics))
        .route("/health", get(handlers::health));
    if let Some(console) = console {
        app = app
            .merge(console.routes())
            .merge(steps::routes(console, state.clone()));
    }
    around_routes(app, &state, 0).with_state(state)
}

/// `routes` behind [`require_api_key`], when the server has keys or a
/// trusted tenant header; with neither every request is anonymous and
/// passes, so the middleware (a boxed service clone and two boxed futures
/// per request) is left out.
fn behind_key(routes: Router<Arc<AppState>>, state: &Arc<AppState>) -> Router<Arc<AppState>> {
    if state.access.is_open() {
        return routes;
    }
    routes.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        require_api_key,
    ))
}

/// Rejects /v1/*, /tokenize and /detokenize requests without the right bearer
/// token, and names the request's tenant (a request extension) from it.
pub async fn require_api_key(
    State(s): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    match identify(&s, &req) {
        Ok(Some(tenant)) => {
            req.extensions_mut().insert(tenant);
        }
        Ok(None) => {}
        Err(refused) => return refused.into_response(),
    }
    next.run(req).await
}

/// `req`'s tenant, named by its key and its peer (a request extension), or
/// the refusal to answer.
fn identify<B>(s: &AppState, req: &Request<B>) -> Result<Option<Arc<Tenant>>, ApiError> {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    s.access
        .identify(peer, req.headers())
        .map_err(|refusal| match refusal {
            AccessRefusal::Unauthorized => ApiError::unauthorized(),
            AccessRefusal::BadTenantHeader(message) => ApiError::invalid(message, None),
        })
}

/// The main listener's service, [`router`] with the generation routes taken
/// out in front of it: a generation post goes straight to its handler,
/// inside the same HTTP metrics layer, body limit and API-key check; every
/// other request goes through the router.
///
/// Why: these routes are the request path, and the router's work per request
/// (the match, the route's boxed service cloned, `MatchedPath`, `UrlParams`
/// and `OriginalUri` inserted) was a measurable share of it
/// (`docs/results/request-path.md`).
#[derive(Clone)]
pub struct Front {
    router: Router,
    generation: HttpMetricsService<Generation>,
    /// The connection's client (the API-key check's `--trusted-proxy`).
    peer: Option<SocketAddr>,
    /// Whether every request passes the API-key check (no keys, no trusted
    /// tenant header): the generation posts then need no peer.
    open: bool,
    /// `--max-request-body-bytes`.
    max_body: usize,
}

impl Front {
    /// [`router`] for the main listener, with the generation routes in front.
    pub fn new(
        state: Arc<AppState>,
        max_body: usize,
        serve_metrics: bool,
        console: Option<&Arc<Console>>,
    ) -> Self {
        let generation = state.metrics.http_layer().layer(Generation {
            state: state.clone(),
            max_body,
        });
        Self {
            open: state.access.is_open(),
            router: router(state, max_body, serve_metrics, console),
            generation,
            peer: None,
            max_body,
        }
    }

    /// The service of one connection, whose client is `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Self {
            peer: Some(peer),
            ..self.clone()
        }
    }
}

/// What a generation post's handler future resolves to, as a service's.
type Answered = Result<Response, Infallible>;
/// A generation post's future under the HTTP metrics layer.
type MeteredAnswer = inferscope_metrics::http::ResponseFuture<BoxFuture<'static, Answered>>;

/// The service's future for either kind of request.
type FrontFuture = Either<
    Map<MeteredAnswer, fn(Result<Response<MeteredBody<Body>>, Infallible>) -> Answered>,
    <Router as Service<Request>>::Future,
>;

impl Front {
    /// The generation route `req` posts to, if any. A request for the
    /// router is told its peer where the router may ask (`ConnectInfo`).
    fn route_of<B>(&self, req: &mut Request<B>) -> Option<&'static str> {
        let route = generation_route(req.method(), req.uri().path());
        if let Some(peer) = self.peer
            && (route.is_none() || !self.open)
        {
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        route
    }
}

/// The metrics layer's answer as the connection's: the body type it
/// counts erased, the error that cannot happen unwrapped.
fn unmetered(r: Result<Response<MeteredBody<Body>>, Infallible>) -> Response {
    match r {
        Ok(r) => r.map(Body::new),
        Err(never) => match never {},
    }
}

/// A request hyper read (the rest of a connection the inbound path handed
/// over): routed as a read one, with the generation posts' futures boxed,
/// as a `Service`'s future must have a type.
impl Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = FrontFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        match self.route_of(&mut req) {
            Some(route) => {
                let ok: fn(Result<Response<MeteredBody<Body>>, Infallible>) -> Answered =
                    |r| Ok(unmetered(r));
                let start = Instant::now();
                Either::Left(self.generation.call_route(req, route, start).map(ok))
            }
            None => Either::Right(self.router.call(req)),
        }
    }
}

/// A request the inbound path read ([`inferscope_inbound`]).
impl Connection for Front {
    fn max_body(&self) -> usize {
        self.max_body
    }

    fn serve_read(&mut self, mut req: Request<ReadBody>) -> impl Future<Output = Response> + Send {
        let read_at = req.body().read_at();
        match self.route_of(&mut req) {
            // The metrics layer is told the route and start (no extension,
            // an allocation each), and wraps the handler's future as it is.
            Some(route) => Either::Left(
                self.generation
                    .call_route_with(req, route, read_at, |g, req| g.answer(req))
                    .map(unmetered),
            ),
            None => {
                req.extensions_mut().insert(RequestStart(read_at));
                Either::Right(self.router.call(req).map(|r| match r {
                    Ok(r) => r,
                    Err(never) => match never {},
                }))
            }
        }
    }
}

/// The generation routes' handlers as one service, under [`Front`]'s HTTP
/// metrics layer: the body limit and the API-key check the router puts
/// around them, then what the routed handler does.
#[derive(Clone)]
pub struct Generation {
    state: Arc<AppState>,
    max_body: usize,
}

impl Generation {
    /// The answer to a generation post: the body limit and the API-key
    /// check the router puts around the handlers, then what the routed
    /// handler does. Its future borrows nothing, so a caller may keep it
    /// anywhere.
    fn answer<B>(
        &self,
        req: Request<CountingBody<B>>,
    ) -> impl Future<Output = Answered> + Send + use<B>
    where
        B: HttpBody<Data = Bytes> + Send + 'static,
        B::Error: Into<axum::BoxError>,
    {
        let state = self.state.clone();
        let tenant = if state.access.is_open() {
            None
        } else {
            match identify(&state, &req) {
                Ok(tenant) => tenant,
                Err(refused) => {
                    return Either::Left(std::future::ready(Ok(refused.into_response())));
                }
            }
        };
        let api = match req.uri().path() {
            "/v1/chat/completions" => Api::Chat,
            _ => Api::Completions,
        };
        // The handler's extractors by hand: the headers are moved, not
        // cloned (axum's `HeaderMap` extractor clones them); the body is
        // read as axum's `Bytes` extractor reads it, under the same limit.
        let (mut parts, body) = req.into_parts();
        let headers = std::mem::take(&mut parts.headers);
        let max_body = self.max_body;
        Either::Right(async move {
            let body = handlers::read_body(body, max_body).await;
            Ok(handlers::generation_route(state, api, tenant, headers, body).await)
        })
    }
}

impl<B> Service<Request<CountingBody<B>>> for Generation
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Answered>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<CountingBody<B>>) -> Self::Future {
        Box::pin(self.answer(req))
    }
}

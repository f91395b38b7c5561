//! The router: which path goes to which handler, the API-key check in front
//! of `/v1/*` and the tokenizer routes, the console on whichever listener
//! serves `/metrics`, the body limit and the HTTP metrics layer around
//! everything.

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::console::{Console, steps};
use crate::error::ApiError;
use crate::handlers;
use crate::kv_debug;
use crate::profile;
use crate::state::AppState;
use inferscope_tenants::AccessRefusal;

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
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    match s.access.identify(peer, req.headers()) {
        Ok(Some(tenant)) => {
            req.extensions_mut().insert(tenant);
        }
        Ok(None) => {}
        Err(AccessRefusal::Unauthorized) => return ApiError::unauthorized().into_response(),
        Err(AccessRefusal::BadTenantHeader(message)) => {
            return ApiError::invalid(message, None).into_response();
        }
    }
    next.run(req).await
}

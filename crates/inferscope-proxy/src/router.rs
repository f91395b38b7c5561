//! The router: the generation routes, `/metrics`, every other path passed
//! through, the API-key check in front of `/v1/*`, the HTTP metrics layer
//! around everything.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};

use crate::handlers::{generation, metrics, pass_through};
use crate::state::{AppState, Peer, refusal_response};

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let mut v1 = Router::new()
        .route("/v1/completions", post(generation))
        .route("/v1/chat/completions", post(generation))
        .route("/v1/models", get(pass_through))
        .route("/v1/{*rest}", any(pass_through));
    // Only when there is a key to check: a middleware is a boxed future and
    // a clone of the request's state more on every request's path.
    if state.checks_access() {
        v1 = v1.route_layer(middleware::from_fn_with_state(
            state.clone(),
            require_api_key,
        ));
    }
    let mut app = Router::new().merge(v1).route("/metrics", get(metrics));
    // `/console` and its data; `/` stays the upstream's (llama.cpp's page).
    if let Some(console) = &state.console {
        app = app.merge(console.routes());
    }
    app.fallback(pass_through)
        .layer(state.manager.http_layer())
        .with_state(state)
}

pub(crate) async fn require_api_key(
    State(s): State<Arc<AppState>>,
    req: Request,
    next: Next,
) -> Response {
    let peer = req.extensions().get::<Peer>().copied();
    match s.identify(peer, req.headers()) {
        Err(refusal) => refusal_response(refusal),
        Ok(_) => next.run(req).await,
    }
}

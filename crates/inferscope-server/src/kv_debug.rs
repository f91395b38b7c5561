//! Routes that exist only with `--kv-events-config`: what a KV-event consumer
//! needs to check itself against the engine, and vLLM's prefix-cache reset.
//!
//! - `GET /debug/kv_cache_blocks`: each engine's cached block hashes, the set
//!   a consumer of the events must have rebuilt;
//! - `POST /reset_prefix_cache`: drops every engine's prefix cache (each
//!   publishes `AllBlocksCleared`); 409 while requests hold blocks.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::error::ApiError;
use crate::state::AppState;

/// How long a handler waits for the engine threads to answer.
const ENGINE_ANSWER: Duration = Duration::from_secs(5);

/// `GET /debug/kv_cache_blocks`.
pub async fn kv_cache_blocks(State(s): State<Arc<AppState>>) -> Response {
    // The engines answer between steps: wait for them off the runtime.
    let answer =
        tokio::task::spawn_blocking(move || s.coordinator.cached_block_hashes(ENGINE_ANSWER)).await;
    let Ok(engines) = answer else {
        return ApiError::internal("the engine query failed").into_response();
    };
    if let Some((engine, _)) = engines.iter().find(|(_, h)| h.is_none()) {
        return ApiError::unavailable(format!("engine {engine} did not answer")).into_response();
    }
    let engines: Vec<_> = engines
        .into_iter()
        .map(|(engine, hashes)| json!({"engine": engine, "block_hashes": hashes.unwrap_or_default()}))
        .collect();
    Json(json!({ "engines": engines })).into_response()
}

/// `POST /reset_prefix_cache`.
pub async fn reset_prefix_cache(State(s): State<Arc<AppState>>) -> Response {
    let answer =
        tokio::task::spawn_blocking(move || s.coordinator.reset_prefix_cache(ENGINE_ANSWER)).await;
    match answer {
        Ok(true) => StatusCode::OK.into_response(),
        Ok(false) => ApiError::conflict(
            "the prefix cache cannot be reset while requests hold KV blocks; retry when idle",
        )
        .into_response(),
        Err(_) => ApiError::internal("the engine query failed").into_response(),
    }
}

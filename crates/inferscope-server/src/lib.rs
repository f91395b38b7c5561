//! inferscope-server: the OpenAI-compatible HTTP server.
//!
//! Layers, each importing only those below it (docs/architecture.md has the
//! table, checked against the `use` lines): [`lifecycle`] (bind, serve, shut
//! down) → [`router`] (routes, API key, HTTP metrics layer) → [`handlers`]
//! (thin) → [`state`] (what handlers share, built at start-up) → [`openai`]
//! (response, infer, validation, protocol) → [`console`] (the browser page
//! and its data, mounted by the router) → [`request_log`], [`timings`],
//! [`validation_workers`], [`request_ids`], [`otel`] (request traces),
//! [`admission`], [`error`], [`cli`].

pub mod admission;
pub mod cli;
pub mod console;
pub mod error;
pub mod features;
pub mod handlers;
pub mod kv_debug;
pub mod lifecycle;
pub mod openai;
pub mod otel;
pub mod profile;
pub mod request_ids;
pub mod request_log;
pub mod router;
pub mod state;
pub mod timings;
pub mod validation_workers;

pub use cli::{ExecutorKind, ServeArgs};
pub use console::Diagnose;
pub use error::{ApiError, ServerError};
pub use lifecycle::{RunningServer, limit_allocator_arenas, run, start, start_with_findings};
pub use state::{AppState, build_state};

//! inferscope-server: the OpenAI-compatible HTTP server.
//!
//! Layers, each importing only those below it: [`lifecycle`] (bind, serve,
//! shut down) → [`router`] (routes, API key, HTTP metrics layer) →
//! [`handlers`] (thin) → [`state`] (what handlers share, built at start-up)
//! → [`openai`] (protocol, validation, generate, response) and the leaves
//! [`workers`], [`request_ids`], [`admission`], [`error`], [`cli`]; [`otel`]
//! exports request traces.

pub mod admission;
pub mod cli;
pub mod error;
pub mod handlers;
pub mod kv_debug;
pub mod lifecycle;
pub mod openai;
pub mod otel;
pub mod request_ids;
pub mod request_log;
pub mod router;
pub mod state;
pub mod timings;
pub mod workers;

pub use cli::{ExecutorKind, ServeArgs};
pub use error::{ApiError, ServerError};
pub use lifecycle::{RunningServer, limit_allocator_arenas, run, start};
pub use state::{AppState, build_state};

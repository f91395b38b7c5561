//! inferscope-server: the OpenAI-compatible HTTP server — routes, SSE
//! streaming, validation and errors, `/metrics`, `/health`, and the wiring of
//! engine cores, executors and metrics.

pub mod admission;
pub mod app;
pub mod cli;
pub mod error;
pub mod generation;
pub mod protocol;
pub mod routes;
pub mod validation;

pub use app::{
    AppState, RunningServer, ServerError, build_state, limit_allocator_arenas, run, start,
};
pub use cli::{ExecutorKind, ServeArgs};
pub use error::ApiError;

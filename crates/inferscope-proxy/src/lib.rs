//! inferscope-proxy: `inferscope proxy`, a reverse proxy that brings
//! inferscope's metrics to any OpenAI-compatible server (llama.cpp, Ollama,
//! vLLM, a vendor's endpoint) without changing it.
//!
//! Requests and responses pass through unchanged (streams frame by frame,
//! TCP_NODELAY on both sides); [`observe`] reads a view of each generation
//! response on the way and records it, under the schema's names, in the
//! metrics crate's [`StatLoggerManager`] (the same one `serve` uses, with the
//! series only an engine can know left unregistered, so they are absent, not
//! zero). The HTTP layer is `serve`'s. `--upstream-metrics` appends the
//! upstream's own exposition to the proxy's `/metrics`.
//!
//! `inferscope proxy` ([`run`]) serves on one current-thread runtime per
//! thread, each with its own `SO_REUSEPORT` listener and upstream pool, so a
//! chunk crosses no thread on its way from the upstream to the client.
//!
//! Layers, each importing only those after it: [`cli`] (flags) →
//! [`lifecycle`] (start, run, runtimes, accept loop, drain; `models`: the
//! `model_name` labels; client connections are `inferscope_inbound`'s:
//! plain HTTP/1.1 read on the socket, the rest by hyper) → `services` (each
//! connection's service: generation posts sent upstream early when they can
//! and straight to their handler, the rest through `router`) → `handlers` (generation,
//! pass-through, `/metrics` with `upstream_metrics` appended) → `state` (what
//! the handlers share) → [`observe`] (the measured body and the series a
//! proxy can measure) → [`admission`] (a request's holds on its tenant's
//! limits, the fair queue to the upstream's slots), [`relay`] (the measured routes' upstream client) and
//! [`upstream`] (hyper's client, URL, failures).

pub mod admission;
pub mod cli;
mod handlers;
pub mod lifecycle;
mod models;
pub mod observe;
pub mod relay;
mod router;
mod services;
mod state;
pub mod upstream;
mod upstream_metrics;

pub use cli::ProxyArgs;
pub use lifecycle::{RunningProxy, run, start};

use thiserror::Error;

/// Why the proxy cannot start.
#[derive(Debug, Error)]
pub enum ProxyError {
    /// `--upstream` or `--upstream-metrics` is not a usable URL.
    #[error("invalid upstream URL {url:?}: {reason}")]
    Upstream {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A flag out of range.
    #[error("{0}")]
    Flag(String),
    /// The metrics configuration was refused (e.g. the namespace).
    #[error(transparent)]
    Metrics(#[from] inferscope_metrics::ConfigError),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// `host:port`.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving failed: {0}")]
    Serve(std::io::Error),
}

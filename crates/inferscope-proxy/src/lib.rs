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
//! Layers: [`cli`] (flags) → `inbound` (client connections: plain HTTP/1.1
//! read on the socket, the rest by hyper) → [`app`] (router, handlers,
//! `/metrics`, start) → [`observe`] (the measured body), [`relay`] (the
//! measured routes' upstream client) and [`upstream`] (hyper's client, URL,
//! failures).

pub mod app;
pub mod cli;
mod inbound;
pub mod observe;
pub mod relay;
pub mod upstream;

pub use app::{RunningProxy, run, start};
pub use cli::ProxyArgs;

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

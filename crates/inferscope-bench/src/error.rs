//! Typed errors of the benchmark library.

use std::path::PathBuf;

/// Everything that can stop a benchmark before or after it runs.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value is malformed or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArg(String),
    /// The dataset could not be read or holds no usable prompt.
    #[error("dataset: {0}")]
    Dataset(String),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON document could not be parsed or written.
    #[error("{context}: {source}")]
    Json {
        /// What was being parsed.
        context: String,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// The server could not be reached or answered unusably before the run.
    #[error("server: {0}")]
    Server(String),
    /// A plot could not be encoded.
    #[error("plot: {0}")]
    Plot(String),
}

impl BenchError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        BenchError::Io {
            path: path.into(),
            source,
        }
    }
}

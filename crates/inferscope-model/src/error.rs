//! The error type of model loading and tokenization.

use std::path::PathBuf;

/// Why a model could not be loaded or a text could not be (de)tokenized.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file the model needs does not exist.
    #[error("missing file: {0}")]
    MissingFile(PathBuf),
    /// A file exists but could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// `config.json` or GGUF metadata names an architecture we do not run.
    #[error("unsupported architecture {name:?} (supported: {supported})")]
    UnsupportedArchitecture {
        /// The architecture the file names.
        name: String,
        /// The ones this build runs (`config::supported_architectures`).
        supported: String,
    },
    /// The configuration is malformed or inconsistent.
    #[error("invalid model config: {0}")]
    Config(String),
    /// A weight the architecture needs is absent.
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    /// A weight has the wrong shape.
    #[error("tensor {name:?} has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape in the file.
        actual: Vec<usize>,
    },
    /// The tokenizer failed or could not be loaded.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A tensor operation failed.
    #[error("tensor operation failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// The spec is neither `demo`, a directory nor a file.
    #[error(
        "cannot load model {0:?}: expected `demo`, `demo-random`, a Hugging Face model directory or a GGUF file"
    )]
    BadSpec(String),
    /// A file that is not a GGUF file (by its first bytes, whatever its name).
    #[error(
        "cannot load model {0}: not a GGUF file (it does not start with the bytes `GGUF`); expected `demo`, `demo-random`, a Hugging Face model directory or a GGUF file"
    )]
    NotGguf(PathBuf),
}

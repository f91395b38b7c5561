//! Exact token counts with a `tokenizer.json` (not available in this build yet).

use crate::dataset::{DatasetSpec, SampleRequest};
use crate::error::BenchError;
use crate::rng::Rng;
use std::path::Path;

/// A tokenizer loaded from `tokenizer.json`.
pub struct TextTokenizer {
    _private: (),
}

impl TextTokenizer {
    /// Loads a tokenizer.
    pub fn from_file(path: &Path) -> Result<Self, BenchError> {
        Err(BenchError::InvalidArg(format!(
            "--tokenizer {}: tokenizer support is not built in yet",
            path.display()
        )))
    }

    /// Number of tokens in `text`.
    pub fn count(&self, text: &str) -> usize {
        crate::dataset::estimate_tokens(text)
    }

    /// Draws requests with exact prompt lengths.
    pub fn sample(
        &self,
        spec: &DatasetSpec,
        n: usize,
        rng: &mut Rng,
    ) -> Result<Vec<SampleRequest>, BenchError> {
        crate::dataset::sample(spec, n, rng)
    }
}

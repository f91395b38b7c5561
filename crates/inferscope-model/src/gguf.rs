//! GGUF files (not yet implemented).

use std::path::Path;
use std::sync::Arc;

use crate::error::ModelError;
use crate::llama::LlamaModel;
use crate::tokenizer::Tokenizer;

/// Loads a GGUF file.
pub fn load_gguf(path: &Path) -> Result<(LlamaModel, Arc<dyn Tokenizer>), ModelError> {
    if !path.is_file() {
        return Err(ModelError::MissingFile(path.to_path_buf()));
    }
    Err(ModelError::BadSpec(format!(
        "{}: GGUF loading is not implemented yet",
        path.display()
    )))
}

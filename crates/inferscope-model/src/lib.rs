//! inferscope-model: the `cpu` executor — tokenizers, a Llama-family forward
//! pass over a paged KV cache, safetensors/GGUF loading and the demo model.

mod attention;
mod bpe;
pub mod chat_template;
pub mod config;
pub mod demo;
mod elementwise;
pub mod embedding;
pub mod error;
pub mod executor;
pub mod generation_config;
pub mod gguf;
pub mod gguf_file;
mod gguf_meta;
mod gguf_tokenizer;
pub mod iq4;
mod isa;
#[cfg(test)]
mod kernel_reference;
pub mod kv_storage;
pub mod llama;
pub mod loader;
pub mod logprobs;
pub mod model;
pub mod packed;
pub mod packed_cache;
pub mod packed_kquant;
pub mod packed_q8;
pub mod panel_data;
mod pretokenizer;
mod q8k;
pub mod sampler;
pub mod token_counts;
pub mod tokenizer;

pub use chat_template::{ChatInput, ChatTemplate};
pub use config::ModelConfig;
pub use error::ModelError;
pub use executor::{CpuCost, CpuExecutor, KvBudget};
pub use generation_config::GenerationDefaults;
pub use gguf_tokenizer::GgufTokenizer;
pub use kv_storage::KvDtype;
pub use logprobs::LogprobsMode;
pub use model::{LoadedModel, ModelOptions};
pub use packed_cache::PackedCache;
pub use tokenizer::{ByteTokenizer, ChatMessage, HfTokenizer, IncrementalDecoder, Tokenizer};

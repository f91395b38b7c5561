//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-model --test it demo_model::`.

mod common;
mod demo_model;
mod executor;
mod gguf;
mod kv_cache;
mod llama_cpp_vocab;
mod reference;

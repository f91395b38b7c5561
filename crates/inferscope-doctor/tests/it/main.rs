//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-doctor --test it fixtures::`.

mod common;
mod console;
mod fixtures;
mod scenarios;
mod top;
mod vllm_published;

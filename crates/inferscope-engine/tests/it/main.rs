//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-engine --test it coordinator::`.

mod common;
mod coordinator;
mod grammar_masks;
mod kv_events;
mod parity_metrics;
mod scheduler_props;

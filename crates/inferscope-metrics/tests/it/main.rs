//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-metrics --test it deploy_names::`.

mod deploy_names;
mod exposition;
mod http;
mod log_lines;
mod schema_docs;
mod traffic;

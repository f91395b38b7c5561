//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-bench --test it keepalive_close::`.

mod common;
mod keepalive_close;
mod mock_server;
mod report;

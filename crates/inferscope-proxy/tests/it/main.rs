//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-proxy --test it inbound::`.

mod common;
mod console;
mod inbound;
mod proxy;
mod tenants;

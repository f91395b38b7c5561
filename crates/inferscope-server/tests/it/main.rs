//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope-server --test it api::`.

mod api;
mod common;
mod console;
mod front;
mod fuzz_validation;
mod inbound;
mod logprobs;
mod metrics_integration;
mod parity_metrics;
mod per_request;
mod profile;
mod reliability;
mod request_fields;
mod server_contract;
mod structured;
mod tenants;
mod tokenize;
mod tools;

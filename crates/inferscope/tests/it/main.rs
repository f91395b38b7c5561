//! The integration tests, linked into one binary (one per test file made
//! linking most of `cargo test`'s time). Run one file's tests with a filter:
//! `cargo test -p inferscope --test it architecture_doc::`.

mod architecture_doc;
mod bench_profile;
mod bench_tokens;
mod chat_template;
mod common;
mod deploy;
mod logs;
mod memory;
mod shutdown;

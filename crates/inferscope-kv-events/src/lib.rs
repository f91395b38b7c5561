//! KV-cache events in vLLM's wire format, for prefix-cache-aware routers
//! (llm-d, the Gateway API Inference Extension's precise prefix scorer).
//!
//! The engine hands each step's events to a [`KvEventPublisher`] (an
//! [`inferscope_engine::KvEventSink`]) without waiting: a bounded queue per
//! engine, full means dropped and counted. One thread per engine encodes the
//! batches as msgpack `KVEventBatch`es ([`encode`]) and sends them on a ZeroMQ
//! PUB socket as three frames (topic, 8-byte big-endian sequence number,
//! payload), keeping the last `buffer_steps` for the replay (ROUTER) socket.
//!
//! ZeroMQ comes from the pure-Rust `zeromq` crate rather than a libzmq
//! binding: it speaks the same ZMTP 3 protocol to pyzmq/libzmq peers, and a
//! fresh machine with only the Rust toolchain builds and tests it, where a
//! binding needs libzmq (or cmake and a C++ compiler to vendor it).

pub mod config;
pub mod encode;
pub mod publisher;

pub use config::{ConfigError, KvEventsConfig};
pub use publisher::{KvEventPublisher, PublisherError};

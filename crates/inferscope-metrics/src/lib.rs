//! inferscope-metrics: the metric schema, stats types, the stat-logger
//! manager, the Prometheus and log-line loggers, and HTTP instrumentation.
//!
//! The server builds one [`StatLoggerManager`] from a [`MetricsConfig`],
//! hands it to the engine as its [`StatsRecorder`], records TTFT / ITL / e2e
//! through [`StatLoggerManager::engine`], wraps its router in
//! [`StatLoggerManager::http_layer`], serves `/metrics` with
//! [`exposition::negotiate`] + [`StatLoggerManager::render`], and calls
//! [`StatLoggerManager::log`] every interval.

#![warn(missing_docs)]

pub mod exposition;
pub mod histogram;
pub mod http;
pub mod log_line;
pub mod manager;
pub mod prometheus;
pub mod schema;
pub mod stats;

#[cfg(test)]
mod test_support;

pub use exposition::{Format, negotiate};
pub use http::{HttpMetrics, HttpMetricsLayer};
pub use manager::{ConfigError, MetricsConfig, StatLoggerManager};
pub use prometheus::{CacheConfig, EngineMetrics};
pub use schema::{BucketGroup, BucketOverrides, BucketsError, parse_buckets};
pub use stats::{
    FinishReason, FinishedRequestStats, FrontendRequestStats, IterationStats, NoopRecorder,
    SchedulerStats, StatsRecorder,
};

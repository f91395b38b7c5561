//! inferscope-metrics: the metric schema, stats types, the stat-logger
//! manager, the Prometheus and log-line loggers, and HTTP instrumentation.

pub mod stats;

pub use stats::{
    FinishReason, FinishedRequestStats, FrontendRequestStats, IterationStats, NoopRecorder,
    SchedulerStats, StatsRecorder,
};

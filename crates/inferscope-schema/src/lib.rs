//! inferscope-schema: the contract between inferscope's crates.
//!
//! - [`schema`]: every metric's name ([`schema::names`]), help, type, unit,
//!   labels and buckets; `docs/metrics.md` is generated from it.
//! - [`stats`]: the plain stats structs the engine emits and the
//!   [`StatsRecorder`] it hands them to, and the front end's
//!   ([`FrontendStats`]).
//! - [`promtext`]: the one parser of the Prometheus text exposition (0.0.4)
//!   and OpenMetrics, used by bench, doctor, top and the tests.
//! - [`scrape`]: the one view of a server from its scrapes: counter deltas
//!   across resets, histogram deltas and quantiles, namespace detection and
//!   the vLLM name fallbacks.
//! - [`palette`]: the chart series colours the bench report and the console share.
//! - [`units`]: byte sizes as command lines write them (`512MiB`, `2G`).
//!
//! Std-level dependencies only: the engine links this crate and must never
//! pull HTTP or Prometheus client code.

pub mod palette;
pub mod promtext;
pub mod schema;
pub mod scrape;
pub mod stats;
pub mod units;

pub use schema::{BucketGroup, BucketOverrides, BucketsError, names, parse_buckets};
pub use stats::{
    EngineFailure, FinishReason, FinishedRequestStats, FrontendRequestStats, FrontendStats,
    IterationStats, KvBlockResidency, NoopRecorder, ObservedRequest, RequestRef, SchedulerStats,
    StatsRecorder, TenantLabel, TenantTokens,
};

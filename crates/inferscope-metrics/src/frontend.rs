//! The front end's route into the metrics: a [`FrontendRecorder`] takes the
//! [`FrontendStats`] that `serve` (per delta, per finished choice) and the
//! proxy (per chunk, per finished choice) measure, as the manager's
//! `StatsRecorder` takes the engine's stats.

use std::sync::Arc;

use inferscope_schema::stats::{FrontendStats, RequestRef};

use crate::prometheus::EngineMetrics;

/// Records front-end stats into one engine's series (on the proxy, one
/// model's). Resolved once, by [`crate::StatLoggerManager::frontend`] or
/// [`crate::StatLoggerManager::model_frontend`]; cloning it is one
/// reference-count increment, and recording touches only atomics (no
/// lookup, no lock, no allocation), so it serves the per-token path.
/// It records even with Prometheus disabled (the series are just not
/// rendered).
#[derive(Debug, Clone)]
pub struct FrontendRecorder {
    engine: Arc<EngineMetrics>,
}

impl FrontendRecorder {
    pub(crate) fn new(engine: Arc<EngineMetrics>) -> Self {
        Self { engine }
    }

    /// The global engine index (the `engine` label) it records into.
    pub fn engine_index(&self) -> usize {
        self.engine.index()
    }

    /// The `model_name` label it records into.
    pub fn model_name(&self) -> &str {
        self.engine.model_name()
    }

    /// Records `stats`, with no exemplar.
    #[inline]
    pub fn record(&self, stats: &FrontendStats) {
        self.engine.record_frontend(stats, None);
    }

    /// Records `stats` of `request`: the request is the exemplar of the
    /// latency buckets (and the success counter) the stats land in.
    #[inline]
    pub fn record_for(&self, stats: &FrontendStats, request: &RequestRef) {
        self.engine.record_frontend(stats, Some(request));
    }
}

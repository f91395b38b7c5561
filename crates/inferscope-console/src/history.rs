//! The console's short history: one [`Sample`] of every engine's metrics a
//! second, the last [`HISTORY_SECONDS`] of them, taken from the metric
//! handles the engines and the front end already update (no second metrics
//! pipeline, no work per token).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use inferscope_metrics::{EngineReading, StatLoggerManager};

/// Seconds between samples.
pub const INTERVAL_SECONDS: u64 = 1;

/// Samples kept: five minutes at one a second.
pub const HISTORY_SECONDS: usize = 300;

/// Now, in unix seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Every engine's values at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// When it was taken, unix seconds.
    pub t: f64,
    /// One reading per engine, in engine order.
    pub engines: Vec<EngineReading>,
}

impl Sample {
    /// Reads every engine of `metrics` now.
    pub fn take(metrics: &StatLoggerManager) -> Self {
        Self {
            t: unix_now(),
            engines: metrics.read_engines(),
        }
    }

    /// Bytes the sample costs in the ring, heap included (its `Arc`'s
    /// counts and its ring slot too): what the memory bound adds up.
    pub fn size_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + 2 * std::mem::size_of::<usize>()
            + std::mem::size_of::<Arc<Self>>()
            + self
                .engines
                .iter()
                .map(|e| {
                    std::mem::size_of::<EngineReading>()
                        + e.latency.iter().map(|c| c.len() * 8).sum::<usize>()
                })
                .sum::<usize>()
    }
}

/// A ring of the last [`HISTORY_SECONDS`] samples, oldest first.
pub struct History {
    samples: Mutex<VecDeque<Arc<Sample>>>,
    capacity: usize,
}

impl History {
    /// A ring of `capacity` samples (at least one).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            samples: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity,
        }
    }

    /// Adds `sample`, dropping the oldest when full.
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        if samples.len() == self.capacity {
            samples.pop_front();
        }
        samples.push_back(Arc::new(sample));
    }

    /// Every sample kept, oldest first (shared, not copied).
    pub fn all(&self) -> Vec<Arc<Sample>> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.iter().cloned().collect()
    }

    /// The newest sample.
    pub fn latest(&self) -> Option<Arc<Sample>> {
        let samples = self.samples.lock().unwrap_or_else(PoisonError::into_inner);
        samples.back().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64) -> Sample {
        Sample {
            t,
            engines: Vec::new(),
        }
    }

    /// The bound docs/console.md states: a full history of one engine
    /// with the default buckets (`--nocapture` prints the figure).
    #[test]
    fn a_full_history_fits_the_documented_bound() {
        let metrics = StatLoggerManager::new(inferscope_metrics::MetricsConfig::default()).unwrap();
        let one = Sample::take(&metrics);
        assert_eq!(one.engines.len(), 1);
        let per_engine = one.size_bytes() * HISTORY_SECONDS;
        println!("history of one engine: {per_engine} bytes");
        assert!(per_engine <= 320 * 1024, "{per_engine} bytes");
    }

    #[test]
    fn the_ring_keeps_the_newest_in_order() {
        let h = History::new(3);
        assert!(h.latest().is_none());
        for t in 0..5 {
            h.push(sample(f64::from(t)));
        }
        let ts: Vec<f64> = h.all().iter().map(|s| s.t).collect();
        assert_eq!(ts, [2.0, 3.0, 4.0]);
        assert_eq!(h.latest().unwrap().t, 4.0);
    }
}

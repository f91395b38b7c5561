//! A point-in-time copy of the values one engine's handles hold, for a
//! reader inside the process (the server's console) that wants them without
//! rendering and parsing `/metrics`. Reading is a few dozen relaxed atomic
//! loads per engine; nothing on the recording side changes.

use inferscope_schema::stats::FinishReason;

/// The latency histograms a [`EngineReading`] carries, in its order.
pub const LATENCIES: [Latency; 4] = [Latency::Ttft, Latency::Itl, Latency::E2e, Latency::Queue];

/// One of the request-latency histograms a reading copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// `time_to_first_token_seconds`.
    Ttft,
    /// `inter_token_latency_seconds`.
    Itl,
    /// `e2e_request_latency_seconds`.
    E2e,
    /// `request_queue_time_seconds`.
    Queue,
}

impl Latency {
    /// The short key (`ttft`, `itl`, `e2e`, `queue`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ttft => "ttft",
            Self::Itl => "itl",
            Self::E2e => "e2e",
            Self::Queue => "queue",
        }
    }
}

/// One engine's gauges, counters and latency bucket counts, read at once.
/// Counters are cumulative since start (a reader takes differences).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineReading {
    /// The global engine index (the `engine` label).
    pub engine: usize,
    /// `num_requests_running`.
    pub running: i64,
    /// `num_requests_waiting`.
    pub waiting: i64,
    /// `kv_cache_usage_perc` (a fraction, 0–1).
    pub kv_cache_usage: f64,
    /// `device_busy_seconds_total`.
    pub device_busy_seconds: f64,
    /// `num_preemptions_total`.
    pub preemptions: u64,
    /// `prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// `generation_tokens_total`.
    pub generation_tokens: u64,
    /// `request_success_total` by finish reason, in [`FinishReason::ALL`] order.
    pub requests: [u64; FinishReason::ALL.len()],
    /// Non-cumulative bucket counts of each of [`LATENCIES`], `+Inf` last
    /// (one more than the histogram's finite bounds).
    pub latency: [Box<[u64]>; LATENCIES.len()],
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use inferscope_schema::stats::{
        FinishedRequestStats, FrontendStats, IterationStats, RequestRef, SchedulerStats,
        StatsRecorder,
    };

    use super::*;
    use crate::{MetricsConfig, StatLoggerManager};

    /// Each field of a reading is the handle the exposition renders: a
    /// step and a finished request on engine 1 show there and only there.
    #[test]
    fn a_reading_holds_what_was_recorded_on_its_engine() {
        let m = StatLoggerManager::new(MetricsConfig {
            engine_indices: vec![0, 1],
            ..MetricsConfig::default()
        })
        .unwrap();
        let sched = SchedulerStats {
            num_running: 3,
            num_waiting: 2,
            kv_cache_usage: 0.25,
            num_preemptions: 1,
            ..SchedulerStats::default()
        };
        let finished = FinishedRequestStats {
            request: RequestRef::new("r", None),
            finish_reason: FinishReason::Length,
            num_prompt_tokens: 100,
            num_generation_tokens: 7,
            num_cached_tokens: 0,
            max_tokens_param: 7,
            n: 1,
            num_preemptions: 0,
            queue_time: Duration::from_millis(30),
            prefill_time: Duration::ZERO,
            decode_time: Duration::ZERO,
            inference_time: Duration::ZERO,
        };
        let iter = IterationStats {
            num_prompt_tokens: 100,
            num_generation_tokens: 7,
            device_time: Duration::from_millis(500),
            finished_requests: vec![finished],
            ..IterationStats::default()
        };
        m.record_step(1, &sched, &iter);
        m.frontend(1).unwrap().record_for(
            &FrontendStats::FirstToken {
                ttft: Duration::from_millis(40),
            },
            &RequestRef::new("r", None),
        );
        let r = m.read_engines();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].engine, 0);
        assert_eq!((r[0].running, r[0].prompt_tokens), (0, 0));
        let e = &r[1];
        assert_eq!((e.engine, e.running, e.waiting), (1, 3, 2));
        assert_eq!(e.kv_cache_usage, 0.25);
        assert_eq!(e.device_busy_seconds, 0.5);
        assert_eq!(
            (e.preemptions, e.prompt_tokens, e.generation_tokens),
            (1, 100, 7)
        );
        assert_eq!(e.requests, [0, 1, 0, 0]);
        for (l, counts) in LATENCIES.iter().zip(&e.latency) {
            let bounds = m.latency_bounds(*l);
            assert_eq!(counts.len(), bounds.len() + 1, "{l:?}: +Inf last");
            let expected = match l {
                Latency::Ttft => Some(0.04),
                Latency::Queue => Some(0.03),
                Latency::Itl | Latency::E2e => None,
            };
            let total: u64 = counts.iter().sum();
            assert_eq!(total, u64::from(expected.is_some()), "{l:?}");
            if let Some(v) = expected {
                // The bucket `le` semantics put it in: the first bound >= v.
                let at = bounds.partition_point(|&b| b < v);
                assert_eq!(counts[at], 1, "{l:?} in the bucket of {v}");
            }
        }
    }
}

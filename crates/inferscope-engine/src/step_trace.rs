//! What an engine core records of its steps for a profile (`/start_profile`
//! … `/stop_profile`) and for the console's step timeline: each step's
//! phases and batch, and the timelines of the requests it served.
//!
//! Nothing here runs unless asked: a core records a profile only between
//! the two messages, and the step ring only while its switch is on (one
//! relaxed load per step).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::request::RequestTimeline;

/// Steps one engine keeps in a profile; later steps are counted as dropped
/// (a bound on memory when a profile is left running: ~100 bytes plus the
/// batch per step).
pub const MAX_PROFILE_STEPS: usize = 1_000_000;

/// One request's part of a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepSeq {
    /// The engine request id.
    pub request_id: Arc<str>,
    /// Prompt tokens computed (a prefill chunk or a recompute).
    pub prefill_tokens: u32,
    /// Generated tokens fed back in (a decode: one).
    pub decode_tokens: u32,
}

/// One engine step as the core ran it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepRecord {
    /// Where the step's schedule phase starts (the previous step's end, or
    /// the end of the last idle period: where the core, out of work, took
    /// new work in).
    pub start: Instant,
    /// Building the batch, plus the host work between steps.
    pub schedule: Duration,
    /// The executor call (host wall time).
    pub execute: Duration,
    /// Applying the output: tokens, stop checks, freeing, outputs.
    pub postprocess: Duration,
    /// What the executor reports as device-busy time.
    pub device_time: Duration,
    /// The sequences of the batch, in batch order.
    pub batch: Vec<StepSeq>,
}

impl StepRecord {
    /// The step's wall time: schedule + execute + postprocess.
    pub fn wall(&self) -> Duration {
        self.schedule + self.execute + self.postprocess
    }

    /// Wall time the device was not busy (host overhead of the step).
    pub fn host_time(&self) -> Duration {
        self.wall().saturating_sub(self.device_time)
    }
}

/// A request's timeline as a profile saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestTrace {
    /// The engine request id.
    pub request_id: Arc<str>,
    /// Its timestamps (`finished` unset while it is still in flight).
    pub timeline: RequestTimeline,
}

/// What one engine recorded between the start and the stop of a profile.
#[derive(Debug, Clone)]
pub struct EngineProfile {
    /// Global engine index.
    pub engine: usize,
    /// When the engine took the start message.
    pub started: Instant,
    /// When it took the stop message.
    pub stopped: Instant,
    /// The steps it ran, in order (at most [`MAX_PROFILE_STEPS`]).
    pub steps: Vec<StepRecord>,
    /// Steps run past [`MAX_PROFILE_STEPS`], not kept.
    pub dropped_steps: u64,
    /// Requests that finished during the profile, then those still in
    /// flight at its stop.
    pub requests: Vec<RequestTrace>,
}

impl EngineProfile {
    /// An empty profile of `engine` starting now.
    pub(crate) fn start(engine: usize) -> Self {
        let now = Instant::now();
        Self {
            engine,
            started: now,
            stopped: now,
            steps: Vec::new(),
            dropped_steps: 0,
            requests: Vec::new(),
        }
    }

    /// Keeps `step`, or counts it past the bound.
    pub(crate) fn push(&mut self, step: StepRecord) {
        if self.steps.len() < MAX_PROFILE_STEPS {
            self.steps.push(step);
        } else {
            self.dropped_steps += 1;
        }
    }
}

/// Steps an engine's ring keeps for the console.
pub const STEP_RING_CAPACITY: usize = 2048;

/// The last steps of one engine, kept while [`StepRing::set_enabled`] is on
/// (the console turns it on while a page watches). The engine pushes once
/// per step under an uncontended lock; a reader copies the ring out.
#[derive(Debug)]
pub struct StepRing {
    enabled: AtomicBool,
    steps: Mutex<VecDeque<StepRecord>>,
}

impl Default for StepRing {
    fn default() -> Self {
        Self {
            enabled: AtomicBool::new(false),
            steps: Mutex::new(VecDeque::new()),
        }
    }
}

impl StepRing {
    /// Whether the engine records into the ring (one relaxed load).
    pub fn is_enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// Turns recording on or off; off also empties the ring, freeing it.
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
        if !on {
            *self.steps.lock() = VecDeque::new();
        }
    }

    /// Appends a step, dropping the oldest past [`STEP_RING_CAPACITY`]
    /// (the engine core, once per step while enabled).
    pub fn push(&self, step: StepRecord) {
        let mut steps = self.steps.lock();
        if steps.len() == STEP_RING_CAPACITY {
            steps.pop_front();
        }
        steps.push_back(step);
    }

    /// The steps that started after `since` (all with `None`), oldest first.
    pub fn steps_since(&self, since: Option<Instant>) -> Vec<StepRecord> {
        let steps = self.steps.lock();
        let from = match since {
            Some(t) => steps.partition_point(|s| s.start <= t),
            None => 0,
        };
        steps.range(from..).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(start: Instant) -> StepRecord {
        StepRecord {
            start,
            schedule: Duration::ZERO,
            execute: Duration::ZERO,
            postprocess: Duration::ZERO,
            device_time: Duration::ZERO,
            batch: Vec::new(),
        }
    }

    /// The ring keeps the newest steps up to its capacity, answers those
    /// after a time, and frees them when switched off.
    #[test]
    fn the_ring_is_bounded_and_emptied_when_off() {
        let ring = StepRing::default();
        assert!(!ring.is_enabled());
        ring.set_enabled(true);
        let t = Instant::now();
        let at = |i: usize| t + Duration::from_micros(i as u64);
        for i in 0..STEP_RING_CAPACITY + 5 {
            ring.push(step(at(i)));
        }
        let all = ring.steps_since(None);
        assert_eq!(all.len(), STEP_RING_CAPACITY);
        assert_eq!(all[0].start, at(5), "the oldest dropped first");
        let after = ring.steps_since(Some(at(STEP_RING_CAPACITY + 2)));
        assert_eq!(after.len(), 2, "only the steps that started after");
        ring.set_enabled(false);
        assert!(ring.steps_since(None).is_empty());
    }
}

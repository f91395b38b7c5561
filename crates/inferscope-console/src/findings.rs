//! The doctor's findings, recomputed live for the console.
//!
//! The rules live in `inferscope-doctor`, a client crate the server may not
//! link (docs/architecture.md), so the binary hands the server a [`Diagnose`]
//! function. Every [`EVERY_SECONDS`] the console renders its own `/metrics`
//! text, keeps the renders of the last [`WINDOW_SECONDS`], and passes them
//! to that function, off the runtime: the same input `inferscope doctor
//! --window 30s` reads from `/metrics`, so the console and the doctor agree.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use inferscope_metrics::{Format, StatLoggerManager};
use serde_json::Value;

/// The doctor's rules over `/metrics` texts taken at the given seconds
/// (oldest first); returns the findings as JSON (docs/console.md).
pub type Diagnose = Arc<dyn Fn(&[(f64, &str)]) -> Value + Send + Sync>;

/// Seconds between two diagnoses (and two renders of `/metrics`).
pub const EVERY_SECONDS: u64 = 5;
/// The window the findings cover once the server has run this long: the
/// doctor's default `--window`.
pub const WINDOW_SECONDS: u64 = 30;

/// The renders of the window and the latest findings.
pub struct Findings {
    diagnose: Diagnose,
    /// `(unix seconds, /metrics text)`, oldest first, spanning at most
    /// [`WINDOW_SECONDS`].
    renders: Mutex<VecDeque<(f64, Arc<str>)>>,
    /// The latest findings and their number (0: none yet).
    latest: Mutex<(u64, Value)>,
}

impl Findings {
    /// Findings computed by `diagnose`.
    pub fn new(diagnose: Diagnose) -> Self {
        Self {
            diagnose,
            renders: Mutex::new(VecDeque::new()),
            latest: Mutex::new((0, Value::Null)),
        }
    }

    /// Renders `/metrics` now, drops renders older than the window, and
    /// diagnoses the window once it holds two. Blocking: call it off the
    /// runtime.
    pub fn update(&self, metrics: &StatLoggerManager, now: f64) {
        let (_, text) = metrics.render(Format::Prometheus);
        let window: Vec<(f64, Arc<str>)> = {
            let mut renders = self.renders.lock().unwrap_or_else(|e| e.into_inner());
            renders.push_back((now, text.into()));
            while renders
                .front()
                .is_some_and(|(t, _)| now - t > WINDOW_SECONDS as f64 + 0.5)
            {
                renders.pop_front();
            }
            if renders.len() < 2 {
                return;
            }
            // The texts are shared, not copied: the diagnosis runs
            // without the lock.
            renders.iter().cloned().collect()
        };
        let start = window[0].0;
        let scrapes: Vec<(f64, &str)> = window
            .iter()
            .map(|(t, text)| (t - start, &**text))
            .collect();
        let found = (self.diagnose)(&scrapes);
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        *latest = (latest.0 + 1, found);
    }

    /// The latest findings (`null` before the first).
    pub fn latest(&self) -> Value {
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// The latest findings' number (0 before the first).
    pub fn number(&self) -> u64 {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// The latest findings, with their number, when that is not `seen`: a
    /// reader that has them gets nothing (and nothing is copied).
    pub fn newer_than(&self, seen: u64) -> Option<(u64, Value)> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        (latest.0 != seen).then(|| latest.clone())
    }
}

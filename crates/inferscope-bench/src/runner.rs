//! Runs a plan: sends each request at its scheduled time, caps concurrency,
//! and collects the per-request measurements.
//!
//! A dedicated OS thread keeps the schedule (std sleep has ~50 µs resolution,
//! the tokio timer 1 ms) and spawns each request onto the runtime at its time,
//! so a busy runtime does not delay the schedule itself; the lag of each
//! actual send behind its scheduled time is measured and reported.

use crate::client::{ApiClient, RequestOutput};
use crate::dataset::SampleRequest;
use crate::progress::Progress;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// What to send and when.
pub struct Plan {
    /// The requests, in send order.
    pub requests: Vec<SampleRequest>,
    /// Send offsets from the start (same length as `requests`).
    pub offsets: Vec<Duration>,
    /// Most requests in flight at once.
    pub max_concurrency: Option<usize>,
    /// Show a progress bar.
    pub progress: bool,
}

/// Measurements of a run.
pub struct RunResult {
    /// One output per request, in request order.
    pub outputs: Vec<RequestOutput>,
    /// From the first scheduled send to the last response, seconds.
    pub duration_s: f64,
}

/// Executes the plan on the current tokio runtime.
pub async fn execute(client: Arc<ApiClient>, plan: Plan) -> RunResult {
    let n = plan.requests.len();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, RequestOutput)>();
    let sem = plan
        .max_concurrency
        .map(|c| Arc::new(Semaphore::new(c.max(1))));
    let done = Arc::new(AtomicUsize::new(0));
    let progress = Progress::start(n, plan.progress, done.clone());
    let handle = tokio::runtime::Handle::current();
    let start = Instant::now();
    let requests = plan.requests;
    let mut offsets = plan.offsets;
    offsets.resize(n, offsets.last().copied().unwrap_or_default());
    std::thread::spawn(move || {
        for (i, (req, off)) in requests.into_iter().zip(offsets).enumerate() {
            let target = start.checked_add(off).unwrap_or(start);
            let now = Instant::now();
            if target > now {
                std::thread::sleep(target - now);
            }
            let dispatched = Instant::now();
            let (client, tx, sem, done) = (client.clone(), tx.clone(), sem.clone(), done.clone());
            handle.spawn(async move {
                // The permit is held until the response has been read.
                let _permit = match sem {
                    Some(s) => s.acquire_owned().await.ok(),
                    None => None,
                };
                let sent = Instant::now();
                let mut out = client
                    .send(&req.prompt, req.prompt_len, req.expected_output_len)
                    .await;
                out.start = sent.duration_since(start).as_secs_f64();
                out.send_lag = sent.saturating_duration_since(target).as_secs_f64();
                out.dispatch_lag = dispatched.saturating_duration_since(target).as_secs_f64();
                done.fetch_add(1, Ordering::Relaxed);
                let _ = tx.send((i, out));
            });
        }
    });
    let mut outputs = vec![RequestOutput::default(); n];
    while let Some((i, o)) = rx.recv().await {
        if let Some(slot) = outputs.get_mut(i) {
            *slot = o;
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    progress.finish();
    for o in outputs.iter_mut() {
        if !o.success && o.error.is_empty() {
            o.error = "request task ended without a result".to_string();
        }
    }
    RunResult {
        outputs,
        duration_s,
    }
}

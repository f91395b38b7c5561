//! A bounded pool for the CPU-heavy part of a request before the engine:
//! JSON parsing, chat-template rendering and tokenization.
//!
//! Run inline on the async runtime's worker threads, tokenizing a long prompt
//! (tens of milliseconds for 8k tokens with a BPE tokenizer) stalls every
//! other task on that thread, so other streams' SSE writes wait behind it.
//! TGI moves this work onto validation workers; so does this server.
//!
//! The design: a semaphore-bounded `spawn_blocking`, not N dedicated threads
//! fed by a channel. It needs no MPMC channel (the workspace has none, and a
//! `Mutex<Receiver>` shared by N threads would be one more lock), a job whose
//! client left while it waited for a permit is dropped with its future
//! instead of running for nothing, and a panicking tokenizer costs one
//! request (a 500) rather than a worker thread. Two semaphores bound it:
//! `running` caps the jobs on blocking threads at `workers` (so tokenization
//! never takes more cores than that from the engine), and `queued` caps the
//! request bytes held by running and waiting jobs, so a flood of large
//! prompts is refused with a 429 instead of piling up in memory. The bound is
//! in bytes, not requests, because memory is what it protects: a burst of
//! many small requests waits its turn, a flood of 8k-token prompts does not.
//!
//! A small request (at most [`INLINE_MAX_BYTES`] of body) is prepared on
//! the runtime thread that holds it: parsing and tokenizing a few hundred
//! bytes takes a few microseconds, less than handing it to a blocking thread
//! and waking the runtime again when it is done (two cross-thread wakes,
//! which on a busy or pinned core cost more than the work itself). It still
//! costs one request, a 500, if it panics.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::error::ApiError;

/// The `reason` label of a refusal because the pool's queue is full.
pub const REASON_VALIDATION_QUEUE: &str = "validation_queue";

/// Requests of at most this many body bytes are prepared inline, on the
/// runtime, not on a worker: short enough to tokenize in microseconds (a
/// 2 KiB prompt is ~500 tokens), so nothing else waits long behind it.
pub const INLINE_MAX_BYTES: usize = 2048;

/// Runs blocking request preparation on at most `workers` threads at once.
#[derive(Debug)]
pub struct ValidationWorkers {
    running: Arc<Semaphore>,
    queued: Arc<Semaphore>,
    queue_bytes: u32,
}

impl ValidationWorkers {
    /// A pool of `workers` threads (at least one) whose running and waiting
    /// jobs hold at most `queue_bytes` of requests (at most 4 GiB).
    pub fn new(workers: usize, queue_bytes: usize) -> Self {
        let queue_bytes = u32::try_from(queue_bytes).unwrap_or(u32::MAX).max(1);
        Self {
            running: Arc::new(Semaphore::new(workers.max(1))),
            queued: Arc::new(Semaphore::new(queue_bytes as usize)),
            queue_bytes,
        }
    }

    /// Runs `job`, which holds a request of `bytes`, on a blocking thread
    /// once a worker is free, or at once on this thread when `bytes` is at
    /// most [`INLINE_MAX_BYTES`]. A full queue is an immediate 429 (a request
    /// larger than the whole queue goes through when the queue is empty);
    /// the job's own error is returned as it is.
    pub async fn run<T, F>(&self, bytes: usize, job: F) -> Result<T, ApiError>
    where
        F: FnOnce() -> Result<T, ApiError> + Send + 'static,
        T: Send + 'static,
    {
        if bytes <= INLINE_MAX_BYTES {
            return catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|_| {
                Err(ApiError::internal(
                    "request preparation failed: it panicked",
                ))
            });
        }
        let cost = u32::try_from(bytes)
            .unwrap_or(u32::MAX)
            .clamp(1, self.queue_bytes);
        let Ok(_queued) = self.queued.clone().try_acquire_many_owned(cost) else {
            return Err(self.full());
        };
        // Both semaphores live as long as `self` and are never closed.
        let Ok(running) = self.running.clone().acquire_owned().await else {
            return Err(ApiError::unavailable("the validation workers are stopped"));
        };
        tokio::task::spawn_blocking(move || {
            let _running = running;
            job()
        })
        .await
        .unwrap_or_else(|e| {
            Err(ApiError::internal(format!(
                "request preparation failed: {e}"
            )))
        })
    }

    /// The 429 of a full queue.
    fn full(&self) -> ApiError {
        let waiting = self.queue_bytes as usize - self.queued.available_permits();
        ApiError::overloaded(format!(
            "the server is overloaded: {waiting} bytes of requests are waiting to be tokenized (limit {}); retry later",
            self.queue_bytes
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn runs_jobs_and_passes_their_errors() {
        let w = ValidationWorkers::new(2, 4);
        assert_eq!(w.run(1, || Ok(7)).await, Ok(7));
        let err = w
            .run(1, || Err::<(), _>(ApiError::invalid("bad", Some("prompt"))))
            .await
            .expect_err("the job's error");
        assert_eq!(err.param, Some("prompt"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_queue_is_refused_and_at_most_workers_jobs_run() {
        // Sizes in units above the inline bound, so every job goes to the pool.
        const U: usize = INLINE_MAX_BYTES + 1;
        // Room for 100 units of requests.
        let w = Arc::new(ValidationWorkers::new(1, 100 * U));
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = Arc::new(std::sync::Mutex::new(release_rx));
        let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<usize>();
        // One job of 60 units runs (blocked until released), one of 40 waits
        // for the worker.
        let mut jobs = Vec::new();
        for (i, units) in [(0, 60), (1, 40)] {
            let (w, rx, started) = (w.clone(), release_rx.clone(), started_tx.clone());
            jobs.push(tokio::spawn(async move {
                w.run(units * U, move || {
                    let _ = started.send(i);
                    let _ = rx.lock().map(|r| r.recv());
                    Ok(i)
                })
                .await
            }));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(started_rx.try_recv().is_ok(), "the first job runs");
        assert!(
            started_rx.try_recv().is_err(),
            "the second waits for the worker"
        );
        // Refused at once: waiting for the worker would hang here.
        let err = tokio::time::timeout(Duration::from_secs(5), w.run(U, || Ok(9)))
            .await
            .expect("answered at once")
            .expect_err("the queue is full");
        assert_eq!(err.status.as_u16(), 429);
        // A small request is prepared inline, even with the queue full.
        assert_eq!(w.run(INLINE_MAX_BYTES, || Ok(3)).await, Ok(3));
        for _ in 0..2 {
            let _ = release_tx.send(());
        }
        for j in jobs {
            assert!(j.await.expect("joined").is_ok());
        }
        assert_eq!(w.run(100 * U, || Ok(1)).await, Ok(1), "room again");
        assert_eq!(
            w.run(1000 * U, || Ok(2)).await,
            Ok(2),
            "a request larger than the queue goes through an empty one"
        );
    }

    #[tokio::test]
    async fn a_panicking_job_is_a_500() {
        let w = ValidationWorkers::new(1, 0);
        // Inline and on the pool alike.
        for bytes in [1, INLINE_MAX_BYTES + 1] {
            let err = w
                .run(bytes, || -> Result<(), ApiError> {
                    panic!("tokenizer bug")
                })
                .await
                .expect_err("panicked");
            assert_eq!(err.status.as_u16(), 500);
            assert_eq!(w.run(bytes, || Ok(2)).await, Ok(2), "the pool survives");
        }
    }
}

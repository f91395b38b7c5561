//! The channel a request's outputs travel on: from the engine core's thread
//! (or its output thread) to the request's task on the async runtime.
//!
//! One queue under one lock, with the receiving task's waker beside it. A
//! request's channel lives for one request, so what it costs to make counts
//! as much as what a message costs: tokio's unbounded channel allocates a
//! cache-aligned state (through `memalign`) and a first block of 32 slots
//! (1.5 KiB, more than glibc's per-thread cache takes) per channel. Here it
//! is one small shared state, and a queue that the receiver swaps whole
//! with its own (empty) one: a burst of outputs is taken in one lock, and
//! the two buffers' capacity is kept for the rest of the request.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
pub use std::sync::mpsc::TryRecvError;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::request::RequestOutput;

/// A new channel whose queue has room for `capacity` outputs before it grows.
pub fn channel(capacity: usize) -> (OutputSender, OutputReceiver) {
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::with_capacity(capacity),
            waker: None,
            receiver: true,
        }),
        senders: AtomicUsize::new(1),
    });
    let receiver = OutputReceiver {
        shared: Arc::clone(&shared),
        taken: VecDeque::new(),
    };
    (OutputSender { shared }, receiver)
}

struct Shared {
    state: Mutex<State>,
    /// Live senders; the channel is closed when none is left (counted
    /// outside the lock: the scheduler clones a sender per held output).
    senders: AtomicUsize,
}

struct State {
    queue: VecDeque<RequestOutput>,
    /// The receiving task, when it waits.
    waker: Option<Waker>,
    /// Whether the receiver still exists (else a send is refused).
    receiver: bool,
}

/// The sending side; cloned freely (the channel closes when the last one
/// is dropped).
pub struct OutputSender {
    shared: Arc<Shared>,
}

impl OutputSender {
    /// Queues `out` and wakes the receiver; gives it back when the receiver
    /// is gone (the client left: the request's abort follows).
    pub fn send(&self, out: RequestOutput) -> Result<(), RequestOutput> {
        let waker = {
            let mut state = self.shared.state.lock();
            if !state.receiver {
                return Err(out);
            }
            state.queue.push_back(out);
            state.waker.take()
        };
        // Woken outside the lock: the woken task's first act is to take it.
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        !self.shared.state.lock().receiver
    }
}

impl std::fmt::Debug for OutputSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No lock taken: a value printed while its channel is in use.
        f.debug_struct("OutputSender")
            .field("senders", &self.shared.senders.load(Ordering::Relaxed))
            .finish()
    }
}

impl Clone for OutputSender {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for OutputSender {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last sender: a waiting receiver learns the channel closed.
            let waker = self.shared.state.lock().waker.take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

/// The receiving side (one per channel).
pub struct OutputReceiver {
    shared: Arc<Shared>,
    /// Outputs taken from the shared queue, not yet returned.
    taken: VecDeque<RequestOutput>,
}

impl OutputReceiver {
    /// The next output if one is there; `Disconnected` once every sender is
    /// gone and every output was received.
    pub fn try_recv(&mut self) -> Result<RequestOutput, TryRecvError> {
        self.take(None)
    }

    /// Waits for the next output; `None` once every sender is gone and
    /// every output was received.
    pub async fn recv(&mut self) -> Option<RequestOutput> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    /// The next output, or `Pending` with `cx`'s task woken by the next send
    /// (or the last sender's drop).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<RequestOutput>> {
        match self.take(Some(cx.waker())) {
            Ok(out) => Poll::Ready(Some(out)),
            Err(TryRecvError::Disconnected) => Poll::Ready(None),
            Err(TryRecvError::Empty) => Poll::Pending,
        }
    }

    /// The next output: from what was taken before, else from the shared
    /// queue (taken whole). When there is none, `waker` (if any) is left to
    /// be woken.
    fn take(&mut self, waker: Option<&Waker>) -> Result<RequestOutput, TryRecvError> {
        if let Some(out) = self.taken.pop_front() {
            return Ok(out);
        }
        let mut state = self.shared.state.lock();
        std::mem::swap(&mut state.queue, &mut self.taken);
        if let Some(out) = self.taken.pop_front() {
            return Ok(out);
        }
        // Under the lock: a sender's last output is queued before its drop
        // is counted, so none can be missed here.
        if self.shared.senders.load(Ordering::Acquire) == 0 {
            return Err(TryRecvError::Disconnected);
        }
        if let Some(w) = waker {
            match &mut state.waker {
                Some(old) if old.will_wake(w) => {}
                slot => *slot = Some(w.clone()),
            }
        }
        Err(TryRecvError::Empty)
    }
}

impl std::fmt::Debug for OutputReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputReceiver")
            .field("taken", &self.taken.len())
            .finish()
    }
}

impl Drop for OutputReceiver {
    fn drop(&mut self) {
        // What is still queued is dropped outside the lock.
        let queued = {
            let mut state = self.shared.state.lock();
            state.receiver = false;
            state.waker = None;
            std::mem::take(&mut state.queue)
        };
        drop(queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn output(token: u32) -> RequestOutput {
        RequestOutput {
            token_id: Some(token),
            at: Instant::now(),
            finished: None,
            logprobs: None,
            prompt_logprobs: None,
        }
    }

    /// Outputs arrive in order, across the swaps of the two queues; the
    /// channel reads as closed only after the last one.
    #[test]
    fn outputs_arrive_in_order_then_the_close() {
        let (tx, mut rx) = channel(2);
        assert_eq!(rx.try_recv().err(), Some(TryRecvError::Empty));
        for t in 0..5 {
            tx.send(output(t)).unwrap();
        }
        assert_eq!(rx.try_recv().unwrap().token_id, Some(0));
        // Sent while the receiver holds a taken batch: after it.
        tx.send(output(5)).unwrap();
        let second = tx.clone();
        drop(tx);
        second.send(output(6)).unwrap();
        drop(second);
        let got: Vec<_> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|o| o.token_id.unwrap())
            .collect();
        assert_eq!(got, [1, 2, 3, 4, 5, 6]);
        assert_eq!(rx.try_recv().err(), Some(TryRecvError::Disconnected));
    }

    /// A send after the receiver is gone is refused (the output comes back).
    #[test]
    fn a_send_to_a_dropped_receiver_is_refused() {
        let (tx, rx) = channel(0);
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send(output(7)).unwrap_err().token_id, Some(7));
    }

    /// A waiting task is woken by a send from another thread, and by the
    /// last sender's drop.
    #[test]
    fn a_waiting_receiver_is_woken_by_a_send_and_by_the_close() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = channel(0);
            let sender = std::thread::spawn(move || {
                for t in 0..100 {
                    tx.send(output(t)).unwrap();
                    if t % 10 == 0 {
                        std::thread::yield_now();
                    }
                }
            });
            let mut got = Vec::new();
            while let Some(o) = rx.recv().await {
                got.push(o.token_id.unwrap());
            }
            sender.join().unwrap();
            assert_eq!(got, (0..100).collect::<Vec<_>>());
        });
    }
}
